package shim

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// The fuzz targets drive the per-frame functions of a shim that is not
// running (no goroutines, no sleeping): a fresh one per input, so that
// every failure reproduces from its input alone. It has VLAN 10 ↔ 0x800a
// besides the default partition, a local guest (macA1) with its VIF, and
// one known remote endpoint (QPN 0x77 of fe80::b) in each partition.

var (
	fuzzGID    = testutil.GID("fe80::a")
	fuzzRemote = ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b"))
	fuzzStart  = time.Unix(1e6, 0)
)

type fuzzEnv struct {
	s     *Shim
	now   time.Time
	remac ether.MAC // the remote endpoint's REMAC in the default partition
	qpn   uint32    // the local guest's VIF
}

func newFuzzShim(tb testing.TB, rfc4390 bool) *fuzzEnv {
	fab, err := memfabric.New(2048)
	if err != nil {
		tb.Fatal(err)
	}
	port, err := fab.NewPort(fuzzGID)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Device: tap.NewMem(256), Port: port, Logger: slog.New(slog.DiscardHandler), Clock: clock.NewFake(fuzzStart),
		Partitions: map[uint16]ipoib.PKey{10: 0x800a}}
	if rfc4390 {
		cfg.DHCP = DHCPRFC4390
	}
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e := &fuzzEnv{s: s, now: fuzzStart}
	for _, pk := range []ipoib.PKey{0xffff, 0x800a} {
		nb, err := s.neigh.Learn(pk, fuzzRemote, e.now)
		if err != nil {
			tb.Fatal(err)
		}
		if pk == 0xffff {
			e.remac = nb.REMAC
		}
	}
	v, err := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, e.now)
	if err != nil {
		tb.Fatal(err)
	}
	e.qpn = v.QPN
	return e
}

// fuzzDrops sums the drop counters: a frame or packet not delivered is
// counted in exactly one of them.
func fuzzDrops(s *Shim) uint64 {
	var n uint64
	for k := DropRunt; k < numCounters; k++ {
		n += s.Get(k)
	}
	return n
}

func fuzzSerialize(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		tb.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// Seed frames: what guests send. Each builder returns the IP (or ARP)
// packet; fuzzEth puts an Ethernet header (tagged when vlan != 0) in
// front.

func fuzzEth(dst, src ether.MAC, vlan uint16, et uint16, pkt []byte) []byte {
	f := make([]byte, ether.VLANHeaderLen+len(pkt))
	n := ether.PutHeader(f, dst, src, vlan, et)
	return append(f[:n], pkt...)
}

func seedARP(tb testing.TB, op uint16, sha ether.MAC, spa netip.Addr, tha ether.MAC, tpa netip.Addr) []byte {
	return fuzzSerialize(tb, &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: op, SourceHwAddress: sha[:], SourceProtAddress: spa.AsSlice(), DstHwAddress: tha[:], DstProtAddress: tpa.AsSlice()})
}

func seedUDP4(tb testing.TB, src, dst netip.Addr, sp, dp layers.UDPPort, flags layers.IPv4Flag, payload gopacket.SerializableLayer) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Flags: flags, Id: 9}
	udp := &layers.UDP{SrcPort: sp, DstPort: dp}
	udp.SetNetworkLayerForChecksum(ip)
	return fuzzSerialize(tb, ip, udp, payload)
}

func seedUDP6(tb testing.TB, src, dst netip.Addr, size int) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	udp := &layers.UDP{SrcPort: 1, DstPort: 2}
	udp.SetNetworkLayerForChecksum(ip)
	return fuzzSerialize(tb, ip, udp, gopacket.Payload(make([]byte, size)))
}

func seedICMPv6(tb testing.TB, src, dst netip.Addr, hop uint8, typ uint8, body gopacket.SerializableLayer) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: hop, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, 0)}
	icmp.SetNetworkLayerForChecksum(ip)
	return fuzzSerialize(tb, ip, icmp, body)
}

