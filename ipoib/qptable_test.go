package ipoib

import (
	"fmt"
	"testing"
)

// BenchmarkQPTableFillEmpty fills a table with n device-numbered QPs and
// frees them one by one, as a port's start and stop do with its VIFs:
// each change must cost about the same however full the table is.
func BenchmarkQPTableFillEmpty(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tbl := NewQPTable(0)
				for i := range n {
					if err := tbl.Add(uint32(0x11+i), 0xffff, nil); err != nil {
						b.Fatal(err)
					}
				}
				for i := range n {
					if err := tbl.Free(uint32(0x11 + i)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkGroupTableJoinLeave joins n groups and leaves them one by one.
func BenchmarkGroupTableJoinLeave(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tbl := NewGroupTable()
				for i := range n {
					tbl.Join(groupN(i), nil)
				}
				for i := range n {
					tbl.Leave(groupN(i), nil)
				}
			}
		})
	}
}

// groupN is a distinct IPv4 group's MGID per n.
func groupN(n int) GID {
	g := BroadcastMGID(0xffff, ScopeLinkLocal)
	g[12], g[13], g[14], g[15] = 0, byte(n>>16), byte(n>>8), byte(n)
	return g
}

// TestTableReadsAllocateNothing: the data path's lookups of both tables
// allocate nothing, hit or miss.
func TestTableReadsAllocateNothing(t *testing.T) {
	qps, groups := NewQPTable(0), NewGroupTable()
	if err := qps.Add(0x11, 0xffff, "state"); err != nil {
		t.Fatal(err)
	}
	groups.Join(groupN(1), nil)
	allocs := testing.AllocsPerRun(100, func() {
		q, ok := qps.Lookup(0x11)
		_, miss := qps.Lookup(0x12345)
		if !ok || q.Data != "state" || miss || !groups.Full(groupN(1)) || groups.Full(groupN(2)) {
			t.Fatal("wrong answer")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per lookup", allocs)
	}
}

// TestQPTableRadix: QPNs at the edges of leaves and of the QPN space are
// kept apart, All yields them in QPN order, an emptied leaf is dropped,
// and Clear returns everything and leaves the table empty.
func TestQPTableRadix(t *testing.T) {
	tbl := NewQPTable(0)
	qpns := []uint32{2, qpLeafSize - 1, qpLeafSize, 5 * qpLeafSize, MaxQPN - 1}
	for i, q := range qpns {
		if err := tbl.Add(q, PKey(0x8001+i), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := tbl.Add(MaxQPN, 0xffff, nil); err == nil {
		t.Fatal("the multicast QPN added")
	}
	var got []uint32
	for q, e := range tbl.All() {
		if e.Data != len(got) {
			t.Fatalf("QPN %#x has %v", q, e.Data)
		}
		got = append(got, q)
	}
	if fmt.Sprint(got) != fmt.Sprint(qpns) || tbl.Len() != len(qpns) {
		t.Fatalf("All yields %v, Len %d", got, tbl.Len())
	}
	if _, ok := tbl.Lookup(MaxQPN); ok {
		t.Fatal("found the multicast QPN")
	}
	if err := tbl.Free(5 * qpLeafSize); err != nil || tbl.root[5].Load() != nil {
		t.Fatalf("Free: %v; the emptied leaf stays: %v", err, tbl.root[5].Load() != nil)
	}
	if err := tbl.Free(qpLeafSize - 1); err != nil || tbl.root[0].Load() == nil {
		t.Fatal("a leaf still holding QPN 2 was dropped")
	}
	if old := tbl.Clear(); len(old) != 3 || old[MaxQPN-1].PKey != 0x8005 || tbl.Len() != 0 {
		t.Fatalf("Clear returned %v, Len %d", old, tbl.Len())
	}
	if _, ok := tbl.Lookup(2); ok {
		t.Fatal("QPN 2 outlived Clear")
	}
}

// TestQPTableConcurrent: lookups running beside Add and Free (go test
// -race) see a QP that stays in the table throughout, and never one that
// was never added.
func TestQPTableConcurrent(t *testing.T) {
	tbl := NewQPTable(0)
	if err := tbl.Add(0x11, 0xffff, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20000 {
			q := uint32(0x1000 + i%5000)
			if i < 5000 {
				tbl.Add(q, 0xffff, nil)
			} else {
				tbl.Free(q)
				tbl.Add(q, 0xffff, nil)
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		if _, ok := tbl.Lookup(0x11); !ok {
			t.Fatal("a QP in the table throughout was not found")
		}
		if _, ok := tbl.Lookup(0x10); ok {
			t.Fatal("found a QP never added")
		}
	}
}
