package shim

// The control plane off the data path: a port whose control
// calls take seconds, or refuse, must not stop or slow other guests'
// traffic, nor housekeeping.

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// blockingPort is a memfabric port whose AllocQP, FreeQP, Join,
// JoinSendOnly and Leave each block while slow is set (as a kernel IPoIB
// child or an SA join does on real hardware), and refuse with a named
// reason when told to. A call blocks for delay, or, with delay 0, until
// the test lets it go (next).
type blockingPort struct {
	*memfabric.Port
	delay                   time.Duration
	slow                    atomic.Bool
	refuseAlloc, refuseJoin atomic.Bool
	step                    chan struct{} // a send lets one held call go
	release                 chan struct{} // closed (unblock): no call blocks any more
	once                    sync.Once
	allocs, joins, sendOnly atomic.Int32 // calls made while slow
	leaves, frees           atomic.Int32 // calls made while slow
	entered                 atomic.Int32 // calls that began blocking
}

// unblock ends every wait, now and to come.
func (p *blockingPort) unblock() { p.once.Do(func() { close(p.release) }) }

// block waits while the port is slow and says whether it was.
func (p *blockingPort) block() bool {
	if !p.slow.Load() {
		return false
	}
	p.entered.Add(1)
	var timeout <-chan time.Time // nil, with delay 0: held until let go
	if p.delay > 0 {
		timeout = time.After(p.delay)
	}
	select {
	case <-timeout:
	case <-p.step:
	case <-p.release:
	}
	return true
}

// heldCall waits until control call n (from 1) blocks, or until done.
// While the call is held, A1 sends heldPings frames, each of which must
// arrive in order, and a housekeeping round must run; then the call is
// let go. It returns A1's next seq, and false if done came first.
func (p *blockingPort) heldCall(t *testing.T, a *hv, first <-chan int, remacB1 ether.MAC, n int32, seq int, lat *[]time.Duration, done func() bool) (int, bool) {
	t.Helper()
	testutil.WaitFor(t, "a control call blocking", func() bool { return p.entered.Load() >= n || done() })
	if p.entered.Load() < n {
		return seq, false
	}
	round := a.s.lastRound.Load()
	for range heldPings {
		*lat = append(*lat, pingA1(t, a, first, remacB1, seq))
		seq++
	}
	testutil.WaitFor(t, "a housekeeping round while a control call is held", func() bool { return a.s.lastRound.Load() != round })
	select {
	case p.step <- struct{}{}:
	case <-time.After(testutil.Settle):
		t.Fatalf("control call %d never took its release", n)
	}
	return seq, true
}

// heldPings is how many of A1's frames cross while each call is held.
const heldPings = 20

func (p *blockingPort) AllocQP(pkey ipoib.PKey, hint uint32) (uint32, error) {
	if p.block() {
		p.allocs.Add(1)
	}
	if p.refuseAlloc.Load() {
		return 0, &ipoib.RefusedError{Reason: "no_qp", Err: errors.New("the device has no QP left")}
	}
	return p.Port.AllocQP(pkey, hint)
}

func (p *blockingPort) FreeQP(qpn uint32) error {
	if p.block() {
		p.frees.Add(1)
	}
	return p.Port.FreeQP(qpn)
}

func (p *blockingPort) Join(mgid ipoib.GID) error {
	if p.block() {
		p.joins.Add(1)
	}
	if p.refuseJoin.Load() {
		return &ipoib.RefusedError{Reason: "sa_refused", Err: errors.New("the SA refused the join")}
	}
	return p.Port.Join(mgid)
}

func (p *blockingPort) JoinSendOnly(mgid ipoib.GID) error {
	if p.block() {
		p.sendOnly.Add(1)
	}
	if p.refuseJoin.Load() {
		return &ipoib.RefusedError{Reason: "sa_refused", Err: errors.New("the SA refused the join")}
	}
	return p.Port.JoinSendOnly(mgid)
}

func (p *blockingPort) Leave(mgid ipoib.GID) error {
	if p.block() {
		p.leaves.Add(1)
	}
	return p.Port.Leave(mgid)
}

