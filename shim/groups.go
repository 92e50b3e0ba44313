package shim

// Multicast groups on the port. Each partition is a full member of its
// broadcast group, all-nodes (ff02::1) and all-hosts (224.0.0.1) for its
// lifetime ("static"); other groups are joined and left as the snooped
// IGMP/MLD memberships of guests come and go. A guest sending to a group
// no local guest listens to makes the port a send-only member, left after
// a membership interval without traffic.

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/snoop"
)

var (
	allNodes = netip.MustParseAddr("ff02::1")
	allHosts = netip.MustParseAddr("224.0.0.1")
)

// Bounds on the MGIDs one port joins. Send-only memberships have their
// own, smaller bound and the least recently used one makes room for a new
// one; a full membership needing room evicts send-only ones too, so a
// guest sending to thousands of groups can never keep other guests from
// joining theirs.
const (
	maxGroups   = 4096 // full and send-only together
	maxSendOnly = 256  // of which send-only
)

// groupState is one joined MGID. sendOnly never changes: an upgrade to a
// full membership replaces the state.
type groupState struct {
	sendOnly bool
	refs     int          // full memberships using the MGID (static ones never released); under groupSet.mu
	lastUsed atomic.Int64 // unix ns of the last send (send-only groups)
}

// groupSet is the set of MGIDs the port has joined. Full memberships are
// reference-counted: several snooped groups can map to one MGID (IPv6
// groups that differ only in scope or flags share the low 80 bits), and
// the MGID is left when the last one goes. lookup is lock-free (a
// copy-on-write map); changes are serialised by mu, which is held across
// the port call so that the port and the set never disagree.
type groupSet struct {
	mu          sync.Mutex
	m           atomic.Pointer[map[ipoib.GID]*groupState]
	max, maxSO  int
	sendOnlyLen int // under mu
	overflow    atomic.Uint64
	evicted     atomic.Uint64 // send-only memberships evicted for room
}

func (g *groupSet) init(max, maxSendOnly int) {
	g.max, g.maxSO = max, maxSendOnly
	g.m.Store(&map[ipoib.GID]*groupState{})
}

func (g *groupSet) lookup(mgid ipoib.GID) (*groupState, bool) {
	st, ok := (*g.m.Load())[mgid]
	return st, ok
}

// edit replaces the map with an edited copy; call with mu held.
func (g *groupSet) edit(fn func(m map[ipoib.GID]*groupState)) {
	old := *g.m.Load()
	m := make(map[ipoib.GID]*groupState, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	fn(m)
	g.m.Store(&m)
}

// errGroupsFull is returned when no room can be made for a membership.
var errGroupsFull = errors.New("shim: multicast group table full")

// makeRoom evicts least recently used send-only memberships until a new
// membership fits: under the total bound, and for a send-only one under
// the send-only bound too. Call with mu held.
func (g *groupSet) makeRoom(port ipoib.Port, sendOnly bool) error {
	m := *g.m.Load()
	need := len(m) - g.max + 1 // entries to evict for the total bound
	if sendOnly {
		need = max(need, g.sendOnlyLen-g.maxSO+1)
	}
	if need <= 0 {
		return nil
	}
	if need > g.sendOnlyLen {
		g.overflow.Add(1)
		return fmt.Errorf("%w: %d groups, %d of them full memberships", errGroupsFull, len(m), len(m)-g.sendOnlyLen)
	}
	for ; need > 0; need-- {
		var lru ipoib.GID
		oldest := int64(math.MaxInt64)
		for mgid, st := range *g.m.Load() {
			if st.sendOnly && st.lastUsed.Load() < oldest {
				lru, oldest = mgid, st.lastUsed.Load()
			}
		}
		if err := g.remove(port, lru); err != nil {
			return err
		}
		g.evicted.Add(1)
	}
	return nil
}

// remove leaves mgid on the port and forgets it; call with mu held.
func (g *groupSet) remove(port ipoib.Port, mgid ipoib.GID) error {
	st, ok := g.lookup(mgid)
	if !ok {
		return nil
	}
	if st.sendOnly {
		g.sendOnlyLen--
	}
	g.edit(func(m map[ipoib.GID]*groupState) { delete(m, mgid) })
	if err := port.Leave(mgid); err != nil {
		return fmt.Errorf("shim: leave %s: %w", mgid, err)
	}
	return nil
}

// join adds a full membership of mgid (upgrading a send-only one); a
// static one is never released.
func (g *groupSet) join(port ipoib.Port, mgid ipoib.GID, static bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	refs := 1
	if static {
		refs = math.MaxInt32 // never released
	}
	st, ok := g.lookup(mgid)
	switch {
	case ok && !st.sendOnly:
		st.refs = min(st.refs+refs, math.MaxInt32)
		return nil
	case !ok:
		if err := g.makeRoom(port, false); err != nil {
			return err
		}
	}
	if err := port.Join(mgid); err != nil {
		return fmt.Errorf("shim: join %s: %w", mgid, err)
	}
	if ok {
		g.sendOnlyLen--
	}
	g.edit(func(m map[ipoib.GID]*groupState) { m[mgid] = &groupState{refs: refs} })
	return nil
}

// joinSendOnly makes the port a send-only member of mgid, unless it is a
// member already.
func (g *groupSet) joinSendOnly(port ipoib.Port, mgid ipoib.GID, now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.lookup(mgid); ok {
		return nil
	}
	if err := g.makeRoom(port, true); err != nil {
		return err
	}
	if err := port.JoinSendOnly(mgid); err != nil {
		return fmt.Errorf("shim: send-only join %s: %w", mgid, err)
	}
	st := &groupState{sendOnly: true}
	st.lastUsed.Store(now.UnixNano())
	g.sendOnlyLen++
	g.edit(func(m map[ipoib.GID]*groupState) { m[mgid] = st })
	return nil
}

// leave releases one full membership of mgid, leaving the MGID with the
// last.
func (g *groupSet) leave(port ipoib.Port, mgid ipoib.GID) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	st, ok := g.lookup(mgid)
	if !ok || st.sendOnly {
		return nil
	}
	if st.refs--; st.refs > 0 {
		return nil
	}
	return g.remove(port, mgid)
}

