package shim

import (
	"sync/atomic"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/internal/tap"
)

// Counter indexes the shim's counters.
type Counter int

// The shim's counters; counterTable names and documents each. Drops are
// named drop_*. Every frame read from the TAP ends in exactly one value
// marked stat.TxEnd (pending_frames while queued for a resolution; none
// while held for a new VIF or a group join). Every packet read from the
// port ends in exactly one marked stat.RxEnd. A new outcome or drop
// reason is marked in its table line, and docs/metrics.md and the tests
// follow.
const (
	TxFrames Counter = iota
	TxBytes
	TxForwarded
	TxPackets
	TxPortRefused
	TxBroadcast
	TxMulticast
	TxSuper
	TxSuperSegments
	TxSuperCut
	TxMSSClamped
	TxFragmented
	TxFragments
	TxICMPTooBig
	TxQueued
	TxResolveSent
	TxQueries
	McastJoins
	McastLeaves
	RxPackets
	RxFrames
	RxBytes
	VIFsCreated
	VIFsAged
	VIFsRemoved
	VIFsKeptFastPath
	NeighboursKeptFastPath
	DropRunt
	DropEtherType
	DropVLANUnmapped
	DropBadSrcMAC
	DropVIFLimit
	DropUndeclared
	DropUndeclaredLocal
	DropBadIP
	DropTooBig
	DropDstLocal
	DropUnresolved
	DropVIFGone
	DropTxRewrite
	DropRxRewrite
	DropRxBadHeader
	DropRxEtherType
	DropRxUnknownPKey
	DropRxUnknownVIF
	DropRxMulticast
	DropRxNeighbour
	DropTAPWrite
	DropLocalTAPWrite
	DropBadMcastReport
	DropNoGroup
	DropSuperGroup
	RxUnknownSource
	CaptureMissed
	TxAnnounced
	RARPAnnouncements
	DropAnnounce
	TxMovedLocal
	TxToldLocal
	TxProbedLocal

	// Frames waiting for the control plane (control.go, newvif.go).
	TxQueuedNewVIF
	TxQueuedGroup
	DropVIFPendingFull
	DropVIFRefused
	DropGroupPendingFull
	DropControlFull
	numCounters
)

