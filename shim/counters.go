package shim

import (
	"sync/atomic"

	"github.com/eipoib/eipoibd/arpndp"
)

// Counter indexes the shim's counters.
type Counter int

// The shim's counters. Drops are named drop_*. Every frame read from the
// TAP ends in exactly one of tx_forwarded, tx_fragmented, tx_icmp_too_big,
// tx_moved_local or a TX drop (while it waits for a resolution, a new
// guest's VIF or a group's join it is held: pending_frames, vifs_pending);
// every packet read from the port ends in exactly one of rx_frames or an
// RX drop.
const (
	TxFrames            Counter = iota // frames read from the TAP
	TxBytes                            // their bytes (Ethernet header included)
	TxForwarded                        // frames sent on as one IPoIB packet (at once or after a resolution)
	TxPackets                          // IPoIB packets the port accepted (fragments and resolutions included; a super-frame once)
	TxPortRefused                      // packets the port refused or lost (see its port_drop_* counters)
	TxBroadcast                        // of tx_forwarded, those to the broadcast group
	TxMulticast                        // of tx_forwarded, those to another MGID
	TxSuper                            // of tx_forwarded, TCP super-frames the port took whole to cut itself
	TxSuperSegments                    // the segments the port is to cut them into
	TxMSSClamped                       // guests' TCP SYNs whose MSS was lowered to fit the IPoIB MTU (--clamp-mss)
	TxFragmented                       // IPv4 packets fragmented to the IPoIB MTU
	TxFragments                        // fragments made of them
	TxICMPTooBig                       // ICMP fragmentation-needed / ICMPv6 packet-too-big sent to guests
	TxQueued                           // frames queued while their destination was resolved
	TxResolveSent                      // ARP/NS sent on a guest's behalf
	TxQueries                          // IGMP/MLD queries sent to guests
	McastJoins                         // groups joined for snooped members
	McastLeaves                        // groups left when their last member went
	RxPackets                          // packets read from the port
	RxFrames                           // received packets written to the TAP as frames
	RxBytes                            // their bytes (Ethernet header included)
	VIFsCreated                        // VIFs created for new source MACs
	VIFsAged                           // VIFs removed as idle
	VIFsRemoved                        // VIFs removed when the bridge forgot their MAC
	DropRunt                           // TX frame shorter than its Ethernet header
	DropEtherType                      // TX: ethertype IPoIB does not carry
	DropVLANUnmapped                   // TX frame on a VLAN with no P_Key
	DropBadSrcMAC                      // multicast or zero source MAC
	DropVIFLimit                       // no VIF: --max-vifs reached (a new guest refused for it)
	DropUndeclared                     // --learn declared: a source MAC never declared (bridge static entry or DeclareVIF)
	DropBadIP                          // IP header inconsistent with the frame
	DropTooBig                         // oversized and neither fragmentable nor answerable
	DropDstLocal                       // unicast to a local guest (the bridge delivers those)
	DropUnresolved                     // destination not resolved in time, or queue full
	DropVIFGone                        // queued for a resolution while the guest's VIF aged out
	DropTxRewrite                      // ARP/NDP/DHCP rewrite refused (see rewrite counters)
	DropRxRewrite                      // same, on receive
	DropRxBadHeader                    // IPoIB header missing or reserved bits set
	DropRxEtherType                    // RX: ethertype other than IPv4, IPv6, ARP, RARP
	DropRxUnknownPKey                  // P_Key with no partition here
	DropRxUnknownVIF                   // unicast to a QPN that is no VIF of that partition
	DropRxMulticast                    // MGID that maps to no Ethernet multicast MAC
	DropRxNeighbour                    // source could not get a REMAC
	DropTAPWrite                       // received frames the kernel refused on the TAP
	DropLocalTAPWrite                  // the shim's own frames to guests (queries, ICMP) the kernel refused
	DropBadMcastReport                 // malformed IGMP/MLD report or leave from a guest
	DropNoGroup                        // multicast to a group the port could not join (group table full)
	DropSuperGroup                     // a TCP super-frame to a broadcast or multicast MAC
	DropRxUnknownSource                // sender unknown to the port and never seen in ARP/NDP (a resolution is sent)
	CaptureMissed                      // packets a capture left out because its reader was slow (forwarding is never held up)
	TxAnnounced                        // gratuitous ARPs / unsolicited NAs sent for guests whose MAC appeared here
	RARPAnnouncements                  // RARP announcements (QEMU's, after a migration) seen from guests
	DropAnnounce                       // announcements not queued: too many at once
	TxMovedLocal                       // frames to the old REMAC of a guest that moved here, sent back to the bridge for it
	TxToldLocal                        // gratuitous ARPs / unsolicited NAs telling local guests a guest that moved here
	TxProbedLocal                      // ARP probes / DAD solicitations asking a guest that moved here for its other addresses

	// Frames waiting for the control plane (control.go, newvif.go).
	TxQueuedNewVIF       // frames of a new guest held while its VIF is made (sent once ready)
	TxQueuedGroup        // frames to a group held while the port joins it (sent once joined)
	DropVIFPendingFull   // frames of new guests beyond the bounds held while their VIFs are made
	DropVIFRefused       // frames of a guest whose QP the port refused (held ones, and new ones during the back-off)
	DropGroupPendingFull // frames to a group being joined beyond the 64 held per group
	DropControlFull      // frames whose request to the control plane found its queue full
	numCounters
)