// seedNDP is a neighbour solicitation or advertisement about target with
// a link-layer option carrying ll (6 bytes on Ethernet, 20 on IPoIB,
// where the option has 2 bytes of pad first).
func seedNDP(tb testing.TB, typ uint8, src, dst, target netip.Addr, ll []byte) []byte {
	opt := byte(1)
	body := []byte{0, 0, 0, 0}
	if typ == layers.ICMPv6TypeNeighborAdvertisement {
		opt, body[0] = 2, 0x60
	}
	body = append(body, target.AsSlice()...)
	if len(ll) == ipoib.HwAddrLen {
		body = append(append(body, opt, 3, 0, 0), ll...)
	} else if ll != nil {
		body = append(append(body, opt, 1), ll...)
	}
	return seedICMPv6(tb, src, dst, 255, typ, gopacket.Payload(body))
}

func seedIGMP(tb testing.TB, group netip.Addr, recType byte) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 1, Protocol: layers.IPProtocolIGMP, SrcIP: ipA1.AsSlice(), DstIP: netip.MustParseAddr("224.0.0.22").AsSlice()}
	igmp := append([]byte{0x22, 0, 0, 0, 0, 0, 0, 1, recType, 0, 0, 0}, group.AsSlice()...)
	binary.BigEndian.PutUint16(igmp[2:], csum.Fold(csum.Sum(0, igmp)))
	return fuzzSerialize(tb, ip, gopacket.Payload(igmp))
}

func seedMLD(tb testing.TB, group netip.Addr, recType byte) []byte {
	report := append([]byte{0, 0, 0, 1, recType, 0, 0, 0}, group.AsSlice()...)
	return seedICMPv6(tb, netip.MustParseAddr("fe80::a1"), netip.MustParseAddr("ff02::16"), 1,
		layers.ICMPv6TypeMLDv2MulticastListenerReportMessageV2, gopacket.Payload(report))
}

func seedDHCP(tb testing.TB, reply, ib bool, mac ether.MAC) []byte {
	d := &layers.DHCPv4{Operation: layers.DHCPOpRequest, HardwareType: layers.LinkTypeEthernet, HardwareLen: 6, Xid: 0x1234, ClientHWAddr: mac[:],
		Options: layers.DHCPOptions{layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(layers.DHCPMsgTypeDiscover)})}}
	src, dst, sp, dp := netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), layers.UDPPort(68), layers.UDPPort(67)
	if reply {
		d.Operation, d.Flags, d.YourClientIP = layers.DHCPOpReply, 0x8000, netip.MustParseAddr("10.0.0.50").AsSlice()
		d.Options[0] = layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(layers.DHCPMsgTypeOffer)})
		src, sp, dp = netip.MustParseAddr("10.0.0.1"), 67, 68
	}
	if ib {
		d.HardwareType, d.HardwareLen, d.ClientHWAddr = layers.LinkType(32), 0, nil
		d.Options = append(d.Options, layers.NewDHCPOption(layers.DHCPOptClientID, append([]byte{1}, mac[:]...)))
	}
	return seedUDP4(tb, src, dst, sp, dp, 0, d)
}

