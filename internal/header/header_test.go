package header

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// ipv4WithOptions is an IPv4/UDP packet whose header carries record route
// (type 7, not copied), a NOP, router alert (0x94, copied) and loose
// source route (0x83, copied), built and checksummed by gopacket.
func ipv4WithOptions(t testing.TB, payload int) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, Id: 9, Flags: layers.IPv4DontFragment,
		SrcIP: netip.MustParseAddr("10.0.0.1").AsSlice(), DstIP: netip.MustParseAddr("10.0.0.2").AsSlice(),
		Options: []layers.IPv4Option{
			{OptionType: 7, OptionLength: 7, OptionData: []byte{4, 0, 0, 0, 0}},
			{OptionType: 1},
			{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}},
			{OptionType: 0x83, OptionLength: 7, OptionData: []byte{4, 10, 0, 0, 2}},
		}}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		ip, gopacket.Payload(make([]byte, payload))); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestIPv4(t *testing.T) {
	pkt := ipv4WithOptions(t, 100)
	h, ok := ParseIPv4(append(pkt, 0, 0, 0)) // Ethernet padding
	if !ok || len(h) != len(pkt) {
		t.Fatalf("ParseIPv4: ok %v, %d bytes, want %d", ok, len(h), len(pkt))
	}
	if h.HeaderLen() != 20+20 || h.TotalLen() != 140 || h.ID() != 9 || !h.DontFragment() || h.MoreFragments() ||
		h.FragmentOffset() != 0 || h.Protocol() != ProtoUDP || h.Src() != netip.MustParseAddr("10.0.0.1") ||
		h.Dst() != netip.MustParseAddr("10.0.0.2") || len(h.Payload()) != 100 || len(h.Options()) != 20 {
		t.Fatalf("accessors: hl %d tl %d id %d df %v mf %v off %d proto %d %s→%s payload %d",
			h.HeaderLen(), h.TotalLen(), h.ID(), h.DontFragment(), h.MoreFragments(), h.FragmentOffset(), h.Protocol(), h.Src(), h.Dst(), len(h.Payload()))
	}
	h.SetFragment(1480, true)
	h.SetTotalLen(60)
	h.SetChecksum()
	p := gopacket.NewPacket(h, layers.LayerTypeIPv4, gopacket.Default)
	ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if ip == nil || ip.FragOffset != 185 || ip.Flags != layers.IPv4DontFragment|layers.IPv4MoreFragments || ip.Length != 60 {
		t.Fatalf("after SetFragment/SetTotalLen, gopacket reads %+v", ip)
	}
	var sum uint32
	for i := 0; i < h.HeaderLen(); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	if sum != 0xffff {
		t.Fatalf("header checksum does not verify: %#x", sum)
	}
}

