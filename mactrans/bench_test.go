package mactrans

import (
	"runtime"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// liveHeap returns the bytes of live heap after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkNeighLearnNew learns endpoints never seen before into a table
// at the daemon's default bound (65,536), full from the start, so that
// each one evicts another: a neighbour flood's cost per endpoint. It
// also reports the table's live heap per entry (B/entry), measured once
// the table is full.
func BenchmarkNeighLearnNew(b *testing.B) {
	const size = 65536
	base := liveHeap()
	tbl := NewNeighTable(size)
	now := t0
	for i := range size {
		if _, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(i), remoteGID), now); err != nil {
			b.Fatal(err)
		}
	}
	perEntry := float64(liveHeap()-base) / size
	b.ReportAllocs()
	b.SetBytes(1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Millisecond)
		if _, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(size+i)%ipoib.MaxQPN, remoteGID), now); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if tbl.Len() != size {
		b.Fatalf("%d entries, want %d", tbl.Len(), size)
	}
	b.ReportMetric(perEntry, "B/entry") // after ResetTimer, which clears it
}

// BenchmarkVIFCreateRemove creates a VIF and removes another in a table
// of 1,024 (the daemon's default bound): the VIF table's write path. It
// also reports the table's live heap per VIF (B/entry).
func BenchmarkVIFCreateRemove(b *testing.B) {
	const size = 1024
	base := liveHeap()
	tbl := NewVIFTable(localGID, size)
	var al allocator
	for i := range size - 1 {
		if _, _, err := tbl.Create(VIFKey{mac(i), 0}, 0xffff, OriginLearned, t0, al.alloc); err != nil {
			b.Fatal(err)
		}
	}
	perEntry := float64(liveHeap()-base) / (size - 1)
	b.ReportAllocs()
	b.SetBytes(1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := tbl.Create(VIFKey{mac(size - 1 + i), 0}, 0xffff, OriginLearned, t0, al.alloc); err != nil {
			b.Fatal(err)
		}
		if _, ok := tbl.Remove(VIFKey{mac(i), 0}, OriginDeclared); !ok {
			b.Fatalf("VIF %d missing", i)
		}
	}
	b.ReportMetric(perEntry, "B/entry") // after ResetTimer, which clears it
}
