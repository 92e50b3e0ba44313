package tap

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/header"
)

// ethLink returns an Ethernet header from macA to macB for IPv4 or IPv6,
// 802.1Q-tagged when vlan != 0.
func ethLink(v6 bool, vlan uint16) []byte {
	l := append(append([]byte(nil), macB...), macA...)
	if vlan != 0 {
		l = binary.BigEndian.AppendUint16(l, 0x8100)
		l = binary.BigEndian.AppendUint16(l, vlan)
	}
	et := uint16(0x0800)
	if v6 {
		et = 0x86dd
	}
	return binary.BigEndian.AppendUint16(l, et)
}

// udpSuperFrame returns the super-frame and vnet header a TAP with USO
// hands over for a guest's UDP_SEGMENT send of payload in size-byte
// datagrams (include/linux/virtio_net.h virtio_net_hdr_from_skb).
func udpSuperFrame(tb testing.TB, v6 bool, vlan uint16, payload []byte, size int) ([]byte, vnetHdr) {
	f, l4 := gsotest.SuperUDP(tb, ethLink(v6, vlan), v6, payload)
	return f, vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, gsoType: unix.VIRTIO_NET_HDR_GSO_UDP_L4,
		hdrLen: uint16(l4 + gso.UDPHeaderLen), gsoSize: uint16(size), csumStart: uint16(l4), csumOffset: gso.UDPChecksumOff}
}

// cutAll cuts what s was started on into fresh slices.
func cutAll(s *segmenter) [][]byte {
	var out [][]byte
	dst := make([]byte, maxSuperFrame)
	for !s.Done() {
		n := s.Cut(dst)
		out = append(out, append([]byte(nil), dst[:n]...))
	}
	return out
}

// TestSegmentUDP: a UDP super-frame becomes exactly the datagrams a
// guest sending them one by one would have sent: the bytes gopacket
// builds. It covers IPv4 and IPv6, untagged and tagged, the last
// datagram full or shorter, and datagrams larger than the IPoIB MTU
// (they cannot be cut smaller). Each datagram has its own UDP length and
// checksum, IPv4 total length, consecutive IDs and header checksum, and
// IPv6 payload length. The description ReadSuper gives says UDP, the
// version and gso_size uncut.
func TestSegmentUDP(t *testing.T) {
	for _, c := range []struct {
		v6          bool
		vlan        uint16
		size, total int
	}{{false, 0, 64, 64 * 32}, {true, 0, 64, 64*32 - 10}, {false, 7, 1400, 20000}, {true, 9, 1200, 7}, {false, 0, 8000, 30000}} {
		payload := pattern(c.total)
		f, h := udpSuperFrame(t, c.v6, c.vlan, payload, c.size)
		var s segmenter
		sup, err := s.start(f, h, 4092)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if want := (Super{L4: h.csumStart, Size: uint16(c.size), V6: c.v6, UDP: true}); sup != want {
			t.Fatalf("%+v: described as %+v, want %+v", c, sup, want)
		}
		gsotest.CheckUDPCut(t, cutAll(&s), ethLink(c.v6, c.vlan), c.v6, payload, c.size)
	}
}

// TestSegmentUDPChecksumZero: a datagram whose checksum computes to 0 is
// sent with 0xFFFF, as __udp_gso_segment does (CSUM_MANGLED_0): 0 would
// say "no checksum", and is invalid over IPv6.
func TestSegmentUDPChecksumZero(t *testing.T) {
	payload := pattern(200)
	f, h := udpSuperFrame(t, true, 0, payload, 100)
	// Make the first datagram's sum 0xFFFF by setting its first payload
	// word: the datagram as cut, with that word zero, gives the rest.
	l4 := int(h.csumStart)
	binary.BigEndian.PutUint16(f[l4+8:], 0)
	var s segmenter
	if _, err := s.start(f, h, 4092); err != nil {
		t.Fatal(err)
	}
	d := cutAll(&s)[0]
	ip := header.IPv6(d[14:])
	binary.BigEndian.PutUint16(d[l4+gso.UDPChecksumOff:], 0)
	rest := ^csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoUDP, len(d)-l4), d[l4:]))
	binary.BigEndian.PutUint16(f[l4+8:], 0xffff-rest)
	if _, err := s.start(f, h, 4092); err != nil {
		t.Fatal(err)
	}
	d = cutAll(&s)[0]
	if got := binary.BigEndian.Uint16(d[l4+gso.UDPChecksumOff:]); got != 0xffff {
		t.Fatalf("a checksum computing to 0 was written as %#04x, want 0xffff", got)
	}
}

