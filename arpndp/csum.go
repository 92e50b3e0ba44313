package arpndp

import "encoding/binary"

// sum adds b to a one's-complement running sum (RFC 1071).
func sum(acc uint32, b []byte) uint32 {
	for len(b) >= 2 {
		acc += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
}

// fold finishes a running sum into a checksum.
func fold(acc uint32) uint16 {
	for acc>>16 != 0 {
		acc = acc&0xffff + acc>>16
	}
	return ^uint16(acc)
}

// pseudoSum is the running sum of a pseudo-header: the addresses, the
// protocol and the upper-layer length (RFC 768, RFC 8200 §8.1).
func pseudoSum(src, dst []byte, proto uint8, length int) uint32 {
	acc := sum(0, src)
	acc = sum(acc, dst)
	return acc + uint32(proto) + uint32(length)
}
