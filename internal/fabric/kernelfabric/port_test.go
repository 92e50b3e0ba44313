package kernelfabric_test

import (
	"errors"
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

func open(t testing.TB, k *fakekernel.Kernel) *kf.Port {
	t.Helper()
	p, err := kf.New(kf.Config{Kernel: k, Parent: "ib0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestChildLifecycle: leftovers are reclaimed; children share a P_Key,
// get the host-off settings before coming up, and go with FreeQP and
// Close; the parent's carrier is followed.
func TestChildLifecycle(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	if err := k.AddChild(kf.ChildSpec{Name: "ib0.e7", Parent: 1, PKey: 0xffff}); err != nil {
		t.Fatal(err)
	}
	p := open(t, k)
	if _, ok := k.Link("ib0.e7"); ok || p.Counters().Stats[kf.StatReclaimed] != 1 {
		t.Fatal("leftover child not reclaimed")
	}
	q1, err1 := p.AllocQP(0x8001, 0)
	q2, err2 := p.AllocQP(0x8001, 0)
	if err1 != nil || err2 != nil || q1 == q2 {
		t.Fatalf("two children of P_Key 0x8001: %#x %v, %#x %v", q1, err1, q2, err2)
	}
	for _, name := range []string{"ib0.e1", "ib0.e2", "ib0.m8001", "ib0.mffff"} {
		st, ok := k.Link(name)
		if !ok || !st.Up || !st.NoARP || st.GRO {
			t.Fatalf("%s: %+v %v", name, st, ok)
		}
		for path, v := range map[string]string{"ipv6/conf/%s/disable_ipv6": "1", "ipv6/conf/%s/addr_gen_mode": "1", "ipv4/conf/%s/arp_ignore": "8", "ipv4/conf/%s/forwarding": "0", "ipv4/conf/%s/rp_filter": "1"} {
			if got := k.Sysctl("net/" + strings.Replace(path, "%s", name, 1)); got != v {
				t.Errorf("%s %s = %q", name, path, got)
			}
		}
	}
	if st, _ := k.Link("ib0.e2"); st.PKey != 0x8001 {
		t.Fatalf("P_Key %s", st.PKey)
	}
	if err := p.FreeQP(q1); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Link("ib0.e1"); ok {
		t.Fatal("freed child still there")
	}
	k.SetCarrier(false)
	testutil.WaitFor(t, "the port down", func() bool { return p.IsDown() })
	k.SetCarrier(true)
	testutil.WaitFor(t, "the port up", func() bool { return !p.IsDown() })
	p.Close()
	if links, _ := k.Links(); len(links) != 1 {
		t.Fatalf("links after Close: %v", links)
	}
}

// TestLongParentName: a parent of IFNAMSIZ - 1 bytes gets children whose
// names fit (ChildStem hashes it). A VIF child's index is reused once
// its child is freed. One whose creation failed (P_Key not in the table)
// takes none, so the names never grow. A restart reclaims the children a
// previous run left.
func TestLongParentName(t *testing.T) {
	const parent = "ibp129s0f0np0xy" // 15 bytes
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), parent, 2044)
	k.SetPKeys(0xffff, 0x8001)
	stem := kf.ChildStem(parent)
	leftover, _ := kf.ChildName(stem, 7)
	if err := k.AddChild(kf.ChildSpec{Name: leftover, Parent: 1, PKey: 0xffff}); err != nil {
		t.Fatal(err)
	}
	cfg := kf.Config{Kernel: k, Parent: parent, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p, err := kf.New(cfg)
	if err != nil {
		t.Fatalf("New on %s: %v", parent, err)
	}
	if _, ok := k.Link(leftover); ok || p.Counters().Stats[kf.StatReclaimed] != 1 {
		t.Fatalf("leftover %s not reclaimed", leftover)
	}
	var qpns []uint32
	for range 3 {
		q, err := p.AllocQP(0xffff, 0)
		if err != nil {
			t.Fatalf("AllocQP under %s: %v", parent, err)
		}
		qpns = append(qpns, q)
	}
	if _, err := p.AllocQP(0x8002, 0); err == nil {
		t.Fatal("child of a P_Key not in the table made")
	}
	if err := p.FreeQP(qpns[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AllocQP(0xffff, 0); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{kf.GroupChildName(stem, 0xffff): true}
	for _, n := range []int{1, 2, 3} {
		name, _ := kf.ChildName(stem, n)
		want[name] = true
	}
	if got := children(k); !maps.Equal(got, want) {
		t.Fatalf("children %v, want %v", got, want)
	}
	p.Close()
	// What a crash leaves: the children, recreated (Close deleted them).
	for name := range want {
		if err := k.AddChild(kf.ChildSpec{Name: name, Parent: 1, PKey: 0xffff}); err != nil {
			t.Fatal(err)
		}
	}
	p = openCfg(t, k, cfg)
	if n := p.Counters().Stats[kf.StatReclaimed]; n != 4 {
		t.Fatalf("%d reclaimed at restart, want 4", n)
	}
}

// TestConnectedParent: a parent in connected mode (MTU 65520) is
// accepted. The port's IB MTU is the UD one its children take (2048),
// and a VIF exchanges a packet of that full size with another host's. A
// mode the driver does not have is refused, naming it.
func TestConnectedParent(t *testing.T) {
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	ka.SetConnected()
	if l, _ := ka.LinkByName("ib0"); l.MTU != 65520 {
		t.Fatalf("connected parent's MTU %d", l.MTU)
	}
	a, b := open(t, ka), open(t, kb)
	if a.MTU() != 2048 || a.PartitionMTU(0xffff) != 2048 {
		t.Fatalf("IB MTU %d, partition %d, want 2048", a.MTU(), a.PartitionMTU(0xffff))
	}
	qa, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	qb, err := b.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := unicast(a, qa, 0xffff, ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b")), 2044); n != 1 {
		t.Fatalf("sent %d (%v)", n, a.Counters().Drops)
	}
	if n := readOne(t, b); n != 2048 {
		t.Fatalf("received %d bytes, want 2048", n)
	}
	if n := unicast(a, qa, 0xffff, ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b")), 2045); n != 0 || a.Counters().Drops[ipoib.DropOversize.String()] != 1 {
		t.Fatalf("one byte over the UD MTU: sent %d, drops %v", n, a.Counters().Drops)
	}
	k := f.NewHost(testutil.GID("fe80::c"), "ib0", 2044)
	k.ModeOf = "bogus"
	if _, err := kf.New(kf.Config{Kernel: k, Parent: "ib0"}); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Fatalf("mode bogus: %v", err)
	}
}

// TestBroadcastOnce: a broadcast reaches every child of the receiving
// host, and Read returns it once, from the group child, with no source;
// the copies on the VIF children are dropped by their sockets' HostOnly
// filters, before anything reads them.
func TestBroadcastOnce(t *testing.T) {
	f := fakekernel.NewFabric()
	kb := f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	a, b := open(t, f.NewHost(testutil.GID("fe80::a"), "ib0", 2044)), open(t, kb)
	bc := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	if err := b.Join(bc); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := b.AllocQP(0xffff, 0); err != nil {
			t.Fatal(err)
		}
	}
	qa, _ := a.AllocQP(0xffff, 0)
	buf := append(make([]byte, ipoib.Headroom), 0x08, 0x06, 0, 0, 1, 2, 3)
	if n, _ := a.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, bc), SrcQPN: qa, PKey: 0xffff}}, ipoib.Headroom); n != 1 {
		t.Fatalf("sent %d (%v)", n, a.Counters().Drops)
	}
	bufs, sizes, meta := [][]byte{make([]byte, 4200), make([]byte, 4200)}, make([]int, 2), make([]ipoib.RxMeta, 2)
	n, err := b.Read(bufs, sizes, meta, 64)
	if err != nil || n != 1 || sizes[0] != 7 || !meta[0].SrcUnknown || meta[0].MGID != bc || meta[0].DstQPN != ipoib.MulticastQPN {
		t.Fatalf("read %d %v %v %+v", n, err, sizes, meta[0])
	}
	if n, copies := kb.Filtered(), b.Counters().Stats[kf.StatMcastCopies]; n != 3 || copies != 0 {
		t.Fatalf("%d copies dropped by the VIF children's filters, %d read, want 3 and 0", n, copies)
	}
}

