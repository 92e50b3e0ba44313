package snoop

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Timers are the membership timers of RFC 3376 §8 (IGMPv3) and RFC 3810
// §9 (MLDv2), which share their defaults.
type Timers struct {
	Robustness              int           // 2
	QueryInterval           time.Duration // 125 s
	QueryResponseInterval   time.Duration // 10 s
	LastMemberQueryInterval time.Duration // 1 s
	LastMemberQueryCount    int           // Robustness
}

// WithDefaults fills zero fields with the RFC defaults.
func (t Timers) WithDefaults() Timers {
	if t.Robustness == 0 {
		t.Robustness = 2
	}
	if t.QueryInterval == 0 {
		t.QueryInterval = 125 * time.Second
	}
	if t.QueryResponseInterval == 0 {
		t.QueryResponseInterval = 10 * time.Second
	}
	if t.LastMemberQueryInterval == 0 {
		t.LastMemberQueryInterval = time.Second
	}
	if t.LastMemberQueryCount == 0 {
		t.LastMemberQueryCount = t.Robustness
	}
	return t
}

// Validate checks the timers are usable (after WithDefaults).
func (t Timers) Validate() error {
	switch {
	case t.Robustness < 1 || t.Robustness > 7:
		return fmt.Errorf("snoop: robustness %d out of range 1..7", t.Robustness)
	case t.QueryResponseInterval >= t.QueryInterval:
		return fmt.Errorf("snoop: query response interval %s must be below the query interval %s", t.QueryResponseInterval, t.QueryInterval)
	case t.LastMemberQueryInterval < 100*time.Millisecond || t.LastMemberQueryInterval > 25*time.Second:
		return fmt.Errorf("snoop: last member query interval %s out of range 100ms..25s", t.LastMemberQueryInterval)
	case t.QueryResponseInterval > 25*time.Second || t.QueryResponseInterval < 100*time.Millisecond:
		return fmt.Errorf("snoop: query response interval %s out of range 100ms..25s", t.QueryResponseInterval)
	case t.QueryInterval > 3000*time.Second:
		return fmt.Errorf("snoop: query interval %s above 3000s", t.QueryInterval)
	}
	return nil
}

// MembershipInterval is how long a group lives without a report:
// robustness × query interval + query response interval (260 s).
func (t Timers) MembershipInterval() time.Duration {
	return time.Duration(t.Robustness)*t.QueryInterval + t.QueryResponseInterval
}

// LeaveTime is how long a group lives after a leave with no report in
// answer to the group-specific queries: count × interval (2 s).
func (t Timers) LeaveTime() time.Duration {
	return time.Duration(t.LastMemberQueryCount) * t.LastMemberQueryInterval
}

// Key is a group on one VLAN: the shim keeps a partition per VLAN, and
// the same group on two VLANs is two groups (two MGIDs, one per P_Key).
type Key struct {
	VLAN  uint16
	Group netip.Addr
}

// Actions are what the table asks of its owner.
//
// Join and Leave are called with the table's lock held, in the order of
// the state changes they follow. So a leave can never overtake a later
// join of the same group, as long as the owner carries them out in that
// order; the shim queues them, first in first out, to its control
// goroutine. They must be quick, never a port call, as the data path
// holds the lock while it reports. They must not call back into the
// table.
//
// A Join that fails leaves the group unrecorded; the next report tries
// again. A join the owner accepted and then could not carry out is
// reported back with Forget and the generation Join was given. So the
// table never claims a group its owner did not join. And a late Forget
// of an earlier join never drops a later entry of the same group, whose
// own join is pending or done and must be released by a Leave.
//
// Query is called without the lock.
type Actions struct {
	Join  func(k Key, gen uint64) error // the group's first member appeared; gen names this entry (Forget)
	Leave func(Key)                     // the group's last member is gone
	Query func(Key)                     // send a group-specific query
}

type member struct {
	expires     time.Time
	queriesLeft int
	nextQuery   time.Time
	reporter    netip.Addr // source of the last report
	gen         uint64     // the entry's generation, given to Join
}

// Table is the membership state machine for IGMP and MLD alike: a report
// creates or refreshes a group for the membership interval; a leave
// starts group-specific queries and shortens the group's life to the
// leave time unless a report answers. It is safe for concurrent use.
type Table struct {
	t   Timers
	act Actions
	max int

	mu       sync.Mutex
	m        map[Key]*member
	gen      uint64 // the last generation given to an entry
	overflow uint64 // new groups refused for the bound
	failed   uint64 // joins the owner refused
}

