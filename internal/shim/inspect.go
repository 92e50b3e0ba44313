package shim

// Inspection for the control socket: snapshots of the tables, taken off
// the data path (each walks a table once, allocating its result).

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// PortInfo describes the IB port and the partitions.
type PortInfo struct {
	GID        ipoib.GID
	IBMTU      int
	IPoIBMTU   int
	Up         bool                  // the carrier the TAP shows
	Partitions map[uint16]ipoib.PKey // VLAN → P_Key, untagged (0) included
	// PartitionMTUs are the partitions' IPoIB MTUs by VLAN (IPoIBMTU is
	// the largest).
	PartitionMTUs map[uint16]int
}

// Port describes the IB port.
func (s *Shim) Port() PortInfo {
	pi := PortInfo{GID: s.port.LocalGID(), IBMTU: s.port.MTU(), IPoIBMTU: s.ipMTU, Up: s.carrier.Load(), Partitions: map[uint16]ipoib.PKey{}, PartitionMTUs: map[uint16]int{}}
	for _, p := range s.partitions() {
		pi.Partitions[p.vlan] = p.pkey
		pi.PartitionMTUs[p.vlan] = p.mtu()
	}
	return pi
}

// VIFInfo is one VIF as the CLI shows it.
type VIFInfo struct {
	MAC    ether.MAC
	VLAN   uint16
	PKey   ipoib.PKey
	QPN    uint32
	Addr   ipoib.HwAddr // the LIMAC, the guest's 20-byte address
	Origin mactrans.Origin
	Idle   time.Duration
	mactrans.VIFStats
}

// VIFs returns every ready VIF, by VLAN and MAC (pending ones are counted
// in Counters as vifs_pending).
func (s *Shim) VIFs() []VIFInfo {
	now := s.clk.Now()
	var out []VIFInfo
	for _, v := range s.vifs.All() {
		if !v.Ready() { // its held frames are being sent: still pending (vifs_pending)
			continue
		}
		out = append(out, VIFInfo{MAC: v.Key.MAC, VLAN: v.Key.VLAN, PKey: v.PKey, QPN: v.QPN, Addr: v.LIMAC,
			Origin: v.Origin(), Idle: max(0, now.Sub(v.LastUsed())), VIFStats: v.Stats()})
	}
	slices.SortFunc(out, func(a, b VIFInfo) int {
		if a.VLAN != b.VLAN {
			return int(a.VLAN) - int(b.VLAN)
		}
		return strings.Compare(a.MAC.String(), b.MAC.String())
	})
	return out
}

// NeighInfo is one remote endpoint as the CLI shows it.
type NeighInfo struct {
	REMAC ether.MAC
	RIMAC ipoib.HwAddr
	PKey  ipoib.PKey
	// IPs are the addresses its ARP and NDP packets spoke for.
	IPs []netip.Addr
	Age time.Duration // since it was last seen
}

// Neighbours returns every remote endpoint, by partition and REMAC.
func (s *Shim) Neighbours() []NeighInfo {
	now := s.clk.Now()
	ips := map[srcKey]ether.MAC{}
	s.srcs.mu.RLock()
	for k, mac := range s.srcs.m {
		ips[k] = mac
	}
	s.srcs.mu.RUnlock()
	byMAC := map[[2]uint64]*NeighInfo{}
	var out []NeighInfo
	for _, n := range s.neigh.All() {
		out = append(out, NeighInfo{REMAC: n.REMAC, RIMAC: n.RIMAC, PKey: n.PKey, Age: max(0, now.Sub(n.LastSeen()))})
	}
	for i := range out {
		byMAC[neighKey(out[i].PKey, out[i].REMAC)] = &out[i]
	}
	for k, mac := range ips {
		if n := byMAC[neighKey(k.pkey, mac)]; n != nil {
			n.IPs = append(n.IPs, k.ip)
		}
	}
	for i := range out {
		slices.SortFunc(out[i].IPs, func(a, b netip.Addr) int { return a.Compare(b) })
	}
	slices.SortFunc(out, func(a, b NeighInfo) int {
		if a.PKey != b.PKey {
			return int(a.PKey) - int(b.PKey)
		}
		return strings.Compare(a.REMAC.String(), b.REMAC.String())
	})
	return out
}

func neighKey(pkey ipoib.PKey, mac ether.MAC) [2]uint64 {
	var m uint64
	for _, b := range mac {
		m = m<<8 | uint64(b)
	}
	return [2]uint64{uint64(pkey.Full()), m}
}

// FlushNeighbours forgets every remote endpoint and the IPs learned of
// them; traffic re-learns them. It returns how many went.
func (s *Shim) FlushNeighbours() int {
	n := s.neigh.Flush()
	s.srcs.mu.Lock()
	clear(s.srcs.m)
	s.srcs.mu.Unlock()
	return n
}

// GroupInfo is one multicast group the port is a member of.
type GroupInfo struct {
	MGID     ipoib.GID
	SendOnly bool
	// Groups are the snooped guest groups (VLAN and address) mapped to
	// the MGID, with their state; empty for the partitions' broadcast
	// and all-nodes groups and for send-only groups.
	Groups []SnoopedGroup
}

// SnoopedGroup is a guest group the snooping table holds.
type SnoopedGroup struct {
	VLAN    uint16
	Group   netip.Addr
	Expires time.Duration // until the membership ends without a report
	// Querying: a guest left and the shim, the querier, is sending
	// group-specific queries (QueriesLeft more) before the group goes.
	QueriesLeft int
	// LastReporter is the guest address the last report came from.
	LastReporter netip.Addr
}

// Groups returns the port's multicast memberships, by MGID.
func (s *Shim) Groups() []GroupInfo {
	now := s.clk.Now()
	m := *s.groups.set.m.Load()
	byMGID := make(map[ipoib.GID]*GroupInfo, len(m))
	out := make([]GroupInfo, 0, len(m))
	for mgid, st := range m {
		out = append(out, GroupInfo{MGID: mgid, SendOnly: st.sendOnly})
	}
	for i := range out {
		byMGID[out[i].MGID] = &out[i]
	}
	for _, g := range s.groups.snoop.Groups() {
		p := s.byVLAN[g.VLAN].Load()
		if p == nil {
			continue
		}
		if gi := byMGID[s.groups.mgid(p, g.Group)]; gi != nil {
			gi.Groups = append(gi.Groups, SnoopedGroup{VLAN: g.VLAN, Group: g.Group, Expires: max(0, g.Expires.Sub(now)), QueriesLeft: g.QueriesLeft, LastReporter: g.LastReporter})
		}
	}
	slices.SortFunc(out, func(a, b GroupInfo) int { return a.MGID.Addr().Compare(b.MGID.Addr()) })
	return out
}
