package shim

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestConservation: over a mixed batch of good and bad frames, every TAP
// frame is counted exactly once: as forwarded, fragmented, answered with
// ICMP, queued or under one drop reason (each checked exactly). Every
// fabric packet is counted as delivered or under one drop reason.
func TestConservation(t *testing.T) {
	a, b := pair(t, func(c *Config) { c.MaxVIFs = 2 })
	_, remacB1 := arpExchange(t, a, b)
	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA2, ipA2, ether.Broadcast, ether.MAC{}, ipB1)) // A2 gets its VIF
	b.recv(t)
	base := a.s.Counters()
	frames := map[string]int{}
	inject := func(outcome string, frame []byte) {
		frames[outcome]++
		a.dev.Inject(frame)
	}
	big := func(dst ether.MAC, df bool) []byte { return udpFrame(t, macA1, dst, ipA1, ipB1, 3000, df) }
	badIP := udpFrame(t, macA1, remacB1, ipA1, ipB1, 20, true)
	binary.BigEndian.PutUint16(badIP[14+2:], 200) // total length past the frame
	badIGMP := igmpReport(t, macA1, 4, netip.MustParseAddr("239.1.1.1"))
	badIGMP[14+20+8] = 9 // record type 9
	inject("tx_forwarded", udpFrame(t, macA1, remacB1, ipA1, ipB1, 10, true))
	inject("tx_forwarded", udpFrame(t, macA2, remacB1, ipA2, ipB1, 10, true))
	inject("tx_forwarded", arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	inject("tx_forwarded", udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 1, 1, 1}, ipA1, netip.MustParseAddr("239.1.1.1"), 10, false))
	inject("tx_fragmented", big(remacB1, false))
	inject("tx_icmp_too_big", big(remacB1, true))
	inject("drop_runt", []byte{1, 2, 3})
	inject("drop_ethertype", serialize(t, eth(macA1, ether.Broadcast, layers.EthernetType(0x88cc)), gopacket.Payload(make([]byte, 46))))
	inject("drop_vlan_unmapped", serialize(t, &layers.Ethernet{SrcMAC: macA1[:], DstMAC: ether.Broadcast[:], EthernetType: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{VLANIdentifier: 77, Type: layers.EthernetTypeARP}, gopacket.Payload(make([]byte, 28))))
	inject("drop_bad_src_mac", udpFrame(t, ether.MAC{1, 2, 3, 4, 5, 6}, remacB1, ipA1, ipB1, 10, true))
	inject("drop_vif_limit", udpFrame(t, ether.MAC{0x52, 0x54, 0, 0, 0xa, 9}, remacB1, ipA1, ipB1, 10, true))
	inject("drop_bad_ip", badIP)
	inject("drop_dst_local", udpFrame(t, macA1, macA2, ipA1, ipA2, 10, true))
	inject("drop_tx_rewrite", arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1)[:14+20])
	inject("drop_bad_mcast_report", badIGMP)
	inject("drop_unresolved", big(ether.MAC{2, 9, 9, 9, 9, 8}, false)) // oversize, unknown: counted once
	inject("pending_frames", udpFrame(t, macA1, ether.MAC{2, 9, 9, 9, 9, 9}, ipA1, netip.MustParseAddr("10.0.0.99"), 10, true))
	total := 0
	for _, n := range frames {
		total += n
	}
	a.waitCounter(t, TxFrames, base["tx_frames"]+uint64(total))
	check := func(c map[string]uint64) {
		t.Helper()
		if out := sumEnds(c, stat.TxEnd); c["tx_frames"] != out {
			t.Fatalf("tx_frames %d, outcomes %d: %v", c["tx_frames"], out, c)
		}
		if sent := c["tx_forwarded"] + c["tx_fragments"] + c["tx_resolve_sent"]; c["tx_packets"]+c["tx_port_refused"] != sent || c["tx_port_refused"] != 0 {
			t.Fatalf("packets offered %d, accepted %d, refused %d", sent, c["tx_packets"], c["tx_port_refused"])
		}
	}
	c := a.s.Counters()
	check(c)
	for k, want := range frames {
		if got := c[k] - base[k]; got != uint64(want) {
			t.Errorf("%s rose by %d, want %d", k, got, want)
		}
	}
	// The queued frame is dropped after the tries, counted once.
	a.resolveOut(t, base["drop_unresolved"]+2)
	c = a.s.Counters()
	check(c)
	if c["pending_frames"] != 0 {
		t.Fatalf("pending_frames %d", c["pending_frames"])
	}
	// Receive side, on b: what a sent plus bad packets from a raw port.
	raw, _ := a.port.AllocQP(0xffff, 0)
	vb, _ := b.s.vifs.Lookup(mactrans.VIFKey{MAC: macB1})
	for _, pay := range [][]byte{{8, 0, 0, 1, 0x45}, {0x88, 0xcc, 0, 0, 1}, {8, 6, 0, 0, 0, 32}, {8}} {
		buf := append(make([]byte, ipoib.Headroom), pay...)
		a.port.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, vb.QPN, b.port.LocalGID()), SrcQPN: raw, PKey: 0xffff}}, ipoib.Headroom)
	}
	b.waitCounter(t, DropRxRewrite, 1)
	b.waitCounter(t, DropRxBadHeader, 2) // the four packets may arrive in any order
	testutil.WaitFor(t, "b to read every packet", func() bool { return b.s.Get(RxPackets) == b.port.Counters().RxPackets })
	if c := b.s.Counters(); sumEnds(c, stat.RxEnd) != c["rx_packets"] {
		t.Fatalf("rx_packets %d, delivered + dropped %d: %v", c["rx_packets"], sumEnds(c, stat.RxEnd), c)
	}
	if b.s.Get(DropRxBadHeader) != 2 || b.s.Get(DropRxEtherType) != 1 || b.s.Get(DropRxRewrite) != 1 {
		t.Fatalf("receive drops %v", b.s.Counters())
	}
}

