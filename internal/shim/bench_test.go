package shim

import (
	"io"
	"log/slog"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// stillShim is a shim on a port of f that is not running: tests and
// benchmarks call the per-frame functions directly.
func stillShim(tb testing.TB, f *memfabric.Fabric, gid string, mod func(*Config)) (*Shim, *memfabric.Port) {
	tb.Helper()
	port, err := f.NewPort(testutil.GID(gid))
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Device: tap.NewMem(1024), Port: port, Clock: clock.NewFake(time.Unix(1e6, 0)), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s, port
}

// benchShim is a still shim that knows one remote endpoint and has the
// VIF of guest macA1 (made by the control plane, off the measured path).
func benchShim(b *testing.B) (*Shim, ether.MAC) {
	f, _ := memfabric.New(4096)
	s, _ := stillShim(b, f, "fe80::a", nil)
	nb, err := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b")), time.Now())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, time.Now()); err != nil {
		b.Fatal(err)
	}
	return s, nb.REMAC
}

// udpPacket is an IPv4/UDP packet of size payload bytes from sip to dip.
func udpPacket(tb testing.TB, sip, dip netip.Addr, size int) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: sip.AsSlice(), DstIP: dip.AsSlice()}
	udp := &layers.UDP{SrcPort: 1, DstPort: 2}
	udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, gopacket.Payload(make([]byte, size))); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkTx is the per-frame TX path: a 1400-byte UDP frame from a known
// guest to a known REMAC.
func BenchmarkTx(b *testing.B) {
	s, remac := benchShim(b)
	ip := udpPacket(b, ipA1, ipB1, 1400)
	frame := make([]byte, ether.HeaderLen+len(ip))
	ether.PutHeader(frame, remac, macA1, 0, ether.TypeIPv4)
	copy(frame[ether.HeaderLen:], ip)
	benchTx(b, s, frame)
}

// benchTx measures s.tx on one frame.
func benchTx(b *testing.B, s *Shim, frame []byte) {
	buf := make([]byte, devBufSize)
	batch := &txBatch{bufs: make([][]byte, 0, 1), meta: make([]ipoib.TxMeta, 0, 1)}
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := 0; i < b.N; i++ {
		copy(buf[devHeadroom:], frame)
		s.tx(batch, buf, len(frame), tap.Super{}, now)
		if len(batch.bufs) != 1 {
			b.Fatalf("frame not translated: %v", s.Counters())
		}
		batch.bufs, batch.meta = batch.bufs[:0], batch.meta[:0]
	}
}

// BenchmarkTxIPv6 is the per-frame TX path for IPv6 (with the snooping
// checks every IPv6 frame passes).
func BenchmarkTxIPv6(b *testing.B) {
	s, remac := benchShim(b)
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: netip.MustParseAddr("fd00::a1").AsSlice(), DstIP: netip.MustParseAddr("fd00::b1").AsSlice()}
	udp := &layers.UDP{SrcPort: 1, DstPort: 2}
	udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, gopacket.Payload(make([]byte, 1400)))
	frame := make([]byte, ether.HeaderLen+len(buf.Bytes()))
	ether.PutHeader(frame, remac, macA1, 0, ether.TypeIPv6)
	copy(frame[ether.HeaderLen:], buf.Bytes())
	benchTx(b, s, frame)
}

// BenchmarkRx is the per-packet RX path: a 1400-byte UDP packet from a
// known endpoint to a guest's VIF.
func BenchmarkRx(b *testing.B) {
	s, _ := benchShim(b)
	v, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	pkt := append([]byte{8, 0, 0, 0}, udpPacket(b, ipA1, ipB1, 1400)...)
	buf := make([]byte, rxOffset+4096+64)
	m := ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b")), DstQPN: v.QPN, PKey: 0xffff}
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for i := 0; i < b.N; i++ {
		copy(buf[rxOffset:], pkt)
		if f := s.rx(buf, len(pkt), &m, now); f == nil {
			b.Fatalf("packet not translated: %v", s.Counters())
		}
	}
}