// FuzzTx translates one arbitrary frame from a guest. It must not panic;
// TxFrames counts it once; it ends up sent (as one or more IPoIB packets
// within the MTU), queued, answered with an ICMP too-big, or counted in
// exactly one drop counter.
func FuzzTx(f *testing.F) {
	e := newFuzzShim(f, false)
	remac, bcast := e.remac, ether.Broadcast
	la, lb := netip.MustParseAddr("fd00::a1"), netip.MustParseAddr("fd00::b1")
	g4, g6 := netip.MustParseAddr("239.1.1.1"), netip.MustParseAddr("ff15::1234")
	mcast4, mcast6, snMAC := ether.MAC{1, 0, 0x5e, 1, 1, 1}, ether.MAC{0x33, 0x33, 0, 0, 0x12, 0x34}, ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xb1}
	unknown := ether.MAC{2, 9, 9, 9, 9, 9}
	for _, s := range []struct {
		frame   []byte
		rfc4390 bool
	}{
		{fuzzEth(bcast, macA1, 0, ether.TypeARP, seedARP(f, 1, macA1, ipA1, ether.MAC{}, ipB1)), false},
		{fuzzEth(remac, macA1, 0, ether.TypeARP, seedARP(f, 2, macA1, ipA1, remac, ipB1)), false},
		{fuzzEth(bcast, macA2, 10, ether.TypeARP, seedARP(f, 1, macA2, ipA2, ether.MAC{}, ipB1)), false},
		{fuzzEth(bcast, macA2, 30, ether.TypeARP, seedARP(f, 1, macA2, ipA2, ether.MAC{}, ipB1)), false},
		{fuzzEth(remac, macA1, 0, ether.TypeIPv4, seedUDP4(f, ipA1, ipB1, 5000, 6000, 0, gopacket.Payload("hello"))), false},
		{fuzzEth(unknown, macA1, 0, ether.TypeIPv4, seedUDP4(f, ipA1, ipB1, 5000, 6000, 0, gopacket.Payload("hello"))), false},
		{fuzzEth(mcast4, macA1, 0, ether.TypeIPv4, seedUDP4(f, ipA1, g4, 5000, 6000, 0, gopacket.Payload("hello"))), false},
		{fuzzEth(remac, macA1, 0, ether.TypeIPv4, seedUDP4(f, ipA1, ipB1, 5000, 6000, layers.IPv4DontFragment, gopacket.Payload(make([]byte, 3000)))), false},
		{fuzzEth(remac, macA1, 0, ether.TypeIPv4, seedUDP4(f, ipA1, ipB1, 5000, 6000, 0, gopacket.Payload(make([]byte, 5000)))), false},
		{fuzzEth(remac, macA1, 0, ether.TypeIPv6, seedUDP6(f, la, lb, 3000)), false},
		{fuzzEth(mcast6, macA1, 0, ether.TypeIPv6, seedUDP6(f, la, g6, 100)), false},
		{fuzzEth(snMAC, macA1, 0, ether.TypeIPv6, seedNDP(f, layers.ICMPv6TypeNeighborSolicitation, la, netip.MustParseAddr("ff02::1:ff00:b1"), lb, macA1[:])), false},
		{fuzzEth(snMAC, macA1, 0, ether.TypeIPv6, seedNDP(f, layers.ICMPv6TypeNeighborSolicitation, netip.IPv6Unspecified(), netip.MustParseAddr("ff02::1:ff00:a1"), la, nil)), false},
		{fuzzEth(remac, macA1, 0, ether.TypeIPv6, seedNDP(f, layers.ICMPv6TypeNeighborAdvertisement, la, lb, la, macA1[:])), false},
		{fuzzEth(ether.MAC{1, 0, 0x5e, 0, 0, 0x16}, macA1, 0, ether.TypeIPv4, seedIGMP(f, g4, 4)), false},
		{fuzzEth(ether.MAC{0x33, 0x33, 0, 0, 0, 0x16}, macA1, 0, ether.TypeIPv6, seedMLD(f, g6, 4)), false},
		{fuzzEth(bcast, macA1, 0, ether.TypeIPv4, seedDHCP(f, false, false, macA1)), false},
		{fuzzEth(bcast, macA1, 0, ether.TypeIPv4, seedDHCP(f, false, false, macA1)), true},
		{fuzzEth(bcast, macA1, 0, 0x88cc, make([]byte, 46)), false},
		{[]byte{1, 2, 3}, false},
	} {
		// A long frame is seeded as its headers and a length of zeros.
		frame, tail := s.frame, 0
		if len(frame) > 128 && !slices.ContainsFunc(frame[128:], func(b byte) bool { return b != 0 }) {
			frame, tail = frame[:128], len(frame)-128
		}
		f.Add(frame, uint16(tail), s.rfc4390)
	}
	buf := make([]byte, devBufSize)
	b := newTxBatch(1)
	// The frame is frame followed by tail zeros: long frames (oversize,
	// fragmentation) from short inputs, which the fuzzer minimizes in
	// reasonable time (its minimizer is quadratic in a []byte's length).
	f.Fuzz(func(t *testing.T, frame []byte, tail uint16, rfc4390 bool) {
		if len(frame)+int(tail) > devBufSize-devHeadroom-256 {
			return // more than the device delivers
		}
		e := newFuzzShim(t, rfc4390)
		s := e.s
		clear(buf)
		n := copy(buf[devHeadroom:], frame) + int(tail)
		frames, drops, queued, icmp := s.Get(TxFrames), fuzzDrops(s), s.Get(TxQueued), s.Get(TxICMPTooBig)
		s.ctr.inc(TxFrames) // as txLoop does
		s.tx(b, buf, n, tap.Super{}, e.now)
		for i, pkt := range b.bufs {
			h := ipoib.Header(pkt[min(ipoib.Headroom, len(pkt)):])
			if !h.IsValid() || !rxEtherType(h.EtherType()) || len(h) > s.port.MTU() || !b.meta[i].PKey.IsValid() {
				t.Fatalf("packet %d of %d bytes (header %x, P_Key %s) for an MTU of %d", i, len(h), h[:min(4, len(h))], b.meta[i].PKey, s.port.MTU())
			}
		}
		sent := len(b.bufs)
		s.flushTx(b)
		if got := s.Get(TxFrames) - frames; got != 1 {
			t.Fatalf("TxFrames counted %d times", got)
		}
		outcomes := fuzzDrops(s) - drops + s.Get(TxQueued) - queued + s.Get(TxICMPTooBig) - icmp
		if sent > 0 {
			outcomes++
		}
		if outcomes != 1 {
			t.Fatalf("frame sent as %d packets, and %d drops, %d queued, %d ICMP: %v",
				sent, fuzzDrops(s)-drops, s.Get(TxQueued)-queued, s.Get(TxICMPTooBig)-icmp, fuzzCounters(s))
		}
	})
}

