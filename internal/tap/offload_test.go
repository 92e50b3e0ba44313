package tap

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
)

var (
	macA = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	macB = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
)

// tcpFrame builds an Ethernet frame (802.1Q-tagged when vlan != 0) with a
// TCP segment carrying payload, with valid checksums. flags are TCP flag
// bits.
func tcpFrame(tb testing.TB, v6 bool, vlan uint16, seq uint32, id uint16, flags uint8, payload []byte) []byte {
	tb.Helper()
	eth := &layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: layers.EthernetTypeIPv4}
	var ls []gopacket.SerializableLayer
	ls = append(ls, eth)
	if vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: vlan, Type: layers.EthernetTypeIPv4})
	}
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 5201, Seq: seq, Ack: 777, Window: 500,
		FIN: flags&header.TCPFlagFIN != 0, PSH: flags&header.TCPFlagPSH != 0, ACK: flags&header.TCPFlagACK != 0, CWR: flags&header.TCPFlagCWR != 0,
		Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: []byte{0, 0, 0, 1, 0, 0, 0, 2}}}}
	if v6 {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}
		if vlan != 0 {
			ls[1].(*layers.Dot1Q).Type = layers.EthernetTypeIPv6
		} else {
			eth.EthernetType = layers.EthernetTypeIPv6
		}
		tcp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, ip)
	} else {
		ip := &layers.IPv4{Version: 4, TTL: 64, Id: id, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolTCP,
			SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
		tcp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, ip)
	}
	ls = append(ls, tcp, gopacket.Payload(payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		tb.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// superFrame turns a frame built by tcpFrame into what the kernel hands a
// TAP with TSO: the TCP checksum field holds the pseudo-header sum only,
// and the vnet header asks for segments of mss.
func superFrame(tb testing.TB, f []byte, v6 bool, mss int) ([]byte, vnetHdr) {
	s, ok := parseAnyTCP(f)
	if !ok {
		tb.Fatal("not a TCP frame")
	}
	var sum uint32
	if v6 {
		ip := header.IPv6(f[s.l3:])
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(f)-s.l4)
	} else {
		ip := header.IPv4(f[s.l3:])
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(f)-s.l4)
	}
	header.TCP(f[s.l4:]).SetChecksum(^csum.Fold(sum))
	h := vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, gsoType: unix.VIRTIO_NET_HDR_GSO_TCPV4, hdrLen: uint16(s.hl),
		gsoSize: uint16(mss), csumStart: uint16(s.l4), csumOffset: header.TCPChecksumOff}
	if v6 {
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV6
	}
	return f, h
}

// parseAnyTCP locates the headers of a TCP frame without the checks
// parseTCPSeg makes (checksum, flags).
func parseAnyTCP(f []byte) (seg, bool) {
	s := seg{f: f, l3: 14}
	et := binary.BigEndian.Uint16(f[12:])
	if et == 0x8100 {
		s.l3, et = 18, binary.BigEndian.Uint16(f[16:])
	}
	switch et {
	case 0x0800:
		s.l4 = s.l3 + header.IPv4(f[s.l3:]).HeaderLen()
	case 0x86dd:
		s.l4, s.v6 = s.l3+header.IPv6Len, true
	default:
		return s, false
	}
	s.hl = s.l4 + header.TCP(f[s.l4:]).HeaderLen()
	return s, true
}

