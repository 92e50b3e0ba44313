package shim

import (
	"net/netip"
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestManyDestinationsResolveInOneBatch: 150 destinations with 3 queued
// frames each resolve in one RX batch, and all 450 frames go out in one
// port Write. On the simulated fabric a Write past 129 packets must not
// panic: that would kill the daemon from the RX goroutine.
func TestManyDestinationsResolveInOneBatch(t *testing.T) {
	f := memFab(t, 4096)
	s, _ := stillShim(t, f.Fabric, "fe80::a", nil)
	far, err := f.NewPort(testutil.GID("fe80::b"))
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
	if got := s.resolver.pending.frames.Load(); got != dsts*per || s.Get(TxQueued) != dsts*per || s.Get(TxResolveSent) != dsts {
		t.Fatalf("queued %d frames (%d), resolutions %d; want %d and %d", got, s.Get(TxQueued), s.Get(TxResolveSent), dsts*per, dsts)
	}
	// One RX batch: a packet from every destination.
	for i, q := range qpns {
		pkt := append([]byte{8, 0, 0, 0}, udpPacket(t, ips[i], ipA1, 10)...)
		if rxPacket(s, pkt, ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, q, far.LocalGID()), DstQPN: vif.QPN, PKey: 0xffff}) == nil {
			t.Fatalf("packet from destination %d dropped: %v", i, s.Counters())
		}
	}
	s.resolver.flush()
	count := make(map[uint32]int)
	for _, m := range readAll(t, far, dsts*per) {
		count[m.DstQPN]++
	}
	for _, q := range qpns {
		if count[q] != per {
			t.Fatalf("QPN %#x got %d frames, want %d", q, count[q], per)
		}
	}
	if s.Get(TxForwarded) != dsts*per || s.Get(TxPackets) != dsts*per+dsts || s.Get(TxPortRefused) != 0 || s.resolver.pending.frames.Load() != 0 {
		t.Fatalf("counters %v", s.Counters())
	}
}

// TestResolverRetriesThenDrops: frames to an unknown REMAC wait, up to
// pendingPerDst. The resolution is an IPoIB ARP request from the guest's
// VIF to the broadcast group, sent at once and retried each
// resolveInterval. Unanswered after resolveTries, the frames are dropped
// as unresolved. Frames to a destination the fabric then teaches are
// sent to its RIMAC.
func TestResolverRetriesThenDrops(t *testing.T) {
	rig := newPartRig(t, "fe80::a")
	neigh := mactrans.NewNeighTable(64)
	var r resolver
	r.init(rig.sh, neigh, newTestGroups(rig), ipoib.ScopeLinkLocal)
	v := rig.vif(t, macA1)
	far := ipoib.MakeHwAddr(0, 0x123, testutil.GID("fe80::b"))
	dst := mactrans.DeriveREMAC(far.GID(), far.QPN(), 0)
	target := netip.MustParseAddr("10.0.0.2")
	pkt := append(make([]byte, ipoib.Headroom), 8, 0, 0, 0)
	for i := range pendingPerDst + 1 {
		if got := r.enqueue(rig.p, v, dst, pkt, ipoib.TxMeta{SrcQPN: v.QPN}, ipA1, target, rig.clk.Now()); got != (i < pendingPerDst) {
			t.Fatalf("frame %d queued %v", i, got)
		}
	}
	if len(rig.sent) != 1 || rig.ctr.c[TxResolveSent].Load() != 1 || rig.ctr.c[TxQueued].Load() != pendingPerDst {
		t.Fatalf("%d packets sent, tx_resolve_sent %d, tx_queued %d; want 1, 1, %d", len(rig.sent), rig.ctr.c[TxResolveSent].Load(), rig.ctr.c[TxQueued].Load(), pendingPerDst)
	}
	arp, m := rig.sent[0][ipoib.Headroom+ipoib.HeaderLen:], rig.meta[0]
	if m.SrcQPN != v.QPN || m.Dst != ipoib.MakeHwAddr(0, ipoib.MulticastQPN, rig.p.bcast) || ipoib.HwAddr(arp[8:28]) != v.LIMAC || netip.AddrFrom4([4]byte(arp[52:56])) != target {
		t.Fatalf("resolution from QPN %#x to %s: sender %x, target %v", m.SrcQPN, m.Dst, arp[8:28], arp[52:56])
	}
	for try := 2; try <= resolveTries+1; try++ {
		r.tick(rig.clk.Now()) // not due yet
		rig.clk.Advance(resolveInterval)
		r.tick(rig.clk.Now())
		if want := min(try, resolveTries); len(rig.sent) != want {
			t.Fatalf("after round %d: %d resolutions sent, want %d", try, len(rig.sent), want)
		}
	}
	if n := rig.ctr.c[DropUnresolved].Load(); n != pendingPerDst || r.pending.frames.Load() != 0 || r.pending.count.Load() != 0 {
		t.Fatalf("drop_unresolved %d, pending %d frames of %d destinations; want %d, 0, 0", n, r.pending.frames.Load(), r.pending.count.Load(), pendingPerDst)
	}
	// Answered: the frames go to the RIMAC the fabric taught.
	r.enqueue(rig.p, v, dst, pkt, ipoib.TxMeta{SrcQPN: v.QPN}, ipA1, target, rig.clk.Now())
	if _, err := neigh.Learn(rig.p.pkey, far, rig.clk.Now()); err != nil {
		t.Fatal(err)
	}
	rig.sent, rig.meta = nil, nil
	r.flush()
	if len(rig.meta) != 1 || rig.meta[0].Dst != far || rig.ctr.c[TxForwarded].Load() != 1 || r.pending.count.Load() != 0 {
		t.Fatalf("after the answer: sent %+v, tx_forwarded %d, pending %d", rig.meta, rig.ctr.c[TxForwarded].Load(), r.pending.count.Load())
	}
}
