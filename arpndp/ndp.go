package arpndp

// NDP rewriting (RFC 4861). The source/target link-layer address options
// (types 1 and 2) are 8 bytes on Ethernet (RFC 2464 §6: type, length 1,
// MAC) and 24 bytes on IPoIB (RFC 4391 §9.3.1: type, length 3, 2 bytes of
// zero pad, the 20-byte address). Rewriting grows or shrinks the packet by
// 16 bytes per option; the IPv6 payload length and the ICMPv6 checksum are
// fixed afterwards. Other options (prefix, MTU, redirected header, …) pass
// unchanged. Only ICMPv6 directly after the IPv6 header is rewritten.

import (
	"encoding/binary"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/ipoib"
)

// NDP message types.
const (
	TypeRouterSolicitation    = 133
	TypeRouterAdvertisement   = 134
	TypeNeighborSolicitation  = 135
	TypeNeighborAdvertisement = 136
	TypeRedirect              = 137
)

// Option lengths in bytes.
const (
	OptSLLA     = 1
	OptTLLA     = 2
	optEthLen   = 8
	optIBLen    = 24
	optGrowth   = optIBLen - optEthLen
	maxLLOpts   = 8 // far more than any NDP message carries
	ipv6HdrLen  = 40
	protoICMPv6 = 58
)

// ndpFixedLen returns the length of the fixed part (ICMPv6 header included)
// of an NDP message type, or 0 if t is not NDP.
func ndpFixedLen(t byte) int {
	switch t {
	case TypeRouterSolicitation:
		return 8
	case TypeRouterAdvertisement:
		return 16
	case TypeNeighborSolicitation, TypeNeighborAdvertisement:
		return 24
	case TypeRedirect:
		return 40
	}
	return 0
}

// IsNDP reports whether pkt is an IPv6 packet carrying an NDP message
// (ICMPv6 types 133–137 right after the IPv6 header). It checks no more
// than the headers needed to say so.
func IsNDP(pkt []byte) bool {
	return len(pkt) > ipv6HdrLen && pkt[0]>>4 == 6 && pkt[6] == protoICMPv6 && ndpFixedLen(pkt[ipv6HdrLen]) != 0
}

// ndpBounds validates the IPv6 framing and returns the end of the packet
// and the offset of the options.
func ndpBounds(pkt []byte) (end, opts int, err error) {
	if len(pkt) < ipv6HdrLen {
		return 0, 0, ErrTruncated
	}
	if !IsNDP(pkt) {
		return 0, 0, ErrNotNDP
	}
	end = ipv6HdrLen + int(binary.BigEndian.Uint16(pkt[4:6]))
	if end > len(pkt) {
		return 0, 0, ErrTruncated
	}
	opts = ipv6HdrLen + ndpFixedLen(pkt[ipv6HdrLen])
	if end < opts {
		return 0, 0, ErrTruncated
	}
	if !ICMPv6ChecksumOK(pkt) {
		return 0, 0, ErrBadChecksum
	}
	return end, opts, nil
}

// scanOpts walks the options in pkt[off:end], checks their framing and
// returns the offsets of the link-layer options. wantLen is the length
// field (in 8-byte units) a link-layer option must have.
func scanOpts(pkt []byte, off, end int, wantLen byte, ll *[maxLLOpts]int) (int, error) {
	k := 0
	for off < end {
		if end-off < 2 {
			return 0, ErrOptOverrun
		}
		l := int(pkt[off+1]) * 8
		if l == 0 {
			return 0, ErrOptLenZero
		}
		if off+l > end {
			return 0, ErrOptOverrun
		}
		if t := pkt[off]; t == OptSLLA || t == OptTLLA {
			if pkt[off+1] != wantLen {
				return 0, ErrBadOptLen
			}
			if k == maxLLOpts {
				return 0, ErrTooManyOpts
			}
			ll[k] = off
			k++
		}
		off += l
	}
	return k, nil
}

