package shim

// Multicast groups on the port. Each partition is a full member of its
// broadcast group, all-nodes (ff02::1) and all-hosts (224.0.0.1) for its
// lifetime ("static"); other groups are joined and left as the snooped
// IGMP/MLD memberships of guests come and go. A guest sending to a group
// no local guest listens to makes the port a send-only member, left after
// a membership interval without traffic.

import (
	"fmt"
	"log/slog"
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

// maxGroups bounds the MGIDs one port joins.
const maxGroups = 4096

// groupState is one joined MGID.
type groupState struct {
	static   bool         // joined for the partition's lifetime
	sendOnly bool         // a send-only membership
	lastUsed atomic.Int64 // unix ns of the last send (send-only groups)
}

// groupSet is the set of MGIDs the port has joined. lookup is lock-free
// (a copy-on-write map); changes are rare.
type groupSet struct {
	mu       sync.Mutex
	m        atomic.Pointer[map[ipoib.GID]*groupState]
	overflow atomic.Uint64
}

func (g *groupSet) init() { g.m.Store(&map[ipoib.GID]*groupState{}) }

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

// join makes the port a full member of mgid (upgrading a send-only
// membership).
func (g *groupSet) join(port ipoib.Port, mgid ipoib.GID, static bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	st, ok := g.lookup(mgid)
	if ok && !st.sendOnly {
		st.static = st.static || static
		return nil
	}
	if !ok && len(*g.m.Load()) >= maxGroups {
		g.overflow.Add(1)
		return fmt.Errorf("shim: %d multicast groups joined (max)", maxGroups)
	}
	if err := port.Join(mgid); err != nil {
		return fmt.Errorf("shim: join %s: %w", mgid, err)
	}
	g.edit(func(m map[ipoib.GID]*groupState) { m[mgid] = &groupState{static: static} })
	return nil
}

// joinSendOnly makes the port a send-only member of mgid.
func (g *groupSet) joinSendOnly(port ipoib.Port, mgid ipoib.GID, now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.lookup(mgid); ok {
		return nil
	}
	if len(*g.m.Load()) >= maxGroups {
		g.overflow.Add(1)
		return fmt.Errorf("shim: %d multicast groups joined (max)", maxGroups)
	}
	if err := port.JoinSendOnly(mgid); err != nil {
		return fmt.Errorf("shim: send-only join %s: %w", mgid, err)
	}
	st := &groupState{sendOnly: true}
	st.lastUsed.Store(now.UnixNano())
	g.edit(func(m map[ipoib.GID]*groupState) { m[mgid] = st })
	return nil
}

// leave leaves a non-static group.
func (g *groupSet) leave(port ipoib.Port, mgid ipoib.GID) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	st, ok := g.lookup(mgid)
	if !ok || st.static {
		return nil
	}
	g.edit(func(m map[ipoib.GID]*groupState) { delete(m, mgid) })
	return port.Leave(mgid)
}

// expireSendOnly leaves the send-only groups unused for idle and returns
// them.
func (g *groupSet) expireSendOnly(port ipoib.Port, now time.Time, idle time.Duration) []ipoib.GID {
	var gone []ipoib.GID
	cut := now.Add(-idle).UnixNano()
	for mgid, st := range *g.m.Load() {
		if st.sendOnly && st.lastUsed.Load() <= cut {
			gone = append(gone, mgid)
		}
	}
	for _, mgid := range gone {
		g.leave(port, mgid)
	}
	return gone
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
}

// counts returns the full and send-only memberships.
func (g *groupSet) counts() (full, sendOnly int) {
	for _, st := range *g.m.Load() {
		if st.sendOnly {
			sendOnly++
		} else {
			full++
		}
	}
	return
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
func (s *Shim) mcastJoin(k snoop.Key) {
	p := s.byVLAN[k.Scope]
	mgid := s.groupMGID(p, k.Group)
	if err := s.groups.join(s.port, mgid, false); err != nil {
		s.log.Warn("join group", "group", k.Group, "vlan", k.Scope, "err", err)
		return
	}
	s.ctr.inc(McastJoins)
	s.log.Info("joined group", "group", k.Group, "vlan", p.vlan, "pkey", p.pkey, "mgid", mgid)
}

// mcastLeave is the snooping table's Leave: the last guest left.
func (s *Shim) mcastLeave(k snoop.Key) {
	p := s.byVLAN[k.Scope]
	mgid := s.groupMGID(p, k.Group)
	if err := s.groups.leave(s.port, mgid); err != nil {
		s.log.Warn("leave group", "group", k.Group, "vlan", k.Scope, "err", err)
		return
	}
	s.ctr.inc(McastLeaves)
	s.log.Info("left group", "group", k.Group, "vlan", p.vlan, "pkey", p.pkey, "mgid", mgid)
}

// member records a guest's membership of group (from a report, or the
// solicited-node group of an address it uses).
func (s *Shim) member(p *partition, group netip.Addr, leave bool, now time.Time) {
	k := snoop.Key{Scope: p.vlan, Group: group}
	if leave {
		s.snoop.Leave(k, now)
	} else {
		s.snoop.Report(k, now)
	}
}

// fullMember reports, without locking, whether the port is a full member
// of group's MGID in partition p.
func (s *Shim) fullMember(p *partition, group netip.Addr) bool {
	st, ok := s.groups.lookup(s.groupMGID(p, group))
	return ok && !st.sendOnly
}

// sendTo makes sure the port may send to mgid: a member already, or a
// send-only member from now on.
func (s *Shim) sendTo(mgid ipoib.GID, now time.Time) {
	if st, ok := s.groups.lookup(mgid); ok {
		if n := now.UnixNano(); st.sendOnly && n-st.lastUsed.Load() >= int64(time.Second) {
			st.lastUsed.Store(n)
		}
		return
	}
	if err := s.groups.joinSendOnly(s.port, mgid, now); err != nil {
		s.log.Warn("send-only join", "mgid", mgid, "err", err)
	}
}
