// Package header has zero-copy views of the IPv4 and IPv6 headers, in
// the style of gVisor's header package. A view is the packet's own
// []byte with accessors at fixed offsets, so the hot path reads and
// writes headers in place without parsing them into structs or
// allocating. Parse functions check a header against the bytes that
// carry it before any accessor is used; accessors trust a parsed view.
package header

import (
	"encoding/binary"
	"net/netip"

	"github.com/eipoib/eipoibd/internal/csum"
)

// IP protocol numbers the shim looks at.
const (
	ProtoICMP   = 1
	ProtoIGMP   = 2
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// IPv4 offsets and sizes (RFC 791 §3.1).
const (
	IPv4MinLen     = 20
	IPv4MaxLen     = 60
	ipv4TotalLen   = 2
	ipv4ID         = 4
	ipv4FlagsFrag  = 6
	ipv4TTL        = 8
	ipv4Protocol   = 9
	ipv4Checksum   = 10
	ipv4Src        = 12
	ipv4Dst        = 16
	ipv4FlagDF     = 0x4000
	ipv4FlagMF     = 0x2000
	ipv4OffsetMask = 0x1fff
)

// IPv4 option types with a fixed length of one byte (RFC 791 §3.1).
const (
	IPv4OptEOL = 0
	IPv4OptNOP = 1
	// ipv4OptCopied is the option type's copied flag: the option goes
	// into every fragment, not only the first.
	ipv4OptCopied = 0x80
)

// IPv4 is a view of an IPv4 packet, header first.
type IPv4 []byte

// ParseIPv4 checks that b starts with a well-formed IPv4 header whose
// total length fits b, and returns the packet without link-layer padding.
func ParseIPv4(b []byte) (IPv4, bool) {
	if len(b) < IPv4MinLen || b[0]>>4 != 4 {
		return nil, false
	}
	h := IPv4(b)
	hl, tl := h.HeaderLen(), h.TotalLen()
	if hl < IPv4MinLen || tl < hl || tl > len(b) {
		return nil, false
	}
	return h[:tl], true
}

// HeaderLen is the header length in bytes (IHL × 4).
func (h IPv4) HeaderLen() int { return int(h[0]&0x0f) * 4 }

// TotalLen is the packet length the header states.
func (h IPv4) TotalLen() int { return int(binary.BigEndian.Uint16(h[ipv4TotalLen:])) }

// SetTotalLen sets the total length.
func (h IPv4) SetTotalLen(n int) { binary.BigEndian.PutUint16(h[ipv4TotalLen:], uint16(n)) }

// ID is the identification field.
func (h IPv4) ID() uint16 { return binary.BigEndian.Uint16(h[ipv4ID:]) }

// DontFragment reports the DF flag.
func (h IPv4) DontFragment() bool {
	return binary.BigEndian.Uint16(h[ipv4FlagsFrag:])&ipv4FlagDF != 0
}

// MoreFragments reports the MF flag.
func (h IPv4) MoreFragments() bool {
	return binary.BigEndian.Uint16(h[ipv4FlagsFrag:])&ipv4FlagMF != 0
}

// FragmentOffset is the fragment offset in bytes.
func (h IPv4) FragmentOffset() int {
	return int(binary.BigEndian.Uint16(h[ipv4FlagsFrag:])&ipv4OffsetMask) * 8
}

// SetFragment sets the fragment offset (bytes, a multiple of 8) and the MF
// flag, keeping DF and the reserved bit.
func (h IPv4) SetFragment(offset int, more bool) {
	v := binary.BigEndian.Uint16(h[ipv4FlagsFrag:])&^(ipv4FlagMF|ipv4OffsetMask) | uint16(offset/8)&ipv4OffsetMask
	if more {
		v |= ipv4FlagMF
	}
	binary.BigEndian.PutUint16(h[ipv4FlagsFrag:], v)
}

// Protocol is the payload's IP protocol number.
func (h IPv4) Protocol() uint8 { return h[ipv4Protocol] }

// Src is the source address.
func (h IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(h[ipv4Src : ipv4Src+4])) }