// NDPToIB rewrites an NDP packet (pkt starts at the IPv6 header) from a
// guest: each 8-byte Ethernet link-layer option becomes a 24-byte IPoIB
// one. It returns the rewritten packet, which may be longer than pkt and
// must fit in pkt's capacity. Bytes past the IPv6 payload length are
// dropped.
func NDPToIB(pkt []byte, tr Translator) ([]byte, error) {
	end, opts, err := ndpBounds(pkt)
	if err != nil {
		return nil, err
	}
	var ll [maxLLOpts]int
	k, err := scanOpts(pkt, opts, end, 1, &ll)
	if err != nil {
		return nil, err
	}
	newEnd := end + k*optGrowth
	if newEnd-ipv6HdrLen > 0xffff {
		return nil, ErrBadLength
	}
	if cap(pkt) < newEnd {
		return nil, ErrNoRoom
	}
	var hws [maxLLOpts]ipoib.HwAddr
	for j := 0; j < k; j++ {
		hw, ok := tr.EthToIB(ether.MAC(pkt[ll[j]+2 : ll[j]+8]))
		if !ok {
			return nil, ErrUnknownAddr
		}
		hws[j] = hw
	}
	out := pkt[:newEnd]
	// From the last option back: the bytes after option j move by
	// 16*(j+1), option j itself by 16*j, so nothing is overwritten
	// before it is moved.
	segEnd := end
	for j := k - 1; j >= 0; j-- {
		o := ll[j]
		copy(out[o+optEthLen+optGrowth*(j+1):], pkt[o+optEthLen:segEnd])
		n := o + optGrowth*j
		t := pkt[o]
		out[n], out[n+1], out[n+2], out[n+3] = t, 3, 0, 0
		copy(out[n+4:n+optIBLen], hws[j][:])
		segEnd = o
	}
	finishICMPv6(out)
	return out, nil
}

// NDPToEth rewrites an NDP packet from the fabric: each 24-byte IPoIB
// link-layer option becomes an 8-byte Ethernet one. The packet shrinks in
// place.
func NDPToEth(pkt []byte, tr Translator) ([]byte, error) {
	end, opts, err := ndpBounds(pkt)
	if err != nil {
		return nil, err
	}
	var ll [maxLLOpts]int
	k, err := scanOpts(pkt, opts, end, 3, &ll)
	if err != nil {
		return nil, err
	}
	var macs [maxLLOpts]ether.MAC
	for j := 0; j < k; j++ {
		mac, ok := tr.IBToEth(ipoib.HwAddr(pkt[ll[j]+4 : ll[j]+optIBLen]))
		if !ok {
			return nil, ErrUnknownAddr
		}
		macs[j] = mac
	}
	// Front to back: every write lands at or before what it replaces.
	w := ll[0:k]
	r := opts
	wr := opts
	for j, o := range w {
		wr += copy(pkt[wr:], pkt[r:o])
		pkt[wr], pkt[wr+1] = pkt[o], 1
		copy(pkt[wr+2:wr+optEthLen], macs[j][:])
		wr += optEthLen
		r = o + optIBLen
	}
	wr += copy(pkt[wr:], pkt[r:end])
	out := pkt[:wr]
	finishICMPv6(out)
	return out, nil
}

// finishICMPv6 sets the IPv6 payload length from len(pkt) and recomputes
// the ICMPv6 checksum.
func finishICMPv6(pkt []byte) {
	plen := len(pkt) - ipv6HdrLen
	binary.BigEndian.PutUint16(pkt[4:6], uint16(plen))
	icmp := pkt[ipv6HdrLen:]
	icmp[2], icmp[3] = 0, 0
	acc := csum.Pseudo(pkt[8:24], pkt[24:40], protoICMPv6, plen)
	binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(acc, icmp)))
}

// ICMPv6ChecksumOK reports whether the ICMPv6 checksum of an IPv6 packet
// (ICMPv6 right after the header, within the payload length) is right.
func ICMPv6ChecksumOK(pkt []byte) bool {
	if len(pkt) < ipv6HdrLen+4 || pkt[6] != protoICMPv6 {
		return false
	}
	end := ipv6HdrLen + int(binary.BigEndian.Uint16(pkt[4:6]))
	if end > len(pkt) || end < ipv6HdrLen+4 {
		return false
	}
	acc := csum.Pseudo(pkt[8:24], pkt[24:40], protoICMPv6, end-ipv6HdrLen)
	return csum.Fold(csum.Sum(acc, pkt[ipv6HdrLen:end])) == 0
}