// BenchmarkTxARP includes the ARP payload rewrite.
func BenchmarkTxARP(b *testing.B) {
	s, remac := benchShim(b)
	frame := make([]byte, ether.HeaderLen+28)
	ether.PutHeader(frame, remac, macA1, 0, ether.TypeARP)
	copy(frame[ether.HeaderLen:], []byte{0, 1, 8, 0, 6, 4, 0, 2})
	copy(frame[ether.HeaderLen+8:], macA1[:])
	copy(frame[ether.HeaderLen+18:], remac[:])
	a4 := netip.MustParseAddr("10.0.0.2").As4()
	copy(frame[ether.HeaderLen+24:], a4[:])
	benchTx(b, s, frame)
}

// BenchmarkTx64K is the TX path for the 16 segments of a 64 KB TCP
// super-frame after the TAP cut it (4,040-byte segments to a known
// REMAC), per super-frame; BenchmarkSegment64K in package tap is the
// cutting.
func BenchmarkTx64K(b *testing.B) {
	s, remac := benchShim(b)
	ip := udpPacket(b, ipA1, ipB1, 4092-28)
	frame := make([]byte, ether.HeaderLen+len(ip))
	ether.PutHeader(frame, remac, macA1, 0, ether.TypeIPv4)
	copy(frame[ether.HeaderLen:], ip)
	const segs = 16
	bufs := make([][]byte, segs)
	for i := range bufs {
		bufs[i] = make([]byte, devBufSize)
	}
	batch := newTxBatch(segs)
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(segs * int64(len(frame)))
	for i := 0; i < b.N; i++ {
		for j := range bufs {
			copy(bufs[j][devHeadroom:], frame)
			s.tx(batch, bufs[j], len(frame), tap.Super{}, now)
		}
		if len(batch.bufs) != segs {
			b.Fatalf("%d of %d segments translated: %v", len(batch.bufs), segs, s.Counters())
		}
		batch.bufs, batch.meta = batch.bufs[:0], batch.meta[:0]
	}
}

// BenchmarkRx64K is the RX path for 16 segments of 64 KB arriving in one
// batch, per 64 KB; the TAP then merges them (BenchmarkCoalesce64K).
func BenchmarkRx64K(b *testing.B) {
	s, _ := benchShim(b)
	v, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	pkt := append([]byte{8, 0, 0, 0}, udpPacket(b, ipB1, ipA1, 4092-28)...)
	const segs = 16
	bufs := make([][]byte, segs)
	for i := range bufs {
		bufs[i] = make([]byte, rxOffset+4096+64)
	}
	m := ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b")), DstQPN: v.QPN, PKey: 0xffff}
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(segs * int64(len(pkt)))
	for i := 0; i < b.N; i++ {
		for _, buf := range bufs {
			copy(buf[rxOffset:], pkt)
			if f := s.rx(buf, len(pkt), &m, now); f == nil {
				b.Fatalf("packet not translated: %v", s.Counters())
			}
		}
	}
}

// BenchmarkTablesAtScale fills 1,024 VIFs (one QP each) and 100,000
// neighbours, reports the heap they take (table-MiB), then measures a
// VIF and a neighbour lookup each (per op) in that steady state.
func BenchmarkTablesAtScale(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f, _ := memfabric.New(4096)
	s, _ := stillShim(b, f, "fe80::a", func(c *Config) { c.MaxNeighbours = 100000 })
	now := time.Now()
	macs := make([]ether.MAC, 1024)
	for i := range macs {
		macs[i] = ether.MAC{0x52, 0x54, 0, 1, byte(i >> 8), byte(i)}
		if _, err := s.vif(s.byVLAN[0].Load(), macs[i], mactrans.OriginLearned, now); err != nil {
			b.Fatal(err)
		}
	}
	remacs := make([]ether.MAC, 100000)
	for i := range remacs {
		gid := testutil.GID("fe80::1")
		gid[12], gid[13], gid[14], gid[15] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
		nb, err := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, 0x100+uint32(i%1000), gid), now)
		if err != nil {
			b.Fatal(err)
		}
		remacs[i] = nb.REMAC
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.vifs.Len() != 1024 || s.neigh.Len() != 100000 {
		b.Fatalf("%d VIFs, %d neighbours", s.vifs.Len(), s.neigh.Len())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := s.vifs.Lookup(mactrans.VIFKey{MAC: macs[i%len(macs)]}); !ok {
			b.Fatal("VIF missing")
		}
		if _, ok := s.neigh.LookupREMAC(0xffff, remacs[i%len(remacs)]); !ok {
			b.Fatal("neighbour missing")
		}
	}
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "table-MiB") // after the loop: ResetTimer deletes metrics
}

