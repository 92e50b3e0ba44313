package shim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/ip4defrag"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/memfabric"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/tap"
)

// txFrame runs one frame through the TX path of a still shim, as the TX
// loop does, into batch b (flushed by the caller).
func txFrame(s *Shim, b *txBatch, frame []byte) {
	buf := make([]byte, devBufSize)
	copy(buf[devHeadroom:], frame)
	s.ctr.inc(TxFrames)
	s.tx(b, buf, len(frame), tap.Super{}, s.clk.Now())
	s.runIntents(nil) // the control goroutine's part: a new guest's VIF, joins
}

// rxPacket runs one IPoIB packet through the RX path of a still shim and
// returns the frame for the TAP, or nil.
func rxPacket(s *Shim, pkt []byte, m ipoib.RxMeta) []byte {
	buf := make([]byte, rxOffset+len(pkt)+64)
	copy(buf[rxOffset:], pkt)
	s.ctr.inc(RxPackets)
	return s.rx(buf, len(pkt), &m, s.clk.Now())
}

// readAll reads n packets from port p, failing after two seconds.
func readAll(t *testing.T, p *memfabric.Port, n int) []ipoib.RxMeta {
	t.Helper()
	done := make(chan []ipoib.RxMeta, 1)
	go func() {
		var got []ipoib.RxMeta
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 4200)
		}
		sizes, meta := make([]int, 64), make([]ipoib.RxMeta, 64)
		for len(got) < n {
			k, err := p.Read(bufs, sizes, meta, 64)
			if err != nil {
				break
			}
			got = append(got, meta[:k]...)
		}
		done <- got
	}()
	select {
	case got := <-done:
		if len(got) != n {
			t.Fatalf("read %d packets, want %d", len(got), n)
		}
		return got
	case <-time.After(settle):
		t.Fatalf("fewer than %d packets arrived (port counters %+v)", n, p.Counters())
	}
	return nil
}