// Dst is the destination address.
func (h IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(h[ipv4Dst : ipv4Dst+4])) }

// Options are the header's options (and their padding).
func (h IPv4) Options() []byte { return h[IPv4MinLen:h.HeaderLen()] }

// Payload is what follows the header, up to the total length.
func (h IPv4) Payload() []byte { return h[h.HeaderLen():h.TotalLen()] }

// SetChecksum computes the header checksum.
func (h IPv4) SetChecksum() { csum.IPv4Header(h[:h.HeaderLen()]) }

// IPv4Fields are the fields EncodeIPv4 writes; the rest are zero.
type IPv4Fields struct {
	TotalLen int
	TTL      uint8
	Protocol uint8
	Src, Dst netip.Addr
}

// EncodeIPv4 writes a 20-byte header without options into b and returns
// it as a view; the checksum is computed.
func EncodeIPv4(b []byte, f IPv4Fields) IPv4 {
	h := IPv4(b[:IPv4MinLen])
	clear(h)
	h[0] = 0x45
	h.SetTotalLen(f.TotalLen)
	h[ipv4TTL], h[ipv4Protocol] = f.TTL, f.Protocol
	s, d := f.Src.As4(), f.Dst.As4()
	copy(h[ipv4Src:], s[:])
	copy(h[ipv4Dst:], d[:])
	h.SetChecksum()
	return IPv4(b)
}

// CopiedOptions writes into dst the options of h that RFC 791 §3.2 copies
// into every fragment (copied flag set), padded with end-of-options to a
// multiple of 4, and returns their length. dst needs room for the
// options (at most 40 bytes). Options that are not copied, NOPs included,
// are left out; a malformed option list ends the copy where it breaks.
func (h IPv4) CopiedOptions(dst []byte) int {
	opts := h.Options()
	n := 0
	for i := 0; i < len(opts); {
		t := opts[i]
		if t == IPv4OptEOL {
			break
		}
		if t == IPv4OptNOP {
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			break
		}
		l := int(opts[i+1])
		if t&ipv4OptCopied != 0 {
			n += copy(dst[n:], opts[i:i+l])
		}
		i += l
	}
	for n%4 != 0 {
		dst[n] = IPv4OptEOL
		n++
	}
	return n
}

// IPv6 offsets and sizes (RFC 8200 §3).
const (
	IPv6Len        = 40
	ipv6PayloadLen = 4
	ipv6NextHeader = 6
	ipv6HopLimit   = 7
	ipv6Src        = 8
	ipv6Dst        = 24
)

// IPv6 is a view of an IPv6 packet, fixed header first.
type IPv6 []byte

// ParseIPv6 checks that b starts with an IPv6 header whose payload length
// fits b, and returns the packet without link-layer padding.
func ParseIPv6(b []byte) (IPv6, bool) {
	if len(b) < IPv6Len || b[0]>>4 != 6 {
		return nil, false
	}
	h := IPv6(b)
	tl := IPv6Len + h.PayloadLen()
	if tl > len(b) {
		return nil, false
	}
	return h[:tl], true
}

// PayloadLen is the payload length the header states.
func (h IPv6) PayloadLen() int { return int(binary.BigEndian.Uint16(h[ipv6PayloadLen:])) }

// SetPayloadLen sets the payload length.
func (h IPv6) SetPayloadLen(n int) { binary.BigEndian.PutUint16(h[ipv6PayloadLen:], uint16(n)) }

// NextHeader is the protocol number of what follows the fixed header.
func (h IPv6) NextHeader() uint8 { return h[ipv6NextHeader] }

// HopLimit is the hop limit.
func (h IPv6) HopLimit() uint8 { return h[ipv6HopLimit] }

