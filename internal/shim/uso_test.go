package shim

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// usoFabric is the in-memory fabric with ports that take UDP
// super-packets (Offloads.USO): each records the GSO descriptions it is
// given and cuts the super-packets itself, as the simulated fabric does.
type usoFabric struct{ memFabric }

type usoPort struct {
	testPort
	mu   sync.Mutex
	seen []ipoib.GSO
}

func (f usoFabric) port(t *testing.T, gid ipoib.GID) testPort {
	return &usoPort{testPort: f.memFabric.port(t, gid)}
}

func (p *usoPort) Offloads() ipoib.Offloads {
	o := p.testPort.Offloads()
	o.USO = true
	return o
}

func (p *usoPort) gsos() []ipoib.GSO {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ipoib.GSO(nil), p.seen...)
}

// Write cuts the UDP super-packets and hands everything to the
// in-memory port.
func (p *usoPort) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	var out [][]byte
	var om []ipoib.TxMeta
	for i, b := range bufs {
		m := meta[i]
		if !m.GSO.Type.UDP() {
			out, om = append(out, b), append(om, m)
			continue
		}
		p.mu.Lock()
		p.seen = append(p.seen, m.GSO)
		p.mu.Unlock()
		var s gso.Segmenter
		if err := s.StartUDP(b[offset:], ipoib.HeaderLen, int(m.GSO.L4), m.GSO.Type.V6(), int(m.GSO.Size), p.MTU()-ipoib.HeaderLen); err != nil {
			return 0, fmt.Errorf("usoPort: %w", err)
		}
		for !s.Done() {
			d := make([]byte, offset+p.MTU()+64)
			n := s.Cut(d[offset:])
			m.GSO = ipoib.GSO{}
			out, om = append(out, d[:offset+n]), append(om, m)
		}
	}
	n, err := p.testPort.Write(out, om, offset)
	if n < len(out) {
		return 0, err // a test: all or nothing
	}
	return len(bufs), err
}

// recvDatagrams returns the next n frames b's guest receives.
func recvDatagrams(t *testing.T, b *hv, n int) [][]byte {
	var got [][]byte
	for len(got) < n {
		got = append(got, b.recv(t).Data())
	}
	b.quiet(t)
	return got
}

// TestUDPSuperFrames: a guest's UDP super-frame (UDP_SEGMENT through a
// TAP with USO) reaches the far guest as exactly the datagrams it would
// have sent one by one (gsotest.CheckUDPCut: lengths, IPv4 IDs,
// checksums), IPv4 and IPv6. It is given whole to a port that takes UDP
// super-packets (tx_super, tx_super_segments). That port sees the
// datagram size uncut and the UDP header's offset. For one that does
// not, it is cut here (tx_super_cut). Datagrams larger than the IPoIB MTU
// cannot be cut smaller: with DF the guest gets one ICMP too-big for the
// frame, and none is sent on; without, each is fragmented.
func TestUDPSuperFrames(t *testing.T) {
	for _, uso := range []bool{false, true} {
		t.Run(fmt.Sprintf("uso=%v", uso), func(t *testing.T) {
			mf := memFab(t, 2048)
			mf.SetTSO(true)
			var f fabric = mf
			if uso {
				f = usoFabric{mf}
			}
			a, b := newHV(t, f, "fe80::a", nil), newHV(t, f, "fe80::b", nil)
			_, remacB1 := arpExchange(t, a, b)
			supers, cut, segs := uint64(0), uint64(0), uint64(0)
			for _, v6 := range []bool{false, true} {
				et := layers.EthernetTypeIPv4
				if v6 {
					et = layers.EthernetTypeIPv6
				}
				link := serialize(t, eth(macA1, remacB1, et))[:ether.HeaderLen]
				for _, c := range []struct{ size, total int }{{64, 64 * 32}, {1000, 9999}} {
					payload := gsotest.Pattern(c.total)
					pkt, l4 := gsotest.SuperUDP(t, link, v6, payload)
					a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: uint16(c.size), V6: v6, UDP: true})
					n := (c.total + c.size - 1) / c.size
					got := recvDatagrams(t, b, n)
					gsotest.CheckUDPCut(t, got, got[0][:ether.HeaderLen], v6, payload, c.size)
					if uso {
						supers++
						segs += uint64(n)
					} else {
						cut++
					}
				}
			}
			if s, g, c := a.s.Get(TxSuper), a.s.Get(TxSuperSegments), a.s.Get(TxSuperCut); s != supers || g != segs || c != cut {
				t.Fatalf("tx_super %d of %d datagrams, tx_super_cut %d; want %d of %d, %d", s, g, c, supers, segs, cut)
			}
			if uso {
				p := a.port.(*usoPort)
				want := ipoib.GSO{Type: ipoib.GSOUDPv4, L4: ipoib.HeaderLen + header.IPv4MinLen, Size: 64}
				if g := p.gsos(); len(g) != 4 || g[0] != want {
					t.Fatalf("the port was given %+v, want 4 starting with %+v", g, want)
				}
			}
			// Datagrams of 3,000 bytes with DF over a 2,044-byte IPoIB MTU.
			link := serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv4))[:ether.HeaderLen]
			pkt, l4 := gsotest.SuperUDP(t, link, false, gsotest.Pattern(9000))
			a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 3000, UDP: true})
			a.waitCounter(t, TxICMPTooBig, 1)
			if p := a.recv(t); p.Layer(layers.LayerTypeICMPv4) == nil {
				t.Fatalf("the guest got %v, want ICMP fragmentation needed", p)
			}
			b.quiet(t)
			// Without DF each datagram is fragmented, as the kernel
			// fragments the segments of a GSO skb: three datagrams in
			// two fragments each, one frame read, one outcome.
			pkt[ether.HeaderLen+6] &^= 0x40 // DF
			header.IPv4(pkt[ether.HeaderLen:]).SetChecksum()
			a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 3000, UDP: true})
			a.waitCounter(t, TxFragmented, 1)
			for range recvDatagrams(t, b, 6) {
			}
			if c, r := a.s.Get(TxSuperCut), a.s.Get(TxPortRefused); c != cut+1 || r != 0 {
				t.Fatalf("tx_super_cut %d, tx_port_refused %d; want %d, 0", c, r, cut+1)
			}
			if c := a.s.Counters(); c["tx_fragmented"] != 1 || c["tx_fragments"] != 6 || sumEnds(c, stat.TxEnd) != c["tx_frames"] {
				t.Fatalf("tx_fragmented %d of %d fragments, outcomes %d of tx_frames %d; want 1 of 6, every frame once",
					c["tx_fragmented"], c["tx_fragments"], sumEnds(c, stat.TxEnd), c["tx_frames"])
			}
		})
	}
}

