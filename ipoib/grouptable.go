package ipoib

import (
	"fmt"
	"hash/maphash"
	"maps"
	"sync"
	"sync/atomic"
)

// GroupTable is a port's multicast memberships, full or send-only; the
// fabric backends share it. attach and detach (either may be nil) are
// the backend's own work to receive a group or stop receiving it. They
// run under the table's lock, so they happen once per change.
//
// Full, asked per received multicast packet, takes no lock and allocates
// nothing. The full memberships are groupShards immutable sets, chosen
// by a seeded hash of the MGID so that a guest cannot pile its groups
// into one. Join and Leave replace a shard copy on write: a change
// copies 1/groupShards of the set. It is safe for concurrent use.
type GroupTable struct {
	mu       sync.Mutex // serialises changes
	seed     maphash.Seed
	full     [groupShards]atomic.Pointer[map[GID]struct{}]
	sendOnly map[GID]bool
}

// groupShards is the number of shards of the full memberships.
const groupShards = 256

// NewGroupTable returns an empty table.
func NewGroupTable() *GroupTable {
	t := &GroupTable{seed: maphash.MakeSeed(), sendOnly: make(map[GID]bool)}
	for i := range t.full {
		t.full[i].Store(&map[GID]struct{}{})
	}
	return t
}

// shard is mgid's shard.
func (t *GroupTable) shard(mgid GID) *atomic.Pointer[map[GID]struct{}] {
	return &t.full[maphash.Comparable(t.seed, mgid)%groupShards]
}

// setFull replaces mgid's shard with a copy with mgid in or out.
// Called with mu held.
func (t *GroupTable) setFull(mgid GID, in bool) {
	s := t.shard(mgid)
	m := maps.Clone(*s.Load())
	if in {
		m[mgid] = struct{}{}
	} else {
		delete(m, mgid)
	}
	s.Store(&m)
}

// Join makes the port a full member of mgid, upgrading a send-only
// membership; attach runs when it was not a full member yet.
func (t *GroupTable) Join(mgid GID, attach func() error) error {
	if !mgid.IsMulticast() {
		return fmt.Errorf("ipoib: %s is not an MGID", mgid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.Full(mgid) {
		return nil
	}
	if attach != nil {
		if err := attach(); err != nil {
			return err
		}
	}
	t.setFull(mgid, true)
	delete(t.sendOnly, mgid)
	return nil
}

// JoinSendOnly makes the port a send-only member of mgid unless it is a
// full member.
func (t *GroupTable) JoinSendOnly(mgid GID) error {
	if !mgid.IsMulticast() {
		return fmt.Errorf("ipoib: %s is not an MGID", mgid)
	}
	t.mu.Lock()
	if !t.Full(mgid) {
		t.sendOnly[mgid] = true
	}
	t.mu.Unlock()
	return nil
}

// Leave ends either membership of mgid; detach runs when it was a full
// one.
func (t *GroupTable) Leave(mgid GID, detach func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sendOnly, mgid)
	if !t.Full(mgid) {
		return nil
	}
	t.setFull(mgid, false)
	if detach != nil {
		return detach()
	}
	return nil
}

// Full reports whether the port is a full member of mgid: whether the
// group's traffic may be delivered to it. It takes no lock.
func (t *GroupTable) Full(mgid GID) bool {
	_, ok := (*t.shard(mgid).Load())[mgid]
	return ok
}

// SendOnly reports whether the port is a send-only member of mgid.
func (t *GroupTable) SendOnly(mgid GID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sendOnly[mgid]
}
