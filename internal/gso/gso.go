// Package gso cuts a TCP super-packet (a Linux GSO skb's shape: one set
// of headers and up to 64 KB of payload, its TCP checksum field holding
// the pseudo-header sum) into segments that fit an MTU, as the kernel's
// tcp_gso_segment does. The TAP cuts the super-frames guests send through
// it with this, and so does a port that takes super-packets whole (the
// simulated fabric builds its UDP GSO trains from the segments). The link
// header in front of the IP header (Ethernet, or the 4-byte IPoIB header)
// is copied into every segment unchanged.
package gso

import (
	"encoding/binary"
	"errors"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
)

// ErrBad is a super-packet that is not one TCP flow's, or whose headers
// disagree with its description; it is counted under this name.
var ErrBad = errors.New("bad_gso")

// Segmenter cuts one TCP super-packet into segments. Its zero value has
// nothing to cut.
type Segmenter struct {
	pkt    []byte // the super-packet; nil when done
	l3, l4 int    // IP and TCP header offsets
	hdrLen int    // all headers
	mss    int
	v6     bool
	next   int // offset in pkt of the next segment's payload
	seg    int // index of the next segment
	id     uint16
	seq    uint32
	flags  uint8
	// seed is the pseudo-header sum left in the checksum field for the
	// whole TCP length tcpLen. Segments take it and swap the length, as
	// the kernel's own segmentation does: the addresses in it are the
	// final ones even behind a routing header or a source route option,
	// which the header's own addresses are not.
	seed   uint16
	tcpLen int
}

// Done reports whether the segmenter has nothing left to cut.
func (s *Segmenter) Done() bool { return s.pkt == nil }

// HdrLen is the length of the headers copied into every segment.
func (s *Segmenter) HdrLen() int { return s.hdrLen }

// MSS is the TCP payload of every segment but the last.
func (s *Segmenter) MSS() int { return s.mss }

// Start checks pkt, whose IP header starts at l3 and TCP header at l4
// (v6 for IPv6, else IPv4), and prepares to cut it into segments of at
// most size bytes of payload whose IP packets fit mtu. pkt must stay
// untouched until Done.
func (s *Segmenter) Start(pkt []byte, l3, l4 int, v6 bool, size, mtu int) error {
	if l3 < 0 || l3 >= len(pkt) || l4 <= l3 {
		return ErrBad
	}
	var id uint16
	if v6 {
		ip, ok := header.ParseIPv6(pkt[l3:])
		if !ok || len(ip) != len(pkt)-l3 || TCPAfterIPv6(ip) != l4-l3 {
			return ErrBad
		}
	} else {
		ip, ok := header.ParseIPv4(pkt[l3:])
		if !ok || ip.Protocol() != header.ProtoTCP || l4 != l3+ip.HeaderLen() || len(ip) != len(pkt)-l3 {
			return ErrBad
		}
		id = ip.ID()
	}
	if l4 > len(pkt) {
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
		seed: binary.BigEndian.Uint16(pkt[l4+header.TCPChecksumOff:]), tcpLen: len(pkt) - l4}
	return nil
}

// TCPAfterIPv6 returns the offset of the TCP header in an IPv6 packet,
// after any hop-by-hop, routing and destination options headers, or -1.
func TCPAfterIPv6(ip header.IPv6) int {
	nh, off := ip.NextHeader(), header.IPv6Len
	for {
		switch nh {
		case header.ProtoTCP:
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
// bytes) and returns its length.
func (s *Segmenter) Cut(dst []byte) int {
	end := min(s.next+s.mss, len(s.pkt))
	n := copy(dst, s.pkt[:s.hdrLen])
	n += copy(dst[n:], s.pkt[s.next:end])
	seg := dst[:n]
	plen := n - s.l4 // TCP header and payload
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
	sum := uint32(s.seed) + uint32(^uint16(s.tcpLen)) + uint32(plen)
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
	s.seg++
	s.next = end
	if end == len(s.pkt) {
		s.pkt = nil
	}
	return n
}