// TestManyDestinationsResolveInOneBatch: 150 destinations with 3 queued
// frames each resolve in one RX batch, and all 450 frames go out in one
// port Write. On the simulated fabric that Write used to panic past 129
// packets, killing the daemon from the RX goroutine.
func TestManyDestinationsResolveInOneBatch(t *testing.T) {
	f := memFab(t, 4096)
	s, _ := stillShim(t, f.Fabric, "fe80::a", nil)
	far, err := f.NewPort(gidOf("fe80::b"))
	if err != nil {
		t.Fatal(err)
	}
	const dsts, per = 150, pendingPerDst
	vif, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, s.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	b := newTxBatch(16)
	qpns := make([]uint32, dsts)
	ips := make([]netip.Addr, dsts)
	for i := range qpns {
		qpns[i], _ = far.AllocQP(0xffff, 0)
		ips[i] = netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		remac := mactrans.DeriveREMAC(far.LocalGID(), qpns[i], 0)
		for k := 0; k < per; k++ {
			txFrame(s, b, udpFrame(t, macA1, remac, ipA1, ips[i], 64+k, true))
		}
	}
	s.flushTx(b)
	if got := s.pending.frames.Load(); got != dsts*per || s.Get(TxQueued) != dsts*per || s.Get(TxResolveSent) != dsts {
		t.Fatalf("queued %d frames (%d), resolutions %d; want %d and %d", got, s.Get(TxQueued), s.Get(TxResolveSent), dsts*per, dsts)
	}
	// One RX batch: a packet from every destination.
	for i, q := range qpns {
		pkt := append([]byte{8, 0, 0, 0}, udpPacket(t, ips[i], ipA1, 10)...)
		if rxPacket(s, pkt, ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, q, far.LocalGID()), DstQPN: vif.QPN, PKey: 0xffff}) == nil {
			t.Fatalf("packet from destination %d dropped: %v", i, s.Counters())
		}
	}
	s.flushResolved()
	count := make(map[uint32]int)
	for _, m := range readAll(t, far, dsts*per) {
		count[m.DstQPN]++
	}
	for _, q := range qpns {
		if count[q] != per {
			t.Fatalf("QPN %#x got %d frames, want %d", q, count[q], per)
		}
	}
	if s.Get(TxForwarded) != dsts*per || s.Get(TxPackets) != dsts*per+dsts || s.Get(TxPortRefused) != 0 || s.pending.frames.Load() != 0 {
		t.Fatalf("counters %v", s.Counters())
	}
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestSendOnlyFlood: a guest sending to 5,000 groups keeps at most
// maxSendOnly send-only memberships (least recently used evicted), and
// afterwards another guest's IGMP join still joins and receives, a new
// IPv6 address still gets its solicited-node group and its neighbour
// solicitations, and the flood added at most two lines to the log.
// Before the bound, the send-only joins filled the 4,096-group table,
// the join and the solicited-node group were refused, and a warning was
// logged per frame.
func TestSendOnlyFlood(t *testing.T) {
	f := memFab(t, 2048)
	var logs syncBuffer
	a := newHV(t, f, "fe80::a", func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	b := newHV(t, f, "fe80::b", nil)
	// The guest's first frame (its VIF is created and logged), then the
	// flood; the log is measured across the flood only.
	a.dev.Inject(udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 2, 0, 0}, ipA1, netip.AddrFrom4([4]byte{239, 2, 0, 0}), 20, false))
	a.waitCounter(t, TxFrames, 1)
	waitFor(t, "the start-up log", func() bool { return strings.Contains(logs.String(), "shim running") })
	before := strings.Count(logs.String(), "\n")
	const groups = 5000
	for i := 1; i < groups; i++ {
		g := netip.AddrFrom4([4]byte{239, 2, byte(i >> 8), byte(i)})
		a.dev.Inject(udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 2, byte(i >> 8), byte(i)}, ipA1, g, 20, false))
	}
	a.waitCounter(t, TxFrames, groups)
	// Each frame is sent once its group is joined, or dropped and
	// counted: at most maxSendOnly groups wait for their join at once.
	waitFor(t, "every flood frame sent or counted", func() bool {
		return a.s.Get(TxMulticast)+a.s.Get(DropNoGroup)+a.s.Get(DropGroupPendingFull) == groups && a.s.Counters()["groups_send_only"] == maxSendOnly
	})
	if grew := strings.Count(logs.String(), "\n") - before; grew > 2 {
		t.Fatalf("the log grew by %d lines during the flood:\n%s", grew, logs.String())
	}
	c := a.s.Counters()
	if joined := c["groups_send_only"] + c["groups_send_only_evicted"]; c["groups_send_only"] != maxSendOnly || joined != c["tx_multicast"] {
		t.Fatalf("send-only %d, evicted %d, sent %d; want %d, and one send-only join per frame sent", c["groups_send_only"], c["groups_send_only_evicted"], c["tx_multicast"], maxSendOnly)
	}
	// Another guest joins a group and receives what b's guest sends to it.
	g := netip.MustParseAddr("239.9.9.9")
	a.dev.Inject(igmpReport(t, macA2, 4, g))
	waitFor(t, "the join of 239.9.9.9", func() bool { return a.port.Joined(ipoib.IPv4MGID(g, 0xffff, 2)) })
	b.dev.Inject(udpFrame(t, macB1, ether.MAC{1, 0, 0x5e, 9, 9, 9}, ipB1, g, 100, false))
	if e := a.recv(t).Layer(layers.LayerTypeEthernet).(*layers.Ethernet); e.DstMAC.String() != "01:00:5e:09:09:09" {
		t.Fatalf("group traffic delivered to %s", e.DstMAC)
	}
	// A third guest's new IPv6 address (duplicate address detection)
	// gets its solicited-node group; a solicitation from b reaches it.
	macA3 := ether.MAC{0x52, 0x54, 0, 0, 0xa, 3}
	la3 := netip.MustParseAddr("fd00::a3")
	sn := solicitedNode(la3)
	snMAC := ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xa3}
	dad := &layers.ICMPv6NeighborSolicitation{TargetAddress: la3.AsSlice()}
	a.dev.Inject(ndpFrame(t, macA3, netip.IPv6Unspecified(), sn, snMAC, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0), dad))
	waitFor(t, "the solicited-node group of fd00::a3", func() bool { return a.port.Joined(ipoib.IPv6MGID(sn, 0xffff, 2)) })
	ns := &layers.ICMPv6NeighborSolicitation{TargetAddress: la3.AsSlice(), Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptSourceAddress, Data: macB1[:]}}}
	b.dev.Inject(ndpFrame(t, macB1, netip.MustParseAddr("fd00::b1"), sn, snMAC, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0), ns))
	for {
		p := a.recv(t)
		if got, ok := p.Layer(layers.LayerTypeICMPv6NeighborSolicitation).(*layers.ICMPv6NeighborSolicitation); ok && netip.AddrFrom16([16]byte(got.TargetAddress)) == la3 && p.NetworkLayer().NetworkFlow().Src().String() == "fd00::b1" {
			break
		}
	}
}

