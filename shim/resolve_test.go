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
// port Write. On the simulated fabric that Write used to panic past 129
// packets, killing the daemon from the RX goroutine.
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
