// Package gso cuts a TCP or UDP super-packet into segments, as the
// kernel's tcp_gso_segment and __udp_gso_segment
// (net/ipv4/udp_offload.c, SKB_GSO_UDP_L4) do. A super-packet has a
// Linux GSO skb's shape: one set of headers and up to 64 KB of payload,
// its checksum field holding the pseudo-header sum. TCP segments fit an
// MTU; UDP datagrams carry gso_size bytes each.
//
// The TAP cuts the super-frames guests send through it with this. So
// does a port that takes super-packets whole: the simulated fabric
// builds its UDP GSO trains from the segments. The link header in front
// of the IP header (Ethernet, or the 4-byte IPoIB header) is copied into
// every segment unchanged.
package gso

import (
	"encoding/binary"
	"errors"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/ipoib"
)

// ErrBad is a super-packet that is not one TCP or UDP flow's, or whose
// headers disagree with its description; it is counted under this name.
var ErrBad = errors.New("bad_gso")

// The UDP header's length and its checksum field's offset (RFC 768).
const (
	UDPHeaderLen   = 8
	UDPChecksumOff = 6
)

// Segmenter cuts one TCP or UDP super-packet into segments. Its zero
// value has nothing to cut.
type Segmenter struct {
	pkt    []byte // the super-packet; nil when done
	l3, l4 int    // IP and TCP/UDP header offsets
	hdrLen int    // all headers
	mss    int    // TCP payload, or UDP payload per datagram
	v6     bool
	udp    bool
	next   int // offset in pkt of the next segment's payload
	seg    int // index of the next segment
	id     uint16
	seq    uint32
	flags  uint8
	// seed is the pseudo-header sum left in the checksum field for the
	// whole TCP or UDP length l4Len. Segments take it and swap the length, as
	// the kernel's own segmentation does: the addresses in it are the
	// final ones even behind a routing header or a source route option,
	// which the header's own addresses are not.
	seed  uint16
	l4Len int
}

// Done reports whether the segmenter has nothing left to cut.
func (s *Segmenter) Done() bool { return s.pkt == nil }

// HdrLen is the length of the headers copied into every segment.
func (s *Segmenter) HdrLen() int { return s.hdrLen }

// MSS is the TCP (or UDP) payload of every segment (datagram) but the
// last.
func (s *Segmenter) MSS() int { return s.mss }

// Segments is how many segments a super-packet of pktLen bytes whose
// headers take hdrLen and whose segments carry mss bytes is cut into.
func Segments(pktLen, hdrLen, mss int) int { return (pktLen - hdrLen + mss - 1) / mss }

// Start checks pkt, whose IP header starts at l3 and TCP header at l4
// (v6 for IPv6, else IPv4), and prepares to cut it into segments of at
// most size bytes of payload whose IP packets fit mtu. pkt must stay
// untouched until Done.
func (s *Segmenter) Start(pkt []byte, l3, l4 int, v6 bool, size, mtu int) error {
	id, ok := checkIP(pkt, l3, l4, v6, header.ProtoTCP)
	if !ok {
		return ErrBad
	}
	tcp, ok := header.ParseTCP(pkt[l4:])
	if !ok {
		return ErrBad
	}
	hdrLen := l4 + tcp.HeaderLen()
	mss := min(size, mtu-(hdrLen-l3))
	if mss <= 0 || hdrLen >= len(pkt) {
		return ErrBad
	}
	*s = Segmenter{pkt: pkt, l3: l3, l4: l4, hdrLen: hdrLen, mss: mss, v6: v6, next: hdrLen,
		id: id, seq: tcp.Seq(), flags: tcp.Flags(),
		seed: binary.BigEndian.Uint16(pkt[l4+header.TCPChecksumOff:]), l4Len: len(pkt) - l4}
	return nil
}

// StartIPoIB starts cutting pkt, the IPoIB super-packet g describes
// (from its IPoIB header), into packets of at most mtu bytes, IPoIB
// header included: TCP into segments, UDP into its datagrams (which must
// fit already). Every port that takes super-packets cuts them so.
func (s *Segmenter) StartIPoIB(g ipoib.GSO, pkt []byte, mtu int) error {
	return s.StartL4(g.Type.UDP(), pkt, ipoib.HeaderLen, int(g.L4), g.Type.V6(), int(g.Size), mtu-ipoib.HeaderLen)
}

// StartL4 starts a TCP super-packet's cut (Start), or a UDP one's
// (StartUDP) when udp is set.
func (s *Segmenter) StartL4(udp bool, pkt []byte, l3, l4 int, v6 bool, size, mtu int) error {
	if udp {
		return s.StartUDP(pkt, l3, l4, v6, size, mtu)
	}
	return s.Start(pkt, l3, l4, v6, size, mtu)
}

