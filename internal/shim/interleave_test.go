package shim

// Tests of how the control plane interleaves with the TX workers: each
// drives the interleaving it is about through hooks in the port, not
// sleeps.

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/state"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// hookPort is a memfabric port that runs onWrite before each Write and
// onMTU in each PartitionMTU.
type hookPort struct {
	*memfabric.Port
	onWrite func(meta []ipoib.TxMeta)
	onMTU   func(pkey ipoib.PKey)
}

func (p *hookPort) PartitionMTU(pkey ipoib.PKey) int {
	if p.onMTU != nil {
		p.onMTU(pkey)
	}
	return p.Port.PartitionMTU(pkey)
}

func (p *hookPort) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	if p.onWrite != nil {
		p.onWrite(meta)
	}
	return p.Port.Write(bufs, meta, offset)
}

// hookShim is a still shim on a hookPort of a memfabric f.
func hookShim(t *testing.T) (*Shim, *hookPort, memFabric) {
	f := memFab(t, 2048)
	hp := &hookPort{}
	s, _ := stillShim(t, f.Fabric, "fe80::a", func(c *Config) {
		hp.Port = c.Port.(*memfabric.Port)
		c.Port = hp
	})
	return s, hp, f
}

// TestGroupHeldFramesBeforeVisible: the frames held for a group being
// joined are written while the group is still invisible to the TX
// workers; a worker that saw it could send a newer frame ahead of them.
func TestGroupHeldFramesBeforeVisible(t *testing.T) {
	s, hp, _ := hookShim(t)
	b := newTxBatch(1)
	txFrame(s, b, arpFrame(t, 1, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1)) // A1's VIF
	s.flushTx(b)
	g := netip.AddrFrom4([4]byte{239, 1, 2, 3})
	mgid := ipoib.IPv4MGID(g, 0xffff, s.cfg.Scope)
	const held = 3
	for i := range held {
		txOnly(s, b, udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 1, 2, 3}, ipA1, g, 64+i, false))
	}
	if s.Get(TxQueuedGroup) != held {
		t.Fatalf("%d frames held for the group, want %d (counters %v)", s.Get(TxQueuedGroup), held, s.Counters())
	}
	written, visible := 0, 0
	hp.onWrite = func(meta []ipoib.TxMeta) {
		for _, m := range meta {
			if m.Dst.GID() == mgid {
				written++
				if _, ok := s.groups.set.lookup(mgid); ok {
					visible++
				}
			}
		}
	}
	s.runIntents(nil) // the send-only join
	if written != held || visible != 0 {
		t.Fatalf("%d held frames written, %d of them with the group already visible to the workers; want %d, 0", written, visible, held)
	}
	if _, ok := s.groups.set.lookup(mgid); !ok {
		t.Fatal("the group is not published after its held frames")
	}
}

// TestShutdownWhileVIFMade: a new guest's frames, to a destination not
// resolved yet, are held while its QP is allocated; Run stops meanwhile
// (its TX workers gone, its stopPort queued behind the VIF). Once the QP
// comes, the held frames wait for their resolution: every one of them
// must end in drop_unresolved (beyond the destination's queue bound
// or at the shutdown), none left held and uncounted.
func TestShutdownWhileVIFMade(t *testing.T) {
	a, _, bp, _, _ := slowPair(t, time.Minute)
	unknown := mactrans.DeriveREMAC(testutil.GID("fe80::c"), 0x77, 0)
	bp.slow.Store(true)
	const held = 5
	for i := range held {
		a.dev.Inject(udpFrom(t, macA2, unknown, ipA2, i))
	}
	testutil.WaitFor(t, "A2's QP being allocated", func() bool { return bp.entered.Load() == 1 && a.s.Get(TxQueuedNewVIF) >= held })
	a.stop()
	testutil.WaitFor(t, "stopPort queued", func() bool {
		a.s.ctl.mu.Lock()
		defer a.s.ctl.mu.Unlock()
		return slices.ContainsFunc(a.s.ctl.q, func(it intent) bool { return it.kind == intentCall })
	})
	bp.unblock()
	if err := <-a.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	a.stop = nil
	a.s.resolver.pending.mu.Lock()
	left := len(a.s.resolver.pending.m)
	a.s.resolver.pending.mu.Unlock()
	if c := a.s.Counters(); left != 0 || c["drop_unresolved"] != held || c["tx_queued"] == 0 {
		t.Fatalf("after the shutdown: %d destinations still hold frames; counters %v (want %d dropped unresolved, over the queue's bound or at the shutdown)", left, c, held)
	}
}

