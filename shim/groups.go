package shim

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/eipoib/eipoibd/ipoib"
)

var allNodes = netip.MustParseAddr("ff02::1")

// maxGroups bounds the MGIDs one port joins.
const maxGroups = 4096

// groupSet is the set of MGIDs the port has joined. has is lock-free
// (copy-on-write map); joins are rare.
type groupSet struct {
	mu       sync.Mutex
	m        atomic.Pointer[map[ipoib.GID]struct{}]
	overflow atomic.Uint64
}

func (g *groupSet) init() { g.m.Store(&map[ipoib.GID]struct{}{}) }

func (g *groupSet) has(mgid ipoib.GID) bool {
	_, ok := (*g.m.Load())[mgid]
	return ok
}

// join joins mgid on port once.
func (g *groupSet) join(port ipoib.Port, mgid ipoib.GID) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.m.Load()
	if _, ok := old[mgid]; ok {
		return nil
	}
	if len(old) >= maxGroups {
		g.overflow.Add(1)
		return fmt.Errorf("shim: %d multicast groups joined (max)", maxGroups)
	}
	if err := port.Join(mgid); err != nil {
		return fmt.Errorf("shim: join %s: %w", mgid, err)
	}
	m := make(map[ipoib.GID]struct{}, len(old)+1)
	for k := range old {
		m[k] = struct{}{}
	}
	m[mgid] = struct{}{}
	g.m.Store(&m)
	return nil
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
	g.m.Store(&map[ipoib.GID]struct{}{})
}

// list returns the joined MGIDs.
func (g *groupSet) list() []ipoib.GID {
	m := *g.m.Load()
	out := make([]ipoib.GID, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Groups returns the MGIDs the shim has joined.
func (s *Shim) Groups() []ipoib.GID { return s.groups.list() }

// solicitedNode returns ff02::1:ffXX:XXXX for a unicast IPv6 address
// (RFC 4291 §2.7.1).
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// joinSolicited joins the solicited-node group of a guest's IPv6 address
// so that neighbour solicitations for it arrive: until full IGMP/MLD
// snooping, this is how NDP gets its groups. Cheap when already joined.
func (s *Shim) joinSolicited(p *partition, a netip.Addr) {
	if !a.Is6() || a.IsUnspecified() || a.IsMulticast() {
		return
	}
	s.joinGroup(p, solicitedNode(a))
}

// solicitedPrefix is ff02::1:ff00:0/104 (RFC 4291 §2.7.1).
var solicitedPrefix = netip.MustParsePrefix("ff02::1:ff00:0/104")

// joinGroup joins the MGID of an IPv6 group in partition p.
func (s *Shim) joinGroup(p *partition, group netip.Addr) {
	mgid := ipoib.IPv6MGID(group, p.pkey, s.cfg.Scope)
	if s.groups.has(mgid) {
		return
	}
	if err := s.groups.join(s.port, mgid); err != nil {
		s.log.Warn("join group", "group", group, "err", err)
		return
	}
	s.log.Info("joined group", "group", group, "mgid", mgid, "pkey", p.pkey)
}
