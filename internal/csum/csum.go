// Package csum computes Internet checksums (RFC 1071) for the packets
// eipoibd rewrites or builds: IPv4 headers, UDP, ICMP and ICMPv6.
package csum

import "encoding/binary"

// Sum adds b to a one's-complement running sum.
func Sum(acc uint32, b []byte) uint32 {
	for len(b) >= 2 {
		acc += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
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