// TestNoWorkAfterStop: once stopPort has run, DeclareVIF, AddPartition
// and RestoreGuests are refused with errStopping and allocate no QP and
// join no group, since nothing would free or leave them.
func TestNoWorkAfterStop(t *testing.T) {
	f := memFab(t, 2048)
	s, port := stillShim(t, f.Fabric, "fe80::a", nil)
	if err := s.call(s.stopPort); err != nil {
		t.Fatal(err)
	}
	if err := s.DeclareVIF(macA1, 0, mactrans.OriginDeclared); !errors.Is(err, errStopping) {
		t.Errorf("DeclareVIF after the stop: %v, want %v", err, errStopping)
	}
	if err := s.AddPartition(5, 0x8005); !errors.Is(err, errStopping) {
		t.Errorf("AddPartition after the stop: %v, want %v", err, errStopping)
	}
	if n, _, skipped := s.RestoreGuests([]state.Guest{{MAC: macA2, Origin: mactrans.OriginDeclared}}); n != 0 || len(skipped) != 1 || !errors.Is(skipped[0], errStopping) {
		t.Errorf("RestoreGuests after the stop: %d restored, skipped %v", n, skipped)
	}
	if port.Joined(ipoib.BroadcastMGID(0x8005, s.cfg.Scope)) || s.vifs.Len() != 0 || s.byVLAN[5].Load() != nil {
		t.Errorf("after the refused calls: VLAN 5's group joined %v, %d VIFs, VLAN 5 mapped %v", port.Joined(ipoib.BroadcastMGID(0x8005, s.cfg.Scope)), s.vifs.Len(), s.byVLAN[5].Load() != nil)
	}
}

// TestPartitionMTUEventWhileAdded: a port MTU event of a partition being
// added, sent while AddPartition reads the partition's MTU (so after the
// read), is applied to the partition once published, not lost because
// the partition was not visible yet. The hook waits (bounded) for the
// event to be applied, as it would be without the ordering.
func TestPartitionMTUEventWhileAdded(t *testing.T) {
	s, hp, _ := hookShim(t)
	const pkey, small = ipoib.PKey(0x8005), 1500
	var events sync.WaitGroup
	hp.onMTU = func(k ipoib.PKey) {
		if k.Full() != pkey {
			return
		}
		done := make(chan struct{})
		events.Add(1)
		go func() {
			defer events.Done()
			defer close(done)
			s.applyEvent(ipoib.Event{Kind: ipoib.EventPartitionMTU, PKey: pkey, MTU: small})
		}()
		select { // the event applied, or waiting for the partition
		case <-done:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := s.AddPartition(5, pkey); err != nil {
		t.Fatal(err)
	}
	events.Wait()
	if got, want := s.byVLAN[5].Load().mtu(), small-ipoib.HeaderLen; got != want {
		t.Fatalf("VLAN 5's IPoIB MTU %d after an MTU event sent during AddPartition, want %d", got, want)
	}
}

// TestMACFloodTakesNoLock: a frame of a guest in its refusal back-off is
// dropped and counted without taking newGuests.mu. So is one of a new
// guest while the VIF table is full (no guest pending). Otherwise a MAC
// flood would make every TX worker queue on that lock. The test holds
// the lock while it sends them.
func TestMACFloodTakesNoLock(t *testing.T) {
	f := memFab(t, 2048)
	s, _ := stillShim(t, f.Fabric, "fe80::a", func(c *Config) { c.MaxVIFs = 1 })
	remac := knownRemote(t, s, f)
	if _, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, s.clk.Now()); err != nil {
		t.Fatal(err)
	}
	s.refuseVIF(mactrans.VIFKey{MAC: macA2}, &ipoib.RefusedError{Reason: "no_qp"}, s.clk.Now())
	s.newVIFs.mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := newTxBatch(1)
		for _, src := range []ether.MAC{macA2, {0x02, 0xf1, 0, 0, 0, 1}} {
			txOnly(s, b, udpFrom(t, src, remac, ipA2, 0))
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.newVIFs.mu.Unlock()
		<-done
		t.Fatal("the TX path waited for newGuests.mu to drop a refused guest's and a full table's frames")
	}
	s.newVIFs.mu.Unlock()
	if s.Get(DropVIFRefused) != 1 || s.Get(DropVIFLimit) != 1 || len(s.ctl.q) != 0 {
		t.Fatalf("counters %v, %d intents; want one drop_vif_refused, one drop_vif_limit, no intent", s.Counters(), len(s.ctl.q))
	}
}

// knownRemote makes a remote endpoint on f known to s and returns its
// REMAC.
func knownRemote(t *testing.T, s *Shim, f memFabric) ether.MAC {
	t.Helper()
	far, err := f.NewPort(testutil.GID("fe80::b"))
	if err != nil {
		t.Fatal(err)
	}
	q, _ := far.AllocQP(0xffff, 0)
	nb, err := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, q, far.LocalGID()), s.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return nb.REMAC
}

// txOnly runs frame through the TX path of a still shim, without playing
// the control goroutine (txFrame does).
func txOnly(s *Shim, b *txBatch, frame []byte) {
	buf := make([]byte, devBufSize)
	copy(buf[devHeadroom:], frame)
	s.tx(b, buf, len(frame), tap.Super{}, s.clk.Now())
}
