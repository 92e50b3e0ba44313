package shim

import (
	"encoding/binary"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/header"
)

// Received frames go to the guests through the TAP queue their flow
// hashes to. A multi-queue TAP steers a flow's frames from the guests to
// the queue its last received frame was written on (the kernel's
// automatic flow steering, tun_automq_select_queue); writing all of a
// flow through one queue keeps its frames from the guests on that queue,
// read by one TX worker and so in order, and spreads flows over the
// workers.

// flowQueue returns the queue, of n, for frame f: by a hash of its
// addresses, protocol and ports (TCP and UDP, unfragmented), symmetric so
// that either direction gives the same queue; 0 for anything else.
func flowQueue(f ether.Frame, n int) int {
	if n == 1 {
		return 0
	}
	var src, dst, ports []byte
	var proto uint8
	switch pay := f.Payload(); f.EtherType() {
	case ether.TypeIPv4:
		ip, ok := header.ParseIPv4(pay)
		if !ok || ip.MoreFragments() || ip.FragmentOffset() != 0 {
			return 0
		}
		src, dst, proto, ports = ip.SrcBytes(), ip.DstBytes(), ip.Protocol(), ip[ip.HeaderLen():]
	case ether.TypeIPv6:
		ip, ok := header.ParseIPv6(pay)
		if !ok {
			return 0
		}
		src, dst, proto, ports = ip.SrcBytes(), ip.DstBytes(), ip.NextHeader(), ip[header.IPv6Len:]
	default:
		return 0
	}
	if proto != header.ProtoTCP && proto != header.ProtoUDP || len(ports) < 4 {
		return 0
	}
	a := endpointHash(src, ports[0:2])
	b := endpointHash(dst, ports[2:4])
	h := (a + b) ^ uint64(proto) // + is symmetric
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 32
	return int(h % uint64(n))
}

// endpointHash mixes an address and a port (FNV-1a).
func endpointHash(addr, port []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range addr {
		h = (h ^ uint64(b)) * 1099511628211
	}
	return (h ^ uint64(binary.BigEndian.Uint16(port))) * 1099511628211
}
