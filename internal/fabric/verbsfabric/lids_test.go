package verbsfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestSenderWithoutGRH: unicast without a GRH, as a Linux IPoIB host (a
// router above all) sends inside a subnet, is named by the completion's
// source QPN and the GID last seen behind its SLID. That GID is learned
// from the sender's multicast (which has a GRH) or from the path record
// to it. Before either, and after a flush (the SM may move LIDs), the
// sender is unknown. Each case is counted.
func TestSenderWithoutGRH(t *testing.T) {
	n := newIBNet(t, newSM(), []ipoib.PKey{0xffff}, 0xffff)
	n.hub.mu.Lock()
	n.hub.noGRH = true
	n.hub.mu.Unlock()
	q1, err := n.p1.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	q2, err := n.p2.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	to1, from2 := ipoib.MakeHwAddr(0, q1, gid1), ipoib.MakeHwAddr(0, q2, gid2)
	stats := func() (byLID, unknown uint64) {
		s := n.p1.Counters().Stats
		return s["rx_src_by_lid"], s["rx_src_unknown"]
	}
	expect := func(step string, want ipoib.RxMeta, byLID, unknown uint64) {
		t.Helper()
		_, m := readN(t, n.p1, 1)
		if m[0].Src != want.Src || m[0].SrcUnknown != want.SrcUnknown {
			t.Fatalf("%s: received from %s (unknown %v), want %s (unknown %v)", step, m[0].Src, m[0].SrcUnknown, want.Src, want.SrcUnknown)
		}
		if b, u := stats(); b != byLID || u != unknown {
			t.Fatalf("%s: rx_src_by_lid %d, rx_src_unknown %d; want %d and %d", step, b, u, byLID, unknown)
		}
	}

	send(t, n.p2, q2, 0xffff, to1, 300, 1)
	expect("a LID never seen", ipoib.RxMeta{SrcUnknown: true}, 0, 1)

	bc := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	if err := n.p1.Join(bc); err != nil {
		t.Fatal(err)
	}
	send(t, n.p2, q2, 0xffff, ipoib.MakeHwAddr(0, ipoib.MulticastQPN, bc), 300, 2)
	expect("multicast, with its GRH", ipoib.RxMeta{Src: from2}, 0, 1)
	send(t, n.p2, q2, 0xffff, to1, 300, 3)
	expect("unicast after the sender's multicast", ipoib.RxMeta{Src: from2}, 1, 1)

	n.d1.events <- asyncEvent{ev: eventLIDChange, port: 1}
	testutil.WaitFor(t, "the flush", func() bool { return n.p1.Counters().Stats["flushes"] == 1 })
	send(t, n.p2, q2, 0xffff, to1, 300, 4)
	expect("unicast after a LID change", ipoib.RxMeta{SrcUnknown: true}, 1, 2)

	send(t, n.p1, q1, 0xffff, from2, 300, 5) // p1 resolves the path to p2
	readN(t, n.p2, 1)
	send(t, n.p2, q2, 0xffff, to1, 300, 6)
	expect("unicast after the path record", ipoib.RxMeta{Src: from2}, 2, 2)
}

// TestLIDTableGuards: a LID seen with a second GID since the last clear
// (SR-IOV VFs behind their PF's LID) names neither. A path record asked
// before a clear and answered after it teaches nothing. A LID outside
// the port's subnet, or multicast, is never learned. A clear forgets
// ambiguity too.
func TestLIDTableGuards(t *testing.T) {
	local := testutil.GID("fe80::1")
	a, b := testutil.GID("fe80::a"), testutil.GID("fe80::b")
	var lt lidTable
	lt.learn(7, a, local)
	if g, ok := lt.lookup(7); !ok || g != a {
		t.Fatalf("LID 7 after learning %s: %s %v", a, g, ok)
	}
	lt.learn(7, a, local) // the same again: still a
	lt.learn(7, b, local)
	if g, ok := lt.lookup(7); ok {
		t.Errorf("LID 7 seen with %s and %s: names %s, want none", a, b, g)
	}
	lt.learn(7, a, local)
	if _, ok := lt.lookup(7); ok {
		t.Error("an ambiguous LID became unambiguous by seeing one of its GIDs again")
	}
	epoch := lt.now() // a path record asked
	lt.clear()        // a flush while it was out
	if _, ok := lt.lookup(7); ok {
		t.Error("LID 7 after a clear: still named")
	}
	lt.learnAt(epoch, 9, a, local) // its answer
	if g, ok := lt.lookup(9); ok {
		t.Errorf("LID 9 learned from an answer asked before the clear: names %s", g)
	}
	lt.learnAt(lt.now(), 9, a, local)
	if g, ok := lt.lookup(9); !ok || g != a {
		t.Errorf("LID 9 learned after the clear: %s %v, want %s", g, ok, a)
	}
	lt.learn(10, testutil.GID("fe80:0:0:1::a"), local) // another subnet
	lt.learn(0xc001, a, local)                         // a multicast LID
	lt.learn(11, testutil.GID("ff12:401b:ffff::1"), local)
	for _, lid := range []uint16{10, 0xc001, 11} {
		if g, ok := lt.lookup(lid); ok {
			t.Errorf("LID %#x: names %s, want none", lid, g)
		}
	}
}