// Src is the source address.
func (h IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(h[ipv6Src : ipv6Src+16])) }

// Dst is the destination address.
func (h IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(h[ipv6Dst : ipv6Dst+16])) }

// SrcBytes is the source address as bytes, for checksums.
func (h IPv6) SrcBytes() []byte { return h[ipv6Src : ipv6Src+16] }

// DstBytes is the destination address as bytes, for checksums.
func (h IPv6) DstBytes() []byte { return h[ipv6Dst : ipv6Dst+16] }

// Payload is what follows the fixed header, up to the payload length.
func (h IPv6) Payload() []byte { return h[IPv6Len : IPv6Len+h.PayloadLen()] }

// IPv6Fields are the fields EncodeIPv6 writes; traffic class and flow
// label are zero.
type IPv6Fields struct {
	PayloadLen int
	NextHeader uint8
	HopLimit   uint8
	Src, Dst   netip.Addr
}

// EncodeIPv6 writes a fixed header into b and returns it as a view.
func EncodeIPv6(b []byte, f IPv6Fields) IPv6 {
	h := IPv6(b[:IPv6Len])
	clear(h)
	h[0] = 0x60
	h.SetPayloadLen(f.PayloadLen)
	h[ipv6NextHeader], h[ipv6HopLimit] = f.NextHeader, f.HopLimit
	s, d := f.Src.As16(), f.Dst.As16()
	copy(h[ipv6Src:], s[:])
	copy(h[ipv6Dst:], d[:])
	return IPv6(b)
}

// TCP offsets, sizes and flags (RFC 9293 §3.1).
const (
	TCPMinLen      = 20
	tcpSeq         = 4
	tcpDataOff     = 12
	tcpFlags       = 13
	TCPChecksumOff = 16 // where the checksum sits in the header
	ProtoTCP       = 6

	TCPFlagFIN = 0x01
	TCPFlagSYN = 0x02
	TCPFlagRST = 0x04
	TCPFlagPSH = 0x08
	TCPFlagACK = 0x10
	TCPFlagURG = 0x20
	TCPFlagECE = 0x40
	TCPFlagCWR = 0x80
)

// TCP is a view of a TCP segment, header first.
type TCP []byte

// ParseTCP checks that b starts with a TCP header whose data offset fits
// b.
func ParseTCP(b []byte) (TCP, bool) {
	if len(b) < TCPMinLen {
		return nil, false
	}
	h := TCP(b)
	if hl := h.HeaderLen(); hl < TCPMinLen || hl > len(b) {
		return nil, false
	}
	return h, true
}

// HeaderLen is the header length in bytes (data offset × 4).
func (h TCP) HeaderLen() int { return int(h[tcpDataOff]>>4) * 4 }

// Seq is the sequence number.
func (h TCP) Seq() uint32 { return binary.BigEndian.Uint32(h[tcpSeq:]) }

// SetSeq sets the sequence number.
func (h TCP) SetSeq(v uint32) { binary.BigEndian.PutUint32(h[tcpSeq:], v) }

// Flags are the control bits.
func (h TCP) Flags() uint8 { return h[tcpFlags] }

// SetFlags sets the control bits.
func (h TCP) SetFlags(f uint8) { h[tcpFlags] = f }

// SetChecksum stores a checksum.
func (h TCP) SetChecksum(v uint16) { binary.BigEndian.PutUint16(h[TCPChecksumOff:], v) }

// SetID sets the IPv4 identification field.
func (h IPv4) SetID(id uint16) { binary.BigEndian.PutUint16(h[ipv4ID:], id) }

// SrcBytes is the source address as bytes, for checksums.
func (h IPv4) SrcBytes() []byte { return h[ipv4Src : ipv4Src+4] }

// DstBytes is the destination address as bytes, for checksums.
func (h IPv4) DstBytes() []byte { return h[ipv4Dst : ipv4Dst+4] }
