package verbsfabric

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/parked"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// The tests of the control side's ordering and locking: each drives the
// port through the fake SA into an interleaving it must survive.

// otherGroup is a group of partition 0xFFFF no test has joined.
var otherGroup = testutil.GID("ff12:401b:ffff::506:708")

// holdJoins makes sa's next join wait until the returned release is
// called; entered is closed once it waits. release is also called at
// the test's end.
func holdJoins(t *testing.T, sa *fakeSA) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once, rel sync.Once
	sa.mu.Lock()
	sa.joinHook = func(joinReq) {
		once.Do(func() {
			close(in)
			<-out
		})
	}
	sa.mu.Unlock()
	release = func() { rel.Do(func() { close(out) }) }
	t.Cleanup(release)
	return in, release
}

// memberOf is p's SA membership of mgid (nil: none).
func memberOf(p *Port, mgid ipoib.GID) *member {
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	if m := p.members[mgid]; m != nil {
		c := *m
		return &c
	}
	return nil
}

// readyAH reports p's address handle of key made.
func readyAH(p *Port, key ahKey) bool {
	e := p.ahs.get(key)
	return e != nil && e.ready
}

// TestJoinDoesNotStallReceive: while a Join waits for the SA (held by
// the fake), a packet to a group the port already joined is received:
// the SA call holds no lock the receive path (take) needs.
func TestJoinDoesNotStallReceive(t *testing.T) {
	n, q1, _, g := groupSetup(t, newSM())
	entered, release := holdJoins(t, n.s2)
	joined := make(chan error, 1)
	go func() { joined <- n.p2.Join(otherGroup) }()
	<-entered
	pkt := send(t, n.p1, q1, 0xffff, ipoib.MakeHwAddr(0, ipoib.MulticastQPN, g), 100, 9)
	data, m := readN(t, n.p2, 1)
	if !bytes.Equal(data[0], pkt) || m[0].MGID != g {
		t.Fatalf("received %+v", m[0])
	}
	release()
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
}

// TestMulticastErrorWhileDownWaitsForActive: a MULTICAST_ERROR that
// comes with PORT_ERR (mcast_event_handler reports it to every member)
// is not rejoined while the port is down, and the membership is
// rejoined, with its group QP attached to the new MLID, on
// PORT_ACTIVE.
func TestMulticastErrorWhileDownWaitsForActive(t *testing.T) {
	sm := newSM()
	n, _, _, g := groupSetup(t, sm)
	gq := groupQPOf(n.p1, 0xffff)
	joins := loseWhileDown(t, n, g, gq)
	n.p1.retryRejoins() // what the resolver's ticker does
	if asked := joinsSince(n.s1, joins); asked != 0 {
		t.Fatalf("%d joins while the port was down", asked)
	}
	n.d1.raise(eventPortActive)
	testutil.WaitFor(t, "the rejoin on PORT_ACTIVE", func() bool {
		m := memberOf(n.p1, g)
		joined, so := n.s1.member(g)
		l, ok := n.d1.attachedMLID(g, gq)
		return m != nil && !m.lost && joined && !so && ok && l == m.mlid
	})
}

// loseWhileDown takes n.p1's port down and raises the MULTICAST_ERROR
// of PORT_ERR, and waits until its membership of g is lost with group
// QP gq kept; it returns how many joins n.s1 had been asked before.
func loseWhileDown(t *testing.T, n ibNet, g ipoib.GID, gq uint32) int {
	t.Helper()
	n.d1.raise(eventPortDown)
	testutil.WaitFor(t, "the port down", n.p1.IsDown)
	joins := joinsSince(n.s1, 0)
	n.s1.portErr()
	testutil.WaitFor(t, "the membership marked lost", func() bool {
		m := memberOf(n.p1, g)
		return m != nil && m.lost && m.qp == gq
	})
	return joins
}

// joinsSince is how many joins sa was asked after the first n.
func joinsSince(sa *fakeSA, n int) int {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	return len(sa.joined) - n
}