// verify decodes a segment with gopacket and checks its IP and TCP
// checksums; it returns the TCP layer.
func verify(t *testing.T, seg []byte, v6 bool) *layers.TCP {
	t.Helper()
	p := gopacket.NewPacket(seg, layers.LayerTypeEthernet, gopacket.Default)
	tcp, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if !ok {
		t.Fatalf("segment does not decode as TCP: %v", p)
	}
	s, _ := parseAnyTCP(seg)
	var sum uint32
	if v6 {
		ip := header.IPv6(seg[s.l3:])
		if ip.PayloadLen() != len(seg)-s.l3-header.IPv6Len {
			t.Fatalf("IPv6 payload length %d for %d bytes", ip.PayloadLen(), len(seg)-s.l3-header.IPv6Len)
		}
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(seg)-s.l4)
	} else {
		ip := header.IPv4(seg[s.l3:])
		if ip.TotalLen() != len(seg)-s.l3 || csum.Fold(csum.Sum(0, ip[:ip.HeaderLen()])) != 0 {
			t.Fatalf("IPv4 total length %d for %d bytes, or a bad header checksum", ip.TotalLen(), len(seg)-s.l3)
		}
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(seg)-s.l4)
	}
	if csum.Fold(csum.Sum(sum, seg[s.l4:])) != 0 {
		t.Fatal("TCP checksum does not verify")
	}
	return tcp
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// TestSegment: a 60 KB super-frame (IPv4 and IPv6, untagged and tagged)
// becomes segments of at most the MSS whose IP packets fit the MTU. They
// have valid checksums, consecutive sequence numbers and IPv4 IDs, CWR
// on the first only, PSH and FIN on the last only, and the payload
// intact.
func TestSegment(t *testing.T) {
	for _, c := range []struct {
		v6   bool
		vlan uint16
		mss  int
	}{{false, 0, 4040}, {true, 0, 4020}, {false, 10, 1448}, {true, 20, 9000}} {
		payload := pattern(60000)
		f, h := superFrame(t, tcpFrame(t, c.v6, c.vlan, 1000, 50, header.TCPFlagACK|header.TCPFlagPSH|header.TCPFlagFIN|header.TCPFlagCWR, payload), c.v6, c.mss)
		var s segmenter
		if _, err := s.start(f, h, 4092); err != nil {
			t.Fatal(err)
		}
		var got []byte
		dst := make([]byte, 70000)
		for i := 0; !s.Done(); i++ {
			n := s.Cut(dst)
			seg := dst[:n]
			tcp := verify(t, seg, c.v6)
			st, _ := parseAnyTCP(seg)
			if n-st.l3 > 4092 || len(tcp.Payload) > c.mss {
				t.Fatalf("segment %d: IP packet of %d bytes, payload %d (MSS %d)", i, n-st.l3, len(tcp.Payload), c.mss)
			}
			if tcp.Seq != 1000+uint32(len(got)) {
				t.Fatalf("segment %d: seq %d, want %d", i, tcp.Seq, 1000+len(got))
			}
			last := s.Done()
			if tcp.CWR != (i == 0) || tcp.PSH != last || tcp.FIN != last || !tcp.ACK {
				t.Fatalf("segment %d (last %v): CWR %v PSH %v FIN %v ACK %v", i, last, tcp.CWR, tcp.PSH, tcp.FIN, tcp.ACK)
			}
			if !c.v6 {
				if id := header.IPv4(seg[st.l3:]).ID(); id != 50+uint16(i) {
					t.Fatalf("segment %d: IPv4 ID %d", i, id)
				}
			}
			got = append(got, tcp.Payload...)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("v6 %v vlan %d: %d payload bytes after segmenting, want %d", c.v6, c.vlan, len(got), len(payload))
		}
	}
}

// TestSegmentSeed: segment checksums follow the pseudo-header sum the
// kernel left in the checksum field, not the header's addresses. Behind
// an IPv6 routing header or an IPv4 source route, the pseudo-header
// holds the final destination (RFC 8200 §8.1), which the header does
// not.
func TestSegmentSeed(t *testing.T) {
	f, h := superFrame(t, tcpFrame(t, false, 0, 1, 1, header.TCPFlagACK, pattern(5000)), false, 1000)
	st, _ := parseAnyTCP(f)
	ip := header.IPv4(f[st.l3:])
	final := []byte{10, 9, 9, 9}
	seed := csum.Pseudo(ip.SrcBytes(), final, header.ProtoTCP, len(f)-st.l4)
	header.TCP(f[st.l4:]).SetChecksum(^csum.Fold(seed))
	var s segmenter
	if _, err := s.start(f, h, 4092); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 70000)
	for i := 0; !s.Done(); i++ {
		n := s.Cut(dst)
		sum := csum.Pseudo(ip.SrcBytes(), final, header.ProtoTCP, n-st.l4)
		if csum.Fold(csum.Sum(sum, dst[st.l4:n])) != 0 {
			t.Fatalf("segment %d does not verify against the final destination", i)
		}
	}
}

