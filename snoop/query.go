package snoop

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/internal/csum"
)

// Well-known groups.
var (
	AllNodes = netip.MustParseAddr("ff02::1")   // where MLD general queries go
	AllHosts = netip.MustParseAddr("224.0.0.1") // where IGMP general queries go
)

// Query lengths: the IPv6/IPv4 packets the Append functions build.
const (
	MLDv2QueryLen  = 40 + 8 + 28
	IGMPv3QueryLen = 24 + 12
)

// AppendMLDv2Query appends an MLDv2 query (RFC 3810 §5.1) from the
// link-local address src: a general query when group is invalid (to
// ff02::1), else a multicast-address-specific query (to the group). It
// has a router alert hop-by-hop header and hop limit 1 and asks for
// answers within maxResp (up to 32 s).
func AppendMLDv2Query(b []byte, src, group netip.Addr, robustness uint8, interval time.Duration, maxResp time.Duration) []byte {
	dst, field := AllNodes, netip.IPv6Unspecified()
	if group.IsValid() {
		dst, field = group, group
	}
	s, d, f := src.As16(), dst.As16(), field.As16()
	b = append(b, 0x60, 0, 0, 0, 0, 8+28, 0, 1) // version, payload length, hop-by-hop, hop limit 1
	b = append(b, s[:]...)
	b = append(b, d[:]...)
	b = append(b, 58, 0, 5, 2, 0, 0, 1, 0) // next ICMPv6; router alert (MLD); PadN
	icmp := len(b)
	b = append(b, 130, 0, 0, 0) // multicast listener query
	b = binary.BigEndian.AppendUint16(b, uint16(min(maxResp.Milliseconds(), 32767)))
	b = append(b, 0, 0)
	b = append(b, f[:]...)
	b = append(b, robustness&7, qqic(interval), 0, 0) // S=0, QRV, QQIC, no sources
	sum := csum.Fold(csum.Sum(csum.Pseudo(s[:], d[:], 58, len(b)-icmp), b[icmp:]))
	binary.BigEndian.PutUint16(b[icmp+2:], sum)
	return b
}

// AppendIGMPv3Query appends an IGMPv3 query (RFC 3376 §4.1) from
// 0.0.0.0, as a snooping switch's querier sends it. It is a general
// query to 224.0.0.1 when group is invalid, else a group-specific query
// to the group. It has a router alert option and TTL 1.
func AppendIGMPv3Query(b []byte, group netip.Addr, robustness uint8, interval time.Duration, maxResp time.Duration) []byte {
	dst, field := AllHosts, netip.IPv4Unspecified()
	if group.IsValid() {
		dst, field = group, group
	}
	ip := len(b)
	d, f := dst.As4(), field.As4()
	b = append(b, 0x46, 0xc0, 0, IGMPv3QueryLen, 0, 0, 0, 0, 1, 2, 0, 0) // IHL 6, CS6, length; TTL 1, IGMP
	b = append(b, 0, 0, 0, 0)                                            // source 0.0.0.0
	b = append(b, d[:]...)
	b = append(b, 0x94, 0x04, 0, 0) // router alert
	csum.IPv4Header(b[ip : ip+24])
	igmp := len(b)
	b = append(b, igmpQuery, maxRespCode(maxResp), 0, 0)
	b = append(b, f[:]...)
	b = append(b, robustness&7, qqic(interval), 0, 0)
	binary.BigEndian.PutUint16(b[igmp+2:], csum.Fold(csum.Sum(0, b[igmp:])))
	return b
}

// qqic encodes a query interval in seconds (RFC 3376 §4.1.7): exact below
// 128 s, the floating-point form above.
func qqic(d time.Duration) uint8 {
	s := int(d / time.Second)
	if s < 128 {
		return uint8(max(s, 1))
	}
	for exp := 0; exp < 8; exp++ {
		if mant := s>>(exp+3) - 16; mant < 16 {
			return 0x80 | uint8(exp)<<4 | uint8(mant)
		}
	}
	return 0xff
}

// maxRespCode encodes an IGMPv3 maximum response time in tenths of a
// second, up to 12.7 s exactly.
func maxRespCode(d time.Duration) uint8 {
	return uint8(min(max(d/(100*time.Millisecond), 1), 127))
}