// TestLostMembershipNotJoinedWhileDown: while the port is down, a lost
// membership is joined neither by the resolver making a group's address
// handle (its send-only join) nor by a Join of the group. Both are
// refused with reason port_down, and the SA is asked nothing. The
// membership stays lost with its group QP for PORT_ACTIVE's flush. A
// handle request queued before the MULTICAST_ERROR and run after it must
// not join it as a full member.
func TestLostMembershipNotJoinedWhileDown(t *testing.T) {
	n, _, _, g := groupSetup(t, newSM())
	gq := groupQPOf(n.p1, 0xffff)
	joins := loseWhileDown(t, n, g, gq)
	_, ahErr := n.p1.makeAH(ahKey{g, 0xffff})
	joinErr := n.p1.Join(g)
	for what, err := range map[string]error{"makeAH": ahErr, "Join": joinErr} {
		var re *ipoib.RefusedError
		if !errors.As(err, &re) || re.Reason != "port_down" {
			t.Errorf("%s while down: %v, want a RefusedError port_down", what, err)
		}
	}
	if asked := joinsSince(n.s1, joins); asked != 0 {
		t.Fatalf("%d joins while the port was down", asked)
	}
	if m := memberOf(n.p1, g); m == nil || !m.lost || m.qp != gq {
		t.Fatalf("membership %+v, want lost with group QP %#x", m, gq)
	}
}

// TestSendOnlyKeepsLostFullMembership: a full membership whose rejoin
// failed is not replaced by the send-only join a guest's packet makes:
// the port rejoins as a full member and attaches its group QP again,
// and the group's packets reach it.
func TestSendOnlyKeepsLostFullMembership(t *testing.T) {
	sm := newSM()
	n, q1, q2, g := groupSetup(t, sm)
	gq := groupQPOf(n.p1, 0xffff)
	n.s1.mu.Lock()
	n.s1.refuse = &saSilence
	n.s1.mu.Unlock()
	sm.dropGroup(g)
	testutil.WaitFor(t, "the failed rejoin", func() bool {
		m := memberOf(n.p1, g)
		return m != nil && m.lost
	})
	n.s1.mu.Lock()
	n.s1.refuse = nil
	n.s1.mu.Unlock()
	n.p1.flushAHs(func(k ahKey) bool { return k.gid == g }) // the guest's packet needs a new handle
	send(t, n.p1, q1, 0xffff, ipoib.MakeHwAddr(0, ipoib.MulticastQPN, g), 100, 4)
	m := memberOf(n.p1, g)
	if m == nil || m.lost || m.sendOnly || m.qp != gq {
		t.Fatalf("membership %+v, want full with group QP %#x", m, gq)
	}
	if joined, so := n.s1.member(g); !joined || so {
		t.Fatalf("SA member %v, send-only %v", joined, so)
	}
	if l, ok := n.d1.attachedMLID(g, gq); !ok || l != m.mlid {
		t.Fatalf("group QP attached %v with MLID %#x, want %#x", ok, l, m.mlid)
	}
	pkt := send(t, n.p2, q2, 0xffff, ipoib.MakeHwAddr(0, ipoib.MulticastQPN, g), 120, 5)
	if data, meta := readN(t, n.p1, 1); !bytes.Equal(data[0], pkt) || meta[0].MGID != g {
		t.Fatalf("received %+v", meta[0])
	}
}

