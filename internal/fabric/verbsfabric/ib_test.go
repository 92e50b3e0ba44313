package verbsfabric

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// ibNet is two InfiniBand ports on one fake fabric and subnet: each host
// has an IPoIB interface with an address in every partition of parts.
type ibNet struct {
	sm     *fakeSM
	hub    *fakeHub
	p1, p2 *Port
	d1, d2 *fakeDev
	s1, s2 *fakeSA
}

func newIBNet(t *testing.T, sm *fakeSM, pkeys []ipoib.PKey, parts ...ipoib.PKey) ibNet {
	t.Helper()
	h := newHub()
	n := ibNet{sm: sm, hub: h}
	n.s1, n.s2 = sm.port(gid1, pkeys...), sm.port(gid2, pkeys...)
	for i, pk := range parts {
		n.s1.ipoibIf(pk, fmt.Sprintf("10.%d.0.1", i))
		n.s2.ipoibIf(pk, fmt.Sprintf("10.%d.0.2", i))
	}
	n.p1, n.d1 = openIB(t, h, gid1, n.s1, pkeys)
	n.p2, n.d2 = openIB(t, h, gid2, n.s2, pkeys)
	return n
}

func openIB(t *testing.T, h *fakeHub, g ipoib.GID, sa *fakeSA, pkeys []ipoib.PKey) (*Port, *fakeDev) {
	t.Helper()
	p, err := New(Config{Device: "mlx5_0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		open: h.openerIB(g, sa, pkeys...), ipoibAddr: sa.lookup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, h.devs[g]
}

// send writes one packet of size bytes from QP src (partition pkey) to
// dst until the port has posted it (the first waits for an address
// handle), and returns the packet.
func send(t *testing.T, p *Port, src uint32, pkey ipoib.PKey, dst ipoib.HwAddr, size int, fill byte) []byte {
	t.Helper()
	pkt := packet(size, fill)
	meta := []ipoib.TxMeta{{Dst: dst, SrcQPN: src, PKey: pkey}}
	before := p.Counters().TxPackets
	// Write again only while the port refuses the packet (no QP or path
	// yet): one it took, even held for its path, goes out once, later.
	deadline := time.Now().Add(testutil.Settle)
	for {
		if n, _ := p.Write([][]byte{pkt}, meta, ipoib.Headroom); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not taken: %+v", p.Counters())
		}
		time.Sleep(5 * time.Millisecond)
	}
	testutil.WaitFor(t, "the packet sent", func() bool { return p.Counters().TxPackets != before })
	return pkt[ipoib.Headroom:]
}

// ahsTo is the paths of d's address handles to gid.
func ahsTo(d *fakeDev, gid ipoib.GID) []path {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []path
	for _, p := range d.ahs {
		if p.gid == gid {
			out = append(out, p)
		}
	}
	return out
}

// TestItem5PathRecordPortSpace: the fake refuses RDMA_PS_IPOIB on an
// AF_IB id (cma_select_ib_ps), so a unicast path must be asked with
// RDMA_PS_IB; the port does, and its address handle carries the path
// record's DLID and SL.
func TestItem5PathRecordPortSpace(t *testing.T) {
	sm := newSM()
	sm.sl[0xffff] = 3
	n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
	if _, err := n.s1.pathRecord(pathQuery{sgid: gid1, dgid: gid2, pkey: 0xffff, ps: psIPoIB}); !errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Fatalf("AF_IB with RDMA_PS_IPOIB: %v, want EPROTONOSUPPORT", err)
	}
	q1, err := n.p1.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	q2, _ := n.p2.AllocQP(0xffff, 0)
	pkt := send(t, n.p1, q1, 0xffff, ipoib.MakeHwAddr(0, q2, gid2), 500, 7)
	data, m := readN(t, n.p2, 1)
	if !bytes.Equal(data[0], pkt) || m[0].Src != ipoib.MakeHwAddr(0, q1, gid1) {
		t.Fatalf("received %+v", m[0])
	}
	n.s1.mu.Lock()
	paths := append([]pathQuery(nil), n.s1.paths...)
	n.s1.mu.Unlock()
	if len(paths) == 0 || paths[len(paths)-1] != (pathQuery{sgid: gid1, dgid: gid2, pkey: 0xffff, ps: psIB}) {
		t.Fatalf("path queries %+v", paths)
	}
	ahs := ahsTo(n.d1, gid2)
	if len(ahs) != 1 || ahs[0].dlid != sm.lid(gid2) || ahs[0].sl != 3 || !ahs[0].global {
		t.Fatalf("address handles to %s: %+v, want DLID %d SL 3", gid2, ahs, sm.lid(gid2))
	}
}