// NewTable returns an empty table of at most max groups.
func NewTable(t Timers, max int, act Actions) *Table {
	return &Table{t: t.WithDefaults(), act: act, max: max, m: make(map[Key]*member)}
}

// Timers returns the table's timers.
func (t *Table) Timers() Timers {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.t
}

// SetTimers changes the table's timers (a configuration reload): groups
// keep the expiry and the queries they have; reports, leaves and
// queries from now on use x. Invalid timers change nothing.
func (t *Table) SetTimers(x Timers) error {
	x = x.WithDefaults()
	if err := x.Validate(); err != nil {
		return err
	}
	t.mu.Lock()
	t.t = x
	t.mu.Unlock()
	return nil
}

// Report records that a member of k exists at now, as a report from the
// address from showed.
func (t *Table) Report(k Key, from netip.Addr, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.m[k]
	if !ok {
		if len(t.m) >= t.max {
			t.overflow++
			return
		}
		t.gen++
		if t.act.Join != nil {
			if err := t.act.Join(k, t.gen); err != nil {
				t.failed++
				return
			}
		}
		m = &member{gen: t.gen}
		t.m[k] = m
	}
	m.expires = now.Add(t.t.MembershipInterval())
	m.queriesLeft = 0
	m.reporter = from
}

// Forget drops group k without calling Leave: the owner accepted the
// Join of generation gen but could not carry it out (the port refused
// it). It counts as a failed join; the next report tries again. An entry
// of k of another generation (the group expired, was left and reported
// again meanwhile: its own join is queued behind) is kept.
func (t *Table) Forget(k Key, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m, ok := t.m[k]; ok && m.gen == gen {
		delete(t.m, k)
		t.failed++
	}
}

// Leave records that a member of k left at now: the remaining members,
// if any, are asked to report.
func (t *Table) Leave(k Key, now time.Time) {
	t.mu.Lock()
	m, ok := t.m[k]
	if !ok || m.queriesLeft > 0 {
		t.mu.Unlock()
		return
	}
	if exp := now.Add(t.t.LeaveTime()); exp.Before(m.expires) {
		m.expires = exp
	}
	m.queriesLeft = t.t.LastMemberQueryCount - 1
	m.nextQuery = now.Add(t.t.LastMemberQueryInterval)
	t.mu.Unlock()
	if t.act.Query != nil {
		t.act.Query(k)
	}
}

// Tick expires groups and sends due group-specific queries.
func (t *Table) Tick(now time.Time) {
	var query []Key
	t.mu.Lock()
	for k, m := range t.m {
		switch {
		case !now.Before(m.expires):
			delete(t.m, k)
			if t.act.Leave != nil {
				t.act.Leave(k)
			}
		case m.queriesLeft > 0 && !now.Before(m.nextQuery):
			m.queriesLeft--
			m.nextQuery = now.Add(t.t.LastMemberQueryInterval)
			query = append(query, k)
		}
	}
	t.mu.Unlock()
	for _, k := range query {
		if t.act.Query != nil {
			t.act.Query(k)
		}
	}
}

// NextDeadline returns the earliest time Tick has something to do: a
// group expiring or a group-specific query due; ok is false when no
// group has members.
func (t *Table) NextDeadline() (next time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.m {
		d := m.expires
		if m.queriesLeft > 0 && m.nextQuery.Before(d) {
			d = m.nextQuery
		}
		if !ok || d.Before(next) {
			next, ok = d, true
		}
	}
	return next, ok
}

// Len returns the number of groups with members.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// Overflow returns how many new groups were refused for the bound, and
// how many because the owner's Join failed.
func (t *Table) Overflow() (bound, joinFailed uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.overflow, t.failed
}

// Group is one group's state, for inspection.
type Group struct {
	Key
	// Expires is when the membership ends unless a report refreshes it.
	Expires time.Time
	// Querying: a leave was heard and group-specific queries are being
	// sent (QueriesLeft more) before the group goes.
	QueriesLeft int
	// LastReporter is the source address of the last report.
	LastReporter netip.Addr
}

// Groups returns every group's state.
func (t *Table) Groups() []Group {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Group, 0, len(t.m))
	for k, m := range t.m {
		out = append(out, Group{Key: k, Expires: m.expires, QueriesLeft: m.queriesLeft, LastReporter: m.reporter})
	}
	return out
}