// slowPair is hypervisor a on a blockingPort (housekeeping at the default
// period, 250 ms)
// and b on a plain one, guests A1 and B1 knowing each other; a's port is
// not slow yet.
func slowPair(t *testing.T, delay time.Duration) (a, b *hv, bp *blockingPort, remacA1, remacB1 ether.MAC) {
	f := memFab(t, 2048)
	bp = &blockingPort{delay: delay, step: make(chan struct{}), release: make(chan struct{})}
	a = newHV(t, f, "fe80::a", func(c *Config) {
		bp.Port = c.Port.(*memfabric.Port)
		c.Port = bp
		c.Housekeeping = 250 * time.Millisecond
	})
	b = newHV(t, f, "fe80::b", nil)
	t.Cleanup(func() { bp.slow.Store(false); bp.unblock() }) // before the shutdowns
	remacA1, remacB1 = arpExchange(t, a, b)
	return a, b, bp, remacA1, remacB1
}

// seqMod bounds the sequence numbers frames carry, to fit the IPoIB MTU.
const seqMod = 1000

// udpFrom is frame number seq of a UDP flow from src to dst; its payload
// is seq%seqMod+1 bytes long, so the receiver can tell the frames' order.
func udpFrom(t *testing.T, src, dst ether.MAC, sip netip.Addr, seq int) []byte {
	return udpFrame(t, src, dst, sip, ipB1, seq%seqMod+1, true)
}

// receiver sorts the UDP frames b's guests get: those from from (A1's
// REMAC) go to first, the others to rest.
func receiver(t *testing.T, b *hv, from ether.MAC) (first, rest chan int, stop func()) {
	first, rest = make(chan int, 1024), make(chan int, 1024)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-quit:
				return
			case f := <-b.dev.Sent():
				if len(f) < 14+20+8 || ether.Frame(f).EtherType() != ether.TypeIPv4 || f[14+9] != 17 {
					continue // queries, ARP
				}
				seq := len(f) - 14 - 20 - 8 - 1
				if ether.MAC(f[6:12]) == from {
					first <- seq
				} else {
					rest <- seq
				}
			}
		}
	}()
	return first, rest, func() { close(quit); wg.Wait() }
}

// pingA1 sends A1's frame seq and waits for it on b; it returns the
// latency (for the log) and fails on a loss or a frame out of order.
func pingA1(t *testing.T, a *hv, got <-chan int, remacB1 ether.MAC, seq int) time.Duration {
	t.Helper()
	start := time.Now()
	a.dev.Inject(udpFrom(t, macA1, remacB1, ipA1, seq))
	select {
	case n := <-got:
		if n != seq%seqMod {
			t.Fatalf("A1's frame %d arrived when %d was sent", n, seq%seqMod)
		}
	case <-time.After(testutil.Settle):
		t.Fatalf("A1's frame %d lost (counters %v)", seq, a.s.Counters())
	}
	return time.Since(start)
}

// latencies summarises round trips for the log.
func latencies(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return "median " + s[len(s)/2].String() + ", max " + s[len(s)-1].String()
}

// TestSlowControlPlane: with AllocQP, Join and JoinSendOnly each held
// until the test lets them go, a new guest appears and joins a group
// while guest A1 keeps sending. While each call is held, A1's frames all
// arrive, in order, and housekeeping goes on (a round runs). The new
// guest's frames, held while its VIF was made, go out once it is ready:
// all of them, in order, none before its QP is allocated. Its report's
// send-only join is made once.
func TestSlowControlPlane(t *testing.T) {
	a, b, bp, remacA1, remacB1 := slowPair(t, 0)
	first, rest, stopRecv := receiver(t, b, remacA1)
	defer stopRecv()
	var before, during []time.Duration
	seq := 0
	for range 50 {
		before = append(before, pingA1(t, a, first, remacB1, seq))
		seq++
	}

	bp.slow.Store(true)
	queued := a.s.Get(TxQueuedNewVIF) // A1's first ARP, held while its VIF was made
	const held = 5
	for i := range held {
		a.dev.Inject(udpFrom(t, macA2, remacB1, ipA2, i))
	}
	g := netip.MustParseAddr("239.5.5.5")
	a.dev.Inject(igmpReport(t, macA2, 4, g))
	mgid := ipoib.IPv4MGID(g, 0xffff, 2)
	// The new guest's frames are taken as they come: one that comes
	// before its AllocQP returned went out before its VIF was made
	// (blockingPort counts the call once it returns, before the shim can
	// use the QP).
	var got []int
	take := func(n int) {
		if bp.allocs.Load() == 0 {
			t.Fatalf("the new guest's frame %d went out before its QP was allocated", n)
		}
		got = append(got, n)
	}
	ready := func() bool { return a.port.Joined(mgid) && bp.sendOnly.Load() == 1 }
	for n := int32(1); ; n++ {
		var ok bool
		if seq, ok = bp.heldCall(t, a, first, remacB1, n, seq, &during, ready); !ok {
			break
		}
		for drained := false; !drained; {
			select {
			case n := <-rest:
				take(n)
			default:
				drained = true
			}
		}
	}
	for len(got) < held {
		select {
		case n := <-rest:
			take(n)
		case <-time.After(testutil.Settle):
			t.Fatalf("the new guest's frame %d never arrived (counters %v)", len(got), a.s.Counters())
		}
	}
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("the new guest's frames arrived as %v, want 0 to %d in order", got, held-1)
	}
	select {
	case n := <-rest:
		t.Fatalf("an extra frame %d from the new guest", n)
	case <-time.After(100 * time.Millisecond):
	}
	t.Logf("A1 round trips: %d before (%s), %d while control calls were held (%s)", len(before), latencies(before), len(during), latencies(during))
	// One AllocQP for the new guest, one Join for its group, and one
	// send-only join for 224.0.0.22, where its IGMPv3 report goes.
	if bp.allocs.Load() != 1 || bp.joins.Load() != 1 || bp.sendOnly.Load() != 1 || bp.entered.Load() != 3 {
		t.Errorf("slow calls: %d AllocQP, %d Join, %d JoinSendOnly of %d; want 1 each of 3", bp.allocs.Load(), bp.joins.Load(), bp.sendOnly.Load(), bp.entered.Load())
	}
	c := a.s.Counters()
	if c["tx_queued_new_vif"]-queued != held+1 || c["vifs_created"] != 2 || c["mcast_joins"] != 1 || c["vifs_pending"] != 0 || c["drop_vif_pending_full"] != 0 {
		t.Errorf("counters: %v", c)
	}
}