// TestItem6JoinNeedsIPoIBInterface: a join's id is bound with
// RDMA_PS_IPOIB to the address of the host's IPoIB interface in the
// group's partition. Without such an interface the port says what to
// create. The fake refuses a join whose bound interface's broadcast
// group the port has not joined (cma_join_ib_multicast:
// ib_sa_get_mcmember_rec → -EADDRNOTAVAIL).
func TestItem6JoinNeedsIPoIBInterface(t *testing.T) {
	sm := newSM()
	n := newIBNet(t, sm, []ipoib.PKey{0xffff, 0x8001}, 0xffff)
	g := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	if err := n.p1.Join(g); err != nil {
		t.Fatal(err)
	}
	n.s1.mu.Lock()
	j := n.s1.joined[0]
	n.s1.mu.Unlock()
	if j.mgid != g || j.ps != psIPoIB || j.bind.addr != netip.MustParseAddr("10.0.0.1") || j.sendOnly {
		t.Fatalf("join %+v", j)
	}
	// Partition 0x8001 is in the P_Key table but has no IPoIB interface.
	_, err := n.p1.AllocQP(0x8001, 0)
	if err == nil || !strings.Contains(err.Error(), "no IPoIB interface") || !strings.Contains(err.Error(), "pkey 0x8001") {
		t.Fatalf("a partition without an IPoIB interface: %v", err)
	}
	if err := n.p1.Join(ipoib.BroadcastMGID(0x8001, ipoib.ScopeLinkLocal)); err == nil {
		t.Fatal("joined a group of a partition without an IPoIB interface")
	}
	// An interface whose broadcast group the port's kernel never joined.
	n.s1.ifs[netip.MustParseAddr("10.9.0.1")] = 0x8001
	_, err = n.s1.join(joinReq{mgid: ipoib.BroadcastMGID(0x8001, 2), ps: psIPoIB,
		bind: ipoibBind{addr: netip.MustParseAddr("10.9.0.1")}})
	if !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatalf("join without the broadcast group: %v, want EADDRNOTAVAIL", err)
	}
}