// fuzzCounters returns the shim's non-zero counters, for failure messages.
func fuzzCounters(s *Shim) map[string]uint64 {
	m := map[string]uint64{}
	for k := Counter(0); k < numCounters; k++ {
		if v := s.Get(k); v != 0 {
			m[k.String()] = v
		}
	}
	return m
}

// FuzzRx translates one arbitrary IPoIB packet with arbitrary receive
// metadata (only what a port guarantees: 24-bit QPNs, zero flags). It
// must not panic; a frame it returns lies within the received packet's
// place in buf, with a valid Ethernet header of the packet's ethertype
// and its partition's VLAN; a packet it refuses is counted in exactly
// one drop counter.
func FuzzRx(f *testing.F) {
	e := newFuzzShim(f, false)
	lim := ipoib.MakeHwAddr(0, e.qpn, fuzzGID)
	remote := fuzzRemote.GID()
	bc := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	la, lb := netip.MustParseAddr("fd00::a1"), netip.MustParseAddr("fd00::b1")
	ipoibPkt := func(et uint16, pkt []byte) []byte {
		return append(binary.BigEndian.AppendUint16(nil, et), append([]byte{0, 0}, pkt...)...)
	}
	arpIB := func(op byte, tha ipoib.HwAddr) []byte {
		a := []byte{0, 32, 8, 0, 20, 4, 0, op}
		a = append(append(a, fuzzRemote[:]...), ipB1.AsSlice()...)
		return append(append(a, tha[:]...), ipA1.AsSlice()...)
	}
	for _, s := range []struct {
		pkt     []byte
		dqpn    uint32
		pkey    uint16
		mgid    ipoib.GID
		rfc4390 bool
	}{
		{ipoibPkt(ether.TypeARP, arpIB(1, ipoib.HwAddr{})), ipoib.MulticastQPN, 0xffff, bc, false},
		{ipoibPkt(ether.TypeARP, arpIB(2, lim)), e.qpn, 0xffff, ipoib.GID{}, false},
		{ipoibPkt(ether.TypeARP, arpIB(1, ipoib.HwAddr{})), ipoib.MulticastQPN, 0x800a, ipoib.BroadcastMGID(0x800a, ipoib.ScopeLinkLocal), false},
		{ipoibPkt(ether.TypeIPv4, seedUDP4(f, ipB1, ipA1, 6000, 5000, 0, gopacket.Payload("hello"))), e.qpn, 0xffff, ipoib.GID{}, false},
		{ipoibPkt(ether.TypeIPv4, seedUDP4(f, ipB1, netip.MustParseAddr("239.1.1.1"), 6000, 5000, 0, gopacket.Payload("hi"))), ipoib.MulticastQPN, 0xffff,
			ipoib.IPv4MGID(netip.MustParseAddr("239.1.1.1"), 0xffff, ipoib.ScopeLinkLocal), false},
		{ipoibPkt(ether.TypeIPv6, seedUDP6(f, lb, la, 100)), e.qpn, 0x7fff, ipoib.GID{}, false},
		{ipoibPkt(ether.TypeIPv6, seedNDP(f, layers.ICMPv6TypeNeighborAdvertisement, lb, la, lb, fuzzRemote[:])), e.qpn, 0xffff, ipoib.GID{}, false},
		{ipoibPkt(ether.TypeIPv6, seedNDP(f, layers.ICMPv6TypeNeighborSolicitation, lb, netip.MustParseAddr("ff02::1:ff00:a1"), la, fuzzRemote[:])), ipoib.MulticastQPN, 0xffff,
			ipoib.IPv6MGID(netip.MustParseAddr("ff02::1:ff00:a1"), 0xffff, ipoib.ScopeLinkLocal), false},
		{ipoibPkt(ether.TypeIPv6, seedMLD(f, netip.MustParseAddr("ff15::1234"), 4)), ipoib.MulticastQPN, 0xffff,
			ipoib.IPv6MGID(netip.MustParseAddr("ff02::16"), 0xffff, ipoib.ScopeLinkLocal), false},
		{ipoibPkt(ether.TypeIPv4, seedDHCP(f, true, true, macA1)), ipoib.MulticastQPN, 0xffff, bc, true},
		{ipoibPkt(ether.TypeIPv4, seedDHCP(f, true, true, macA1)), e.qpn, 0xffff, ipoib.GID{}, true},
		{[]byte{8, 0, 0, 1, 0x45}, e.qpn, 0xffff, ipoib.GID{}, false},
		{[]byte{0x88, 0xcc, 0, 0}, e.qpn, 0xffff, ipoib.GID{}, false},
	} {
		f.Add(s.pkt, uint16(0), s.dqpn, s.pkey, s.mgid[:], uint32(0x77), remote[:], s.rfc4390)
	}
	buf := make([]byte, rxOffset+2048+64)
	// The packet is pkt, at most 512 bytes, followed by tail zeros: the
	// fuzzer's minimizer is quadratic in a []byte's length and stalled
	// the workers on kilobyte packets (zeros are PAD in DHCP options).
	f.Fuzz(func(t *testing.T, pkt []byte, tail uint16, dqpn uint32, pkey uint16, mgid []byte, sqpn uint32, sgid []byte, rfc4390 bool) {
		if len(pkt) > 512 || len(pkt)+int(tail) > 2048 {
			return // more than the port delivers
		}
		e := newFuzzShim(t, rfc4390)
		s := e.s
		var m ipoib.RxMeta
		var g ipoib.GID
		copy(m.MGID[:], mgid)
		copy(g[:], sgid)
		m.Src, m.DstQPN, m.PKey = ipoib.MakeHwAddr(0, sqpn&0xffffff, g), dqpn&0xffffff, ipoib.PKey(pkey)
		clear(buf)
		n := copy(buf[rxOffset:], pkt) + int(tail)
		et := binary.BigEndian.Uint16(buf[rxOffset:])
		drops := fuzzDrops(s)
		s.ctr.inc(RxPackets) // as rxLoop does
		fr := s.rx(buf, n, &m, e.now)
		if fr == nil {
			if got := fuzzDrops(s) - drops; got != 1 {
				t.Fatalf("packet refused with %d drops counted: %v", got, fuzzCounters(s))
			}
			return
		}
		if got := fuzzDrops(s) - drops; got != 0 {
			t.Fatalf("packet delivered and %d drops counted: %v", got, fuzzCounters(s))
		}
		// fr is buf[start:end] for some start: its capacity says where.
		start := cap(buf) - cap(fr)
		if start < 0 || start+len(fr) > len(buf) || len(fr) == 0 || &buf[start] != &fr[0] {
			t.Fatalf("frame of %d bytes is not within buf", len(fr))
		}
		if start+len(fr) > rxOffset+n {
			t.Fatalf("frame ends at %d, past the packet's end %d", start+len(fr), rxOffset+n)
		}
		fe := ether.Frame(fr)
		if !fe.IsValid() || fe.EtherType() != et || fe.VLAN() != s.partitions()[m.PKey.Full()].vlan ||
			fe.Src().IsMulticast() || fe.Src().IsZero() || fe.Dst().IsMulticast() != (m.DstQPN == ipoib.MulticastQPN) {
			t.Fatalf("frame %x from a packet of ethertype %#04x, P_Key %s, QPN %#x", fr[:min(len(fr), 18)], et, m.PKey, m.DstQPN)
		}
	})
}
