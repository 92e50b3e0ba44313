// Package ether holds the Ethernet pieces shared by the eipoibd
// packages: the 6-byte MAC type, ethertypes and a zero-copy view of
// Ethernet and 802.1Q headers. It exists so that arpndp, mactrans and
// the shim agree on one MAC type without depending on each other. It is
// public because their exported functions take and return its MAC: code
// outside the module that uses them must be able to name it.
package ether

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
)

// MAC is an Ethernet hardware address. It is comparable and usable as a map
// key without allocation.
type MAC [6]byte

// Broadcast is ff:ff:ff:ff:ff:ff.
var Broadcast = MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// String formats the MAC as lower-case colon-hex.
func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// LogValue logs the MAC as its String, so that a JSON log shows
// "02:00:00:00:00:01" as the text log does, not an array of numbers.
func (m MAC) LogValue() slog.Value { return slog.StringValue(m.String()) }

// IsZero reports whether m is 00:00:00:00:00:00.
func (m MAC) IsZero() bool { return m == MAC{} }

// IsMulticast reports whether the group bit is set (this includes broadcast).
func (m MAC) IsMulticast() bool { return m[0]&0x01 != 0 }

// IsBroadcast reports whether m is ff:ff:ff:ff:ff:ff.
func (m MAC) IsBroadcast() bool { return m == Broadcast }

// ParseMAC parses a 6-byte colon-hex MAC.
func ParseMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return MAC{}, fmt.Errorf("ether: %w", err)
	}
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("ether: %q is not a 6-byte MAC", s)
	}
	return MAC(hw), nil
}

// Ethertypes that cross IPoIB (RFC 4391 carries only these) and the 802.1Q TPID.
const (
	TypeIPv4 = 0x0800
	TypeARP  = 0x0806
	TypeRARP = 0x8035
	TypeIPv6 = 0x86DD
	TypeVLAN = 0x8100
)

// Header lengths.
const (
	HeaderLen     = 14 // dst, src, ethertype
	VLANHeaderLen = 18 // dst, src, 0x8100, TCI, ethertype
	MinFrameLen   = 60 // without FCS; shorter frames are padded
)

// Frame is a zero-copy view of an Ethernet frame, optionally 802.1Q tagged.
type Frame []byte

// IsValid reports whether the frame holds a complete (possibly tagged) header.
func (f Frame) IsValid() bool {
	if len(f) < HeaderLen {
		return false
	}
	return !f.Tagged() || len(f) >= VLANHeaderLen
}

// Dst returns the destination MAC. The frame must be valid.
func (f Frame) Dst() MAC { return MAC(f[0:6]) }

// Src returns the source MAC. The frame must be valid.
func (f Frame) Src() MAC { return MAC(f[6:12]) }

// Tagged reports whether the frame carries an 802.1Q tag.
func (f Frame) Tagged() bool { return binary.BigEndian.Uint16(f[12:14]) == TypeVLAN }

// VLAN returns the 12-bit VLAN ID, 0 for untagged frames.
func (f Frame) VLAN() uint16 {
	if !f.Tagged() {
		return 0
	}
	return binary.BigEndian.Uint16(f[14:16]) & 0x0fff
}

// HeaderLen returns 14 or 18.
func (f Frame) HeaderLen() int {
	if f.Tagged() {
		return VLANHeaderLen
	}
	return HeaderLen
}

// EtherType returns the (inner) ethertype.
func (f Frame) EtherType() uint16 {
	return binary.BigEndian.Uint16(f[f.HeaderLen()-2:])
}

// Payload returns the bytes after the header.
func (f Frame) Payload() []byte { return f[f.HeaderLen():] }

// PutHeader writes an Ethernet header at the start of b, with an 802.1Q tag
// when vlan is non-zero, and returns its length. b must hold 18 bytes when
// tagged, 14 otherwise.
func PutHeader(b []byte, dst, src MAC, vlan uint16, etherType uint16) int {
	copy(b[0:6], dst[:])
	copy(b[6:12], src[:])
	if vlan == 0 {
		binary.BigEndian.PutUint16(b[12:14], etherType)
		return HeaderLen
	}
	binary.BigEndian.PutUint16(b[12:14], TypeVLAN)
	binary.BigEndian.PutUint16(b[14:16], vlan&0x0fff)
	binary.BigEndian.PutUint16(b[16:18], etherType)
	return VLANHeaderLen
}