// TestGroupSet: full memberships are counted per MGID and never pushed
// out by send-only ones; send-only ones are bounded and the least
// recently used goes first; an idle send-only membership upgraded to a
// full one is not expired.
func TestGroupSet(t *testing.T) {
	f := memFab(t, 2048)
	port, _ := f.NewPort(gidOf("fe80::a"))
	var g groupSet
	g.init(4, 2)
	mgid := func(i byte) ipoib.GID { return ipoib.IPv4MGID(netip.AddrFrom4([4]byte{239, 0, 0, i}), 0xffff, 2) }
	t0 := time.Unix(1e6, 0)
	// Two snooped groups on one MGID: left with the second leave only.
	g.join(port, mgid(1), false)
	g.join(port, mgid(1), false)
	g.leave(port, mgid(1))
	if !port.Joined(mgid(1)) {
		t.Fatal("MGID left while a second membership uses it")
	}
	g.leave(port, mgid(1))
	if port.Joined(mgid(1)) {
		t.Fatal("MGID kept after its last membership")
	}
	// Send-only: at most 2, the least recently used evicted.
	for i := byte(1); i <= 3; i++ {
		if err := g.joinSendOnly(port, mgid(10+i), t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if port.SendOnly(mgid(11)) || !port.SendOnly(mgid(12)) || !port.SendOnly(mgid(13)) || g.evicted.Load() != 1 {
		t.Fatalf("send-only after 3 joins: 11 %v 12 %v 13 %v, evicted %d", port.SendOnly(mgid(11)), port.SendOnly(mgid(12)), port.SendOnly(mgid(13)), g.evicted.Load())
	}
	// Full joins fill the total bound (4), evicting send-only ones.
	for i := byte(1); i <= 4; i++ {
		if err := g.join(port, mgid(i), false); err != nil {
			t.Fatalf("full join %d refused: %v", i, err)
		}
	}
	if full, so := g.counts(); full != 4 || so != 0 || g.evicted.Load() != 3 {
		t.Fatalf("full %d, send-only %d, evicted %d; want 4, 0, 3", full, so, g.evicted.Load())
	}
	// Now nothing can be evicted: a fifth full join and a send-only one
	// are refused and counted.
	if err := g.join(port, mgid(5), false); !errors.Is(err, errGroupsFull) {
		t.Fatalf("fifth full join: %v", err)
	}
	if err := g.joinSendOnly(port, mgid(20), t0); !errors.Is(err, errGroupsFull) || g.overflow.Load() != 2 {
		t.Fatalf("send-only join into full memberships: %v, overflow %d", err, g.overflow.Load())
	}
	// A send-only membership upgraded to full is not expired as idle.
	g.leave(port, mgid(4))
	g.joinSendOnly(port, mgid(30), t0)
	g.join(port, mgid(30), false)
	if n, err := g.expireSendOnly(port, t0.Add(time.Hour), time.Minute); n != 0 || err != nil || !port.Joined(mgid(30)) {
		t.Fatalf("expired %d (%v); upgraded group joined %v", n, err, port.Joined(mgid(30)))
	}
}

// TestAgingWaitsForBatch: a VIF's QP is not freed while a batch may be
// sending from it; once the batch is done, aging frees it and the port
// refuses the QPN. Queued frames of a VIF that aged out are dropped as
// drop_vif_gone, never sent from the freed QP.
func TestAgingWaitsForBatch(t *testing.T) {
	f := memFab(t, 2048)
	s, port := stillShim(t, f.Fabric, "fe80::a", func(c *Config) { c.VIFIdle = time.Minute })
	far, _ := f.NewPort(gidOf("fe80::b"))
	qfar, _ := far.AllocQP(0xffff, 0)
	v, _ := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, s.clk.Now())
	send := func() int {
		buf := append(make([]byte, ipoib.Headroom), 8, 0, 0, 0, 0x45)
		n, _ := port.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, qfar, far.LocalGID()), SrcQPN: v.QPN, PKey: 0xffff}}, ipoib.Headroom)
		return n
	}
	// A frame to an unknown destination waits in the queue.
	remac := mactrans.DeriveREMAC(far.LocalGID(), qfar, 0)
	b := newTxBatch(1)
	txFrame(s, b, udpFrame(t, macA1, remac, ipA1, ipB1, 64, true))
	if s.pending.frames.Load() != 1 {
		t.Fatalf("frame not queued: %v", s.Counters())
	}
	s.ep.enter(0) // a batch of TX worker 0 is in flight
	s.ageVIFs(s.clk.Now().Add(2 * time.Minute))
	s.freeDrained()
	if _, ok := s.vifs.Lookup(v.Key); ok {
		t.Fatal("aged VIF still published")
	}
	if send() != 1 {
		t.Fatal("the batch could not send from its VIF's QP")
	}
	s.ep.exit(0)
	s.freeDrained() // the control goroutine's next round
	if len(s.ctl.draining) != 0 {
		t.Fatal("the QP was not freed once the batch ended")
	}
	if send() != 0 || port.Counters().Drops[ipoib.DropBadMeta.String()] != 1 {
		t.Fatalf("freed QP still sends: %+v", port.Counters())
	}
	// The destination answers: the queued frame is dropped, not sent.
	rxPacket(s, append([]byte{8, 0, 0, 0}, udpPacket(t, ipB1, ipA1, 10)...),
		ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, qfar, far.LocalGID()), DstQPN: ipoib.MulticastQPN, MGID: s.byVLAN[0].Load().bcast, PKey: 0xffff})
	s.flushResolved()
	if s.Get(DropVIFGone) != 1 || s.Get(TxForwarded) != 0 || port.Counters().Drops[ipoib.DropBadMeta.String()] != 1 {
		t.Fatalf("queued frame of an aged VIF: %v, port %+v", s.Counters(), port.Counters())
	}
}