// TestSegmentRefuses: super-frames that are not one TCP flow's, or whose
// header does not match them, are refused.
func TestSegmentRefuses(t *testing.T) {
	good, h := superFrame(t, tcpFrame(t, false, 0, 1, 1, header.TCPFlagACK, pattern(5000)), false, 1000)
	good6, h6 := superFrame(t, tcpFrame(t, true, 0, 1, 1, header.TCPFlagACK, pattern(5000)), true, 1000)
	var s segmenter
	for name, c := range map[string]struct {
		f []byte
		h vnetHdr
	}{
		"UDP GSO":                               {good, vnetHdr{flags: h.flags, gsoType: unix.VIRTIO_NET_HDR_GSO_UDP, csumStart: h.csumStart, csumOffset: h.csumOffset, gsoSize: 1000}},
		"TCPv6 on IPv4":                         {good, vnetHdr{flags: h.flags, gsoType: unix.VIRTIO_NET_HDR_GSO_TCPV6, csumStart: h.csumStart, csumOffset: h.csumOffset, gsoSize: 1000}},
		"csum start off":                        {good, vnetHdr{flags: h.flags, gsoType: h.gsoType, csumStart: h.csumStart + 4, csumOffset: h.csumOffset, gsoSize: 1000}},
		"no NEEDS_CSUM":                         {good, vnetHdr{gsoType: h.gsoType, csumStart: h.csumStart, csumOffset: h.csumOffset, gsoSize: 1000}},
		"zero MSS":                              {good, vnetHdr{flags: h.flags, gsoType: h.gsoType, csumStart: h.csumStart, csumOffset: h.csumOffset}},
		"truncated":                             {good[:60], h},
		"IPv4 length too big":                   {good[:len(good)-1], h},
		"IPv6, csum start before the IP header": {good6, vnetHdr{flags: h6.flags, gsoType: h6.gsoType, csumStart: 13, csumOffset: 16, gsoSize: 1000}},
		"IPv6, no TCP header at csum start":     {good6, vnetHdr{flags: h6.flags, gsoType: h6.gsoType, csumStart: 14 + 40 + 8, csumOffset: 16, gsoSize: 1000}},
	} {
		if _, err := s.start(c.f, c.h, 4092); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCompleteChecksum: a UDP frame whose checksum field holds only the
// pseudo-header sum is completed to the checksum gopacket computes.
func TestCompleteChecksum(t *testing.T) {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
	udp := &layers.UDP{SrcPort: 1, DstPort: 2}
	udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: layers.EthernetTypeIPv4}, ip, udp, gopacket.Payload(pattern(333)))
	f := buf.Bytes()
	want := binary.BigEndian.Uint16(f[14+20+6:])
	pseudo := csum.Pseudo(f[14+12:14+16], f[14+16:14+20], header.ProtoUDP, len(f)-34)
	binary.BigEndian.PutUint16(f[14+20+6:], ^csum.Fold(pseudo))
	if err := completeChecksum(f, vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, csumStart: 34, csumOffset: 6}); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint16(f[14+20+6:]); got != want {
		t.Fatalf("completed checksum %#04x, want %#04x", got, want)
	}
	if completeChecksum(f, vnetHdr{csumStart: uint16(len(f)), csumOffset: 6}) == nil {
		t.Fatal("checksum field past the frame accepted")
	}
	// A datagram whose checksum computes to 0 gets 0xFFFF: 0 would mean
	// "no checksum" (and is invalid over IPv6).
	seed := ^csum.Fold(pseudo)
	binary.BigEndian.PutUint16(f[14+20+6:], 0)
	w := f[42:44] // the payload's first word (an even offset in the sum)
	binary.BigEndian.PutUint16(w, 0)
	f0 := ^csum.Fold(csum.Sum(uint32(seed), f[34:])) // the folded sum without that word
	binary.BigEndian.PutUint16(w, 0xffff-f0)
	binary.BigEndian.PutUint16(f[14+20+6:], seed)
	if err := completeChecksum(f, vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, csumStart: 34, csumOffset: 6}); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint16(f[14+20+6:]); got != 0xffff {
		t.Fatalf("a checksum computing to 0 was written as %#04x, want 0xffff", got)
	}
}

// segments returns n consecutive segments of one flow, mss bytes each
// (the last one last bytes), as the fabric delivers them.
func segments(t testing.TB, v6 bool, vlan uint16, n, mss, last int) [][]byte {
	var out [][]byte
	seq := uint32(5000)
	for i := 0; i < n; i++ {
		size := mss
		if i == n-1 {
			size = last
		}
		flags := uint8(header.TCPFlagACK)
		if i == n-1 {
			flags |= header.TCPFlagPSH
		}
		f := tcpFrame(t, v6, vlan, seq, uint16(100+i), flags, pattern(size))
		out = append(out, append(make([]byte, Headroom), f...))
		seq += uint32(size)
	}
	return out
}