// TestPickIPoIB: the interface is chosen by port GID and partition, with
// an IPv4 address first, else an IPv6 link-local one with its zone. Of
// several in a partition, it is the first that is up, has joined its
// broadcast group (operstate up: the carrier) and has an address, not
// merely the first. A missing interface, or one down, not joined or
// without an address, is an error saying what to do.
func TestPickIPoIB(t *testing.T) {
	hw := func(g ipoib.GID) []byte { return append([]byte{0, 0, 0, 0x48}, g[:]...) }
	bc := func(pk ipoib.PKey) []byte {
		m := ipoib.BroadcastMGID(pk, 2)
		return append([]byte{0, 0xff, 0xff, 0xff}, m[:]...)
	}
	ll := netip.MustParseAddr("fe80::1")
	a := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	ifs := []ipoibIf{
		{name: "eth0", index: 2, hw: []byte{1, 2, 3, 4, 5, 6}, addrs: a("192.0.2.1"), up: true, joined: true},
		{name: "ib1", index: 3, hw: hw(gid2), bcast: bc(0xffff), addrs: a("10.1.0.1"), up: true, joined: true},
		{name: "ib0", index: 4, hw: hw(gid1), bcast: bc(0xffff), addrs: []netip.Addr{ll, netip.MustParseAddr("10.0.0.1")}, up: true, joined: true, mtu: 2044},
		{name: "ib0.8001", index: 5, hw: hw(gid1), bcast: bc(0x8001), addrs: []netip.Addr{ll}, up: true, joined: true},
		{name: "ib0.8002", index: 6, hw: hw(gid1), bcast: bc(0x8002), up: true, joined: true},
		// 0x8004: the first has no address, the second is down, the third
		// has not joined; the fourth has all.
		{name: "ib0.8004a", index: 7, hw: hw(gid1), bcast: bc(0x8004), up: true, joined: true},
		{name: "ib0.8004b", index: 8, hw: hw(gid1), bcast: bc(0x8004), addrs: a("10.4.0.2")},
		{name: "ib0.8004c", index: 9, hw: hw(gid1), bcast: bc(0x8004), addrs: a("10.4.0.3"), up: true},
		{name: "ib0.8004d", index: 10, hw: hw(gid1), bcast: bc(0x8004), addrs: a("10.4.0.4"), up: true, joined: true, mtu: 4092, connected: true},
		{name: "ib0.8005", index: 11, hw: hw(gid1), bcast: bc(0x8005), addrs: a("10.5.0.1")},
		{name: "ib0.8006", index: 12, hw: hw(gid1), bcast: bc(0x8006), addrs: a("10.6.0.1"), up: true},
	}
	if b, err := pickIPoIB(ifs, gid1, 0x7fff); err != nil || b.ifname != "ib0" || b.addr != netip.MustParseAddr("10.0.0.1") || b.mtu != 2044 {
		t.Fatalf("default partition (limited P_Key asked): %+v, %v", b, err)
	}
	if b, err := pickIPoIB(ifs, gid1, 0x8001); err != nil || b.ifindex != 5 || b.addr != ll.WithZone("ib0.8001") {
		t.Fatalf("0x8001: %+v, %v", b, err)
	}
	if b, err := pickIPoIB(ifs, gid1, 0x8004); err != nil || b.ifname != "ib0.8004d" || b.addr != netip.MustParseAddr("10.4.0.4") || b.mtu != 4092 || !b.connected {
		t.Fatalf("0x8004: %+v, %v", b, err)
	}
	for pk, want := range map[ipoib.PKey]string{
		0x8002: "IPoIB interface ib0.8002 (partition 0x8002) has no IP address",
		0x8003: "type ipoib pkey 0x8003",
		0x8005: "IPoIB interface ib0.8005 (partition 0x8005) is down",
		0x8006: "IPoIB interface ib0.8006 (partition 0x8006) has not joined its broadcast group",
	} {
		if _, err := pickIPoIB(ifs, gid1, pk); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", pk, err, want)
		}
	}
}

// TestItem7QKeyAndMTUFromBroadcastGroup: an SM's broadcast group has
// Q_Key 0x00C0FFEE and MTU 2048 on 4096-byte ports. The QPs take that
// Q_Key and use it as the remote Q_Key; the fake drops a packet whose
// Q_Key is not the receiving QP's. The partition's MTU is 2048.
func TestItem7QKeyAndMTUFromBroadcastGroup(t *testing.T) {
	sm := newSM()
	sm.qkey, sm.mtu = 0x00C0FFEE, 2048
	n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
	q1, _ := n.p1.AllocQP(0xffff, 0)
	q2, _ := n.p2.AllocQP(0xffff, 0)
	if k1, k2 := n.d1.qkeyOf(q1), n.d2.qkeyOf(q2); k1 != 0x00C0FFEE || k2 != 0x00C0FFEE {
		t.Fatalf("QP Q_Keys %#x %#x", k1, k2)
	}
	if got := n.p1.PartitionMTU(0xffff); got != 2048 || n.p1.MTU() != 4096 {
		t.Fatalf("PartitionMTU %d, MTU %d", got, n.p1.MTU())
	}
	dst := ipoib.MakeHwAddr(0, q2, gid2)
	pkt := send(t, n.p1, q1, 0xffff, dst, 2048, 1)
	if data, _ := readN(t, n.p2, 1); !bytes.Equal(data[0], pkt) || n.d2.qkeyDrop != 0 {
		t.Fatalf("received %d bytes, %d Q_Key drops", len(data[0]), n.d2.qkeyDrop)
	}
	if k, _ := n.p1.Write([][]byte{packet(2049, 0)}, []ipoib.TxMeta{{Dst: dst, SrcQPN: q1, PKey: 0xffff}}, ipoib.Headroom); k != 0 || n.p1.Counters().Drops["oversize"] != 1 {
		t.Fatalf("2049 bytes in a 2048 partition: accepted %d, drops %v", k, n.p1.Counters().Drops)
	}
	// The receiver's check bites: a QP with the default Q_Key gets nothing.
	n.d2.setQKey(q2, ipoib.QKey)
	n.p1.Write([][]byte{packet(100, 0)}, []ipoib.TxMeta{{Dst: dst, SrcQPN: q1, PKey: 0xffff}}, ipoib.Headroom)
	testutil.WaitFor(t, "a Q_Key drop", func() bool {
		n.d2.mu.Lock()
		defer n.d2.mu.Unlock()
		return n.d2.qkeyDrop == 1
	})
}

