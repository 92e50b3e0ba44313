package shim

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/ipoib/memfabric"
	"github.com/eipoib/eipoibd/tap"
)

// TestSuperFrames: a guest's TCP super-frame (TSO) reaches the far guest
// as segments that carry its payload with valid checksums, IPv4 and
// IPv6, whether the port takes it whole and cuts it (tx_super and
// tx_super_segments count it and its segments, and a segment size beyond the IPoIB MTU is cut down to it) or the
// device cuts it before the shim (a port without TSO). A super-frame to a
// broadcast MAC is dropped and counted.
func TestSuperFrames(t *testing.T) {
	for _, tso := range []bool{false, true} {
		t.Run(fmt.Sprintf("tso=%v", tso), func(t *testing.T) {
			f, err := memfabric.New(4096)
			if err != nil {
				t.Fatal(err)
			}
			f.SetTSO(tso)
			a, b := newHV(t, f, "fe80::a", nil), newHV(t, f, "fe80::b", nil)
			_, remacB1 := arpExchange(t, a, b)
			payload := gsotest.Pattern(20000)
			wantSegs := uint64(0)
			sizes := []int{1400}
			if tso {
				sizes = append(sizes, 9000) // cut to 4092 - 20 - 32 bytes of headers
			}
			for _, v6 := range []bool{false, true} {
				for _, size := range sizes {
					et := layers.EthernetTypeIPv4
					if v6 {
						et = layers.EthernetTypeIPv6
					}
					link := serialize(t, eth(macA1, remacB1, et))[:ether.HeaderLen] // without the padding to 60 bytes
					pkt, l4 := gsotest.Super(t, link, v6, payload)
					a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: uint16(size), V6: v6})
					mss := min(size, 4092-(l4-ether.HeaderLen)-32)
					want := (len(payload) + mss - 1) / mss
					if tso {
						wantSegs += uint64(want)
					}
					var segs [][]byte
					for len(segs) < want {
						p := b.recv(t)
						e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
						if ether.MAC(e.DstMAC) != macB1 {
							t.Fatalf("v6 %v size %d: segment to %s", v6, size, e.DstMAC)
						}
						segs = append(segs, p.Data())
					}
					b.quiet(t)
					if back := gsotest.Reassemble(t, segs, ether.HeaderLen, v6, 4092); !bytes.Equal(back, payload) {
						t.Fatalf("v6 %v size %d: %d segments carry %d bytes that differ from the %d sent", v6, size, want, len(back), len(payload))
					}
				}
			}
			wantSuper := uint64(0)
			if tso {
				wantSuper = 4 // two versions, two sizes
			}
			if got, segs := a.s.Get(TxSuper), a.s.Get(TxSuperSegments); got != wantSuper || segs != wantSegs {
				t.Fatalf("tx_super %d of %d segments, want %d of %d", got, segs, wantSuper, wantSegs)
			}
			if tso {
				link := serialize(t, eth(macA1, ether.Broadcast, layers.EthernetTypeIPv4))[:ether.HeaderLen]
				pkt, l4 := gsotest.Super(t, link, false, payload)
				a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 1400})
				a.waitCounter(t, DropSuperGroup, 1)
				b.quiet(t)
			}
		})
	}
}