// TestFlushDropsHandlesMadeBeforeRejoin: a group's address handle made
// while a flush (LID_CHANGE) is under way, before the group is rejoined
// (from the old membership: its MLID), does not survive the flush. The
// fake SA's join hook stands in for the resolver, which cannot be
// scheduled into that window deterministically: during the rejoin it
// caches the handle the resolver would have made from the old
// membership. (A LID change alone raises no MULTICAST_ERROR in the
// fake, whose handling would drop the handle too.)
func TestFlushDropsHandlesMadeBeforeRejoin(t *testing.T) {
	sm := newSM()
	n, _, _, g := groupSetup(t, sm)
	testutil.WaitFor(t, "the group's handle", func() bool { return readyAH(n.p1, ahKey{g, 0xffff}) })
	old := memberOf(n.p1, g)
	key := ahKey{g, 0xffff}
	var stale atomic.Uint64
	var once sync.Once
	n.s1.mu.Lock()
	n.s1.joinHook = func(r joinReq) {
		if r.mgid != g {
			return
		}
		once.Do(func() {
			h, _ := n.d1.createAH(path{gid: g, global: true, dlid: old.mlid, sl: old.sl})
			stale.Store(uint64(h))
			n.p1.ahMu.Lock()
			n.p1.ahs.set(key, &ahEntry{h: h, ready: true})
			n.p1.ahMu.Unlock()
		})
	}
	n.s1.mu.Unlock()
	n.d1.raise(eventLIDChange)
	testutil.WaitFor(t, "the flush to drop the stale handle", func() bool {
		m := memberOf(n.p1, g)
		if m == nil || m.lost || stale.Load() == 0 {
			return false
		}
		e := n.p1.ahs.get(key)
		return e == nil || uint64(e.h) != stale.Load()
	})
}

// TestEvictionWaitsForQueuedSends: an address handle evicted from a full
// cache while a send on it is not complete is destroyed only once its
// completion is reaped. The fake counts a handle destroyed with a send
// outstanding, as rxe would use it when the send runs.
func TestEvictionWaitsForQueuedSends(t *testing.T) {
	l := newLink(t)
	send(t, l.p1, l.q1, 0xffff, ipoib.MakeHwAddr(0, l.q2, gid2), 100, 1)
	p := l.p1
	victim := p.ahs.get(ahKey{gid2, 0xffff})
	if victim == nil || !victim.ready {
		t.Fatal("no handle to gid2")
	}
	// The cache fills with handles used since the hand last passed;
	// gid2's was not (the hand cleared its bit): it is the one to go.
	p.ahMu.Lock()
	for i := 0; p.ahs.n.Load() < ahMax; i++ {
		var g ipoib.GID
		g[0], g[1], g[12], g[13], g[14], g[15] = 0xfe, 0x80, byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
		g[11] = 1 // never gid1 or gid2
		p.ahs.set(ahKey{g, 0xffff}, &ahEntry{h: handle(1<<40 + i), ready: true})
	}
	victim.used.Store(false)
	p.ahMu.Unlock()
	p.wantAH(ahKey{testutil.GID("fe80::99"), 0xffff})
	if p.ahs.get(ahKey{gid2, 0xffff}) != nil {
		t.Fatal("the handle not used since the hand's last pass was not evicted")
	}
	p.Write(nil, nil, 0) // reaps the send's completion
	l.d1.mu.Lock()
	busy, _ := l.d1.busyDestroys, 0
	_, alive := l.d1.ahs[victim.h]
	l.d1.mu.Unlock()
	if busy != 0 || alive {
		t.Fatalf("destroyed with a send outstanding: %d; still alive after the reap: %v", busy, alive)
	}
}

// TestCloseWaitsForControlCalls: Close during a join waiting for the SA
// frees the device (ibvSA.close: the rdma_cm ids) only after the join
// returned; no join or leave reaches the SA after it.
func TestCloseWaitsForControlCalls(t *testing.T) {
	n, _, _, g := groupSetup(t, newSM())
	// The resolver is idle: Close waits for it anyway.
	testutil.WaitFor(t, "the groups' handles", func() bool {
		return readyAH(n.p1, ahKey{g, 0xffff}) && readyAH(n.p1, ahKey{ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal), 0xffff})
	})
	entered, release := holdJoins(t, n.s1)
	joined := make(chan error, 1)
	go func() { joined <- n.p1.Join(otherGroup) }()
	<-entered
	closed := make(chan struct{})
	go func() {
		n.p1.Close()
		close(closed)
	}()
	<-n.d1.woke
	time.Sleep(50 * time.Millisecond) // lets a Close that does not wait free the device first
	release()
	<-joined
	<-closed
	n.s1.mu.Lock()
	defer n.s1.mu.Unlock()
	if n.s1.late != 0 || !n.s1.closed {
		t.Fatalf("SA calls after the close: %d (closed %v)", n.s1.late, n.s1.closed)
	}
}

