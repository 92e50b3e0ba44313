package snoop

import (
	"errors"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/clock"
)

var host1, host2 = netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")

type recorder struct {
	joins, leaves, queries []Key
	gens                   []uint64 // the generations Join was given
}

func (r *recorder) actions() Actions {
	return Actions{
		Join:  func(k Key, gen uint64) error { r.joins = append(r.joins, k); r.gens = append(r.gens, gen); return nil },
		Leave: func(k Key) { r.leaves = append(r.leaves, k) },
		Query: func(k Key) { r.queries = append(r.queries, k) },
	}
}

func TestTimersDefaults(t *testing.T) {
	tm := Timers{}.WithDefaults()
	if tm.MembershipInterval() != 260*time.Second || tm.LeaveTime() != 2*time.Second || tm.Validate() != nil {
		t.Fatalf("RFC 3376 §8 defaults: MI %s, leave %s, %v", tm.MembershipInterval(), tm.LeaveTime(), tm.Validate())
	}
	for _, bad := range []Timers{{Robustness: 9}, {QueryInterval: 5 * time.Second, QueryResponseInterval: 10 * time.Second}, {LastMemberQueryInterval: time.Millisecond}} {
		if bad.WithDefaults().Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestSetTimers: new timers apply to reports from then on, a group keeps
// the expiry it had, and invalid timers change nothing.
func TestSetTimers(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e6, 0))
	var r recorder
	tbl := NewTable(Timers{}, 10, r.actions())
	g1, g2 := Key{0, netip.MustParseAddr("239.1.1.1")}, Key{0, netip.MustParseAddr("239.1.1.2")}
	tbl.Report(g1, host1, clk.Now()) // expires after 260 s
	if err := tbl.SetTimers(Timers{QueryInterval: 20 * time.Second, QueryResponseInterval: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if mi := tbl.Timers().MembershipInterval(); mi != 45*time.Second {
		t.Fatalf("membership interval %s after the change, want 2 × 20 s + 5 s", mi)
	}
	tbl.Report(g2, host1, clk.Now()) // expires after 45 s
	clk.Advance(45 * time.Second)
	tbl.Tick(clk.Now())
	if len(r.leaves) != 1 || r.leaves[0] != g2 {
		t.Fatalf("left %v 45 s on, want %v only", r.leaves, g2)
	}
	if err := tbl.SetTimers(Timers{Robustness: 9}); err == nil || tbl.Timers().QueryInterval != 20*time.Second {
		t.Fatalf("invalid timers: %v, query interval now %s", err, tbl.Timers().QueryInterval)
	}
}

func TestTableLifecycle(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e6, 0))
	var r recorder
	tbl := NewTable(Timers{}, 10, r.actions())
	g := Key{0, netip.MustParseAddr("239.1.1.1")}
	tbl.Report(g, host1, clk.Now())
	tbl.Report(g, host2, clk.Now()) // a second member: no second join
	if len(r.joins) != 1 {
		t.Fatalf("joins %v", r.joins)
	}
	if gs := tbl.Groups(); len(gs) != 1 || gs[0].LastReporter != host2 {
		t.Fatalf("groups %+v, want one with last reporter %s", gs, host2)
	}
	// Refreshed by reports, the group outlives the membership interval.
	for i := 0; i < 5; i++ {
		clk.Advance(125 * time.Second)
		tbl.Report(g, host1, clk.Now())
		tbl.Tick(clk.Now())
	}
	if len(r.leaves) != 0 {
		t.Fatal("refreshed group left")
	}
	// A leave: a group-specific query at once and one more a second later;
	// a report in between keeps the group.
	tbl.Leave(g, clk.Now())
	if len(r.queries) != 1 {
		t.Fatalf("queries %v", r.queries)
	}
	clk.Advance(500 * time.Millisecond)
	tbl.Report(g, host1, clk.Now())
	clk.Advance(3 * time.Second)
	tbl.Tick(clk.Now())
	if len(r.leaves) != 0 || len(r.queries) != 1 {
		t.Fatalf("answered leave: leaves %v queries %v", r.leaves, r.queries)
	}
	// A leave nobody answers: the second query, then gone after the leave time.
	tbl.Leave(g, clk.Now())
	if d, ok := tbl.NextDeadline(); !ok || !d.Equal(clk.Now().Add(time.Second)) {
		t.Fatalf("next deadline %v %v, want the second query 1 s on", d, ok)
	}
	clk.Advance(time.Second)
	tbl.Tick(clk.Now())
	if len(r.queries) != 3 || len(r.leaves) != 0 {
		t.Fatalf("queries %v leaves %v", r.queries, r.leaves)
	}
	clk.Advance(time.Second)
	tbl.Tick(clk.Now())
	if len(r.leaves) != 1 || r.leaves[0] != g || tbl.Len() != 0 {
		t.Fatalf("leaves %v groups %d", r.leaves, tbl.Len())
	}
	if _, ok := tbl.NextDeadline(); ok {
		t.Fatal("deadline with no groups")
	}
	// Silent members expire after the membership interval.
	tbl.Report(g, host1, clk.Now())
	clk.Advance(259 * time.Second)
	tbl.Tick(clk.Now())
	if len(r.leaves) != 1 {
		t.Fatal("expired early")
	}
	clk.Advance(time.Second)
	tbl.Tick(clk.Now())
	if len(r.leaves) != 2 {
		t.Fatal("not expired after the membership interval")
	}
	// Leaves of unknown groups do nothing.
	tbl.Leave(Key{0, netip.MustParseAddr("ff15::1")}, clk.Now())
	if len(r.queries) != 3 {
		t.Fatal("query for an unknown group")
	}
}

