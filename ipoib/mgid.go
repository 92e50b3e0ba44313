package ipoib

import (
	"encoding/binary"
	"net/netip"

	"github.com/eipoib/eipoibd/ether"
)

// MGID signatures (RFC 4391 §4).
const (
	SignatureIPv4 = 0x401B
	SignatureIPv6 = 0x601B
)

// Scopes of an IPoIB MGID (RFC 4391 §4, the IPv6 scope values).
const (
	ScopeLinkLocal = 0x2 // the default
	ScopeSiteLocal = 0x5
	ScopeOrgLocal  = 0x8
	ScopeGlobal    = 0xE
)

func mgidPrefix(sig uint16, pkey PKey, scope uint8) GID {
	var g GID
	g[0] = 0xff
	g[1] = 0x10 | scope&0x0f // flags: T=1 (transient)
	binary.BigEndian.PutUint16(g[2:4], sig)
	binary.BigEndian.PutUint16(g[4:6], uint16(pkey.Full()))
	return g
}

// BroadcastMGID returns the partition's broadcast group
// ff1S:401b:PPPP::ffff:ffff (RFC 4391 §4). IPv4 broadcasts (limited and
// subnet-directed) go there.
func BroadcastMGID(pkey PKey, scope uint8) GID {
	g := mgidPrefix(SignatureIPv4, pkey, scope)
	binary.BigEndian.PutUint32(g[12:16], 0xffffffff)
	return g
}

// IPv4MGID returns ff1S:401b:PPPP:0:0:0:GGGG:GGGG, GGGG:GGGG the low 28 bits
// of the IPv4 group (RFC 4391 §4). group must be IPv4 (or 4-in-6). The
// limited broadcast 255.255.255.255 maps to the broadcast group.
func IPv4MGID(group netip.Addr, pkey PKey, scope uint8) GID {
	b := group.Unmap().As4()
	v := binary.BigEndian.Uint32(b[:])
	if v == 0xffffffff {
		return BroadcastMGID(pkey, scope)
	}
	g := mgidPrefix(SignatureIPv4, pkey, scope)
	binary.BigEndian.PutUint32(g[12:16], v&0x0fffffff)
	return g
}

// IPv6MGID returns ff1S:601b:PPPP: followed by the low 80 bits of the IPv6
// group (RFC 4391 §4). The scope comes from the port's broadcast group, as
// Linux's ipv6_ib_mc_map does, not from the group address.
func IPv6MGID(group netip.Addr, pkey PKey, scope uint8) GID {
	b := group.As16()
	g := mgidPrefix(SignatureIPv6, pkey, scope)
	copy(g[6:16], b[6:16])
	return g
}

// MGIDPKey returns the P_Key embedded in an IPoIB MGID.
func MGIDPKey(g GID) PKey { return PKey(binary.BigEndian.Uint16(g[4:6])) }

// MGIDToMAC maps an IPoIB MGID back to the Ethernet multicast MAC that
// guests expect. The broadcast group maps to ff:ff:ff:ff:ff:ff. An IPv4
// group maps to 01:00:5e plus the low 23 bits of the group (RFC 1112
// §6.4), an IPv6 group to 33:33 plus the low 32 bits (RFC 2464 §7). ok
// is false for a GID that is not an IPoIB MGID.
func MGIDToMAC(g GID) (mac ether.MAC, ok bool) {
	if g[0] != 0xff || g[1]&0xf0 != 0x10 {
		return mac, false
	}
	switch binary.BigEndian.Uint16(g[2:4]) {
	case SignatureIPv4:
		for _, b := range g[6:12] {
			if b != 0 {
				return mac, false
			}
		}
		v := binary.BigEndian.Uint32(g[12:16])
		if v == 0xffffffff {
			return ether.Broadcast, true
		}
		if v > 0x0fffffff {
			return mac, false
		}
		return ether.MAC{0x01, 0x00, 0x5e, byte(v>>16) & 0x7f, byte(v >> 8), byte(v)}, true
	case SignatureIPv6:
		return ether.MAC{0x33, 0x33, g[12], g[13], g[14], g[15]}, true
	}
	return mac, false
}
