package shim

import (
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestAgingWaitsForBatch: a VIF's QP is not freed while a batch may be
// sending from it; once the batch is done, aging frees it and the port
// refuses the QPN. Queued frames of a VIF that aged out are dropped as
// drop_vif_gone, never sent from the freed QP.
func TestAgingWaitsForBatch(t *testing.T) {
	f := memFab(t, 2048)
	s, port := stillShim(t, f.Fabric, "fe80::a", func(c *Config) { c.VIFIdle = time.Minute })
	far, _ := f.NewPort(testutil.GID("fe80::b"))
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
	if s.resolver.pending.frames.Load() != 1 {
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
	s.resolver.flush()
	if s.Get(DropVIFGone) != 1 || s.Get(TxForwarded) != 0 || port.Counters().Drops[ipoib.DropBadMeta.String()] != 1 {
		t.Fatalf("queued frame of an aged VIF: %v, port %+v", s.Counters(), port.Counters())
	}
}

// TestQueuedFramesOfTwoGuests: two guests' frames wait for one
// destination; the first guest's VIF ages out meanwhile. When the
// destination answers, only the second guest's frame is sent, from its
// own QP, and the first is dropped as drop_vif_gone.
func TestQueuedFramesOfTwoGuests(t *testing.T) {
	f := memFab(t, 2048)
	s, _ := stillShim(t, f.Fabric, "fe80::a", func(c *Config) { c.VIFIdle = time.Minute })
	far, _ := f.NewPort(testutil.GID("fe80::b"))
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
	s.resolver.flush()
	got := readAll(t, far, 1)
	if got[0].Src.QPN() != v2.QPN || s.Get(DropVIFGone) != 1 || s.Get(TxForwarded) != 1 {
		t.Fatalf("sent from QPN %#x (A2's %#x); counters %v", got[0].Src.QPN(), v2.QPN, s.Counters())
	}
}