// TestSlowLeaveAndFree: with Leave and FreeQP each held until the test
// lets them go, a guest leaves its group and is removed (as when the
// bridge forgets its port) while guest A1 keeps sending. While each call
// is held, A1's frames all arrive, in order, and housekeeping goes on.
// The group is left and the QP freed once each, after which the guest's
// VIF and group are gone.
func TestSlowLeaveAndFree(t *testing.T) {
	a, b, bp, remacA1, remacB1 := slowPair(t, 0)
	first, rest, stopRecv := receiver(t, b, remacA1)
	defer stopRecv()
	g := netip.MustParseAddr("239.7.7.7")
	mgid := ipoib.IPv4MGID(g, 0xffff, 2)
	a.dev.Inject(udpFrom(t, macA2, remacB1, ipA2, 0))
	a.dev.Inject(igmpReport(t, macA2, 4, g)) // CHANGE_TO_EXCLUDE {}: a join
	select {
	case <-rest:
	case <-time.After(testutil.Settle):
		t.Fatalf("A2's frame never arrived (counters %v)", a.s.Counters())
	}
	testutil.WaitFor(t, "A2's group joined", func() bool { return a.port.Joined(mgid) })

	// The start-up general queries (IGMP and MLD, one partition) come
	// from the housekeeping goroutine whenever it first runs; the clock
	// stands still, so no other general query follows. Waiting for them
	// first makes the next query the group-specific one, however the
	// goroutines were scheduled.
	const startupQueries = 2
	a.waitCounter(t, TxQueries, startupQueries)
	bp.slow.Store(true)
	a.dev.Inject(igmpReport(t, macA2, 3, g))             // CHANGE_TO_INCLUDE {}: a leave
	a.waitCounter(t, TxQueries, startupQueries+1)        // the group-specific query
	a.clk.Advance(a.s.groups.snoop.Timers().LeaveTime()) // no answer: the group goes
	removed := make(chan error, 1)
	go func() {
		_, err := a.s.RemoveVIF(macA2, 0, mactrans.OriginDeclared)
		removed <- err
	}()
	var removeErr error
	isRemoved := func() bool {
		select {
		case removeErr = <-removed:
			removed <- removeErr // keep it for the next look
			return true
		default:
			return false
		}
	}
	gone := func() bool { return isRemoved() && !a.port.Joined(mgid) }
	var during []time.Duration
	seq := 0
	for n := int32(1); ; n++ {
		var ok bool
		if seq, ok = bp.heldCall(t, a, first, remacB1, n, seq, &during, gone); !ok {
			break
		}
	}
	if removeErr != nil {
		t.Fatal(removeErr)
	}
	t.Logf("A1: %d frames while control calls were held (%s)", len(during), latencies(during))
	if bp.leaves.Load() != 1 || bp.frees.Load() != 1 || bp.entered.Load() != 2 {
		t.Errorf("slow calls: %d Leave, %d FreeQP of %d; want 1 each of 2", bp.leaves.Load(), bp.frees.Load(), bp.entered.Load())
	}
	c := a.s.Counters()
	if c["mcast_leaves"] != 1 || c["vifs_removed"] != 1 || c["vifs"] != 1 {
		t.Errorf("counters: %v", c)
	}
}

