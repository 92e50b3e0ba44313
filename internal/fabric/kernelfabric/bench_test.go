package kernelfabric_test

import (
	"fmt"
	"testing"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// BenchmarkBroadcastCopies measures what one fabric broadcast costs a
// port with n VIF children. Every child's QP is attached to its
// partition's broadcast group, so the host gets n+1 copies. The group
// child's goes to Read. The VIF children's HostOnly socket filters drop
// the n others before they are queued (filtered/op). ns/op and allocs/op
// are per broadcast Read returns; the difference between n = 1024 and n
// = 0 is what the copies cost. It runs over the fake kernel. So it
// counts the backend's side and the fake's delivery, the filter's check
// included, but not the kernel's own per-copy work (the HCA's
// replication, an skb per copy, packet_rcv and the filter).
func BenchmarkBroadcastCopies(b *testing.B) {
	for _, n := range []int{0, 1024} {
		b.Run(fmt.Sprintf("children=%d", n), func(b *testing.B) {
			f := fakekernel.NewFabric()
			ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
			a, rx := open(b, ka), open(b, kb)
			bc := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
			if err := rx.Join(bc); err != nil {
				b.Fatal(err)
			}
			for range n {
				if _, err := rx.AllocQP(0xffff, 0); err != nil {
					b.Fatal(err)
				}
			}
			qa, err := a.AllocQP(0xffff, 0)
			if err != nil {
				b.Fatal(err)
			}
			const size = 256 // an ARP request's worth, padded
			pkt := append(make([]byte, ipoib.Headroom), 0x08, 0x06, 0, 0)
			pkt = append(pkt, make([]byte, size)...)
			meta := []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, bc), SrcQPN: qa, PKey: 0xffff}}
			bufs, sizes, rmeta := [][]byte{make([]byte, 4200)}, make([]int, 1), make([]ipoib.RxMeta, 1)
			filtered := kb.Filtered()
			b.SetBytes(size + ipoib.HeaderLen)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if sent, _ := a.Write([][]byte{pkt}, meta, ipoib.Headroom); sent != 1 {
					b.Fatalf("drops %v", a.Counters().Drops)
				}
				if got, err := rx.Read(bufs, sizes, rmeta, 64); got != 1 || err != nil {
					b.Fatalf("read %d %v", got, err)
				}
			}
			b.StopTimer()
			if c := rx.Counters().Stats[kf.StatMcastCopies]; c != 0 {
				b.Fatalf("%d copies reached the VIF children's sockets", c)
			}
			b.ReportMetric(float64(kb.Filtered()-filtered)/float64(b.N), "filtered/op")
		})
	}
}