// TestItem8PartitionsSeparatePaths: with the limited default P_Key at
// index 0 (as SR-IOV functions have it) and partitions 0xFFFF and
// 0x8001, each QP's path is asked in its own partition. That gives two
// address handles to the same GID with each partition's SL, and no query
// in 0x7FFF, where two limited members have no path.
func TestItem8PartitionsSeparatePaths(t *testing.T) {
	sm := newSM()
	sm.sl[0xffff], sm.sl[0x8001] = 1, 5
	pkeys := []ipoib.PKey{0x7fff, 0xffff, 0x8001}
	n := newIBNet(t, sm, pkeys, 0xffff, 0x8001)
	for _, pk := range []ipoib.PKey{0xffff, 0x8001} {
		q1, err := n.p1.AllocQP(pk, 0)
		if err != nil {
			t.Fatal(err)
		}
		q2, _ := n.p2.AllocQP(pk, 0)
		pkt := send(t, n.p1, q1, pk, ipoib.MakeHwAddr(0, q2, gid2), 300, byte(pk))
		data, m := readN(t, n.p2, 1)
		if !bytes.Equal(data[0], pkt) || m[0].PKey != pk {
			t.Fatalf("partition %s: received %+v", pk, m[0])
		}
	}
	sls := map[uint8]bool{}
	for _, a := range ahsTo(n.d1, gid2) {
		sls[a.sl] = true
	}
	if len(sls) != 2 || !sls[1] || !sls[5] {
		t.Fatalf("address handles to %s: %+v", gid2, ahsTo(n.d1, gid2))
	}
	n.s1.mu.Lock()
	defer n.s1.mu.Unlock()
	asked := map[ipoib.PKey]bool{}
	for _, q := range n.s1.paths {
		asked[q.pkey] = true
	}
	if !asked[0xffff] || !asked[0x8001] || asked[0x7fff] {
		t.Fatalf("path records asked in %v", asked)
	}
	if sharesPKey([]ipoib.PKey{0x7fff}, []ipoib.PKey{0x7fff}, 0x7fff) {
		t.Fatal("the fake SA gives two limited members a path")
	}
}

// groupQPOf is p's group QP of partition pkey.
func groupQPOf(p *Port, pkey ipoib.PKey) uint32 {
	p.qpMu.RLock()
	defer p.qpMu.RUnlock()
	return p.gqps[pkey]
}