// counterTable is every counter's snapshot name, help and, for an
// outcome of a frame, its flow; all are totals.
var counterTable = [numCounters]stat.Value{
	TxFrames:            {Name: "tx_frames", Help: "Frames read from the TAP"},
	TxBytes:             {Name: "tx_bytes", Help: "Bytes of the frames read from the TAP (Ethernet header included)"},
	TxForwarded:         {Name: "tx_forwarded", Help: "Frames sent on as one IPoIB packet (at once or after a resolution)", End: stat.TxEnd},
	TxPackets:           {Name: "tx_packets", Help: "IPoIB packets the port accepted (fragments and resolutions included; a super-frame once)"},
	TxPortRefused:       {Name: "tx_port_refused", Help: "Packets the port refused or lost (the port's drops say why)"},
	TxBroadcast:         {Name: "tx_broadcast", Help: "Frames forwarded to the broadcast group"},
	TxMulticast:         {Name: "tx_multicast", Help: "Frames forwarded to a multicast group other than the broadcast group"},
	TxSuper:             {Name: "tx_super", Help: "Frames forwarded that were TCP or UDP super-frames the port took whole to cut itself"},
	TxSuperSegments:     {Name: "tx_super_segments", Help: "Segments (datagrams) the port is to cut the forwarded TCP and UDP super-frames into"},
	TxSuperCut:          {Name: "tx_super_cut", Help: "UDP super-frames cut into datagrams here, for a port that does not take them or datagrams longer than the IPoIB MTU"},
	TxMSSClamped:        {Name: "tx_mss_clamped", Help: "Guests' TCP SYNs whose MSS was lowered to fit the IPoIB MTU (--clamp-mss)"},
	TxFragmented:        {Name: "tx_fragmented", Help: "Frames sent as IPv4 fragments to fit the IPoIB MTU: a packet, or a UDP super-frame cut here into datagrams each fragmented (once for the frame)", End: stat.TxEnd},
	TxFragments:         {Name: "tx_fragments", Help: "Fragments made of the frames fragmented to the IPoIB MTU (every datagram's of a super-frame)"},
	TxICMPTooBig:        {Name: "tx_icmp_too_big", Help: "ICMP fragmentation-needed / ICMPv6 packet-too-big sent to guests", End: stat.TxEnd},
	TxQueued:            {Name: "tx_queued", Help: "Frames queued while their destination was resolved"},
	TxResolveSent:       {Name: "tx_resolve_sent", Help: "ARP/NS sent on a guest's behalf"},
	TxQueries:           {Name: "tx_queries", Help: "IGMP/MLD queries sent to guests"},
	McastJoins:          {Name: "mcast_joins", Help: "Groups joined for snooped members"},
	McastLeaves:         {Name: "mcast_leaves", Help: "Groups left when their last member went"},
	RxPackets:           {Name: "rx_packets", Help: "Packets read from the port"},
	RxFrames:            {Name: "rx_frames", Help: "Received packets written to the TAP as frames", End: stat.RxEnd},
	RxBytes:             {Name: "rx_bytes", Help: "Bytes of the received packets written to the TAP as frames (Ethernet header included)"},
	VIFsCreated:         {Name: "vifs_created", Help: "VIFs created for new source MACs"},
	VIFsAged:            {Name: "vifs_aged", Help: "VIFs removed as idle"},
	VIFsRemoved:         {Name: "vifs_removed", Help: "VIFs removed when the bridge forgot their MAC"},
	DropRunt:            {Name: "drop_runt", Help: "TX frame shorter than its Ethernet header", End: stat.TxEnd},
	DropEtherType:       {Name: "drop_ethertype", Help: "TX: ethertype IPoIB does not carry", End: stat.TxEnd},
	DropVLANUnmapped:    {Name: "drop_vlan_unmapped", Help: "TX frame on a VLAN with no P_Key", End: stat.TxEnd},
	DropBadSrcMAC:       {Name: "drop_bad_src_mac", Help: "Multicast or zero source MAC", End: stat.TxEnd},
	DropVIFLimit:        {Name: "drop_vif_limit", Help: "No VIF: --max-vifs reached or QP allocation failed", End: stat.TxEnd},
	DropUndeclared:      {Name: "drop_undeclared", Help: "--learn declared: a source MAC never declared (bridge static entry or DeclareVIF)", End: stat.TxEnd},
	DropUndeclaredLocal: {Name: "drop_undeclared_local", Help: "--learn declared: the hypervisor's own MAC (the bridge's or the OVS bridge's internal port's, the TAP's), never declared: the host's own frames, not a guest's", End: stat.TxEnd},
	DropBadIP:           {Name: "drop_bad_ip", Help: "IP header inconsistent with the frame", End: stat.TxEnd},
	DropTooBig:          {Name: "drop_too_big", Help: "Oversized and neither fragmentable nor answerable", End: stat.TxEnd},
	DropDstLocal:        {Name: "drop_dst_local", Help: "Unicast to a local guest (the bridge delivers those)", End: stat.TxEnd},
	DropUnresolved:      {Name: "drop_unresolved", Help: "Destination not resolved in time, or queue full", End: stat.TxEnd},
	DropVIFGone:         {Name: "drop_vif_gone", Help: "Queued for a resolution while the guest's VIF aged out", End: stat.TxEnd},
	DropTxRewrite:       {Name: "drop_tx_rewrite", Help: "ARP/NDP/DHCP rewrite refused (the rewrite refusals say why)", End: stat.TxEnd},
	DropRxRewrite:       {Name: "drop_rx_rewrite", Help: "RX: ARP/NDP/DHCP rewrite refused (the rewrite refusals say why)", End: stat.RxEnd},
	DropRxBadHeader:     {Name: "drop_rx_bad_header", Help: "IPoIB header missing or reserved bits set", End: stat.RxEnd},
	DropRxEtherType:     {Name: "drop_rx_ethertype", Help: "RX: ethertype other than IPv4, IPv6, ARP, RARP", End: stat.RxEnd},
	DropRxUnknownPKey:   {Name: "drop_rx_unknown_pkey", Help: "P_Key with no partition here", End: stat.RxEnd},
	DropRxUnknownVIF:    {Name: "drop_rx_unknown_vif", Help: "Unicast to a QPN that is no VIF of that partition", End: stat.RxEnd},
	DropRxMulticast:     {Name: "drop_rx_multicast", Help: "MGID that maps to no Ethernet multicast MAC", End: stat.RxEnd},
	DropRxNeighbour:     {Name: "drop_rx_neighbour", Help: "Source could not get a REMAC", End: stat.RxEnd},
	DropTAPWrite:        {Name: "drop_tap_write", Help: "Received frames the kernel refused on the TAP", End: stat.RxEnd},
	DropLocalTAPWrite:   {Name: "drop_local_tap_write", Help: "The shim's own frames to guests (queries, ICMP) the kernel refused"},
	DropBadMcastReport:  {Name: "drop_bad_mcast_report", Help: "Malformed IGMP/MLD report or leave from a guest", End: stat.TxEnd},
	DropNoGroup:         {Name: "drop_no_group", Help: "Multicast to a group the port could not join (group table full)", End: stat.TxEnd},
	DropSuperGroup:      {Name: "drop_super_group", Help: "A TCP super-frame to a broadcast or multicast MAC", End: stat.TxEnd},
	RxUnknownSource:     {Name: "rx_unknown_source", Help: "Packets from a sender the port cannot name and ARP/NDP never taught (routed from another subnet, or multicast from a host that never sent ARP/NDP), delivered with the partition's stand-in source MAC"},
	CaptureMissed:       {Name: "capture_missed", Help: "Packets a capture left out because its reader was slow (forwarding is never held up)"},
	TxAnnounced:         {Name: "tx_announced", Help: "Gratuitous ARPs / unsolicited NAs sent for guests whose MAC appeared here"},
	RARPAnnouncements:   {Name: "rarp_announcements", Help: "RARP announcements (QEMU's, after a migration) seen from guests"},
	DropAnnounce:        {Name: "drop_announce", Help: "Announcements not queued: too many at once"},
	TxMovedLocal:        {Name: "tx_moved_local", Help: "Frames to the old REMAC of a guest that moved here, sent back to the bridge for it", End: stat.TxEnd},
	TxToldLocal:         {Name: "tx_told_local", Help: "Gratuitous ARPs / unsolicited NAs telling local guests a guest that moved here"},
	TxProbedLocal:       {Name: "tx_probed_local", Help: "ARP probes / DAD solicitations asking a guest that moved here for its other addresses"},

	TxQueuedNewVIF:       {Name: "tx_queued_new_vif", Help: "Frames of a new guest held while its VIF is made (sent once ready)"},
	TxQueuedGroup:        {Name: "tx_queued_group", Help: "Frames to a group held while the port joins it (sent once joined)"},
	DropVIFPendingFull:   {Name: "drop_vif_pending_full", Help: "Frames of new guests beyond the bounds held while their VIFs are made", End: stat.TxEnd},
	DropVIFRefused:       {Name: "drop_vif_refused", Help: "Frames of a guest whose QP the port refused (held ones, and new ones during the back-off)", End: stat.TxEnd},
	DropGroupPendingFull: {Name: "drop_group_pending_full", Help: "Frames to a group being joined beyond the 64 held per group", End: stat.TxEnd},
	DropControlFull:      {Name: "drop_control_full", Help: "Frames whose request to the control plane found its queue full", End: stat.TxEnd},

	// Entries the tables were about to drop, kept for the fast path (fastpath.go).
	VIFsKeptFastPath:       {Name: "vifs_kept_fast_path", Help: "VIFs idle for --vif-idle in eipoibd kept because the kernel backend's fast path carried their frames"},
	NeighboursKeptFastPath: {Name: "neighbours_kept_fast_path", Help: "Remote endpoints about to be aged or evicted kept (or marked used) because the kernel backend's fast path carried frames to or from them"},
}

