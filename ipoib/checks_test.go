package ipoib

import (
	"sync"
	"testing"
)

// TestCheckTx: each refused metadata gets its reason, a good packet none,
// and the source QP's entry comes back with the backend's data.
func TestCheckTx(t *testing.T) {
	qps := NewQPTable(0x100)
	if err := qps.Add(0x4242, 0x8001, "vif"); err != nil {
		t.Fatal(err)
	}
	uni := MakeHwAddr(0, 0x77, GID{0xfe, 0x80, 15: 1})
	mc := MakeHwAddr(0, MulticastQPN, BroadcastMGID(0x8001, ScopeLinkLocal))
	good := TxMeta{Dst: uni, SrcQPN: 0x4242, PKey: 0x8001}
	gso := good
	gso.GSO = GSO{Type: GSOTCPv4, L4: 24, Size: 1000}
	for _, c := range []struct {
		name string
		m    TxMeta
		n    int
		tso  bool
		want Drop
	}{
		{"good", good, 100, false, DropNone},
		{"multicast", TxMeta{Dst: mc, SrcQPN: 0x4242, PKey: 0x8001}, 100, false, DropNone},
		{"foreign QP", TxMeta{Dst: uni, SrcQPN: 0x4243, PKey: 0x8001}, 100, false, DropBadMeta},
		{"other P_Key", TxMeta{Dst: uni, SrcQPN: 0x4242, PKey: 0xffff}, 100, false, DropBadMeta},
		{"limited P_Key", TxMeta{Dst: uni, SrcQPN: 0x4242, PKey: 0x0001}, 100, false, DropBadMeta},
		{"multicast QPN to a GID", TxMeta{Dst: MakeHwAddr(0, MulticastQPN, uni.GID()), SrcQPN: 0x4242, PKey: 0x8001}, 100, false, DropBadMeta},
		{"unicast QPN to an MGID", TxMeta{Dst: MakeHwAddr(0, 5, mc.GID()), SrcQPN: 0x4242, PKey: 0x8001}, 100, false, DropBadMeta},
		{"super-packet without TSO", gso, 5000, false, DropBadGSO},
		{"super-packet", gso, 5000, true, DropNone},
		{"TCP header outside", gso, 30, true, DropBadGSO},
	} {
		q, d := CheckTx(&c.m, c.n, qps, c.tso)
		if d != c.want {
			t.Errorf("%s: %s, want %s", c.name, d, c.want)
		}
		if d == DropNone && q.Data != "vif" {
			t.Errorf("%s: entry %+v", c.name, q)
		}
	}
}

// TestCheckRx: the receive rules for unicast and multicast packets.
func TestCheckRx(t *testing.T) {
	qps := NewQPTable(0x100)
	groups := NewGroupTable()
	q, _ := qps.Alloc(0x8001, 0)
	g := BroadcastMGID(0x8001, ScopeLinkLocal)
	other := BroadcastMGID(0x8002, ScopeLinkLocal)
	groups.Join(g, nil)
	groups.JoinSendOnly(other)
	for _, c := range []struct {
		name string
		m    RxMeta
		want Drop
	}{
		{"unicast", RxMeta{DstQPN: q, PKey: 0x8001}, DropNone},
		{"limited sender to a full QP", RxMeta{DstQPN: q, PKey: 0x0001}, DropNone},
		{"unknown QPN", RxMeta{DstQPN: q + 1, PKey: 0x8001}, DropUnknownQPN},
		{"other partition", RxMeta{DstQPN: q, PKey: 0x8002}, DropPKey},
		{"multicast", RxMeta{DstQPN: MulticastQPN, MGID: g, PKey: 0x8001}, DropNone},
		{"group of another partition", RxMeta{DstQPN: MulticastQPN, MGID: g, PKey: 0x8002}, DropPKey},
		{"send-only group", RxMeta{DstQPN: MulticastQPN, MGID: other, PKey: 0x8002}, DropNotJoined},
		{"multicast QPN without MGID", RxMeta{DstQPN: MulticastQPN, PKey: 0x8001}, DropBadDestQPN},
		{"MGID with a unicast QPN", RxMeta{DstQPN: q, MGID: g, PKey: 0x8001}, DropBadDestQPN},
	} {
		if d := CheckRx(&c.m, qps, groups); d != c.want {
			t.Errorf("%s: %s, want %s", c.name, d, c.want)
		}
	}
}

// TestQPTableAdd: device-numbered QPs keep their data, refuse a QPN in
// use or out of range, and Remove, Clear and All see what was added.
func TestQPTableAdd(t *testing.T) {
	tbl := NewQPTable(0)
	if tbl.Add(0x11, 0xffff, 1) != nil || tbl.Add(0x11, 0xffff, 2) == nil || tbl.Add(1, 0xffff, 0) == nil || tbl.Add(MulticastQPN, 0xffff, 0) == nil || tbl.Add(0x12, 0x8000, 0) == nil {
		t.Fatal("Add accepted a QPN in use, a special QPN or an invalid P_Key, or refused a free one")
	}
	tbl.Add(0x12, 0x8001, 2)
	n := 0
	for qpn, q := range tbl.All() {
		n++
		if qpn == 0x11 && q.Data != 1 || qpn == 0x12 && q.Data != 2 {
			t.Fatalf("%#x: %+v", qpn, q)
		}
	}
	if n != 2 || tbl.Len() != 2 {
		t.Fatalf("All yielded %d, Len %d", n, tbl.Len())
	}
	if q, err := tbl.Remove(0x11); err != nil || q.Data != 1 {
		t.Fatalf("Remove: %+v %v", q, err)
	}
	if old := tbl.Clear(); len(old) != 1 || tbl.Len() != 0 {
		t.Fatalf("Clear returned %v, left %d", old, tbl.Len())
	}
}

// TestTablesConcurrent: lookups run while QPs and groups change (for the
// race detector: the readers take no lock).
func TestTablesConcurrent(t *testing.T) {
	qps := NewQPTable(0x100)
	groups := NewGroupTable()
	g := BroadcastMGID(0xffff, ScopeLinkLocal)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			qps.Lookup(0x100)
			groups.Full(g)
		}
	})
	for range 200 {
		q, err := qps.Alloc(0xffff, 0x100)
		if err != nil {
			t.Fatal(err)
		}
		groups.Join(g, nil)
		if _, ok := qps.Lookup(q); !ok || !groups.Full(g) {
			t.Fatal("a change is not seen by the next lookup")
		}
		qps.Free(q)
		groups.Leave(g, nil)
	}
	close(stop)
	wg.Wait()
}

// BenchmarkCheckTx: the shared transmit check allocates nothing.
func BenchmarkCheckTx(b *testing.B) {
	qps := NewQPTable(0x100)
	for i := range 1024 {
		qps.Alloc(0xffff, uint32(0x100+i))
	}
	m := TxMeta{Dst: MakeHwAddr(0, 0x77, GID{0xfe, 0x80, 15: 1}), SrcQPN: 0x200, PKey: 0xffff}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, d := CheckTx(&m, 100, qps, false); d != DropNone {
				b.Fatal(d)
			}
		}
	})
}
