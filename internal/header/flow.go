package header

import "encoding/binary"

// FlowHash hashes the flow of IP packet ip (IPv6 when v6, else IPv4):
// its addresses, protocol and, for TCP and UDP not fragmented, ports;
// symmetric, so that both directions of a flow hash alike. ok is false
// for a packet that does not parse or is neither TCP nor UDP, and for a
// fragment, which has no ports to hash (each caller picks its own
// default for those).
func FlowHash(ip []byte, v6 bool) (h uint64, ok bool) {
	var src, dst, ports []byte
	var proto uint8
	if v6 {
		p, ok := ParseIPv6(ip)
		if !ok {
			return 0, false
		}
		src, dst, proto, ports = p.SrcBytes(), p.DstBytes(), p.NextHeader(), p[IPv6Len:]
	} else {
		p, ok := ParseIPv4(ip)
		if !ok || p.MoreFragments() || p.FragmentOffset() != 0 {
			return 0, false
		}
		src, dst, proto, ports = p.SrcBytes(), p.DstBytes(), p.Protocol(), p[p.HeaderLen():]
	}
	if proto != ProtoTCP && proto != ProtoUDP || len(ports) < 4 {
		return 0, false
	}
	a := endpointHash(src, ports[0:2])
	b := endpointHash(dst, ports[2:4])
	h = (a + b) ^ uint64(proto) // + is symmetric
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 32
	return h, true
}

// endpointHash mixes an address and a port (FNV-1a).
func endpointHash(addr, port []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range addr {
		h = (h ^ uint64(b)) * 1099511628211
	}
	return (h ^ uint64(binary.BigEndian.Uint16(port))) * 1099511628211
}