// TestRefusedQP: a port that refuses AllocQP (reason "no_qp") refuses the
// new guest: its frames are dropped and counted, the refusal counted by
// reason, one AllocQP for a flood of frames (the back-off); A1's traffic
// goes on. After the back-off the guest is tried again.
func TestRefusedQP(t *testing.T) {
	a, b, bp, remacA1, remacB1 := slowPair(t, 200*time.Millisecond)
	first, rest, stopRecv := receiver(t, b, remacA1)
	defer stopRecv()
	bp.slow.Store(true)
	bp.refuseAlloc.Store(true)
	const flood = 10
	for i := range flood {
		a.dev.Inject(udpFrom(t, macA2, remacB1, ipA2, i))
	}
	for seq := range 20 {
		pingA1(t, a, first, remacB1, seq)
	}
	a.waitCounter(t, DropVIFRefused, flood)
	// The flood came while the one AllocQP blocked, so the pending queue
	// took it all: the back-off is seen by a frame that comes after the
	// refusal, the clock still at the refusal's time. It is dropped
	// without a second AllocQP.
	a.dev.Inject(udpFrom(t, macA2, remacB1, ipA2, flood))
	a.waitCounter(t, DropVIFRefused, flood+1)
	c := a.s.Counters()
	if c["vifs_refused_no_qp"] != 1 || bp.allocs.Load() != 1 || c["vifs"] != 1 || c["vifs_pending"] != 0 || c["drop_vif_refused"] != flood+1 {
		t.Fatalf("after the refusal: %d AllocQP calls, counters %v", bp.allocs.Load(), c)
	}
	select {
	case n := <-rest:
		t.Fatalf("frame %d of the refused guest was sent", n)
	default:
	}
	// The back-off over (the control round forgets the refusal), the
	// port gives QPs again: the guest's next frame makes its VIF.
	bp.refuseAlloc.Store(false)
	bp.slow.Store(false)
	a.clk.Advance(vifRefusedFor)
	testutil.WaitFor(t, "the refusal forgotten", func() bool {
		return len(*a.s.newVIFs.refused.Load()) == 0
	})
	a.dev.Inject(udpFrom(t, macA2, remacB1, ipA2, 0))
	select {
	case n := <-rest:
		if n != 0 {
			t.Fatalf("frame %d, want 0", n)
		}
	case <-time.After(testutil.Settle):
		t.Fatalf("the guest was not tried again (counters %v)", a.s.Counters())
	}
}

// TestRefusedJoin: a port that refuses joins (reason "sa_refused"): the
// snooped group is refused and forgotten by the snooping table, the
// report's own send-only join too (the report dropped and counted), both
// counted by reason; A1's traffic goes on.
func TestRefusedJoin(t *testing.T) {
	a, b, bp, remacA1, remacB1 := slowPair(t, 200*time.Millisecond)
	first, _, stopRecv := receiver(t, b, remacA1)
	defer stopRecv()
	bp.slow.Store(true)
	bp.refuseJoin.Store(true)
	g := netip.MustParseAddr("239.6.6.6")
	a.dev.Inject(igmpReport(t, macA1, 4, g))
	for seq := range 20 {
		pingA1(t, a, first, remacB1, seq)
	}
	testutil.WaitFor(t, "both joins refused", func() bool { return a.s.Counters()["groups_refused_sa_refused"] == 2 })
	c := a.s.Counters()
	if a.port.Joined(ipoib.IPv4MGID(g, 0xffff, 2)) || c["snooped_groups"] != 0 || c["snooped_groups_join_failed"] != 1 || c["drop_no_group"] != 1 || c["mcast_joins"] != 0 {
		t.Fatalf("after the refused joins: counters %v", c)
	}
	if bp.joins.Load() != 1 || bp.sendOnly.Load() != 1 {
		t.Fatalf("%d joins, %d send-only joins; want 1 each", bp.joins.Load(), bp.sendOnly.Load())
	}
}

