package ipoibhost

// The IPoIB link layer as a native host speaks it. It is written from
// RFC 4391 (MGIDs, ARP over IPoIB), RFC 4861 with RFC 4391 §9.1 (the
// 24-byte link-layer address option) and docs/architecture.md. It is
// independent of the shim's rewriters in arpndp and of ipoib's MGID
// helpers, so the interop tests check one implementation against the
// other instead of a shared mistake. Nothing here is on the data path:
// it runs for ARP and NDP messages only.

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/mdlayher/arp"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/ipoib"
)

// Ethertypes carried by IPoIB (RFC 4391 §6).
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd
)

// arpHwInfiniBand is the ARP hardware type of IPoIB (RFC 4391 §8).
const arpHwInfiniBand = 32

// groupMGID returns the MGID of an IP multicast group in partition pkey
// (RFC 4391 §4): ff1S:401b:PPPP::GGGG:GGGG with the low 28 bits of an
// IPv4 group, or ff1S:601b:PPPP followed by the low 80 bits of an IPv6
// group. The limited broadcast address maps to the broadcast group.
func groupMGID(group netip.Addr, pkey ipoib.PKey, scope uint8) ipoib.GID {
	var g ipoib.GID
	g[0], g[1] = 0xff, 0x10|scope
	binary.BigEndian.PutUint16(g[4:6], uint16(pkey)|0x8000)
	if group.Is4() || group.Is4In6() {
		g[2], g[3] = 0x40, 0x1b
		v := group.Unmap().As4()
		low := binary.BigEndian.Uint32(v[:]) & 0x0fffffff
		if v == [4]byte{255, 255, 255, 255} {
			low = 0xffffffff
		}
		binary.BigEndian.PutUint32(g[12:16], low)
		return g
	}
	g[2], g[3] = 0x60, 0x1b
	v := group.As16()
	copy(g[6:], v[6:])
	return g
}

// broadcastMGID is the partition's broadcast group, ff1S:401b:PPPP::ffff:ffff.
func broadcastMGID(pkey ipoib.PKey, scope uint8) ipoib.GID {
	return groupMGID(netip.AddrFrom4([4]byte{255, 255, 255, 255}), pkey, scope)
}

// solicitedNode returns the solicited-node multicast group of an IPv6
// address (RFC 4291 §2.7.1): ff02::1:ff and its low 24 bits.
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0: 0xff, 1: 0x02, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// errBadARP is an ARP packet that is no IPoIB ARP for IPv4.
var errBadARP = errors.New("ipoibhost: not an IPoIB ARP packet for IPv4 (hardware type 32, length 20)")

// encodeARP builds an IPoIB ARP packet: hardware type 32, 20-byte
// hardware addresses (RFC 4391 §8).
func encodeARP(op arp.Operation, sha ipoib.HwAddr, spa netip.Addr, tha ipoib.HwAddr, tpa netip.Addr) []byte {
	p := arp.Packet{
		HardwareType: arpHwInfiniBand, ProtocolType: etherIPv4,
		HardwareAddrLength: ipoib.HwAddrLen, IPLength: 4, Operation: op,
		SenderHardwareAddr: sha[:], SenderIP: spa, TargetHardwareAddr: tha[:], TargetIP: tpa,
	}
	b, _ := p.MarshalBinary() // fails for no field set here
	return b
}

// arpMessage is a decoded IPoIB ARP packet.
type arpMessage struct {
	op       arp.Operation
	sha, tha ipoib.HwAddr
	spa, tpa netip.Addr
}

// decodeARP parses an IPoIB ARP request or reply for IPv4.
func decodeARP(b []byte) (arpMessage, error) {
	var p arp.Packet
	if err := p.UnmarshalBinary(b); err != nil {
		return arpMessage{}, errBadARP
	}
	if p.HardwareType != arpHwInfiniBand || p.ProtocolType != etherIPv4 || p.HardwareAddrLength != ipoib.HwAddrLen ||
		p.IPLength != 4 || p.Operation != arp.OperationRequest && p.Operation != arp.OperationReply {
		return arpMessage{}, errBadARP
	}
	return arpMessage{op: p.Operation, sha: ipoib.HwAddr(p.SenderHardwareAddr), tha: ipoib.HwAddr(p.TargetHardwareAddr),
		spa: p.SenderIP, tpa: p.TargetIP}, nil
}

