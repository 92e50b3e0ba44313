package shim

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestSuperFrames: a guest's TCP super-frame (TSO) reaches the far guest
// as segments that carry its payload with valid checksums, IPv4 and
// IPv6. The port may take it whole and cut it: tx_super and
// tx_super_segments count it and its segments, and a segment size beyond
// the IPoIB MTU is cut down to it. Or the device cuts it before the shim
// (a port without TSO). A super-frame to a broadcast MAC is dropped and
// counted.
func TestSuperFrames(t *testing.T) {
	for _, tso := range []bool{false, true} {
		t.Run(fmt.Sprintf("tso=%v", tso), func(t *testing.T) {
			f := memFab(t, 4096)
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

// TestTxQueues: on a device with two queues, a TX worker reads each. The
// frames two guests send through different queues at the same time all
// reach the far guest, each once, and are all counted as forwarded. Run
// with -race, this also checks the workers share only locked state.
func TestTxQueues(t *testing.T) {
	f := memFab(t, 2048)
	big := func(q int) func(*Config) {
		return func(c *Config) { c.Device = tap.NewMemQueues(2048, q) }
	}
	a, b := newHV(t, f, "fe80::a", big(2)), newHV(t, f, "fe80::b", big(1))
	_, remacB1 := arpExchange(t, a, b)
	// The second guest's VIF first: a new guest's frames are held (16 at
	// most) while its VIF is made.
	a.dev.Queue(1).Inject(arpFrame(t, layers.ARPRequest, macA2, ipA2, ether.Broadcast, ether.MAC{}, ipB1))
	b.recv(t)
	const each = 500
	done := make(chan struct{})
	for q, mac := range []ether.MAC{macA1, macA2} {
		go func() {
			defer func() { done <- struct{}{} }()
			frame := udpFrame(t, mac, remacB1, ipA1, ipB1, 100, true)
			for range each {
				a.dev.Queue(q).Inject(frame)
			}
		}()
	}
	<-done
	<-done
	from := map[string]int{}
	for range 2 * each {
		from[b.recv(t).Layer(layers.LayerTypeEthernet).(*layers.Ethernet).SrcMAC.String()]++
	}
	b.quiet(t)
	if len(from) != 2 {
		t.Fatalf("frames from %v, want %d from each of two REMACs", from, each)
	}
	for src, n := range from {
		if n != each {
			t.Fatalf("%d frames from %s, want %d", n, src, each)
		}
	}
	if got := a.s.Get(TxForwarded); got != 2*each+2 { // and the ARP requests
		t.Fatalf("tx_forwarded %d, want %d", got, 2*each+2)
	}
}

// TestLearnDeclared: with --learn declared, frames from a source MAC that
// was never declared are dropped and counted, take no QP and reach no
// one. Once the MAC is declared (as the bridge watcher does for a static
// FDB entry), its frames pass. A bad mode is refused.
func TestLearnDeclared(t *testing.T) {
	f := memFab(t, 2048)
	a := newHV(t, f, "fe80::a", func(c *Config) { c.Learn = LearnDeclared })
	b := newHV(t, f, "fe80::b", nil)
	req := arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1)
	a.dev.Inject(req)
	a.waitCounter(t, DropUndeclared, 1)
	b.quiet(t)
	if a.s.Get(VIFsCreated) != 0 {
		t.Fatalf("vifs_created %d for an undeclared MAC", a.s.Get(VIFsCreated))
	}
	if err := a.s.DeclareVIF(macA1, 0, mactrans.OriginDeclared); err != nil {
		t.Fatal(err)
	}
	a.dev.Inject(req)
	if p := b.recv(t); p.Layer(layers.LayerTypeARP) == nil {
		t.Fatalf("declared guest's ARP not delivered: %v", p)
	}
	if a.s.Get(DropUndeclared) != 1 || a.s.Get(VIFsCreated) != 1 {
		t.Fatalf("drop_undeclared %d, vifs_created %d; want 1 and 1", a.s.Get(DropUndeclared), a.s.Get(VIFsCreated))
	}
	if _, err := New(Config{Device: tap.NewMem(1), Port: a.port, Learn: 5}); err == nil || !strings.Contains(err.Error(), "learning mode LearnMode(5)") {
		t.Fatalf("bad mode: %v", err)
	}
}