// BenchmarkTxSuper64K is the TX path for a 64 KB TCP super-frame handed
// to a port that cuts it itself (TSO): one translation per super-frame,
// where BenchmarkTx64K translates its 16 segments.
func BenchmarkTxSuper64K(b *testing.B) {
	s, remac := benchShim(b)
	link := make([]byte, ether.HeaderLen)
	ether.PutHeader(link, remac, macA1, 0, ether.TypeIPv4)
	frame, l4 := gsotest.Super(b, link, false, make([]byte, 65535-20-32))
	sup := tap.Super{L4: uint16(l4), Size: 4040}
	buf := make([]byte, devBufSize)
	copy(buf[devHeadroom:], frame)
	hdrs := l4 + header.TCP(frame[l4:]).HeaderLen()
	batch := newTxBatch(1)
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for i := 0; i < b.N; i++ {
		copy(buf[devHeadroom:devHeadroom+hdrs], frame[:hdrs]) // the headers, which the shim rewrites
		s.tx(batch, buf, len(frame), sup, now)
		if len(batch.bufs) != 1 {
			b.Fatalf("super-frame not translated: %v", s.Counters())
		}
		batch.bufs, batch.meta = batch.bufs[:0], batch.meta[:0]
	}
}

// BenchmarkMACFlood is the TX path for a MAC flood's frames, each from a
// guest MAC with no VIF, from every TX worker at once (RunParallel). It
// runs on a full VIF table ("full", refused as vif_limit) and from
// guests in their refusal back-off ("refused"). Neither may serialise
// the workers on a lock.
func BenchmarkMACFlood(b *testing.B) {
	const macs = 1024
	flood := func(b *testing.B, s *Shim, remac ether.MAC, drop Counter) {
		ip := udpPacket(b, ipA2, ipB1, 64)
		frames := make([][]byte, macs)
		for i := range frames {
			frames[i] = make([]byte, ether.HeaderLen+len(ip))
			ether.PutHeader(frames[i], remac, ether.MAC{0x02, 0xf1, 0, 0, byte(i >> 8), byte(i)}, 0, ether.TypeIPv4)
			copy(frames[i][ether.HeaderLen:], ip)
		}
		now := s.clk.Now()
		b.ReportAllocs()
		b.SetBytes(int64(len(frames[0])))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			batch := newTxBatch(1)
			buf := make([]byte, devBufSize)
			i := 0
			for pb.Next() {
				f := frames[i%macs]
				i++
				copy(buf[devHeadroom:], f)
				s.tx(batch, buf, len(f), tap.Super{}, now)
			}
		})
		b.StopTimer()
		if got := s.Get(drop); got < uint64(b.N) || len(s.ctl.q) != 0 {
			b.Fatalf("%d of %d frames counted as %s, %d intents: %v", got, b.N, drop, len(s.ctl.q), s.Counters())
		}
	}
	b.Run("full", func(b *testing.B) {
		f, _ := memfabric.New(4096)
		s, _ := stillShim(b, f, "fe80::a", func(c *Config) { c.MaxVIFs = 1 })
		nb, _ := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b")), s.clk.Now())
		if _, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, s.clk.Now()); err != nil {
			b.Fatal(err)
		}
		flood(b, s, nb.REMAC, DropVIFLimit)
	})
	b.Run("refused", func(b *testing.B) {
		f, _ := memfabric.New(4096)
		s, _ := stillShim(b, f, "fe80::a", nil)
		nb, _ := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b")), s.clk.Now())
		for i := range macs {
			k := mactrans.VIFKey{MAC: ether.MAC{0x02, 0xf1, 0, 0, byte(i >> 8), byte(i)}}
			s.refuseVIF(k, &ipoib.RefusedError{Reason: "no_qp"}, s.clk.Now())
		}
		flood(b, s, nb.REMAC, DropVIFRefused)
	})
}