// TestCoalesceRoundTrip: a run of segments of one flow becomes one
// super-frame with a GSO header; cutting it again gives back the same
// segments (payloads, sequence numbers, flags, checksums).
func TestCoalesceRoundTrip(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		segs := segments(t, v6, 7, 12, 4000, 1234)
		k, first := run(segs, Headroom, true)
		if k != len(segs) {
			t.Fatalf("run of %d, want %d", k, len(segs))
		}
		var c coalescer
		out := c.merge(first, segs, Headroom)
		h := decodeVnet(out)
		wantType := uint8(unix.VIRTIO_NET_HDR_GSO_TCPV4)
		if v6 {
			wantType = unix.VIRTIO_NET_HDR_GSO_TCPV6
		}
		if h.gsoType != wantType || h.gsoSize != 4000 || h.flags != unix.VIRTIO_NET_HDR_F_NEEDS_CSUM || h.csumOffset != 16 {
			t.Fatalf("vnet header %+v", h)
		}
		sf := append([]byte(nil), out[vnetHdrLen:]...)
		var s segmenter
		if _, err := s.start(sf, h, 4092); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, 70000)
		for i := 0; !s.Done(); i++ {
			n := s.Cut(dst)
			orig, _ := parseAnyTCP(segs[i][Headroom:])
			st, _ := parseAnyTCP(dst[:n])
			verify(t, dst[:n], v6)
			if !bytes.Equal(dst[st.l4:n], orig.f[orig.l4:]) {
				t.Fatalf("segment %d differs after the round trip", i)
			}
		}
	}
}

// TestCoalesceBreaks: a run ends at a segment of another flow, a
// non-contiguous one, one with a bad checksum, one after a short or
// pushed segment, and a frame that is not plain TCP is never merged.
func TestCoalesceBreaks(t *testing.T) {
	base := func() [][]byte { return segments(t, false, 0, 4, 1000, 1000) }
	cases := map[string]func(s [][]byte) int{
		"bad checksum": func(s [][]byte) int { s[2][len(s[2])-1] ^= 1; return 2 },
		"bad IPv4 header checksum": func(s [][]byte) int {
			s[1][Headroom+14+8]-- // TTL, header checksum left stale
			return 1
		},
		"other flow": func(s [][]byte) int {
			f := s[2][Headroom:]
			st, _ := parseAnyTCP(f)
			binary.BigEndian.PutUint16(f[st.l4:], 40001) // source port
			refresh(f, st)
			return 2
		},
		"gap":        func(s [][]byte) int { return moveSeq(s, 2, 1) },
		"pushed":     func(s [][]byte) int { return setFlags(s, 1, header.TCPFlagACK|header.TCPFlagPSH) },
		"SYN":        func(s [][]byte) int { return setFlags(s, 0, header.TCPFlagSYN|header.TCPFlagACK) - 1 },
		"short":      func(s [][]byte) int { s[1] = segments(t, false, 0, 1, 999, 999)[0]; return 1 },
		"not TCP":    func(s [][]byte) int { s[0] = append(make([]byte, Headroom), make([]byte, 60)...); return 1 },
		"whole flow": func(s [][]byte) int { return 4 },
	}
	for name, mutate := range cases {
		s := base()
		want := mutate(s)
		if want < 1 {
			want = 1
		}
		if got, _ := run(s, Headroom, true); got != want {
			t.Errorf("%s: run of %d, want %d", name, got, want)
		}
	}
}

// moveSeq shifts segment i's sequence number by d (fixing its checksum)
// and returns the run expected before it.
func moveSeq(s [][]byte, i int, d uint32) int {
	f := s[i][Headroom:]
	st, _ := parseAnyTCP(f)
	tcp := header.TCP(f[st.l4:])
	tcp.SetSeq(tcp.Seq() + d)
	refresh(f, st)
	return i
}

// setFlags sets segment i's TCP flags (fixing its checksum) and returns
// the run expected: up to and including a pushed segment.
func setFlags(s [][]byte, i int, flags uint8) int {
	f := s[i][Headroom:]
	st, _ := parseAnyTCP(f)
	header.TCP(f[st.l4:]).SetFlags(flags)
	refresh(f, st)
	return i + 1
}