// ICMPv6 neighbour discovery (RFC 4861 §4).
const (
	icmpv6            = 58
	ndpRouterSolicit  = 133
	ndpRedirect       = 137
	ndpNeighborSolict = 135
	ndpNeighborAdvert = 136
	optSourceLL       = 1
	optTargetLL       = 2
	// optLLLen is the IPoIB link-layer address option: type, length 3
	// (24 bytes), two reserved bytes, the 20-byte address (RFC 4391 §9.1).
	optLLLen = 24
	// NA flags (RFC 4861 §4.4).
	naSolicited = 0x40
	naOverride  = 0x20
	ipv6HdrLen  = 40
	ndpHopLimit = 255
	ndpBodyLen  = 24 // type, code, checksum, flags/reserved, target
)

// ndpMessage is a decoded neighbour solicitation or advertisement.
type ndpMessage struct {
	typ      uint8
	flags    uint8 // NA flags
	src, dst netip.Addr
	target   netip.Addr
	ll       ipoib.HwAddr // the source (NS) or target (NA) link-layer option
	hasLL    bool
}

// errBadNDP is a malformed or unverifiable NS/NA.
var errBadNDP = errors.New("ipoibhost: malformed neighbour discovery message")

// isNDP reports whether an IPv6 packet is ICMPv6 neighbour discovery
// (RS, RA, NS, NA or redirect) with no extension header.
func isNDP(ip []byte) bool {
	return len(ip) > ipv6HdrLen && ip[6] == icmpv6 && ip[ipv6HdrLen] >= ndpRouterSolicit && ip[ipv6HdrLen] <= ndpRedirect
}

// decodeNDP parses an NS or NA in an IPv6 packet: hop limit 255, code 0,
// a good checksum, well-formed options, and a link-layer option, when
// present, of the IPoIB size.
func decodeNDP(ip []byte) (ndpMessage, error) {
	if len(ip) < ipv6HdrLen+ndpBodyLen || ip[0]>>4 != 6 || ip[6] != icmpv6 || ip[7] != ndpHopLimit {
		return ndpMessage{}, errBadNDP
	}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if ipv6HdrLen+plen > len(ip) || plen < ndpBodyLen {
		return ndpMessage{}, errBadNDP
	}
	icmp := ip[ipv6HdrLen : ipv6HdrLen+plen]
	if icmp[0] != ndpNeighborSolict && icmp[0] != ndpNeighborAdvert || icmp[1] != 0 ||
		csum.Fold(csum.Sum(csum.Pseudo(ip[8:24], ip[24:40], icmpv6, plen), icmp)) != 0 {
		return ndpMessage{}, errBadNDP
	}
	m := ndpMessage{typ: icmp[0], flags: icmp[4], src: netip.AddrFrom16([16]byte(ip[8:24])), dst: netip.AddrFrom16([16]byte(ip[24:40])),
		target: netip.AddrFrom16([16]byte(icmp[8:24]))}
	if m.target.IsMulticast() {
		return ndpMessage{}, errBadNDP
	}
	want := uint8(optSourceLL)
	if m.typ == ndpNeighborAdvert {
		want = optTargetLL
	}
	for opts := icmp[ndpBodyLen:]; len(opts) > 0; {
		if len(opts) < 8 || opts[1] == 0 || int(opts[1])*8 > len(opts) {
			return ndpMessage{}, errBadNDP
		}
		n := int(opts[1]) * 8
		if opts[0] == want {
			if n != optLLLen {
				return ndpMessage{}, errBadNDP // an Ethernet-sized option has no place on IPoIB
			}
			m.ll, m.hasLL = ipoib.HwAddr(opts[4:optLLLen]), true
		}
		opts = opts[n:]
	}
	return m, nil
}

// encodeNDP builds an IPv6 packet holding an NS (target, source
// link-layer option) or an NA (flags, target, target link-layer option)
// from src to dst with hop limit 255 and its checksum.
func encodeNDP(typ, flags uint8, src, dst, target netip.Addr, ll ipoib.HwAddr) []byte {
	plen := ndpBodyLen + optLLLen
	b := make([]byte, ipv6HdrLen+plen)
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:6], uint16(plen))
	b[6], b[7] = icmpv6, ndpHopLimit
	s, d, t := src.As16(), dst.As16(), target.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	icmp := b[ipv6HdrLen:]
	icmp[0] = typ
	if typ == ndpNeighborAdvert {
		icmp[4] = flags
	}
	copy(icmp[8:24], t[:])
	opt := icmp[ndpBodyLen:]
	opt[0], opt[1] = optSourceLL, optLLLen/8
	if typ == ndpNeighborAdvert {
		opt[0] = optTargetLL
	}
	copy(opt[4:], ll[:])
	binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(csum.Pseudo(s[:], d[:], icmpv6, plen), icmp)))
	return b
}