// TestSegmentUDPRefuses: UDP super-frames whose vnet header does not
// describe them are refused (counted as bad_gso by the TAP).
func TestSegmentUDPRefuses(t *testing.T) {
	good, h := udpSuperFrame(t, false, 0, pattern(3000), 1000)
	good6, h6 := udpSuperFrame(t, true, 0, pattern(3000), 1000)
	tcp, th := superFrame(t, tcpFrame(t, false, 0, 1, 1, header.TCPFlagACK, pattern(5000)), false, 1000)
	// Headers only: IP and UDP lengths say so, as a guest's zero-length
	// UDP_SEGMENT send would (the frame passes checkIP; only the missing
	// payload is wrong).
	empty, eh := udpSuperFrame(t, false, 0, nil, 1000)
	badLen := append([]byte(nil), good...)
	binary.BigEndian.PutUint16(badLen[h.csumStart+4:], 1008)
	with := func(f func(*vnetHdr)) vnetHdr { c := h; f(&c); return c }
	var s segmenter
	for name, c := range map[string]struct {
		f []byte
		h vnetHdr
	}{
		"TCP checksum offset":      {good, with(func(v *vnetHdr) { v.csumOffset = header.TCPChecksumOff })},
		"ECN bit":                  {good, with(func(v *vnetHdr) { v.gsoType |= unix.VIRTIO_NET_HDR_GSO_ECN })},
		"no NEEDS_CSUM":            {good, with(func(v *vnetHdr) { v.flags = 0 })},
		"zero size":                {good, with(func(v *vnetHdr) { v.gsoSize = 0 })},
		"csum start off":           {good, with(func(v *vnetHdr) { v.csumStart += 4 })},
		"UDP length not the whole": {badLen, h},
		"truncated":                {good[:len(good)-1], h},
		"IPv6, csum start in IP":   {good6, vnetHdr{flags: h6.flags, gsoType: h6.gsoType, csumStart: 14 + 20, csumOffset: 6, gsoSize: 1000}},
		"a TCP frame called UDP":   {tcp, vnetHdr{flags: th.flags, gsoType: unix.VIRTIO_NET_HDR_GSO_UDP_L4, csumStart: th.csumStart, csumOffset: 6, gsoSize: 1000}},
		"headers only, no payload": {empty, eh},
		"not IP":                   {append(append([]byte(nil), good[:12]...), append([]byte{0x08, 0x06}, good[14:]...)...), h},
	} {
		if _, err := s.start(c.f, c.h, 4092); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// datagrams returns n datagrams of one flow, size bytes of payload each
// (the last one last bytes), IPv4 IDs from gsotest.UDPID on, each behind
// Headroom bytes, as the fabric delivers them.
func datagrams(tb testing.TB, v6 bool, vlan uint16, n, size, last int) [][]byte {
	var out [][]byte
	p := pattern(size*(n-1) + last)
	for i := 0; i < n; i++ {
		d := gsotest.Datagram(tb, ethLink(v6, vlan), v6, gsotest.UDPID+uint16(i), p[i*size:min((i+1)*size, len(p))])
		out = append(out, append(make([]byte, Headroom), d...))
	}
	return out
}

// TestCoalesceUDPRoundTrip: a run of same-size datagrams of one flow
// (the last shorter) becomes one GSO_UDP_L4 super-frame as
// udp_gro_complete leaves it. Its vnet header has NEEDS_CSUM at the UDP
// checksum and gso_size the datagrams' payload. Its IP and UDP lengths
// are the whole, and the checksum field holds the pseudo-header sum over
// it. Cutting it again gives back the same datagrams byte for byte.
func TestCoalesceUDPRoundTrip(t *testing.T) {
	for _, c := range []struct {
		v6   bool
		vlan uint16
	}{{false, 0}, {true, 0}, {false, 3}, {true, 4}} {
		ds := datagrams(t, c.v6, c.vlan, 10, 64, 40)
		k, first := run(ds, Headroom, true)
		if k != len(ds) {
			t.Fatalf("%+v: run of %d, want %d", c, k, len(ds))
		}
		var co coalescer
		out := co.merge(first, ds, Headroom)
		h := decodeVnet(out)
		l3 := len(ethLink(c.v6, c.vlan))
		l4 := l3 + header.IPv4MinLen
		if c.v6 {
			l4 = l3 + header.IPv6Len
		}
		want := vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, gsoType: unix.VIRTIO_NET_HDR_GSO_UDP_L4, hdrLen: uint16(l4 + 8),
			gsoSize: 64, csumStart: uint16(l4), csumOffset: 6}
		if h != want {
			t.Fatalf("%+v: vnet header %+v, want %+v", c, h, want)
		}
		sf := out[vnetHdrLen:]
		if got, want := int(binary.BigEndian.Uint16(sf[l4+4:])), 9*64+40+8; got != want || len(sf)-l4 != want {
			t.Fatalf("%+v: UDP length %d for %d bytes, want %d", c, got, len(sf)-l4, want)
		}
		pkt, _ := gsotest.SuperUDP(t, ethLink(c.v6, c.vlan), c.v6, pattern(9*64+40))
		if !bytes.Equal(sf, pkt) {
			t.Fatalf("%+v: super-frame\n got %x\nwant %x", c, sf, pkt)
		}
		var s segmenter
		if _, err := s.start(append([]byte(nil), sf...), h, 4092); err != nil {
			t.Fatal(err)
		}
		got := cutAll(&s)
		for i := range ds {
			if !bytes.Equal(got[i], ds[i][Headroom:]) {
				t.Fatalf("%+v: datagram %d differs after the round trip", c, i)
			}
		}
	}
}

// TestCoalesceUDPBreaks: a run of datagrams ends at one of another flow,
// one with a bad or no checksum, a larger one, one after a shorter one
// and a fragment; without USO no datagram is merged.
func TestCoalesceUDPBreaks(t *testing.T) {
	base := func() [][]byte { return datagrams(t, false, 0, 4, 100, 100) }
	l4 := Headroom + 14 + 20
	fixUDP := func(f []byte) { // recompute the UDP checksum after an edit
		ip := header.IPv4(f[Headroom+14:])
		f[l4+6], f[l4+7] = 0, 0
		binary.BigEndian.PutUint16(f[l4+6:], csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoUDP, len(f)-l4), f[l4:])))
	}
	cases := map[string]func(s [][]byte) int{
		"bad checksum": func(s [][]byte) int { s[2][len(s[2])-1] ^= 1; return 2 },
		"no checksum":  func(s [][]byte) int { s[1][l4+6], s[1][l4+7] = 0, 0; return 1 },
		"other port":   func(s [][]byte) int { s[3][l4+1]++; fixUDP(s[3]); return 3 },
		"larger":       func(s [][]byte) int { s[2] = datagrams(t, false, 0, 1, 101, 101)[0]; return 2 },
		"after a shorter": func(s [][]byte) int {
			s[1] = datagrams(t, false, 0, 1, 99, 99)[0]
			return 2
		},
		"fragment": func(s [][]byte) int {
			ip := header.IPv4(s[1][Headroom+14:])
			ip.SetFragment(0, true)
			ip.SetChecksum()
			return 1
		},
	}
	for name, edit := range cases {
		s := base()
		want := edit(s)
		if got, _ := run(s, Headroom, true); got != want {
			t.Errorf("%s: run of %d, want %d", name, got, want)
		}
	}
	if got, _ := run(base(), Headroom, false); got != 1 {
		t.Errorf("without USO: run of %d, want 1", got)
	}
}

// BenchmarkSegmentUDP cuts a 32-datagram UDP super-frame of 64-byte
// payloads, what bin/udprate sends, into its datagrams (per
// super-frame).
func BenchmarkSegmentUDP(b *testing.B) {
	f, h := udpSuperFrame(b, false, 0, pattern(64*32), 64)
	benchSegment(b, f, h)
}

// BenchmarkCoalesceUDP merges 32 datagrams of 64 bytes of one flow into
// a super-frame, checksums verified, as the TAP does on write (per
// super-frame).
func BenchmarkCoalesceUDP(b *testing.B) {
	benchCoalesce(b, datagrams(b, false, 0, 32, 64, 64))
}