// refresh recomputes the TCP checksum of an IPv4 frame.
func refresh(f []byte, st seg) {
	ip := header.IPv4(f[st.l3:])
	tcp := header.TCP(f[st.l4:])
	tcp.SetChecksum(0)
	tcp.SetChecksum(csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(f)-st.l4), f[st.l4:])))
}

// FuzzSegment: for any frame and vnet header, start either refuses or
// cutting yields TCP segments that fit the MTU, or UDP datagrams, whose
// checksums verify (and UDP lengths are right), and that add up to the
// payload. The frame is the fuzzer's bytes (headers, mostly) and a
// patterned payload of a fuzzed length, so long frames stay cheap for the
// fuzzer's minimizer, whose cost grows with the square of an input's
// length.
func FuzzSegment(f *testing.F) {
	add := func(v6 bool, vlan uint16, payload, mss int) {
		full := tcpFrame(f, v6, vlan, 1, 1, header.TCPFlagACK, pattern(payload))
		sf, h := superFrame(f, full, v6, mss)
		st, _ := parseAnyTCP(sf)
		f.Add(sf[:st.hl], uint16(payload), h.gsoType, h.flags, h.gsoSize, h.csumStart, h.csumOffset)
	}
	add(false, 0, 9000, 1448)
	add(true, 5, 3000, 600)
	addUDP := func(v6 bool, vlan uint16, payload, size int) {
		sf, h := udpSuperFrame(f, v6, vlan, pattern(payload), size)
		f.Add(sf[:h.hdrLen], uint16(payload), h.gsoType, h.flags, h.gsoSize, h.csumStart, h.csumOffset)
	}
	addUDP(false, 0, 2048, 64)
	addUDP(true, 3, 9000, 1400)
	dst := make([]byte, maxSuperFrame+100)
	f.Fuzz(func(t *testing.T, hdrs []byte, payload uint16, gsoType, flags uint8, gsoSize, csumStart, csumOffset uint16) {
		if len(hdrs) > 256 || len(hdrs)+int(payload) > maxSuperFrame {
			return
		}
		frame := append(hdrs[:len(hdrs):len(hdrs)], pattern(int(payload))...)
		h := vnetHdr{flags: flags, gsoType: gsoType, gsoSize: gsoSize, csumStart: csumStart, csumOffset: csumOffset}
		var s segmenter
		if _, err := s.start(frame, h, 4092); err != nil {
			return
		}
		l3, v6, udp, _ := checkSuper(frame, h)
		l4 := int(h.csumStart)
		proto, mtu := uint8(header.ProtoTCP), 4092
		if udp {
			proto, mtu = header.ProtoUDP, maxSuperFrame // datagrams are not cut smaller
		}
		// The seed the kernel would have left: the pseudo-header sum of
		// the header's addresses and the whole TCP or UDP length.
		var seed uint32
		if v6 {
			ip := header.IPv6(frame[l3:])
			seed = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), proto, len(frame)-l4)
		} else {
			ip := header.IPv4(frame[l3:])
			seed = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), proto, len(frame)-l4)
		}
		binary.BigEndian.PutUint16(frame[l4+int(h.csumOffset):], ^csum.Fold(seed))
		if _, err := s.start(frame, h, 4092); err != nil {
			t.Fatalf("accepted, then refused after the seed was written: %v", err)
		}
		hl := s.HdrLen()
		total := 0
		for i := 0; !s.Done(); i++ {
			n := s.Cut(dst)
			if n-l3 > mtu {
				t.Fatalf("segment %d: IP packet of %d bytes", i, n-l3)
			}
			var sum uint32
			if v6 {
				ip := header.IPv6(dst[l3:n])
				sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), proto, n-l4)
			} else {
				ip := header.IPv4(dst[l3:n])
				if csum.Fold(csum.Sum(0, ip[:ip.HeaderLen()])) != 0 || ip.TotalLen() != n-l3 {
					t.Fatalf("segment %d: bad IPv4 header", i)
				}
				sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), proto, n-l4)
			}
			if csum.Fold(csum.Sum(sum, dst[l4:n])) != 0 {
				t.Fatalf("segment %d: checksum does not verify", i)
			}
			if udp && int(binary.BigEndian.Uint16(dst[l4+4:])) != n-l4 {
				t.Fatalf("datagram %d: UDP length %d for %d bytes", i, binary.BigEndian.Uint16(dst[l4+4:]), n-l4)
			}
			total += n - hl
		}
		if total != len(frame)-hl {
			t.Fatalf("segments carry %d payload bytes of %d", total, len(frame)-hl)
		}
	})
}