// sumEnds is the sum over the snapshot c of the outcomes of the flow e,
// the set the tables declare (and docs/metrics.md states).
func sumEnds(c map[string]uint64, e stat.End) uint64 {
	var n uint64
	for _, v := range counterTable {
		if v.End == e {
			n += c[v.Name]
		}
	}
	for _, v := range tableStats {
		if v.End == e {
			n += c[v.Name]
		}
	}
	return n
}

// TestConservationSplitAndHeld: the frames that become many packets, or
// wait, end in one outcome each as well. They are a TCP super-frame the
// port cuts (tx_super) and a UDP super-frame cut here into datagrams
// (tx_super_cut). Then one cut into datagrams that are each fragmented
// (DF clear), and a new guest's frame held while its VIF is made.
// After each, a's TX outcomes rose by exactly that frame's one
// outcome and sum to its tx_frames. b's RX outcomes sum to its
// rx_packets: every packet the frame became was delivered or dropped
// once.
func TestConservationSplitAndHeld(t *testing.T) {
	f := memFab(t, 2048)
	f.SetTSO(true) // TCP super-packets to the port; UDP ones are cut here
	a, b := newHV(t, f, "fe80::a", nil), newHV(t, f, "fe80::b", nil)
	_, remacB1 := arpExchange(t, a, b)
	link := serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv4))[:ether.HeaderLen]
	// each injects one frame and checks that it ends in outcome and
	// that the counters move by want (outcome's rise included).
	each := func(what string, inject func(), outcome Counter, want map[Counter]uint64) {
		t.Helper()
		base := a.s.Counters()
		inject()
		a.waitCounter(t, outcome, base[outcome.String()]+1)
		c := a.s.Counters()
		for k, n := range want {
			if got := c[k.String()] - base[k.String()]; got != n {
				t.Errorf("%s: %s rose by %d, want %d", what, k, got, n)
			}
		}
		if got := c["tx_frames"] - base["tx_frames"]; got != 1 {
			t.Errorf("%s: tx_frames rose by %d, want 1", what, got)
		}
		if out := sumEnds(c, stat.TxEnd); out != c["tx_frames"] {
			t.Fatalf("%s: TX outcomes %d, tx_frames %d: %v", what, out, c["tx_frames"], c)
		}
		deadline := time.Now().Add(testutil.Settle)
		for {
			c := b.s.Counters()
			if c["rx_packets"] == b.port.Counters().RxPackets && sumEnds(c, stat.RxEnd) == c["rx_packets"] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: b read %d of the port's %d packets, RX outcomes %d: %v", what, c["rx_packets"], b.port.Counters().RxPackets, sumEnds(c, stat.RxEnd), c)
			}
			time.Sleep(time.Millisecond)
		}
	}
	each("TCP super-frame", func() {
		pkt, l4 := gsotest.Super(t, link, false, gsotest.Pattern(20000))
		a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 1400})
	}, TxForwarded, map[Counter]uint64{TxForwarded: 1, TxSuper: 1, TxSuperSegments: 15})
	each("UDP super-frame", func() {
		pkt, l4 := gsotest.SuperUDP(t, link, false, gsotest.Pattern(9999))
		a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 1000, UDP: true})
	}, TxForwarded, map[Counter]uint64{TxForwarded: 1, TxSuperCut: 1})
	each("UDP super-frame of fragmented datagrams", func() {
		pkt, l4 := gsotest.SuperUDP(t, link, false, gsotest.Pattern(9000))
		pkt[ether.HeaderLen+6] &^= 0x40 // DF
		header.IPv4(pkt[ether.HeaderLen:]).SetChecksum()
		a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 3000, UDP: true})
	}, TxFragmented, map[Counter]uint64{TxFragmented: 1, TxFragments: 6, TxSuperCut: 1})
	each("frame of a new guest", func() {
		a.dev.Inject(udpFrame(t, macA2, remacB1, ipA2, ipB1, 10, true))
	}, TxForwarded, map[Counter]uint64{TxForwarded: 1, TxQueuedNewVIF: 1, VIFsCreated: 1})
}