// expireSendOnly leaves the send-only groups unused for idle and returns
// how many. Each is checked under the lock, so a group that became a full
// membership meanwhile is kept.
func (g *groupSet) expireSendOnly(port ipoib.Port, now time.Time, idle time.Duration) (int, error) {
	cut := now.Add(-idle).UnixNano()
	if !g.anyIdle(cut) {
		return 0, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	var first error
	for mgid, st := range *g.m.Load() {
		if st.sendOnly && st.lastUsed.Load() <= cut {
			if err := g.remove(port, mgid); err != nil && first == nil {
				first = err
			}
			n++
		}
	}
	return n, first
}

// anyIdle reports, without locking, whether a send-only group was unused
// since cut.
func (g *groupSet) anyIdle(cut int64) bool {
	for _, st := range *g.m.Load() {
		if st.sendOnly && st.lastUsed.Load() <= cut {
			return true
		}
	}
	return false
}

// leaveAll leaves every group.
func (g *groupSet) leaveAll(port ipoib.Port, log *slog.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for mgid := range *g.m.Load() {
		if err := port.Leave(mgid); err != nil {
			log.Warn("leave group", "mgid", mgid, "err", err)
		}
	}
	g.m.Store(&map[ipoib.GID]*groupState{})
	g.sendOnlyLen = 0
}

// counts returns the full and send-only memberships.
func (g *groupSet) counts() (full, sendOnly int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(*g.m.Load()) - g.sendOnlyLen, g.sendOnlyLen
}

// solicitedNode returns ff02::1:ffXX:XXXX for a unicast IPv6 address
// (RFC 4291 §2.7.1).
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// groupMGID maps a snooped group of partition p to its MGID.
func (s *Shim) groupMGID(p *partition, group netip.Addr) ipoib.GID {
	if group.Is4() {
		return ipoib.IPv4MGID(group, p.pkey, s.cfg.Scope)
	}
	return ipoib.IPv6MGID(group, p.pkey, s.cfg.Scope)
}

// mcastJoin is the snooping table's Join: the first guest of a group.
func (s *Shim) mcastJoin(k snoop.Key) error {
	p := s.byVLAN[k.VLAN].Load()
	mgid := s.groupMGID(p, k.Group)
	if err := s.groups.join(s.port, mgid, false); err != nil {
		if s.groupWarn.Allow(s.clk.Now()) {
			s.log.Warn("join of a snooped group refused", "group", k.Group, "vlan", k.VLAN, "err", err, "suppressed", s.groupWarn.Suppressed())
		}
		return err
	}
	s.ctr.inc(McastJoins)
	s.log.Debug("joined group", "group", k.Group, "vlan", p.vlan, "pkey", p.pkey, "mgid", mgid)
	return nil
}

// mcastLeave is the snooping table's Leave: the last guest left.
func (s *Shim) mcastLeave(k snoop.Key) {
	p := s.byVLAN[k.VLAN].Load()
	mgid := s.groupMGID(p, k.Group)
	if err := s.groups.leave(s.port, mgid); err != nil {
		s.log.Warn("leave group", "group", k.Group, "vlan", k.VLAN, "err", err)
		return
	}
	s.ctr.inc(McastLeaves)
	s.log.Debug("left group", "group", k.Group, "vlan", p.vlan, "pkey", p.pkey, "mgid", mgid)
}

// member records a guest's membership of group (from a report, or the
// solicited-node group of an address it uses), shown by a packet from
// the address from.
func (s *Shim) member(p *partition, group, from netip.Addr, leave bool, now time.Time) {
	k := snoop.Key{VLAN: p.vlan, Group: group}
	if leave {
		s.snoop.Leave(k, now)
	} else {
		s.snoop.Report(k, from, now)
	}
}

// fullMember reports, without locking, whether the port is a full member
// of group's MGID in partition p.
func (s *Shim) fullMember(p *partition, group netip.Addr) bool {
	st, ok := s.groups.lookup(s.groupMGID(p, group))
	return ok && !st.sendOnly
}

// sendTo makes sure the port may send to mgid: a member already, or a
// send-only member from now on. It reports false when the port cannot be
// a member (the frame is then dropped: a UD QP may only send to a group
// it joined).
func (s *Shim) sendTo(mgid ipoib.GID, now time.Time) bool {
	if st, ok := s.groups.lookup(mgid); ok {
		if n := now.UnixNano(); st.sendOnly && n-st.lastUsed.Load() >= int64(time.Second) {
			st.lastUsed.Store(n)
		}
		return true
	}
	if err := s.groups.joinSendOnly(s.port, mgid, now); err != nil {
		if s.groupWarn.Allow(now) {
			s.log.Warn("send-only join refused", "mgid", mgid, "err", err, "suppressed", s.groupWarn.Suppressed())
		}
		return false
	}
	return true
}