// BenchmarkTxSuperUDP is the TX path for a UDP super-frame of 32
// datagrams of 64 bytes (what bin/udprate sends), per super-frame. The
// port does not take UDP super-packets: one translation, then the
// datagrams are cut here into the batch's fragment buffers.
func BenchmarkTxSuperUDP(b *testing.B) {
	s, remac := benchShim(b)
	link := make([]byte, ether.HeaderLen)
	ether.PutHeader(link, remac, macA1, 0, ether.TypeIPv4)
	frame, l4 := gsotest.SuperUDP(b, link, false, make([]byte, 64*32))
	sup := tap.Super{L4: uint16(l4), Size: 64, UDP: true}
	buf := make([]byte, devBufSize)
	batch := newTxBatch(1)
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := 0; i < b.N; i++ {
		copy(buf[devHeadroom:], frame) // whole: the shim rewrites the headers
		s.tx(batch, buf, len(frame), sup, now)
		if len(batch.bufs) != 32 {
			b.Fatalf("%d datagrams in the batch, want 32: %v", len(batch.bufs), s.Counters())
		}
		batch.bufs, batch.meta, batch.nfrag = batch.bufs[:0], batch.meta[:0], 0
	}
}

// joinGate is a port whose JoinSendOnly waits until the test closes
// release, after telling joining that it began.
type joinGate struct {
	testPort
	joining chan struct{}
	release chan struct{}
}

func (p *joinGate) JoinSendOnly(mgid ipoib.GID) error {
	close(p.joining)
	<-p.release
	return p.testPort.JoinSendOnly(mgid)
}

// TestUDPSuperFrameHeldForGroup: a UDP super-frame to a group being
// joined is held. Once the send-only join returns, it is given whole to
// a port that takes UDP super-packets. It is counted as one sent at once
// is: tx_super and tx_super_segments as well as tx_multicast.
func TestUDPSuperFrameHeldForGroup(t *testing.T) {
	mf := memFab(t, 2048)
	mf.SetTSO(true) // the shim reads super-frames from the TAP
	f := usoFabric{mf}
	gate := &joinGate{joining: make(chan struct{}), release: make(chan struct{})}
	a := newHV(t, f, "fe80::a", func(c *Config) {
		gate.testPort = c.Port.(testPort)
		c.Port = gate
	})
	t.Cleanup(func() {
		select {
		case <-gate.release:
		default:
			close(gate.release) // before the shutdown
		}
	})
	b := newHV(t, f, "fe80::b", nil)
	arpExchange(t, a, b) // A1's VIF
	const size, datagrams = 64, 32
	link := serialize(t, eth(macA1, ether.MAC{1, 0, 0x5e, 1, 2, 3}, layers.EthernetTypeIPv4))[:ether.HeaderLen]
	pkt, l4 := gsotest.SuperUDP(t, link, false, gsotest.Pattern(size*datagrams))
	ip := header.IPv4(pkt[ether.HeaderLen:])
	copy(ip.DstBytes(), []byte{239, 1, 2, 3})
	ip.SetChecksum()
	binary.BigEndian.PutUint16(pkt[l4+6:], ^csum.Fold(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoUDP, len(pkt)-l4)))
	before := a.s.Counters()
	a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: size, UDP: true})
	select {
	case <-gate.joining:
	case <-time.After(testutil.Settle):
		t.Fatalf("no send-only join began (counters %v)", a.s.Counters())
	}
	a.waitCounter(t, TxQueuedGroup, before["tx_queued_group"]+1)
	close(gate.release)
	a.waitCounter(t, TxMulticast, before["tx_multicast"]+1)
	c := a.s.Counters()
	d := func(name string) uint64 { return c[name] - before[name] }
	if d("tx_forwarded") != 1 || d("tx_super") != 1 || d("tx_super_segments") != datagrams {
		t.Fatalf("tx_forwarded +%d, tx_super +%d of +%d datagrams; want +1, +1 of +%d",
			d("tx_forwarded"), d("tx_super"), d("tx_super_segments"), datagrams)
	}
	want := ipoib.GSO{Type: ipoib.GSOUDPv4, L4: ipoib.HeaderLen + header.IPv4MinLen, Size: size}
	if g := gate.testPort.(*usoPort).gsos(); len(g) != 1 || g[0] != want {
		t.Fatalf("the port was given %+v, want one %+v", g, want)
	}
}