// groupSetup is two IB ports, each with a VIF QP, both full members of
// the broadcast group and of group g.
func groupSetup(t *testing.T, sm *fakeSM) (ibNet, uint32, uint32, ipoib.GID) {
	t.Helper()
	n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
	q1, _ := n.p1.AllocQP(0xffff, 0)
	q2, _ := n.p2.AllocQP(0xffff, 0)
	g := testutil.GID("ff12:401b:ffff::102:304")
	bcast := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	for _, p := range []*Port{n.p1, n.p2} {
		for _, m := range []ipoib.GID{bcast, g} {
			if err := p.Join(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n, q1, q2, g
}

// TestClientReregisterRejoinsAndRekeys: the SM restarts (new LIDs, new
// groups with a new Q_Key) and the ports get CLIENT_REREGISTER. Each
// port rejoins every group: the broadcast group and g, its group QP
// attached with each one's new MLID. Its QPs take the new Q_Key. The old
// address handles are flushed and destroyed, and a new one carries the
// new DLID. Traffic flows again.
func TestClientReregisterRejoinsAndRekeys(t *testing.T) {
	sm := newSM()
	n, q1, q2, g := groupSetup(t, sm)
	dst := ipoib.MakeHwAddr(0, q2, gid2)
	send(t, n.p1, q1, 0xffff, dst, 100, 1)
	readN(t, n.p2, 1)
	old := ahsTo(n.d1, gid2)
	if len(old) != 1 || old[0].dlid != sm.lid(gid2) {
		t.Fatalf("before: %+v", old)
	}
	oldLID := old[0].dlid
	sm.restart(0x00BEEF00, 4096)
	n.d1.raise(eventClientReregister)
	n.d2.raise(eventClientReregister)
	groups := []ipoib.GID{ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal), g}
	// rejoined reports whether port p (on d, its VIF QP q) has its group
	// QP attached to every group with the group's new MLID, its QP on
	// the new Q_Key, and its flush counted. The flush rejoins, then
	// drops the handles, then counts itself (Port.flush): the rejoins
	// are visible before the count.
	rejoined := func(p *Port, d *fakeDev, q uint32) bool {
		gq := groupQPOf(p, 0xffff)
		for _, m := range groups {
			sm.mu.Lock()
			grp := sm.groups[m]
			sm.mu.Unlock()
			if grp == nil {
				return false
			}
			if l, ok := d.attachedMLID(m, gq); !ok || l != grp.mlid {
				return false
			}
		}
		return d.qkeyOf(q) == 0x00BEEF00 && p.Counters().Stats["flushes"] == 1
	}
	testutil.WaitFor(t, "both ports' rejoins with the new MLIDs and Q_Key, and their flushes", func() bool {
		return rejoined(n.p1, n.d1, q1) && rejoined(n.p2, n.d2, q2)
	})
	pkt := send(t, n.p1, q1, 0xffff, dst, 200, 2)
	if data, _ := readN(t, n.p2, 1); !bytes.Equal(data[0], pkt) {
		t.Fatal("payload changed")
	}
	n.p1.Write(nil, nil, 0) // reaps completions: the flushed handle is destroyed
	now := ahsTo(n.d1, gid2)
	if len(now) != 1 || now[0].dlid != sm.lid(gid2) || now[0].dlid == oldLID {
		t.Fatalf("after: %+v, want one handle with DLID %d", now, sm.lid(gid2))
	}
}

// TestItem9MulticastErrorRejoins: a MULTICAST_ERROR on a membership's id
// (the SA dropped the group) makes the port rejoin it and attach its
// group QP with the new MLID.
func TestItem9MulticastErrorRejoins(t *testing.T) {
	sm := newSM()
	n, _, _, g := groupSetup(t, sm)
	gq := groupQPOf(n.p1, 0xffff)
	before, _ := n.d1.attachedMLID(g, gq)
	sm.dropGroup(g)
	testutil.WaitFor(t, "the rejoin", func() bool {
		l, ok := n.d1.attachedMLID(g, gq)
		joined, _ := n.s1.member(g)
		return ok && l != before && joined
	})
	if n.p1.Counters().Stats["sa_rejoins"] == 0 {
		t.Fatalf("counters %+v", n.p1.Counters().Stats)
	}
}

// TestItem9PKeyChange: a PKEY_CHANGE makes the port read the P_Key table
// again (new QPs take the new index) and flush.
func TestItem9PKeyChange(t *testing.T) {
	sm := newSM()
	n := newIBNet(t, sm, []ipoib.PKey{0xffff, 0x8001}, 0xffff, 0x8001)
	q, _ := n.p1.AllocQP(0x8001, 0)
	if i := n.d1.pkeyIndexOf(q); i != 1 {
		t.Fatalf("index %d", i)
	}
	n.d1.mu.Lock()
	n.d1.table = []ipoib.PKey{0xffff, 0x8002, 0x8001}
	n.d1.mu.Unlock()
	n.d1.raise(eventPKeyChange)
	testutil.WaitFor(t, "the flush", func() bool { return n.p1.Counters().Stats["flushes"] == 1 })
	q2, err := n.p1.AllocQP(0x8001, 0)
	if i := n.d1.pkeyIndexOf(q2); err != nil || i != 2 {
		t.Fatalf("after the change: %v, index %d", err, i)
	}
	// The known limit: the QP made before keeps its index, counted.
	if i, moves := n.d1.pkeyIndexOf(q), n.p1.Counters().Stats["pkey_index_moves"]; i != 1 || moves != 1 {
		t.Fatalf("the QP made before: index %d (want 1, kept), pkey_index_moves %d (want 1)", i, moves)
	}
}

// TestItem10SendOnlyFallback: where the SM lacks send-only full members,
// the kernel refuses a send-only join and the port joins as a full
// member instead. The refusal is -EOPNOTSUPP, or, on kernels since 5.12,
// the SA's refusal as a MULTICAST_ERROR. Where the SM has them, the port
// is a send-only member. Either way the packet reaches the group.
func TestItem10SendOnlyFallback(t *testing.T) {
	for _, c := range []struct{ support, newKernel bool }{{false, false}, {false, true}, {true, false}} {
		support := c.support
		t.Run(fmt.Sprintf("support=%v,newKernel=%v", support, c.newKernel), func(t *testing.T) {
			sm := newSM()
			sm.sendOnly = support
			n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
			n.s1.newKernel = c.newKernel
			q1, _ := n.p1.AllocQP(0xffff, 0)
			g := testutil.GID("ff12:401b:ffff::a0b:c0d")
			if err := n.p2.Join(g); err != nil {
				t.Fatal(err)
			}
			if err := n.p1.JoinSendOnly(g); err != nil {
				t.Fatal(err)
			}
			send(t, n.p1, q1, 0xffff, ipoib.MakeHwAddr(0, ipoib.MulticastQPN, g), 100, 3)
			if _, m := readN(t, n.p2, 1); m[0].MGID != g {
				t.Fatalf("received %+v", m[0])
			}
			joined, sendOnly := n.s1.member(g)
			if !joined || sendOnly != support {
				t.Fatalf("member %v, send-only %v", joined, sendOnly)
			}
			if !support {
				n.s1.mu.Lock()
				var kinds []bool
				for _, j := range n.s1.joined {
					if j.mgid == g {
						kinds = append(kinds, j.sendOnly)
					}
				}
				n.s1.mu.Unlock()
				if len(kinds) != 2 || !kinds[0] || kinds[1] {
					t.Fatalf("joins of the group (send-only?) %v, want [true false]", kinds)
				}
			}
		})
	}
}

// FuzzPickIPoIB: any hardware and broadcast bytes are chosen or passed
// over without a panic; an interface chosen has the port GID and the
// partition asked for.
func FuzzPickIPoIB(f *testing.F) {
	m := ipoib.BroadcastMGID(0x8001, 2)
	f.Add(append([]byte{0, 0, 0, 0x48}, gid1[:]...), append([]byte{0, 0xff, 0xff, 0xff}, m[:]...), uint16(0x8001))
	f.Add([]byte{1, 2, 3}, []byte{}, uint16(0xffff))
	f.Fuzz(func(t *testing.T, hw, bcast []byte, pk uint16) {
		ifs := []ipoibIf{{name: "ib0", index: 3, hw: hw, bcast: bcast, addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, up: true, joined: true}}
		b, err := pickIPoIB(ifs, gid1, ipoib.PKey(pk))
		if err != nil {
			return
		}
		if b.ifname != "ib0" || !bytes.Equal(hw[4:], gid1[:]) || (uint16(bcast[8])<<8|uint16(bcast[9]))|0x8000 != pk|0x8000 {
			t.Fatalf("chose %+v for hw %x bcast %x pkey %#x", b, hw, bcast, pk)
		}
	})
}