// TestHeldWhileMadeReady: a frame of a guest whose VIF is published but
// not ready yet (its held frames being sent) is held too. That holds
// even with the VIF table at its bound, with no second request for the
// VIF. The frame goes out when the VIF is made ready.
func TestHeldWhileMadeReady(t *testing.T) {
	f := memFab(t, 2048)
	s, port := stillShim(t, f.Fabric, "fe80::a", func(c *Config) { c.MaxVIFs = 1 })
	far, _ := f.NewPort(testutil.GID("fe80::b"))
	qfar, _ := far.AllocQP(0xffff, 0)
	nb, err := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, qfar, far.LocalGID()), s.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	p := s.byVLAN[0].Load()
	k := mactrans.VIFKey{MAC: macA1}
	if err := s.vifs.Reserve(k); err != nil {
		t.Fatal(err)
	}
	qpn, _ := port.AllocQP(0xffff, 0)
	v := s.vifs.NewVIF(k, 0xffff, qpn, mactrans.OriginLearned, s.clk.Now())
	s.vifs.Publish(v)
	b := newTxBatch(1)
	buf := make([]byte, devBufSize)
	frame := udpFrom(t, macA1, nb.REMAC, ipA1, 7)
	copy(buf[devHeadroom:], frame)
	s.tx(b, buf, len(frame), tap.Super{}, s.clk.Now())
	if len(b.bufs) != 0 || s.Get(TxQueuedNewVIF) != 1 || s.Get(DropVIFLimit) != 0 || len(s.ctl.q) != 0 {
		t.Fatalf("frame of a VIF being made ready: %d sent, %d intents, counters %v", len(b.bufs), len(s.ctl.q), s.Counters())
	}
	s.readyVIF(p, v, s.clk.Now())
	got := readAll(t, far, 1)
	if !v.Ready() || got[0].Src.QPN() != qpn || s.Get(TxForwarded) != 1 || s.Counters()["vifs_pending"] != 0 {
		t.Fatalf("after readyVIF: ready %v, sent from %#x, counters %v", v.Ready(), got[0].Src.QPN(), s.Counters())
	}
}

// TestHeldPacketsKeepTailRoom: packets held for a resolution or a group's
// join keep the room after them that the simulated fabric writes its pad
// and ICRC into, as read ones do (without it, the port must copy each
// packet to send it).
func TestHeldPacketsKeepTailRoom(t *testing.T) {
	f := memFab(t, 2048)
	s, _ := stillShim(t, f.Fabric, "fe80::a", nil)
	b := newTxBatch(1)
	txFrame(s, b, arpFrame(t, 1, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1)) // A1's VIF
	remac := mactrans.DeriveREMAC(testutil.GID("fe80::b"), 0x77, 0)
	send := func(frame []byte) {
		buf := make([]byte, devBufSize)
		copy(buf[devHeadroom:], frame)
		s.tx(b, buf, len(frame), tap.Super{}, s.clk.Now())
	}
	send(udpFrame(t, macA1, remac, ipA1, ipB1, 64, true))                                                             // to be resolved
	send(udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 1, 2, 3}, ipA1, netip.AddrFrom4([4]byte{239, 1, 2, 3}), 64, false)) // to a group being joined
	var held []heldFrame
	for _, e := range s.resolver.pending.m {
		held = append(held, e.frames...)
	}
	for _, h := range s.groups.wait.m {
		held = append(held, *h...)
	}
	if len(held) != 2 {
		t.Fatalf("%d packets held, want 2 (counters %v)", len(held), s.Counters())
	}
	for _, h := range held {
		if room := cap(h.buf) - len(h.buf); room < simfabric.TailRoom {
			t.Errorf("a held packet has %d bytes after it, the simulated fabric needs %d", room, simfabric.TailRoom)
		}
	}
}

// TestHeldFramesOneWrite: a new guest's held frames go to the port in one
// write once its VIF is made, not one write each.
func TestHeldFramesOneWrite(t *testing.T) {
	s, hp, f := hookShim(t)
	remac := knownRemote(t, s, f)
	b := newTxBatch(1)
	const held = 4
	for i := range held {
		txOnly(s, b, udpFrom(t, macA1, remac, ipA1, i))
	}
	var writes []int
	hp.onWrite = func(meta []ipoib.TxMeta) { writes = append(writes, len(meta)) }
	s.runIntents(nil) // the VIF made, its held frames sent
	if !slices.Equal(writes, []int{held}) || s.Get(TxForwarded) != held {
		t.Fatalf("writes of %v packets, counters %v; want one write of %d", writes, s.Counters(), held)
	}
}