// String returns the counter's snapshot name.
func (c Counter) String() string { return counterTable[c].Name }

type counters struct {
	c         [numCounters]atomic.Uint64
	txRewrite arpndp.Counters
	rxRewrite arpndp.Counters
}

func (c *counters) inc(k Counter) { c.c[k].Add(1) }

// verdict is what a stage of the TX or RX pipeline decides for a frame:
// the outcome it ends in (a Counter marked stat.TxEnd or stat.RxEnd), or
// pass, or held. Stages return it and tx, rx and readyVIF count it once
// (end): that is where every frame the pipelines take ends in exactly
// one outcome.
type verdict int8

const (
	// pass sends the frame on to the next stage.
	pass verdict = -1
	// held ends the frame elsewhere. It is queued for a resolution
	// (pending_frames), or held for its VIF or a group join (counted by
	// the holder when it sends or drops it). Or it is a received frame
	// in the TAP's batch (rx_frames or drop_tap_write at the write).
	held verdict = -2
)

// A verdict holds any Counter (a compile error here when one does not).
const _ = uint8(127 - numCounters)

// end counts the outcome of a frame a pipeline is done with.
func (c *counters) end(v verdict) {
	if v >= 0 {
		c.inc(Counter(v))
	}
}

func (c *counters) add(k Counter, n uint64) { c.c[k].Add(n) }