// FuzzCoalesce: for any three frames, run never overruns the batch, and a
// run longer than one (TCP segments, or UDP datagrams) merges into a
// super-frame whose re-cut segments carry exactly the run's payloads. Each frame is the fuzzer's bytes and
// a patterned payload of a fuzzed length (see FuzzSegment).
func FuzzCoalesce(f *testing.F) {
	segs := segments(f, false, 0, 3, 1000, 500)
	st, _ := parseAnyTCP(segs[0][Headroom:])
	h := func(i int) []byte { return segs[i][Headroom : Headroom+st.hl] }
	f.Add(h(0), h(1), h(2), uint16(1000), uint16(1000), uint16(500))
	ds := datagrams(f, true, 0, 3, 64, 64)
	d := func(i int) []byte { return ds[i][Headroom : Headroom+14+40+8] }
	f.Add(d(0), d(1), d(2), uint16(64), uint16(64), uint16(64))
	f.Fuzz(func(t *testing.T, a, b, c []byte, la, lb, lc uint16) {
		var frames [][]byte
		for i, hdr := range [][]byte{a, b, c} {
			if len(hdr) > 256 {
				return
			}
			fr := append(make([]byte, Headroom), hdr...)
			frames = append(frames, append(fr, pattern(int([]uint16{la, lb, lc}[i])%9000)...))
		}
		k, first := run(frames, Headroom, true)
		if k < 1 || k > len(frames) {
			t.Fatalf("run of %d in %d frames", k, len(frames))
		}
		if k == 1 {
			return
		}
		var co coalescer
		out := co.merge(first, frames[:k], Headroom)
		var s segmenter
		if _, err := s.start(append([]byte(nil), out[vnetHdrLen:]...), decodeVnet(out), maxSuperFrame); err != nil {
			t.Fatalf("merged super-frame refused: %v", err)
		}
		dst := make([]byte, maxSuperFrame+100)
		for i := 0; i < k; i++ {
			if s.Done() {
				t.Fatalf("%d segments from a run of %d", i, k)
			}
			n := s.Cut(dst)
			if !bytes.Equal(dst[first.hl:n], frames[i][Headroom+first.hl:]) {
				t.Fatalf("segment %d payload differs", i)
			}
		}
		if !s.Done() {
			t.Fatalf("more segments than the run of %d", k)
		}
	})
}

// BenchmarkSegment64K cuts a 64 KB TCP super-frame into the segments of
// a 4,092-byte IPoIB MTU, as the TAP does for every super-frame a guest
// sends (per super-frame).
func BenchmarkSegment64K(b *testing.B) {
	full := tcpFrame(b, false, 0, 1, 1, header.TCPFlagACK, pattern(65535-20-32))
	f, h := superFrame(b, full, false, 4040)
	benchSegment(b, f, h)
}

// benchSegment cuts super-frame f described by h, per op.
func benchSegment(b *testing.B, f []byte, h vnetHdr) {
	dst := make([]byte, 70000)
	var s segmenter
	b.ReportAllocs()
	b.SetBytes(int64(len(f)))
	for i := 0; i < b.N; i++ {
		if _, err := s.start(f, h, 4092); err != nil {
			b.Fatal(err)
		}
		for !s.Done() {
			s.Cut(dst)
		}
	}
}

// BenchmarkCoalesce64K merges the 16 segments of 64 KB of one flow into a
// super-frame, checksums verified, as the TAP does on write (per
// super-frame).
func BenchmarkCoalesce64K(b *testing.B) {
	benchCoalesce(b, segments(b, false, 0, 16, 4040, 4040))
}

// benchCoalesce merges frames (behind Headroom), one run, per op.
func benchCoalesce(b *testing.B, frames [][]byte) {
	var c coalescer
	size := 0
	for _, s := range frames {
		size += len(s) - Headroom
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for i := 0; i < b.N; i++ {
		k, first := run(frames, Headroom, true)
		if k != len(frames) {
			b.Fatalf("run of %d", k)
		}
		c.merge(first, frames, Headroom)
	}
}