// TestSuperPacketHandedWhole: with TSO on the children, a super-packet
// goes to the kernel with its virtio_net_hdr.
func TestSuperPacketHandedWhole(t *testing.T) {
	f := fakekernel.NewFabric()
	k := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	k.TSOOn = true
	a := open(t, k)
	if o := a.Offloads(); !o.TSO {
		t.Fatal("no TSO")
	}
	q, _ := a.AllocQP(0xffff, 0)
	pkt := make([]byte, ipoib.Headroom+4+20+20+3000)
	pkt[ipoib.Headroom], pkt[ipoib.Headroom+4] = 0x08, 0x45
	pkt[ipoib.Headroom+4+20+12] = 5 << 4
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, 0x200, testutil.GID("fe80::b")), SrcQPN: q, PKey: 0xffff, GSO: ipoib.GSO{Type: ipoib.GSOTCPv4, L4: 24, Size: 1400}}
	if n, _ := a.Write([][]byte{pkt}, []ipoib.TxMeta{m}, ipoib.Headroom); n != 1 {
		t.Fatalf("drops %v", a.Counters().Drops)
	}
	sp := k.SuperPackets()
	if len(sp) != 1 || sp[0].Hdr != kf.GSOVnetHdr(m.GSO, 20) || sp[0].Len != 3040 {
		t.Fatalf("%+v", sp)
	}
}