// tableStat is a number the shim reads from one of its tables rather
// than counts: its description and how to read it.
type tableStat struct {
	stat.Value
	read func(*Shim) uint64
}

// tableStats are the shim's table sizes and queue depths (levels) and
// the tables' own counters (totals).
var tableStats = []tableStat{
	{stat.Value{Name: "groups", Kind: stat.Level, Help: "Multicast groups the port is a full member of for guests"}, func(s *Shim) uint64 { full, _ := s.groups.set.counts(); return uint64(full) }},
	{stat.Value{Name: "groups_send_only", Kind: stat.Level, Help: "Send-only memberships: groups guests send to with no member here"}, func(s *Shim) uint64 { _, so := s.groups.set.counts(); return uint64(so) }},
	{stat.Value{Name: "groups_overflow", Help: "Groups not joined: the group table was full"}, func(s *Shim) uint64 { return s.groups.set.overflow.Load() }},
	{stat.Value{Name: "groups_send_only_evicted", Help: "Send-only memberships evicted for room"}, func(s *Shim) uint64 { return s.groups.set.evicted.Load() }},
	{stat.Value{Name: "snooped_groups", Kind: stat.Level, Help: "Group memberships snooped from guests' IGMP/MLD reports"}, func(s *Shim) uint64 { return uint64(s.groups.snoop.Len()) }},
	{stat.Value{Name: "snooped_groups_overflow", Help: "Snooped groups refused: the snooping table was full"}, func(s *Shim) uint64 { n, _ := s.groups.snoop.Overflow(); return n }},
	{stat.Value{Name: "snooped_groups_join_failed", Help: "Snooped groups refused: the port's join failed"}, func(s *Shim) uint64 { _, n := s.groups.snoop.Overflow(); return n }},
	{stat.Value{Name: "pending", Kind: stat.Level, Help: "Destinations being resolved"}, func(s *Shim) uint64 { return uint64(s.resolver.pending.count.Load()) }},
	{stat.Value{Name: "pending_frames", Kind: stat.Level, Help: "Frames waiting for their destination's resolution", End: stat.TxEnd}, func(s *Shim) uint64 { return uint64(s.resolver.pending.frames.Load()) }},
	{stat.Value{Name: "vifs", Kind: stat.Level, Help: "VIFs: local guests' MACs (per VLAN) with their own QP"}, func(s *Shim) uint64 { return uint64(s.vifs.Len()) }},
	{stat.Value{Name: "vifs_pending", Kind: stat.Level, Help: "New guests whose VIF the control plane is making ready (their frames held)"}, func(s *Shim) uint64 { return uint64(s.newVIFs.pending.Load()) }},
	{stat.Value{Name: "vifs_overflow", Help: "New source MACs refused a VIF: the VIF table was full (--max-vifs)"}, func(s *Shim) uint64 { return s.vifs.Counters().Overflow }},
	{stat.Value{Name: "neighbours", Kind: stat.Level, Help: "Remote endpoints known (RIMAC and REMAC)"}, func(s *Shim) uint64 { return uint64(s.neigh.Len()) }},
	{stat.Value{Name: "neighbours_learned", Help: "Remote endpoints learned"}, func(s *Shim) uint64 { return s.neigh.Counters().Learned }},
	{stat.Value{Name: "neighbours_aged", Help: "Remote endpoints forgotten as idle"}, func(s *Shim) uint64 { return s.neigh.Counters().Aged }},
	{stat.Value{Name: "neighbours_evicted", Help: "Remote endpoints evicted from a full table"}, func(s *Shim) uint64 { return s.neigh.Counters().Evicted }},
	{stat.Value{Name: "neighbours_collisions", Help: "REMACs derived again because the first was taken by another endpoint"}, func(s *Shim) uint64 { return s.neigh.Counters().Collisions }},
	{stat.Value{Name: "neighbours_unresolved", Help: "Remote endpoints that got no REMAC: every derivation was taken"}, func(s *Shim) uint64 { return s.neigh.Counters().Unresolved }},
}