func TestParseIPv4Rejects(t *testing.T) {
	good := ipv4WithOptions(t, 8)
	for name, b := range map[string][]byte{
		"short":          good[:19],
		"version 6":      append([]byte{0x65}, good[1:]...),
		"IHL 4":          append([]byte{0x44}, good[1:]...),
		"IHL past total": append([]byte{0x4f, 0, 0, 40}, good[4:]...),
		"total past end": good[:len(good)-1],
	} {
		if _, ok := ParseIPv4(b); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCopiedOptions: only options with the copied flag go into non-first
// fragments (RFC 791 §3.2), padded to a multiple of 4.
func TestCopiedOptions(t *testing.T) {
	h, _ := ParseIPv4(ipv4WithOptions(t, 8))
	var dst [40]byte
	n := h.CopiedOptions(dst[:])
	want := []byte{0x94, 4, 0, 0, 0x83, 7, 4, 10, 0, 0, 2, 0}
	if !bytes.Equal(dst[:n], want) {
		t.Fatalf("copied options %x, want %x", dst[:n], want)
	}
	// A malformed option (length running past the header) ends the copy.
	h[20+8+1] = 30 // router alert's length
	if n := h.CopiedOptions(dst[:]); n != 0 {
		t.Fatalf("copied %x from a broken option list", dst[:n])
	}
}

func TestIPv6(t *testing.T) {
	src, dst := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("ff02::1:ff00:2")
	b := make([]byte, IPv6Len+8+4)
	h := EncodeIPv6(b, IPv6Fields{PayloadLen: 8, NextHeader: ProtoICMPv6, HopLimit: 255, Src: src, Dst: dst})
	p, ok := ParseIPv6(h)
	if !ok || len(p) != IPv6Len+8 || p.Src() != src || p.Dst() != dst || p.NextHeader() != ProtoICMPv6 || p.HopLimit() != 255 || len(p.Payload()) != 8 {
		t.Fatalf("ParseIPv6: ok %v len %d %s→%s nh %d hl %d", ok, len(p), p.Src(), p.Dst(), p.NextHeader(), p.HopLimit())
	}
	g := gopacket.NewPacket(p, layers.LayerTypeIPv6, gopacket.Default).Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	if g.Version != 6 || g.Length != 8 || !g.SrcIP.Equal(src.AsSlice()) || g.HopLimit != 255 {
		t.Fatalf("gopacket reads %+v", g)
	}
	if _, ok := ParseIPv6(p[:IPv6Len+7]); ok {
		t.Fatal("payload past the end accepted")
	}
	if _, ok := ParseIPv6(append([]byte{0x40}, p[1:]...)); ok {
		t.Fatal("version 4 accepted as IPv6")
	}
}

func TestEncodeIPv4(t *testing.T) {
	b := make([]byte, 28)
	h := EncodeIPv4(b, IPv4Fields{TotalLen: 28, TTL: 64, Protocol: ProtoICMP, Src: netip.MustParseAddr("10.1.1.1"), Dst: netip.MustParseAddr("10.2.2.2")})
	p, ok := ParseIPv4(h)
	if !ok || p.HeaderLen() != 20 || p.TotalLen() != 28 || p.Protocol() != ProtoICMP || p.Dst() != netip.MustParseAddr("10.2.2.2") {
		t.Fatalf("EncodeIPv4: %x", b)
	}
	ip := gopacket.NewPacket(p, layers.LayerTypeIPv4, gopacket.Default).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if ip.TTL != 64 || ip.Checksum == 0 {
		t.Fatalf("gopacket reads %+v", ip)
	}
}

// FuzzParseIPv4: whatever ParseIPv4 accepts is self-consistent, its
// accessors stay inside the packet, and CopiedOptions writes only options
// with the copied flag, padded to a multiple of 4, no longer than the
// options themselves.
func FuzzParseIPv4(f *testing.F) {
	f.Add(ipv4WithOptions(f, 8))
	f.Add(ipv4WithOptions(f, 0)[:20])
	f.Add([]byte{0x46, 0, 0, 24, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x94, 4, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := ParseIPv4(b)
		if !ok {
			return
		}
		if h.HeaderLen() < IPv4MinLen || h.HeaderLen() > h.TotalLen() || h.TotalLen() != len(h) || len(h.Payload()) != h.TotalLen()-h.HeaderLen() {
			t.Fatalf("inconsistent: hl %d tl %d len %d", h.HeaderLen(), h.TotalLen(), len(h))
		}
		_, _, _, _, _ = h.Src(), h.Dst(), h.FragmentOffset(), h.MoreFragments(), h.DontFragment()
		var dst [40]byte
		n := h.CopiedOptions(dst[:])
		if n%4 != 0 || n > len(h.Options())+3 {
			t.Fatalf("copied %d bytes of %d bytes of options", n, len(h.Options()))
		}
		for i := 0; i < n && dst[i] != IPv4OptEOL; i += int(dst[i+1]) {
			if dst[i]&ipv4OptCopied == 0 || dst[i+1] < 2 {
				t.Fatalf("copied option %x not flagged copied, or of length < 2: %x", dst[i], dst[:n])
			}
		}
	})
}

// FuzzParseIPv6: whatever ParseIPv6 accepts is self-consistent.
func FuzzParseIPv6(f *testing.F) {
	b := make([]byte, IPv6Len+8)
	f.Add(append([]byte(nil), EncodeIPv6(b, IPv6Fields{PayloadLen: 8, NextHeader: ProtoUDP, HopLimit: 1, Src: netip.IPv6Loopback(), Dst: netip.IPv6Loopback()})...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := ParseIPv6(b)
		if !ok {
			return
		}
		if len(h) != IPv6Len+h.PayloadLen() || len(h.Payload()) != h.PayloadLen() {
			t.Fatalf("inconsistent: payload length %d, %d bytes", h.PayloadLen(), len(h))
		}
		_, _ = h.Src(), h.Dst()
	})
}

func TestTCP(t *testing.T) {
	tcp := &layers.TCP{SrcPort: 1, DstPort: 2, Seq: 0xfffffff0, ACK: true, PSH: true, Window: 9,
		Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
			{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: make([]byte, 8)}}}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, tcp, gopacket.Payload("data")); err != nil {
		t.Fatal(err)
	}
	h, ok := ParseTCP(buf.Bytes())
	if !ok || h.HeaderLen() != 32 || h.Seq() != 0xfffffff0 || h.Flags() != TCPFlagACK|TCPFlagPSH {
		t.Fatalf("ParseTCP: ok %v hl %d seq %#x flags %#x", ok, h.HeaderLen(), h.Seq(), h.Flags())
	}
	h.SetSeq(7)
	h.SetFlags(TCPFlagACK | TCPFlagFIN)
	h.SetChecksum(0xbeef)
	g := gopacket.NewPacket(h, layers.LayerTypeTCP, gopacket.Default).Layer(layers.LayerTypeTCP).(*layers.TCP)
	if g.Seq != 7 || !g.FIN || g.PSH || g.Checksum != 0xbeef || string(g.Payload) != "data" {
		t.Fatalf("gopacket reads %+v", g)
	}
	for _, bad := range [][]byte{h[:19], append([]byte(nil), h[:20]...)} {
		if len(bad) == 20 {
			bad[12] = 0x40 // data offset 4: below the minimum
		}
		if _, ok := ParseTCP(bad); ok {
			t.Errorf("ParseTCP accepted %x", bad)
		}
	}
	long := append([]byte(nil), h[:20]...)
	long[12] = 0xf0 // 60-byte header in 20 bytes
	if _, ok := ParseTCP(long); ok {
		t.Error("header longer than the segment accepted")
	}
}