// StartUDP checks pkt, a UDP super-packet (SKB_GSO_UDP_L4) whose IP
// header starts at l3 and UDP header at l4. It prepares to cut it into
// datagrams of size bytes of payload (gso_size), the last possibly
// shorter. A datagram's IP packet must fit mtu, as a datagram cannot be
// cut smaller. The UDP checksum field holds the pseudo-header sum over
// the whole UDP length, as for TCP; the UDP length field must be that
// length. pkt must stay untouched until Done.
func (s *Segmenter) StartUDP(pkt []byte, l3, l4 int, v6 bool, size, mtu int) error {
	id, ok := checkIP(pkt, l3, l4, v6, header.ProtoUDP)
	hdrLen := l4 + UDPHeaderLen
	if !ok || hdrLen >= len(pkt) || size <= 0 || hdrLen-l3+size > mtu ||
		int(binary.BigEndian.Uint16(pkt[l4+4:])) != len(pkt)-l4 {
		return ErrBad
	}
	*s = Segmenter{pkt: pkt, l3: l3, l4: l4, hdrLen: hdrLen, mss: size, v6: v6, udp: true, next: hdrLen,
		id: id, seed: binary.BigEndian.Uint16(pkt[l4+UDPChecksumOff:]), l4Len: len(pkt) - l4}
	return nil
}

// checkIP checks the IP header of pkt at l3 against pkt's length and a
// transport header of protocol proto at l4, and returns the IPv4 ID.
func checkIP(pkt []byte, l3, l4 int, v6 bool, proto uint8) (id uint16, ok bool) {
	if l3 < 0 || l3 >= len(pkt) || l4 <= l3 || l4 > len(pkt) {
		return 0, false
	}
	if v6 {
		ip, ok := header.ParseIPv6(pkt[l3:])
		return 0, ok && len(ip) == len(pkt)-l3 && afterIPv6(ip, proto) == l4-l3
	}
	ip, ok := header.ParseIPv4(pkt[l3:])
	if !ok || ip.Protocol() != proto || l4 != l3+ip.HeaderLen() || len(ip) != len(pkt)-l3 {
		return 0, false
	}
	return ip.ID(), true
}

// afterIPv6 returns the offset of the header of protocol proto in an
// IPv6 packet, after any hop-by-hop, routing and destination options
// headers, or -1.
func afterIPv6(ip header.IPv6, proto uint8) int {
	nh, off := ip.NextHeader(), header.IPv6Len
	for {
		switch nh {
		case proto:
			return off
		case 0, 43, 60: // hop-by-hop, routing, destination options (RFC 8200 §4)
			if off+2 > len(ip) {
				return -1
			}
			nh, off = ip[off], off+(int(ip[off+1])+1)*8
		default:
			return -1
		}
	}
}

// Cut writes the next segment into dst (which must hold HdrLen+MSS
// bytes) and returns its length. The segment is copied whole because it
// needs its own headers in front of its payload, and its checksum is then
// summed over the copy: the super-packet carries only the pseudo-header's
// partial sum, which covers no segment's payload.
func (s *Segmenter) Cut(dst []byte) int {
	end := min(s.next+s.mss, len(s.pkt))
	n := copy(dst, s.pkt[:s.hdrLen])
	n += copy(dst[n:], s.pkt[s.next:end])
	seg := dst[:n]
	plen := n - s.l4 // TCP or UDP header and payload
	if s.v6 {
		ip := header.IPv6(seg[s.l3:])
		ip.SetPayloadLen(n - s.l3 - header.IPv6Len)
	} else {
		ip := header.IPv4(seg[s.l3:])
		ip.SetTotalLen(n - s.l3)
		ip.SetID(s.id + uint16(s.seg))
		ip.SetChecksum()
	}
	// The seed with the whole length taken out (one's complement: add
	// its complement) and this segment's put in.
	sum := uint32(s.seed) + uint32(^uint16(s.l4Len)) + uint32(plen)
	if s.udp {
		// __udp_gso_segment: each datagram its own length and
		// checksum, a computed 0 sent as 0xFFFF (CSUM_MANGLED_0: 0
		// means "no checksum").
		udp := seg[s.l4:]
		binary.BigEndian.PutUint16(udp[4:], uint16(plen))
		udp[UDPChecksumOff], udp[UDPChecksumOff+1] = 0, 0
		c := csum.Fold(csum.Sum(sum, udp))
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(udp[UDPChecksumOff:], c)
	} else {
		tcp := header.TCP(seg[s.l4:])
		tcp.SetSeq(s.seq + uint32(s.next-s.hdrLen))
		flags := s.flags
		if s.seg > 0 {
			flags &^= header.TCPFlagCWR // congestion window reduced: said once
		}
		if end < len(s.pkt) {
			flags &^= header.TCPFlagFIN | header.TCPFlagPSH // only the last segment ends or pushes
		}
		tcp.SetFlags(flags)
		tcp.SetChecksum(0)
		tcp.SetChecksum(csum.Fold(csum.Sum(sum, seg[s.l4:])))
	}
	s.seg++
	s.next = end
	if end == len(s.pkt) {
		s.pkt = nil
	}
	return n
}
