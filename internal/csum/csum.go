// Package csum computes Internet checksums (RFC 1071) for the packets
// eipoibd rewrites or builds: IPv4 headers, UDP, ICMP and ICMPv6.
package csum

import "encoding/binary"

// Sum adds b to a one's-complement running sum. It adds 32-bit words
// into a 64-bit accumulator, eight bytes a step (RFC 1071 §2: the sum
// may be computed in any word size and folded), so a 64 KB segment costs
// a few microseconds; the result is folded back into 32 bits.
func Sum(acc uint32, b []byte) uint32 {
	s := uint64(acc)
	for len(b) >= 32 {
		w0, w1 := binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
		w2, w3 := binary.BigEndian.Uint64(b[16:]), binary.BigEndian.Uint64(b[24:])
		s += w0>>32 + w0&0xffffffff + w1>>32 + w1&0xffffffff + w2>>32 + w2&0xffffffff + w3>>32 + w3&0xffffffff
		b = b[32:]
	}
	for len(b) >= 4 {
		s += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b)) << 16
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 24
	}
	// The words were added as 32-bit big-endian values: fold to 16 bits
	// the one's-complement way, then hand back a 32-bit running sum.
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint32(s)
}

// Fold finishes a running sum into a checksum.
func Fold(acc uint32) uint16 {
	for acc>>16 != 0 {
		acc = acc&0xffff + acc>>16
	}
	return ^uint16(acc)
}

// Pseudo is the running sum of a pseudo-header: the addresses, the
// protocol and the upper-layer length (RFC 768, RFC 8200 §8.1).
func Pseudo(src, dst []byte, proto uint8, length int) uint32 {
	acc := Sum(0, src)
	acc = Sum(acc, dst)
	return acc + uint32(proto) + uint32(length)
}

// IPv4Header recomputes the header checksum of the IPv4 header h.
func IPv4Header(h []byte) {
	h[10], h[11] = 0, 0
	binary.BigEndian.PutUint16(h[10:12], Fold(Sum(0, h)))
}