// openCfg opens the backend on k's cfg.Parent (ib0 if empty) with
// cfg's other fields.
func openCfg(t *testing.T, k kf.Kernel, cfg kf.Config) *kf.Port {
	t.Helper()
	cfg.Kernel, cfg.Logger = k, slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Parent == "" {
		cfg.Parent = "ib0"
	}
	p, err := kf.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// unicast writes one IPv4 packet of n payload bytes from qpn (partition
// pkey) to dst and returns how many the port accepted.
func unicast(p *kf.Port, qpn uint32, pkey ipoib.PKey, dst ipoib.HwAddr, n int) int {
	buf := make([]byte, ipoib.Headroom+ipoib.HeaderLen+n)
	buf[ipoib.Headroom], buf[ipoib.Headroom+ipoib.HeaderLen] = 0x08, 0x45
	sent, _ := p.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: dst, SrcQPN: qpn, PKey: pkey}}, ipoib.Headroom)
	return sent
}

// readOne reads one packet from p and returns its size.
func readOne(t *testing.T, p *kf.Port) int {
	t.Helper()
	bufs, sizes, meta := [][]byte{make([]byte, 4200)}, make([]int, 1), make([]ipoib.RxMeta, 1)
	if n, err := p.Read(bufs, sizes, meta, 64); n != 1 || err != nil {
		t.Fatalf("read %d %v", n, err)
	}
	return sizes[0]
}

// children lists the names of the links under the parent.
func children(k *fakekernel.Kernel) map[string]bool {
	links, _ := k.Links()
	out := map[string]bool{}
	for _, l := range links {
		if l.ParentIndex != 0 {
			out[l.Name] = true
		}
	}
	return out
}

// TestChildWaitsForJoin: AllocQP returns once the child has carrier (its
// broadcast join done, here after 50 ms), not right after IFF_UP, so the
// first packet of the VIF is sent and not lost to the noop qdisc.
func TestChildWaitsForJoin(t *testing.T) {
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	ka.JoinDelay = 50 * time.Millisecond
	a, b := open(t, ka), open(t, kb)
	qa, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := ka.Link("ib0.e1"); !st.Carrier {
		t.Fatal("AllocQP returned before the child's carrier")
	}
	qb, _ := b.AllocQP(0xffff, 0)
	if n := unicast(a, qa, 0xffff, ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b")), 100); n != 1 || ka.TxNoCarrier() != 0 {
		t.Fatalf("sent %d, %d dropped without carrier", n, ka.TxNoCarrier())
	}
	if got := readOne(t, b); got != 104 {
		t.Fatalf("received %d bytes", got)
	}
}

// TestChildPKeyNotInTable: a P_Key the port's table lacks is refused at
// once, with the table named and the SM's configuration to change. No
// child is left behind. The next AllocQP of that partition is answered
// with the same reason without making a child.
func TestChildPKeyNotInTable(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	k.SetPKeys(0xffff, 0x8001)
	p := open(t, k)
	if _, err := p.AllocQP(0x8001, 0); err != nil {
		t.Fatal(err)
	}
	_, err := p.AllocQP(0x0005, 0)
	if !errors.Is(err, kf.ErrPKeyNotInTable) || !strings.Contains(err.Error(), "fake_0 port 1") || !strings.Contains(err.Error(), "partitions.conf") {
		t.Fatalf("got %v", err)
	}
	before := children(k)
	if before["ib0.m8005"] || len(before) != 3 {
		t.Fatalf("children after the refusal: %v", before)
	}
	_, err2 := p.AllocQP(0x0005, 0)
	c := p.Counters().Stats
	if !errors.Is(err2, kf.ErrPKeyNotInTable) || c[kf.StatRefusedPKey] != 1 || c[kf.StatRefusedAgain] != 1 || len(children(k)) != 3 {
		t.Fatalf("again: %v, stats %v, children %v", err2, c, children(k))
	}
	for _, e := range []error{err, err2} { // the shim counts it as vifs_refused_pkey
		if re := (*ipoib.RefusedError)(nil); !errors.As(e, &re) || re.Reason != "pkey" {
			t.Errorf("%v: not a RefusedError with reason pkey", e)
		}
	}
}