// flakyPort refuses its failAt-th Join and notes when a Read returns.
type flakyPort struct {
	*memfabric.Port
	joins, failAt int
	readEnded     atomic.Bool
}

func (p *flakyPort) Join(m ipoib.GID) error {
	if p.joins++; p.joins == p.failAt {
		return errors.New("join refused")
	}
	return p.Port.Join(m)
}

func (p *flakyPort) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	n, err := p.Port.Read(bufs, sizes, meta, offset)
	if err != nil {
		p.readEnded.Store(true)
	}
	return n, err
}

// TestRunLifetimes: a start-up join failure leaves the groups already
// joined; a normal Run returns only after its RX loop has ended.
func TestRunLifetimes(t *testing.T) {
	f := memFab(t, 2048)
	for _, failAt := range []int{2, 0} {
		mp, _ := f.NewPort(gidOf(fmt.Sprintf("fe80::%d", failAt+1)))
		port := &flakyPort{Port: mp, failAt: failAt}
		s, err := New(Config{Device: tap.NewMem(16), Port: port, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		bc := s.byVLAN[0].Load().bcast
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		if failAt == 0 {
			waitFor(t, "the broadcast join", func() bool { return mp.Joined(bc) })
			cancel()
		}
		select {
		case err = <-done:
		case <-time.After(settle):
			t.Fatal("Run did not return")
		}
		cancel()
		if failAt != 0 && (err == nil || mp.Joined(bc)) {
			t.Fatalf("failed start-up: err %v, broadcast group still joined %v", err, mp.Joined(bc))
		}
		if failAt == 0 && (err != nil || !port.readEnded.Load()) {
			t.Fatalf("Run returned %v before its RX loop ended (%v)", err, port.readEnded.Load())
		}
	}
}

// TestConservation: over a mixed batch of good and bad frames, every TAP
// frame is counted exactly once, as forwarded, fragmented, answered with
// ICMP, queued or under one drop reason (each checked exactly), and every
// fabric packet as delivered or under one drop reason.
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
	waitFor(t, "b to read every packet", func() bool { return b.s.Get(RxPackets) == b.port.Counters().RxPackets })
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

// TestLearnOnlyAccepted: packets that RX drops (bad header, ethertype,
// unknown VIF, refused rewrite) teach the neighbour table nothing; an
// accepted one does.
func TestLearnOnlyAccepted(t *testing.T) {
	f := memFab(t, 2048)
	s, _ := stillShim(t, f.Fabric, "fe80::a", nil)
	v, _ := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, s.clk.Now())
	from := func(q uint32) ipoib.HwAddr { return ipoib.MakeHwAddr(0, q, gidOf("fe80::b")) }
	for i, c := range []struct {
		pkt    []byte
		dstQPN uint32
	}{
		{[]byte{8, 0, 0, 1, 0x45}, v.QPN},            // reserved bits
		{[]byte{0x88, 0xcc, 0, 0, 1}, v.QPN},         // ethertype
		{[]byte{8, 0, 0, 0, 0x45}, v.QPN + 1},        // no such VIF
		{[]byte{8, 6, 0, 0, 0, 32, 8, 0, 20}, v.QPN}, // truncated ARP
	} {
		if rxPacket(s, c.pkt, ipoib.RxMeta{Src: from(uint32(100 + i)), DstQPN: c.dstQPN, PKey: 0xffff}) != nil {
			t.Fatalf("bad packet %d delivered", i)
		}
	}
	if n := s.neigh.Len(); n != 0 {
		t.Fatalf("%d neighbours learned from dropped packets", n)
	}
	if rxPacket(s, append([]byte{8, 0, 0, 0}, udpPacket(t, ipB1, ipA1, 10)...), ipoib.RxMeta{Src: from(200), DstQPN: v.QPN, PKey: 0xffff}) == nil || s.neigh.Len() != 1 {
		t.Fatalf("accepted packet: neighbours %d", s.neigh.Len())
	}
}

// TestFragmentOptions: an oversized IPv4 packet with options is
// fragmented so that the first fragment carries every option and the
// others only those with the copied flag (RFC 791 §3.2); each fragment's
// header checksum verifies and the fragments reassemble byte for byte.
func TestFragmentOptions(t *testing.T) {
	a, b := pair(t, nil)
	_, remacB1 := arpExchange(t, a, b)
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, Id: 77, SrcIP: ipA1.AsSlice(), DstIP: ipB1.AsSlice(),
		Options: []layers.IPv4Option{
			{OptionType: 7, OptionLength: 11, OptionData: []byte{4, 0, 0, 0, 0, 0, 0, 0, 0}}, // record route: first fragment only
			{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}},                    // router alert: copied
		}}
	udp := &layers.UDP{SrcPort: 5000, DstPort: 6000}
	udp.SetNetworkLayerForChecksum(ip)
	data := make([]byte, 5000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	frame := serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv4), ip, udp, gopacket.Payload(data))
	orig, _ := header.ParseIPv4(frame[14:])
	a.dev.Inject(frame)
	defrag := ip4defrag.NewIPv4Defragmenter()
	var whole *layers.IPv4
	for i := 0; whole == nil; i++ {
		if i == 4 {
			t.Fatal("no reassembly after 4 fragments")
		}
		p := b.recv(t)
		raw := header.IPv4(p.Layer(layers.LayerTypeIPv4).LayerContents())
		wantOpts := []byte{0x94, 4, 0, 0}
		if i == 0 {
			wantOpts = orig.Options()
		}
		if !bytes.Equal(raw.Options(), wantOpts) {
			t.Fatalf("fragment %d options %x, want %x", i, raw.Options(), wantOpts)
		}
		if csum.Fold(csum.Sum(0, raw[:raw.HeaderLen()])) != 0 {
			t.Fatalf("fragment %d header checksum does not verify", i)
		}
		frag := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if int(frag.Length) > a.s.IPMTU() {
			t.Fatalf("fragment %d of %d bytes", i, frag.Length)
		}
		var err error
		if whole, err = defrag.DefragIPv4(frag); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(whole.Payload, orig.Payload()) {
		t.Fatalf("reassembled payload differs (%d bytes, want %d)", len(whole.Payload), len(orig.Payload()))
	}
}