var counterNames = [numCounters]string{
	TxFrames: "tx_frames", TxBytes: "tx_bytes", RxBytes: "rx_bytes", TxForwarded: "tx_forwarded", TxPackets: "tx_packets", TxPortRefused: "tx_port_refused", TxFragments: "tx_fragments", TxBroadcast: "tx_broadcast", TxMulticast: "tx_multicast", TxSuper: "tx_super", TxSuperSegments: "tx_super_segments", TxMSSClamped: "tx_mss_clamped",
	TxFragmented: "tx_fragmented", TxICMPTooBig: "tx_icmp_too_big", TxQueued: "tx_queued", TxResolveSent: "tx_resolve_sent",
	TxQueries: "tx_queries", McastJoins: "mcast_joins", McastLeaves: "mcast_leaves", RxPackets: "rx_packets", RxFrames: "rx_frames", VIFsCreated: "vifs_created", VIFsAged: "vifs_aged", VIFsRemoved: "vifs_removed",
	DropRunt: "drop_runt", DropEtherType: "drop_ethertype", DropVLANUnmapped: "drop_vlan_unmapped",
	DropBadSrcMAC: "drop_bad_src_mac", DropVIFLimit: "drop_vif_limit", DropUndeclared: "drop_undeclared", DropBadIP: "drop_bad_ip",
	DropTooBig: "drop_too_big", DropDstLocal: "drop_dst_local", DropUnresolved: "drop_unresolved", DropVIFGone: "drop_vif_gone",
	DropTxRewrite: "drop_tx_rewrite", DropRxRewrite: "drop_rx_rewrite", DropRxBadHeader: "drop_rx_bad_header", DropRxEtherType: "drop_rx_ethertype",
	DropRxUnknownPKey: "drop_rx_unknown_pkey", DropRxUnknownVIF: "drop_rx_unknown_vif",
	DropRxMulticast: "drop_rx_multicast", DropRxNeighbour: "drop_rx_neighbour", DropTAPWrite: "drop_tap_write", DropLocalTAPWrite: "drop_local_tap_write",
	DropBadMcastReport: "drop_bad_mcast_report", DropNoGroup: "drop_no_group",
	DropSuperGroup:      "drop_super_group",
	DropRxUnknownSource: "drop_rx_unknown_source",
	CaptureMissed:       "capture_missed",
	TxAnnounced:         "tx_announced",
	RARPAnnouncements:   "rarp_announcements",
	DropAnnounce:        "drop_announce",
	TxMovedLocal:        "tx_moved_local",
	TxToldLocal:         "tx_told_local",
	TxProbedLocal:       "tx_probed_local",

	TxQueuedNewVIF: "tx_queued_new_vif", TxQueuedGroup: "tx_queued_group", DropVIFPendingFull: "drop_vif_pending_full",
	DropVIFRefused: "drop_vif_refused", DropGroupPendingFull: "drop_group_pending_full", DropControlFull: "drop_control_full",
}

// String returns the counter's metric name.
func (c Counter) String() string { return counterNames[c] }

type counters struct {
	c         [numCounters]atomic.Uint64
	txRewrite arpndp.Counters
	rxRewrite arpndp.Counters
}

func (c *counters) inc(k Counter) { c.c[k].Add(1) }

func (c *counters) add(k Counter, n uint64) { c.c[k].Add(n) }

// gauges are the Counters names that are levels, which go up and down,
// rather than totals.
var gauges = map[string]bool{
	"vifs": true, "neighbours": true, "groups": true, "groups_send_only": true,
	"snooped_groups": true, "pending": true, "pending_frames": true, "vifs_pending": true,
}

// IsGauge reports whether the Counters name is a level (a table size or
// queue depth, the port's levels included) rather than a running total.
func (s *Shim) IsGauge(name string) bool {
	if gauges[name] {
		return true
	}
	_, ok := s.portLevels.Load(name)
	return ok
}

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
	m["snooped_groups"] = uint64(s.snoop.Len())
	m["snooped_groups_overflow"], m["snooped_groups_join_failed"] = s.snoop.Overflow()
	m["groups_overflow"] = s.groups.overflow.Load()
	m["groups_send_only_evicted"] = s.groups.evicted.Load()
	m["pending"] = uint64(s.pending.count.Load())
	m["pending_frames"] = uint64(s.pending.frames.Load())
	s.controlCounters(m)
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
	if dc, ok := s.dev.(interface{ Counters() map[string]uint64 }); ok {
		for k, v := range dc.Counters() {
			m["tap_"+k] = v
		}
	}
	pc := s.port.Counters()
	m["port_tx_packets"] = pc.TxPackets
	m["port_tx_bytes"] = pc.TxBytes
	m["port_rx_packets"] = pc.RxPackets
	m["port_rx_bytes"] = pc.RxBytes
	for k, v := range pc.Drops {
		m["port_drop_"+k] = v
	}
	for k, v := range pc.Stats {
		m["port_"+k] = v
	}
	for k, v := range pc.Levels {
		m["port_"+k] = v
		s.portLevels.Store("port_"+k, true)
	}
	return m
}
