package header

import (
	"slices"
	"testing"
)

// swapped is ip (IPv6 when v6, else IPv4, parsed by FlowHash) with its
// source and destination addresses swapped, and its ports.
func swapped(ip []byte, v6 bool) []byte {
	b := slices.Clone(ip)
	src, dst, l4 := 12, 16, int(b[0]&0x0f)*4
	n := 4
	if v6 {
		src, dst, l4, n = 8, 24, IPv6Len, 16
	}
	for i := range n {
		b[src+i], b[dst+i] = b[dst+i], b[src+i]
	}
	b[l4], b[l4+1], b[l4+2], b[l4+3] = b[l4+2], b[l4+3], b[l4], b[l4+1]
	return b
}

// FuzzFlowHash: FlowHash never panics on any bytes; a packet it hashes
// hashes alike with its addresses and ports swapped (the other
// direction of the flow).
func FuzzFlowHash(f *testing.F) {
	udp4 := []byte{0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x27, 0x10, 0x14, 0x51, 0, 8, 0, 0}
	f.Add(udp4, false)
	tcp4opt := []byte{0x46, 0, 0, 44, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x94, 4, 0, 0, 0, 80, 0x1f, 0x90}
	f.Add(append(tcp4opt, make([]byte, 16)...), false)
	frag := slices.Clone(udp4)
	frag[6] = 0x20 // more fragments
	f.Add(frag, false)
	udp6 := make([]byte, IPv6Len+8)
	udp6[0], udp6[5], udp6[6], udp6[7] = 0x60, 8, ProtoUDP, 64
	udp6[8], udp6[23], udp6[24], udp6[39] = 0xfe, 1, 0xfe, 2
	copy(udp6[IPv6Len:], []byte{0x27, 0x10, 0x14, 0x51, 0, 8, 0, 0})
	f.Add(udp6, true)
	f.Add([]byte{}, true)
	f.Add([]byte{0x45}, false)
	f.Fuzz(func(t *testing.T, ip []byte, v6 bool) {
		h, ok := FlowHash(ip, v6)
		if !ok {
			return
		}
		if r, rok := FlowHash(swapped(ip, v6), v6); !rok || r != h {
			t.Fatalf("%x: hash %#x, swapped %#x (%v)", ip, h, r, rok)
		}
	})
}