// TestQueuedFramesOfTwoGuests: two guests' frames wait for one
// destination; the first guest's VIF ages out meanwhile. When the
// destination answers, only the second guest's frame is sent, from its
// own QP, and the first is dropped as drop_vif_gone.
func TestQueuedFramesOfTwoGuests(t *testing.T) {
	f := memFab(t, 2048)
	s, _ := stillShim(t, f.Fabric, "fe80::a", func(c *Config) { c.VIFIdle = time.Minute })
	far, _ := f.NewPort(gidOf("fe80::b"))
	qfar, _ := far.AllocQP(0xffff, 0)
	remac := mactrans.DeriveREMAC(far.LocalGID(), qfar, 0)
	b := newTxBatch(2)
	txFrame(s, b, udpFrame(t, macA1, remac, ipA1, ipB1, 64, true))
	s.clk.(interface{ Advance(time.Duration) }).Advance(50 * time.Second)
	txFrame(s, b, udpFrame(t, macA2, remac, ipA2, ipB1, 64, true))
	v2, _ := s.vifs.Lookup(mactrans.VIFKey{MAC: macA2})
	s.ageVIFs(s.clk.Now().Add(20 * time.Second)) // A1 idle 70 s: gone; A2 idle 20 s: kept
	if _, ok := s.vifs.Lookup(mactrans.VIFKey{MAC: macA1}); ok {
		t.Fatal("A1's VIF did not age out")
	}
	rxPacket(s, append([]byte{8, 0, 0, 0}, udpPacket(t, ipB1, ipA2, 10)...),
		ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, qfar, far.LocalGID()), DstQPN: ipoib.MulticastQPN, MGID: s.byVLAN[0].Load().bcast, PKey: 0xffff})
	s.flushResolved()
	got := readAll(t, far, 1)
	if got[0].Src.QPN() != v2.QPN || s.Get(DropVIFGone) != 1 || s.Get(TxForwarded) != 1 {
		t.Fatalf("sent from QPN %#x (A2's %#x); counters %v", got[0].Src.QPN(), v2.QPN, s.Counters())
	}
}