// TestGroupMTUFallbackCounted: an SA gives no MTU for the broadcast
// group (the path record query to the MGID fails), on a 4096-byte port
// whose partition's group has MTU 2048. The partition takes the MTU the
// kernel's IPoIB interface shows for the group (2044,
// ipoib_mcast_join_finish and ipoib_mcast_carrier_on_task), so 2048, not
// the port's 4096. A 2049-byte packet is refused. The fallback is
// counted in group_mtu_fallbacks at each join and logged once per group.
func TestGroupMTUFallbackCounted(t *testing.T) {
	sm := newSM()
	sm.mtu, sm.noPathMTU = 2048, true
	h := newHub()
	s1 := sm.port(gid1, 0xffff)
	s1.ipoibIf(0xffff, "10.0.0.1")
	var logs bytes.Buffer
	var logMu sync.Mutex
	p, err := New(Config{Device: "mlx5_0", Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)),
		open: h.openerIB(gid1, s1, 0xffff), ipoibAddr: s1.lookup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	q, err := p.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.PartitionMTU(0xffff); got != 2048 || p.MTU() != 4096 || p.Counters().Stats["group_mtu_fallbacks"] != 1 {
		t.Fatalf("PartitionMTU %d, MTU %d, stats %v", got, p.MTU(), p.Counters().Stats)
	}
	if k, _ := p.Write([][]byte{packet(2049, 0)}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, 0x99, gid2), SrcQPN: q, PKey: 0xffff}}, ipoib.Headroom); k != 0 || p.Counters().Drops["oversize"] != 1 {
		t.Fatalf("2049 bytes in a 2048 partition: accepted %d, drops %v", k, p.Counters().Drops)
	}
	sm.restart(ipoib.QKey, 2048)
	h.devs[gid1].raise(eventClientReregister)
	// The restart rejoins the group twice: its MULTICAST_ERROR and the flush.
	testutil.WaitFor(t, "the rejoins' fallbacks", func() bool { return p.Counters().Stats["group_mtu_fallbacks"] == 3 })
	logMu.Lock()
	defer logMu.Unlock()
	if c := strings.Count(logs.String(), "no MTU for the partition's broadcast group"); c != 1 {
		t.Fatalf("logged %d times:\n%s", c, logs.String())
	}
}

// lockedWriter serialises a log handler's writes with the test's reads.
type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestJoinQKeyMismatch: a group whose Q_Key is not the partition
// broadcast group's. Kernels whose cma_make_mc_event calls cma_set_qkey
// report it as the id's MULTICAST_ERROR; newer ones (cma_ib_mc_handler
// calls cma_set_qkey first and sends no event when it fails) leave the
// join to time out, and the port's error says what to check.
func TestJoinQKeyMismatch(t *testing.T) {
	for _, qkeyFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("qkeyFirst=%v", qkeyFirst), func(t *testing.T) {
			sm := newSM()
			n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
			n.s1.qkeyFirst = qkeyFirst
			sm.mu.Lock()
			sm.groups[otherGroup] = &fakeGroup{mlid: 0xc100, qkey: 0x1234, mtu: 4096,
				kernel: map[ipoib.GID]bool{}, ids: map[ipoib.GID]bool{}}
			sm.mu.Unlock()
			err := n.p1.Join(otherGroup)
			switch {
			case err == nil:
				t.Fatal("joined a group with another Q_Key")
			case qkeyFirst && (!errors.Is(err, unix.ETIMEDOUT) || !strings.Contains(err.Error(), "Q_Key differs") || !strings.Contains(err.Error(), "saquery")):
				t.Fatalf("timeout error %q does not say what to check", err)
			case !qkeyFirst && !errors.Is(err, errJoinRefused):
				t.Fatalf("error %v, want the MULTICAST_ERROR refusal", err)
			}
			if n.p1.groups.Full(otherGroup) {
				t.Fatal("the group table records a failed join")
			}
		})
	}
}

