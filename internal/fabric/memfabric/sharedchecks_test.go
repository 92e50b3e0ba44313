package memfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/fabrictest"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestSharedChecks runs the backends' shared conformance suite: packets
// are injected at the receiving port past the switch (deliver).
func TestSharedChecks(t *testing.T) {
	a, b := twoPorts(t)
	fabrictest.Run(t, fabrictest.Backend{
		Port: a,
		Peer: b,
		Inject: func(payload []byte, m ipoib.RxMeta) bool {
			a.deliver(payload, m)
			return true
		},
	})
}

// BenchmarkWriteRead moves batches of 64 packets of 1400 bytes from one
// port to the other: Write's checks and delivery and Read allocate
// nothing.
func BenchmarkWriteRead(b *testing.B) {
	const n, size = 64, 1400
	pa, pb := twoPorts(b)
	qa, _ := pa.AllocQP(ipoib.DefaultPKey, 0)
	qb, _ := pb.AllocQP(ipoib.DefaultPKey, 0)
	bufs, meta := make([][]byte, n), make([]ipoib.TxMeta, n)
	rbufs, sizes, rmeta := make([][]byte, n), make([]int, n), make([]ipoib.RxMeta, n)
	for i := range bufs {
		bufs[i] = make([]byte, ipoib.Headroom+size)
		ipoib.PutHeader(bufs[i][ipoib.Headroom:], 0x0800)
		meta[i] = ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, pb.LocalGID()), SrcQPN: qa, PKey: ipoib.DefaultPKey}
		rbufs[i] = make([]byte, 4096)
	}
	b.ReportAllocs()
	b.SetBytes(n * size)
	for b.Loop() {
		if k, err := pa.Write(bufs, meta, ipoib.Headroom); k != n || err != nil {
			b.Fatalf("wrote %d, %v", k, err)
		}
		for got := 0; got < n; {
			k, err := pb.Read(rbufs, sizes, rmeta, 0)
			if err != nil {
				b.Fatal(err)
			}
			got += k
		}
	}
}
