package shim

import (
	"sync/atomic"

	"github.com/eipoib/eipoibd/arpndp"
)

// Counter indexes the shim's counters.
type Counter int

// The shim's counters. Drops are named drop_*; every frame or packet the
// shim does not deliver is counted in exactly one of them.
const (
	TxFrames           Counter = iota // frames read from the TAP
	TxPackets                         // IPoIB packets handed to the port (fragments counted each)
	TxBroadcast                       // of which to the broadcast group
	TxMulticast                       // of which to another MGID
	TxFragmented                      // IPv4 packets fragmented to the IPoIB MTU
	TxICMPTooBig                      // ICMP fragmentation-needed / ICMPv6 packet-too-big sent to guests
	TxQueued                          // frames queued while their destination was resolved
	TxResolveSent                     // ARP/NS sent on a guest's behalf
	TxQueries                         // IGMP/MLD queries sent to guests
	McastJoins                        // groups joined for snooped members
	McastLeaves                       // groups left when their last member went
	RxPackets                         // packets read from the port
	RxFrames                          // frames written to the TAP
	VIFsCreated                       // VIFs created for new source MACs
	VIFsAged                          // VIFs removed as idle
	DropRunt                          // TX frame shorter than its Ethernet header
	DropEtherType                     // ethertype IPoIB does not carry (TX) or unknown (RX)
	DropVLANUnmapped                  // TX frame on a VLAN with no P_Key
	DropBadSrcMAC                     // multicast or zero source MAC
	DropVIFLimit                      // no VIF: --max-vifs reached or QP allocation failed
	DropBadIP                         // IP header inconsistent with the frame
	DropTooBig                        // oversized and neither fragmentable nor answerable
	DropDstLocal                      // unicast to a local guest (the bridge delivers those)
	DropUnresolved                    // destination not resolved in time, or queue full
	DropTxRewrite                     // ARP/NDP/DHCP rewrite refused (see rewrite counters)
	DropRxRewrite                     // same, on receive
	DropRxBadHeader                   // IPoIB header missing or reserved bits set
	DropRxUnknownPKey                 // P_Key with no partition here
	DropRxUnknownVIF                  // unicast to a QPN that is no VIF of that partition
	DropRxMulticast                   // MGID that maps to no Ethernet multicast MAC
	DropRxNeighbour                   // source could not get a REMAC
	DropTAPWrite                      // frames the kernel refused on the TAP
	DropBadMcastReport                // malformed IGMP/MLD report or leave from a guest
	numCounters
)

var counterNames = [numCounters]string{
	TxFrames: "tx_frames", TxPackets: "tx_packets", TxBroadcast: "tx_broadcast", TxMulticast: "tx_multicast",
	TxFragmented: "tx_fragmented", TxICMPTooBig: "tx_icmp_too_big", TxQueued: "tx_queued", TxResolveSent: "tx_resolve_sent",
	TxQueries: "tx_queries", McastJoins: "mcast_joins", McastLeaves: "mcast_leaves", RxPackets: "rx_packets", RxFrames: "rx_frames", VIFsCreated: "vifs_created", VIFsAged: "vifs_aged",
	DropRunt: "drop_runt", DropEtherType: "drop_ethertype", DropVLANUnmapped: "drop_vlan_unmapped",
	DropBadSrcMAC: "drop_bad_src_mac", DropVIFLimit: "drop_vif_limit", DropBadIP: "drop_bad_ip",
	DropTooBig: "drop_too_big", DropDstLocal: "drop_dst_local", DropUnresolved: "drop_unresolved",
	DropTxRewrite: "drop_tx_rewrite", DropRxRewrite: "drop_rx_rewrite", DropRxBadHeader: "drop_rx_bad_header",
	DropRxUnknownPKey: "drop_rx_unknown_pkey", DropRxUnknownVIF: "drop_rx_unknown_vif",
	DropRxMulticast: "drop_rx_multicast", DropRxNeighbour: "drop_rx_neighbour", DropTAPWrite: "drop_tap_write",
	DropBadMcastReport: "drop_bad_mcast_report",
}

// String returns the counter's metric name.
func (c Counter) String() string { return counterNames[c] }

type counters struct {
	c         [numCounters]atomic.Uint64
	txRewrite arpndp.Counters
	rxRewrite arpndp.Counters
}

func (c *counters) inc(k Counter) { c.c[k].Add(1) }

// Get returns one counter.
func (s *Shim) Get(k Counter) uint64 { return s.ctr.c[k].Load() }

// Counters returns every counter by name: the shim's own, the rewrite
// rejections as tx_rewrite_<reason>/rx_rewrite_<reason>, the table sizes
// and counters, and the port's (port_*).
func (s *Shim) Counters() map[string]uint64 {
	m := make(map[string]uint64, int(numCounters)+32)
	for i := range s.ctr.c {
		m[counterNames[i]] = s.ctr.c[i].Load()
	}
	for k, v := range s.ctr.txRewrite.Snapshot() {
		m["tx_rewrite_"+k] = v
	}
	for k, v := range s.ctr.rxRewrite.Snapshot() {
		m["rx_rewrite_"+k] = v
	}
	full, sendOnly := s.groups.counts()
	m["groups"] = uint64(full)
	m["groups_send_only"] = uint64(sendOnly)
	m["snooped_groups"] = uint64(len(s.snoop.Groups()))
	m["snooped_groups_overflow"] = s.snoop.Overflow()
	m["groups_overflow"] = s.groups.overflow.Load()
	m["pending"] = uint64(s.pending.count.Load())
	vc := s.vifs.Counters()
	m["vifs"] = uint64(s.vifs.Len())
	m["vifs_overflow"] = vc.Overflow
	nc := s.neigh.Counters()
	m["neighbours"] = uint64(s.neigh.Len())
	m["neighbours_learned"] = nc.Learned
	m["neighbours_aged"] = nc.Aged
	m["neighbours_evicted"] = nc.Evicted
	m["neighbours_collisions"] = nc.Collisions
	m["neighbours_unresolved"] = nc.Unresolved
	pc := s.port.Counters()
	m["port_tx_packets"] = pc.TxPackets
	m["port_tx_bytes"] = pc.TxBytes
	m["port_rx_packets"] = pc.RxPackets
	m["port_rx_bytes"] = pc.RxBytes
	for k, v := range pc.Drops {
		m["port_drop_"+k] = v
	}
	return m
}