// TestFreeQPWaitsForBatch: FreeQP takes the QP out of the table only
// between batches (txMu), and destroys it on the device after the batch
// under way has ended. The fake's destroy hook records whether txMu was
// held and the QP still in the table. The test holds txMu as a batch
// does. It lets it go once FreeQP is blocked on it, or has reached the
// device without waiting (the failure the hook records).
func TestFreeQPWaitsForBatch(t *testing.T) {
	l := newLink(t)
	p, d := l.p1, l.d1
	var held, listed bool
	destroyed := make(chan struct{})
	d.mu.Lock()
	d.destroyHook = func(q uint32) {
		if q != l.q1 {
			return
		}
		if held = !p.txMu.TryLock(); !held {
			p.txMu.Unlock()
		}
		listed = p.qp(q) != nil
		close(destroyed)
	}
	d.mu.Unlock()
	p.txMu.Lock()
	freed := make(chan error, 1)
	go func() { freed <- p.FreeQP(l.q1) }()
	testutil.WaitFor(t, "FreeQP blocked on the batch, or at the device", func() bool {
		select {
		case <-destroyed:
			return true
		default:
			return parked.OnMutex("verbsfabric.(*Port).unlist")
		}
	})
	p.txMu.Unlock()
	if err := <-freed; err != nil {
		t.Fatal(err)
	}
	<-destroyed
	if held || listed {
		t.Fatalf("destroyed while a batch held txMu: %v; while still in the table: %v", held, listed)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.qps[l.q1] != nil {
		t.Fatal("the QP outlived FreeQP on the device")
	}
}

// TestFreedQPKeepsItsSlots: the send slots of a freed QP whose sends
// have not completed stay in use until the device has destroyed it.
// While FreeQP waits for the device, a ring's worth of another QP's
// sends never takes one; the fake counts a slot taken while the device
// may still read it. The four that find the ring full are dropped and
// counted. Once the QP is destroyed its slots are free.
func TestFreedQPKeepsItsSlots(t *testing.T) {
	l := newLink(t)
	p, d := l.p1, l.d1
	qb, err := p.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	send(t, p, qb, 0xffff, ipoib.MakeHwAddr(0, l.q2, gid2), 100, 1) // the handle to gid2 made: nothing is held below
	d.mu.Lock()
	d.holdQPN = l.q1
	d.mu.Unlock()
	bufs, meta := l.batch(4, 100)
	if n, err := p.Write(bufs, meta, ipoib.Headroom); n != 4 || err != nil {
		t.Fatalf("wrote %d: %v", n, err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before Close, which waits for FreeQP
	d.mu.Lock()
	d.destroyHook = func(q uint32) {
		if q == l.q1 {
			close(entered)
			<-release
		}
	}
	d.mu.Unlock()
	freed := make(chan error, 1)
	go func() { freed <- p.FreeQP(l.q1) }()
	<-entered
	bufs, meta = l.batch(batchSize, 100)
	for i := range meta {
		meta[i].SrcQPN = qb
	}
	for range sendSlots / batchSize {
		p.Write(bufs, meta, ipoib.Headroom)
	}
	d.mu.Lock()
	over := d.overwrites
	d.mu.Unlock()
	if full := p.drops.Load(ipoib.DropRingFull); over != 0 || full != 4 {
		t.Fatalf("%d slots of the freed QP's sends taken; %d sends found the ring full, want 4", over, full)
	}
	letGo()
	if err := <-freed; err != nil {
		t.Fatal(err)
	}
	if n, _ := p.Write(bufs[:1], meta[:1], ipoib.Headroom); n != 1 || p.slotsInUse() != 1 {
		t.Fatalf("after the destroy: wrote %d, %d slots in use", n, p.slotsInUse())
	}
}

// TestFlushPendingAfterFlush: a packet waits for its destination's
// address handle. A flush drops the handle between the resolver
// publishing it and sending what waited; with no send outstanding, the
// flush destroys it at once. The packet is then not sent on the handle
// the resolver made. It is dropped and counted as no_address_handle, no
// send fails and no handle is destroyed under a send. Hooks force the
// interleaving: the fake's createAH holds the resolver until the test
// holds txMu, and the flush runs once the resolver is blocked on txMu in
// flushPending.
func TestFlushPendingAfterFlush(t *testing.T) {
	l := newLink(t)
	p, d := l.p1, l.d1
	key := ahKey{gid2, 0xffff}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.mu.Lock()
	d.createAHHook = func(pa path) {
		if pa.gid == gid2 {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
	}
	d.mu.Unlock()
	bufs, meta := l.batch(1, 100)
	if n, _ := p.Write(bufs, meta, ipoib.Headroom); n != 1 {
		t.Fatal("the packet was not held")
	}
	<-entered
	p.txMu.Lock()
	close(release)
	testutil.WaitFor(t, "the resolver blocked in flushPending", func() bool {
		return readyAH(p, key) && parked.OnMutex("verbsfabric.(*Port).flushPending")
	})
	p.dropAHs(func(ahKey) bool { return true })
	p.txMu.Unlock()
	testutil.WaitFor(t, "the held packet handled", func() bool {
		p.txMu.Lock()
		defer p.txMu.Unlock()
		return len(p.pending) == 0
	})
	d.mu.Lock()
	busy := d.busyDestroys
	d.mu.Unlock()
	if se, noAH := p.drops.Load(ipoib.DropSendError), p.drops.Load(ipoib.DropNoAH); se != 0 || noAH != 1 || busy != 0 {
		t.Fatalf("send errors %d, no_address_handle %d (want 1), handles destroyed under a send %d", se, noAH, busy)
	}
}

// TestEvictionMidBatch: a handle is evicted while a batch is under way,
// after a packet looked it up and before that packet is queued. (The
// fake's pollSend hook evicts it from the reap that slot runs when the
// ring is full.) It is not destroyed under the packet: eviction marks
// are taken at a batch's start only. A mark taken mid-batch would bury
// the handle once the earlier slots were free, and the packet would be
// posted on the destroyed handle.
func TestEvictionMidBatch(t *testing.T) {
	l := newLink(t)
	p, d := l.p1, l.d1
	send(t, p, l.q1, 0xffff, ipoib.MakeHwAddr(0, l.q2, gid2), 100, 1)
	h, ok := p.ahs.lookup(ahKey{gid2, 0xffff})
	if !ok {
		t.Fatal("no handle to gid2")
	}
	var once sync.Once
	d.mu.Lock()
	d.pollHook = func() { // pollSend runs with txMu held: p.used is readable
		if p.used == sendSlots {
			once.Do(func() {
				p.ahMu.Lock()
				p.evictAH()
				p.ahMu.Unlock()
			})
		}
	}
	d.mu.Unlock()
	bufs, meta := l.batch(sendSlots+1, 100)
	if n, err := p.Write(bufs, meta, ipoib.Headroom); n != sendSlots+1 || err != nil {
		t.Fatalf("wrote %d: %v", n, err)
	}
	if p.ahs.get(ahKey{gid2, 0xffff}) != nil {
		t.Fatal("the hook did not evict the handle")
	}
	p.Write(nil, nil, 0) // takes the eviction, reaps, buries
	d.mu.Lock()
	busy := d.busyDestroys
	_, alive := d.ahs[h]
	d.mu.Unlock()
	if se := p.drops.Load(ipoib.DropSendError); se != 0 || busy != 0 || alive {
		t.Fatalf("send errors %d, handles destroyed under a send %d, evicted handle still alive %v", se, busy, alive)
	}
}

// TestJoinRefusalReasons: a join the SA refuses or never answers is an
// ipoib.RefusedError whose reason the shim counts (groups_refused_<reason>).
func TestJoinRefusalReasons(t *testing.T) {
	sm := newSM()
	n, _, _, _ := groupSetup(t, sm)
	for i, c := range []struct {
		refuse refusal
		reason string
	}{
		{saRefusal, "sa_refused"},
		{saSilence, "sa_timeout"},
	} {
		n.s1.mu.Lock()
		n.s1.refuse = &c.refuse
		n.s1.mu.Unlock()
		mgid := ipoib.IPv4MGID(netip.AddrFrom4([4]byte{239, 9, 9, byte(i + 1)}), 0xffff, ipoib.ScopeLinkLocal)
		err := n.p1.Join(mgid)
		var re *ipoib.RefusedError
		if !errors.As(err, &re) || re.Reason != c.reason {
			t.Errorf("join refused with %v: got %v, want a RefusedError with reason %s", c.refuse, err, c.reason)
		}
	}
}

// TestSlowPathDoesNotStallOthers: while the SA has not answered the path
// record to one destination (its packet waits for it), a packet to
// another destination gets its own path record, address handle and
// delivery: address handles are resolved in parallel. Once the slow
// answer comes, the waiting packet is sent.
func TestSlowPathDoesNotStallOthers(t *testing.T) {
	gid3 := testutil.GID("fe80::3")
	sm := newSM()
	h := newHub()
	var ps [3]*Port
	var sas [3]*fakeSA
	var qs [3]uint32
	for i, g := range []ipoib.GID{gid1, gid2, gid3} {
		sas[i] = sm.port(g, 0xffff)
		sas[i].ipoibIf(0xffff, fmt.Sprintf("10.0.0.%d", i+1))
		ps[i], _ = openIB(t, h, g, sas[i], []ipoib.PKey{0xffff})
		q, err := ps[i].AllocQP(0xffff, 0)
		if err != nil {
			t.Fatal(err)
		}
		qs[i] = q
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	sas[0].mu.Lock()
	sas[0].pathHook = func(q pathQuery) {
		if q.dgid == gid2 {
			once.Do(func() { close(entered) })
			<-release
		}
	}
	sas[0].mu.Unlock()
	var rel sync.Once
	t.Cleanup(func() { rel.Do(func() { close(release) }) })

	slow := packet(300, 2)
	if k, err := ps[0].Write([][]byte{slow}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, qs[1], gid2), SrcQPN: qs[0], PKey: 0xffff}}, ipoib.Headroom); k != 1 || err != nil {
		t.Fatalf("to the slow destination: accepted %d, %v (want 1: held)", k, err)
	}
	<-entered
	fast := send(t, ps[0], qs[0], 0xffff, ipoib.MakeHwAddr(0, qs[2], gid3), 200, 3)
	if data, _ := readN(t, ps[2], 1); !bytes.Equal(data[0], fast) {
		t.Fatalf("the other destination got %d bytes", len(data[0]))
	}
	if n := ps[0].Counters().Levels["address_handles_resolving"]; n != 1 {
		t.Fatalf("address_handles_resolving %d, want 1 (the slow one)", n)
	}
	rel.Do(func() { close(release) })
	if data, _ := readN(t, ps[1], 1); !bytes.Equal(data[0], slow[ipoib.Headroom:]) {
		t.Fatalf("the held packet: %d bytes", len(data[0]))
	}
}

// TestResolveQueueFullCounted: with every resolver waiting for the SA
// and the queue of destinations full, one more destination is not
// queued, and counted (its next packet asks again).
func TestResolveQueueFullCounted(t *testing.T) {
	n := newIBNet(t, newSM(), []ipoib.PKey{0xffff}, 0xffff)
	release := make(chan struct{})
	var rel sync.Once
	t.Cleanup(func() { rel.Do(func() { close(release) }) })
	n.s1.mu.Lock()
	n.s1.pathHook = func(pathQuery) { <-release }
	n.s1.mu.Unlock()
	q, err := n.p1.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	to := func(i int) {
		var g ipoib.GID
		g[0], g[1], g[14], g[15] = 0xfe, 0x80, byte(i>>8), byte(i)
		n.p1.Write([][]byte{packet(100, 0)}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, 0x99, g), SrcQPN: q, PKey: 0xffff}}, ipoib.Headroom)
	}
	for i := range resolvers {
		to(0x100 + i)
	}
	testutil.WaitFor(t, "every resolver busy", func() bool { return n.p1.Counters().Levels["address_handles_resolving"] == resolvers })
	for i := range resolveQueue + 1 {
		to(0x200 + i)
	}
	if c := n.p1.Counters().Stats["address_handle_queue_full"]; c != 1 {
		t.Fatalf("address_handle_queue_full %d, want 1", c)
	}
}