// TestChildAttachLimit: the HCA's per-group QP limit is 3 (the parent,
// the group child and one VIF child in the broadcast group). The next
// child's join never completes. AllocQP gives up after the timeout with
// a reason naming max_mcast_qp_attach, deletes the child and counts it.
// The first VIF keeps working, and a freed VIF lets the next one in.
func TestChildAttachLimit(t *testing.T) {
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	ka.MaxQPPerGroup = 3
	a, b := openCfg(t, ka, kf.Config{ChildTimeout: 200 * time.Millisecond}), open(t, kb)
	q1, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.AllocQP(0xffff, 0)
	if re := (*ipoib.RefusedError)(nil); !errors.Is(err, kf.ErrJoinTimeout) || !strings.Contains(err.Error(), "max_mcast_qp_attach") || !errors.As(err, &re) || re.Reason != "join" {
		t.Fatalf("got %v", err)
	}
	if ch := children(ka); ch["ib0.e2"] || len(ch) != 2 || a.Counters().Stats[kf.StatRefusedJoin] != 1 {
		t.Fatalf("children %v, stats %v", ch, a.Counters().Stats)
	}
	qb, _ := b.AllocQP(0xffff, 0)
	if n := unicast(a, q1, 0xffff, ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b")), 100); n != 1 || readOne(t, b) != 104 {
		t.Fatal("the first VIF stopped working")
	}
	if err := a.FreeQP(q1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocQP(0xffff, 0); err != nil {
		t.Fatalf("after a VIF was freed: %v", err)
	}
}

// TestChildCarrierFollowed: a ready child whose P_Key leaves the port's
// table loses carrier, as does its partition's group child, counted once
// each. Once the backend has seen it, its packets are dropped as
// child_no_carrier. They are not handed to the kernel, whose noop qdisc
// would drop them and say sent. They flow again once the P_Key is back
// and the child joined again.
func TestChildCarrierFollowed(t *testing.T) {
	ka, a, b, qa, dst := partitionPair(t)
	ka.SetPKeys(0xffff)
	testutil.WaitFor(t, "2 carrier losses", func() bool { return a.Counters().Stats[kf.StatCarrierLost] == 2 }) // the VIF's child and the group child
	if n := unicast(a, qa, 0x8001, dst, 100); n != 0 || ka.TxNoCarrier() != 0 || a.Counters().Drops[ipoib.DropNoCarrier.String()] != 1 {
		t.Fatalf("sent %d, handed to the kernel without carrier %d; drops %v", n, ka.TxNoCarrier(), a.Counters().Drops)
	}
	pkeyBack(t, ka, a, b, qa, dst)
}

// partitionPair makes hosts a and b, each with a VIF in partition
// 0x8001 (in a's P_Key table), and returns a's fake, both ports, a's
// VIF QPN and the address of b's.
func partitionPair(t *testing.T) (ka *fakekernel.Kernel, a, b *kf.Port, qa uint32, dst ipoib.HwAddr) {
	t.Helper()
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	ka.SetPKeys(0xffff, 0x8001)
	a, b = open(t, ka), open(t, kb)
	qa, err := a.AllocQP(0x8001, 0)
	if err != nil {
		t.Fatal(err)
	}
	qb, err := b.AllocQP(0x8001, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ka, a, b, qa, ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b"))
}

// pkeyBack puts partition 0x8001 back in a's P_Key table and checks
// that a's VIF qa reaches b's (dst) once its child has joined again.
func pkeyBack(t *testing.T, ka *fakekernel.Kernel, a, b *kf.Port, qa uint32, dst ipoib.HwAddr) {
	t.Helper()
	ka.SetPKeys(0xffff, 0x8001)
	testutil.WaitFor(t, "a packet sent with carrier back", func() bool { return unicast(a, qa, 0x8001, dst, 100) == 1 })
	if readOne(t, b) != 104 {
		t.Fatal("not received after the carrier came back")
	}
}

// TestChildWhilePortDown: a child made while the port is down is not
// waited for, as it cannot join before the port is back. AllocQP
// succeeds, its packets are dropped as child_no_carrier, and it works
// once the port is back and its join done.
func TestChildWhilePortDown(t *testing.T) {
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	a, b := open(t, ka), open(t, kb)
	ka.SetCarrier(false)
	testutil.WaitFor(t, "the port down", a.IsDown)
	qa, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	qb, _ := b.AllocQP(0xffff, 0)
	dst := ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b"))
	if n := unicast(a, qa, 0xffff, dst, 100); n != 0 || a.Counters().Drops[ipoib.DropNoCarrier.String()] != 1 {
		t.Fatalf("sent %d while down, drops %v", n, a.Counters().Drops)
	}
	ka.SetCarrier(true)
	testutil.WaitFor(t, "a packet sent with the port back", func() bool { return unicast(a, qa, 0xffff, dst, 100) == 1 })
	if readOne(t, b) != 104 {
		t.Fatal("not received after the port came back")
	}
}

// TestPartitionMTUFromGroup: under a parent of IB MTU 4096, a partition
// whose broadcast group the SM set to 2048 reports 2048 once its group
// child joined. The default partition reports 4096. A packet of that
// partition longer than 2044 bytes is dropped as oversize (the kernel
// would refuse it with EMSGSIZE); one that fits is delivered.
func TestPartitionMTUFromGroup(t *testing.T) {
	f := fakekernel.NewFabric()
	f.SetGroupMTU(0x8002, 2048)
	a, b := open(t, f.NewHost(testutil.GID("fe80::a"), "ib0", 4092)), open(t, f.NewHost(testutil.GID("fe80::b"), "ib0", 4092))
	if a.PartitionMTU(0x8002) != 4096 {
		t.Fatalf("partition not used yet: %d", a.PartitionMTU(0x8002))
	}
	qa, err := a.AllocQP(0x8002, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.PartitionMTU(0x8002) != 2048 || a.PartitionMTU(0x0002) != 2048 || a.PartitionMTU(0xffff) != 4096 || a.MTU() != 4096 {
		t.Fatalf("partition MTUs %d %d, port %d", a.PartitionMTU(0x8002), a.PartitionMTU(0xffff), a.MTU())
	}
	qb, _ := b.AllocQP(0x8002, 0)
	dst := ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b"))
	if n := unicast(a, qa, 0x8002, dst, 3000); n != 0 || a.Counters().Drops[ipoib.DropOversize.String()] != 1 {
		t.Fatalf("3000 bytes in a 2044-byte partition: sent %d, drops %v", n, a.Counters().Drops)
	}
	if n := unicast(a, qa, 0x8002, dst, 2040); n != 1 || readOne(t, b) != 2044 {
		t.Fatal("a packet of the partition's MTU was not delivered")
	}
}

// TestPartitionMTUChange: when the SM changes a partition's broadcast
// group MTU and the children join again (here after the port went down
// and up), PartitionMTU follows and the change is counted, for the group
// child and the VIF child.
func TestPartitionMTUChange(t *testing.T) {
	f := fakekernel.NewFabric()
	k := f.NewHost(testutil.GID("fe80::a"), "ib0", 4092)
	p := open(t, k)
	if _, err := p.AllocQP(0x8002, 0); err != nil || p.PartitionMTU(0x8002) != 4096 {
		t.Fatalf("%v, MTU %d", err, p.PartitionMTU(0x8002))
	}
	f.SetGroupMTU(0x8002, 2048)
	k.SetCarrier(false)
	k.SetCarrier(true)
	testutil.WaitFor(t, "partition 0x8002 at MTU 2048 after 2 changes", func() bool {
		return p.PartitionMTU(0x8002) == 2048 && p.Counters().Stats[kf.StatPartitionMTUChanges] == 2
	})
	if p.PartitionMTU(0xffff) != 4096 {
		t.Fatalf("default partition %d", p.PartitionMTU(0xffff))
	}
}

// TestOutgoingNotIgnoredCounted: a socket opened without
// PACKET_IGNORE_OUTGOING (the kernel refused it) shows in a Port's
// counters, not only in the package's OutgoingNotIgnored.
func TestOutgoingNotIgnoredCounted(t *testing.T) {
	refuse := func(_, _, opt, _ int) error {
		if opt == unix.PACKET_IGNORE_OUTGOING {
			return unix.ENOPROTOOPT
		}
		return nil
	}
	if err := kf.SetOptions(-1, kf.PacketOptions{}, refuse); err != nil {
		t.Fatal(err)
	}
	p := open(t, fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044))
	if got, want := p.Counters().Stats[kf.StatOutgoingNotIgnored], kf.OutgoingNotIgnored(); got != want || got == 0 {
		t.Fatalf("stat %d, OutgoingNotIgnored %d", got, want)
	}
}
