// Package ipoib holds the IPoIB link layer of RFC 4391/4392: the 20-byte
// hardware address, the 4-byte encapsulation header, P_Key rules, multicast
// GIDs and MTUs, and the batch-shaped fabric Port interface that the shim
// drives. Backends (the simulated UD fabric, the in-memory fabric) live in
// sub-packages; the shim never knows which one it drives.
package ipoib

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
)

// GID is a 16-byte InfiniBand global identifier. An MGID is a GID too.
type GID [16]byte

// String formats the GID as an IPv6 address, the usual notation.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// LogValue logs the GID as its String in every log format (a JSON log
// would otherwise show the 16 bytes as an array of numbers).
func (g GID) LogValue() slog.Value { return slog.StringValue(g.String()) }

// IsMulticast reports whether g is an MGID (first byte 0xff).
func (g GID) IsMulticast() bool { return g[0] == 0xff }

// Addr returns the GID as an IPv6 address.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g) }

// HwAddrLen is the length of an IPoIB hardware address (RFC 4391 §9.1).
const HwAddrLen = 20

// Flag bits of the first byte of an HwAddr.
const (
	// FlagConnected says the endpoint supports IPoIB connected mode (0x80).
	// The UD-only shim never sets it.
	FlagConnected = 0x80
)

// MulticastQPN is the destination QPN of every multicast packet.
const MulticastQPN = 0xFFFFFF

// MaxQPN is the largest 24-bit QPN.
const MaxQPN = 0xFFFFFF

// HwAddr is the 20-byte IPoIB hardware address: 1 byte of flags (reserved
// bits), a 24-bit QPN and the 16-byte port GID (RFC 4391 §9.1). It is
// comparable and usable as a map key.
type HwAddr [HwAddrLen]byte

// MakeHwAddr builds an address from flags, a 24-bit QPN and a GID.
func MakeHwAddr(flags byte, qpn uint32, gid GID) HwAddr {
	var a HwAddr
	a[0] = flags
	a[1], a[2], a[3] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	copy(a[4:], gid[:])
	return a
}

// Flags returns the first byte.
func (a HwAddr) Flags() byte { return a[0] }

// QPN returns the 24-bit queue pair number.
func (a HwAddr) QPN() uint32 { return uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) }

// GID returns the port GID.
func (a HwAddr) GID() GID { return GID(a[4:20]) }

// IsZero reports whether every byte is zero.
func (a HwAddr) IsZero() bool { return a == HwAddr{} }

// WithoutFlags returns a with the flags byte cleared: the identity of the
// endpoint (QPN + GID) regardless of its connected-mode capability.
func (a HwAddr) WithoutFlags() HwAddr { a[0] = 0; return a }

// String formats the address as 20 colon-separated hex bytes, as ip(8)
// prints an IPoIB link address.
func (a HwAddr) String() string {
	var b [HwAddrLen*3 - 1]byte
	for i, c := range a {
		if i > 0 {
			b[i*3-1] = ':'
		}
		hex.Encode(b[i*3:i*3+2], []byte{c})
	}
	return string(b[:])
}

// LogValue logs the address as its String in every log format (a JSON
// log would otherwise show the 20 bytes as an array of numbers).
func (a HwAddr) LogValue() slog.Value { return slog.StringValue(a.String()) }

// ErrBadHwAddr is returned for text that is not a 20-byte IPoIB address.
var ErrBadHwAddr = errors.New("ipoib: not a 20-byte IPoIB hardware address")

// ParseHwAddr parses 20 colon- (or dash-) separated hex bytes.
func ParseHwAddr(s string) (HwAddr, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != HwAddrLen {
		return HwAddr{}, fmt.Errorf("%w: %q", ErrBadHwAddr, s)
	}
	return HwAddr(hw), nil
}

// HeaderLen is the length of the IPoIB encapsulation header (RFC 4391 §6):
// a 16-bit ethertype and 16 reserved bits that must be zero.
const HeaderLen = 4

// Header is a zero-copy view of the IPoIB encapsulation header.
type Header []byte

// IsValid reports whether h holds a full header with zero reserved bits.
func (h Header) IsValid() bool {
	return len(h) >= HeaderLen && h[2] == 0 && h[3] == 0
}

// EtherType returns the encapsulated protocol.
func (h Header) EtherType() uint16 { return binary.BigEndian.Uint16(h[0:2]) }

// PutHeader writes the IPoIB header for etherType into the first 4 bytes of b.
func PutHeader(b []byte, etherType uint16) {
	binary.BigEndian.PutUint16(b[0:2], etherType)
	b[2], b[3] = 0, 0
}

// MTUs of the IPoIB UD link: the IB MTU less the 4-byte header (RFC 4391 §7).
const (
	MTU2044 = 2044 // IB MTU 2048
	MTU4092 = 4092 // IB MTU 4096
)

// IPMTU returns the IPoIB UD MTU for an IB MTU (2048 → 2044, 4096 → 4092),
// or an error for an IB MTU the fabric does not support.
func IPMTU(ibMTU int) (int, error) {
	switch ibMTU {
	case 2048, 4096:
		return ibMTU - HeaderLen, nil
	}
	return 0, fmt.Errorf("ipoib: IB MTU %d not supported (want 2048 or 4096)", ibMTU)
}

// QKey is the well-known IPoIB Q_Key (RFC 4391 §4).
const QKey = 0x00000B1B