// families are the snapshot names that end in a label value. A name
// <prefix><value> of a family declared here is exported as the family's
// metric with the value as its last label, whoever adds the name.
var families = []stat.Family{
	{Prefix: "drop_", Name: "drops", Labels: []string{"reason"}, Help: "Frames from the TAP and packets from the port the shim dropped, by reason"},
	{Prefix: "tx_rewrite_", Name: "rewrite_refused", Labels: []string{"direction", "reason"}, Fixed: []string{"tx"}, Help: rewriteHelp},
	{Prefix: "rx_rewrite_", Name: "rewrite_refused", Labels: []string{"direction", "reason"}, Fixed: []string{"rx"}, Help: rewriteHelp},
	// Guests refused a VIF and group joins the port refused, by the
	// reason the port gave (ipoib.RefusedError; control.go).
	{Prefix: "vifs_refused_", Name: "vifs_refused", Labels: []string{"reason"}, Help: "Guests refused a VIF, by the port's reason"},
	{Prefix: "groups_refused_", Name: "groups_refused", Labels: []string{"reason"}, Help: "Group joins the port refused, by its reason"},
	{Prefix: "tap_drop_", Name: "tap_drops", Labels: []string{"reason"}, Help: "Frames the TAP refused, by reason"},
	{Prefix: "port_drop_", Name: "port_drops", Labels: []string{"reason"}, Help: "Packets the fabric port dropped or could not send, by the backend's reason"},
	// The kernel backend's BPF fast path (--fast-path): every verdict of
	// its programs, as kernelfabric.StatFastPathTX/RX name them.
	{Prefix: "port_fast_path_tx_", Name: "fast_path", Labels: []string{"direction", "reason"}, Fixed: []string{"tx"}, Help: fastPathHelp},
	{Prefix: "port_fast_path_rx_", Name: "fast_path", Labels: []string{"direction", "reason"}, Fixed: []string{"rx"}, Help: fastPathHelp},
}

