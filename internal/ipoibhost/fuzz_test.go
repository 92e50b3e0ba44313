package ipoibhost

import (
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"

	"github.com/eipoib/eipoibd/ipoib"
)

// The parsers of what the fabric and the kernel hand the host: none may
// panic, and what they accept must be consistent.

func FuzzDecodeARP(f *testing.F) {
	hw := ipoib.MakeHwAddr(0, 0x10203, ipoib.GID{0xfe, 0x80, 15: 1})
	f.Add(encodeARP(arp.OperationRequest, hw, netip.MustParseAddr("10.0.0.1"), ipoib.HwAddr{}, netip.MustParseAddr("10.0.0.2")))
	f.Add(encodeARP(arp.OperationReply, hw, netip.MustParseAddr("10.0.0.2"), hw, netip.MustParseAddr("10.0.0.1")))
	f.Add([]byte{0, 1, 8, 0, 6, 4, 0, 1, 1, 2, 3, 4, 5, 6, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeARP(b)
		if err != nil {
			return
		}
		if !m.spa.Is4() || !m.tpa.Is4() {
			t.Fatalf("accepted ARP with addresses %s, %s", m.spa, m.tpa)
		}
		again := encodeARP(m.op, m.sha, m.spa, m.tha, m.tpa)
		if string(again) != string(b[:len(again)]) {
			t.Fatalf("re-encoded % x, was % x", again, b)
		}
	})
}

func FuzzDecodeNDP(f *testing.F) {
	ll := ipoib.MakeHwAddr(0, 0xabcdef, ipoib.GID{0xfe, 0x80, 15: 2})
	src, target := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	f.Add(encodeNDP(ndpNeighborSolict, 0, src, solicitedNode(target), target, ll))
	f.Add(encodeNDP(ndpNeighborAdvert, naOverride, target, allNodes, target, ll))
	f.Fuzz(func(t *testing.T, b []byte) {
		isNDP(b)
		m, err := decodeNDP(b)
		if err != nil {
			return
		}
		if m.typ != ndpNeighborSolict && m.typ != ndpNeighborAdvert || m.target.IsMulticast() {
			t.Fatalf("accepted %+v", m)
		}
	})
}

func FuzzParseIGMP(f *testing.F) {
	f.Add([]byte("Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n1\tlo        :     1      V3\n\t\t\t\t010000E0     1 0:00000000\t\t0\n3\tib0       :     2      V3\n\t\t\t\t030201EF     1 0:00000000\t\t0\n"), "ib0")
	f.Fuzz(func(t *testing.T, b []byte, dev string) {
		gs, err := parseIGMP(b, dev)
		for _, g := range gs {
			if err == nil && !g.Is4() {
				t.Fatalf("group %s", g)
			}
		}
	})
}

func FuzzParseIGMP6(f *testing.F) {
	f.Add([]byte("1    lo              ff020000000000000000000000000001     1 0000000C 0\n3    ib0             ff020000000000000000000001ff000201     1 00000004 0\n"), "ib0")
	f.Fuzz(func(t *testing.T, b []byte, dev string) {
		gs, err := parseIGMP6(b, dev)
		for _, g := range gs {
			if err == nil && !g.Is6() {
				t.Fatalf("group %s", g)
			}
		}
	})
}