func TestTableVLANsAndBound(t *testing.T) {
	var r recorder
	tbl := NewTable(Timers{}, 2, r.actions())
	now := time.Unix(1e6, 0)
	g := netip.MustParseAddr("ff15::1234")
	tbl.Report(Key{10, g}, host1, now)
	tbl.Report(Key{20, g}, host1, now) // same group, other partition: its own state
	tbl.Report(Key{30, g}, host1, now) // over the bound
	if bound, _ := tbl.Overflow(); len(r.joins) != 2 || bound != 1 || tbl.Len() != 2 {
		t.Fatalf("joins %v overflow %d len %d", r.joins, bound, tbl.Len())
	}
}

// TestTableFailedJoin: a group whose Join fails is not recorded, so the
// next report tries again instead of the table claiming a membership the
// port does not have.
func TestTableFailedJoin(t *testing.T) {
	fail := true
	var joins int
	tbl := NewTable(Timers{}, 10, Actions{Join: func(Key, uint64) error {
		joins++
		if fail {
			return errors.New("no room")
		}
		return nil
	}})
	k := Key{0, netip.MustParseAddr("239.1.1.1")}
	now := time.Unix(1e6, 0)
	tbl.Report(k, host1, now)
	if _, failed := tbl.Overflow(); tbl.Len() != 0 || failed != 1 {
		t.Fatalf("after a failed join: %d groups, %d failed", tbl.Len(), failed)
	}
	fail = false
	tbl.Report(k, host1, now)
	if tbl.Len() != 1 || joins != 2 {
		t.Fatalf("after a successful join: %d groups, %d join calls", tbl.Len(), joins)
	}
}

// joinedOne returns a table with group k reported (and joined) at now.
func joinedOne() (*recorder, *Table, Key, time.Time) {
	r := &recorder{}
	tbl := NewTable(Timers{}, 10, r.actions())
	k := Key{0, netip.MustParseAddr("239.1.1.1")}
	now := time.Unix(1e6, 0)
	tbl.Report(k, host1, now)
	return r, tbl, k, now
}

// TestTableForget: a group whose accepted join the owner could not carry
// out is dropped without a Leave, counted as a failed join, and the next
// report joins it again.
func TestTableForget(t *testing.T) {
	r, tbl, k, now := joinedOne()
	tbl.Forget(k, r.gens[0])
	tbl.Forget(k, r.gens[0]) // a group not there: nothing
	if _, failed := tbl.Overflow(); tbl.Len() != 0 || failed != 1 || len(r.leaves) != 0 {
		t.Fatalf("after Forget: %d groups, %d failed, leaves %v", tbl.Len(), failed, r.leaves)
	}
	tbl.Report(k, host1, now)
	if tbl.Len() != 1 || len(r.joins) != 2 {
		t.Fatalf("after a new report: %d groups, joins %v", tbl.Len(), r.joins)
	}
}

// TestTableForgetOtherGeneration: the owner's Forget of a join it could
// not carry out drops only the entry that join was for. Join 1 is
// queued, the group expires (Leave queued) and is reported again (Join 2
// queued). Join 1 fails, and its Forget must keep join 2's entry, whose
// join then succeeds. Else the port would stay in a group the table no
// longer knows, and no Leave would ever release it.
func TestTableForgetOtherGeneration(t *testing.T) {
	r, tbl, k, now := joinedOne()
	now = now.Add(tbl.Timers().MembershipInterval())
	tbl.Tick(now) // expired: Leave
	tbl.Report(k, host1, now)
	if len(r.gens) != 2 || r.gens[0] == r.gens[1] || len(r.leaves) != 1 {
		t.Fatalf("joins %v of generations %v, leaves %v; want two joins of different generations and one leave", r.joins, r.gens, r.leaves)
	}
	tbl.Forget(k, r.gens[0]) // join 1 failed
	if _, failed := tbl.Overflow(); tbl.Len() != 1 || failed != 0 {
		t.Fatalf("after the Forget of join 1: %d groups, %d failed; want join 2's entry kept", tbl.Len(), failed)
	}
	tbl.Tick(now.Add(tbl.Timers().MembershipInterval()))
	if len(r.leaves) != 2 {
		t.Fatalf("join 2's entry expired with leaves %v; want a second Leave releasing it", r.leaves)
	}
}

// TestTableJoinLeaveOrder: with reports and expiries racing, the owner's
// view (joined by Join, unjoined by Leave) always ends equal to the
// table's. When the actions ran outside the lock, a Tick's Leave could
// land after a concurrent Report's Join, leaving the owner unjoined while
// the table said joined.
func TestTableJoinLeaveOrder(t *testing.T) {
	k := Key{0, netip.MustParseAddr("239.1.1.1")}
	var joined atomic.Int32 // the owner's state, changed only by the actions
	act := Actions{
		Join: func(Key, uint64) error {
			if !joined.CompareAndSwap(0, 1) {
				return errors.New("join of a joined group")
			}
			return nil
		},
		Leave: func(Key) {
			runtime.Gosched() // widen the window a late leave needs
			joined.Store(0)
		},
	}
	tm := Timers{QueryInterval: 2 * time.Second, QueryResponseInterval: time.Second}
	tbl := NewTable(tm, 10, act)
	base := time.Unix(1e6, 0)
	for i := 0; i < 2000; i++ {
		now := base.Add(time.Duration(i) * time.Hour) // every Tick expires the group
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); tbl.Tick(now) }()
		go func() { defer wg.Done(); tbl.Report(k, host1, now) }()
		wg.Wait()
		if got, want := joined.Load() == 1, tbl.Len() == 1; got != want {
			t.Fatalf("round %d: owner joined %v, table has the group %v", i, got, want)
		}
	}
}