const fastPathHelp = "Frames (tx: from the TAP) and packets (rx: from a VIF child) the kernel backend's fast path saw, by direction and verdict: redirected, drop_rewrite, or why it left them to eipoibd"

const rewriteHelp = "ARP, NDP and DHCP payloads whose rewrite was refused, by direction and reason"

// Families returns the families of the Counters names, the same slice
// every call (not to be changed).
func Families() []stat.Family { return families }

// Get returns one counter.
func (s *Shim) Get(k Counter) uint64 { return s.ctr.c[k].Load() }

// Stats returns every number of Counters with its kind and help: the
// shim's counters and the rewrite refusals by reason (every reason, zero
// or not) as tx_rewrite_<reason>/rx_rewrite_<reason>. Then the tables'
// sizes and counters, the TAP's counters (tap_*) and the port's
// (port_*). The port's Levels and the TAP's tap.IsLevel names are
// levels; everything else they count is a total.
func (s *Shim) Stats() []stat.Value {
	out := make([]stat.Value, 0, int(numCounters)+len(tableStats)+64)
	for i := range s.ctr.c {
		v := counterTable[i]
		v.Value = s.ctr.c[i].Load()
		out = append(out, v)
	}
	s.ctr.txRewrite.Each(func(r arpndp.Reason, n uint64) {
		out = append(out, stat.Value{Name: "tx_rewrite_" + r.String(), Value: n, Help: "TX: ARP/NDP/DHCP rewrite refused as " + r.String()})
	})
	s.ctr.rxRewrite.Each(func(r arpndp.Reason, n uint64) {
		out = append(out, stat.Value{Name: "rx_rewrite_" + r.String(), Value: n, Help: "RX: ARP/NDP/DHCP rewrite refused as " + r.String()})
	})
	for _, t := range tableStats {
		v := t.Value
		v.Value = t.read(s)
		out = append(out, v)
	}
	out = s.refusalStats(out)
	for k, n := range s.dev.Counters() {
		v := stat.Value{Name: "tap_" + k, Value: n, Help: "The TAP's " + k + " (offloads)"}
		if tap.IsLevel(k) {
			v.Kind, v.Help = stat.Level, "The TAP's "+k+" state (offloads; 1 on, 0 off)"
		}
		out = append(out, v)
	}
	pc := s.port.Counters()
	out = append(out,
		stat.Value{Name: "port_tx_packets", Value: pc.TxPackets, Help: "Packets the fabric port sent"},
		stat.Value{Name: "port_tx_bytes", Value: pc.TxBytes, Help: "Bytes of the packets the fabric port sent"},
		stat.Value{Name: "port_rx_packets", Value: pc.RxPackets, Help: "Packets the fabric port received"},
		stat.Value{Name: "port_rx_bytes", Value: pc.RxBytes, Help: "Bytes of the packets the fabric port received"})
	for k, n := range pc.Drops {
		out = append(out, stat.Value{Name: "port_drop_" + k, Value: n, Help: "Packets the fabric port dropped as " + k})
	}
	for k, n := range pc.Stats {
		out = append(out, stat.Value{Name: "port_" + k, Value: n, Help: "The fabric port's " + k + " (a total the backend counts)"})
	}
	for k, n := range pc.Levels {
		out = append(out, stat.Value{Name: "port_" + k, Value: n, Kind: stat.Level, Help: "The fabric port's " + k + " (a level the backend reports)"})
	}
	return out
}

// Counters returns every number of Stats by name: the snapshot that the
// control socket and `eipoibd stats` show.
func (s *Shim) Counters() map[string]uint64 {
	st := s.Stats()
	m := make(map[string]uint64, len(st))
	for _, v := range st {
		m[v.Name] = v.Value
	}
	return m
}
