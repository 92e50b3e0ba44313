package ipoibhost

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestGroupMGID checks the MGIDs against RFC 4391 §4's text, and
// against the ipoib package the shim uses: two implementations written
// apart must agree.
func TestGroupMGID(t *testing.T) {
	for _, c := range []struct {
		group string
		pkey  ipoib.PKey
		want  string
	}{
		{"255.255.255.255", 0xffff, "ff12:401b:ffff::ffff:ffff"},
		{"224.0.0.1", 0xffff, "ff12:401b:ffff::1"},
		{"239.129.2.3", 0x000a, "ff12:401b:800a::f81:203"}, // low 28 bits; full-membership bit set
		{"ff02::1", 0xffff, "ff12:601b:ffff::1"},
		{"ff02::1:ff00:1234", 0x8001, "ff12:601b:8001::1:ff00:1234"},
		{"ff15::1:7", 0xffff, "ff12:601b:ffff::1:7"}, // scope from the port, not the group
	} {
		g := netip.MustParseAddr(c.group)
		got := groupMGID(g, c.pkey, ipoib.ScopeLinkLocal)
		if got.String() != c.want {
			t.Errorf("MGID of %s in %s: %s, want %s", c.group, c.pkey, got, c.want)
		}
		lib := ipoib.IPv6MGID(g, c.pkey, ipoib.ScopeLinkLocal)
		if g.Is4() {
			lib = ipoib.IPv4MGID(g, c.pkey, ipoib.ScopeLinkLocal)
		}
		if lib != got {
			t.Errorf("MGID of %s: ipoib says %s, this package %s", c.group, lib, got)
		}
	}
	if got := broadcastMGID(0x7fff, ipoib.ScopeSiteLocal); got.String() != "ff15:401b:ffff::ffff:ffff" {
		t.Errorf("site-local broadcast MGID %s", got)
	}
}

func TestARP(t *testing.T) {
	sha := ipoib.MakeHwAddr(0, 0x123456, ipoib.GID{0xfe, 0x80, 15: 1})
	spa, tpa := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	b := encodeARP(arp.OperationRequest, sha, spa, ipoib.HwAddr{}, tpa)
	if len(b) != 8+2*(20+4) || b[1] != 32 || b[4] != 20 {
		t.Fatalf("IPoIB ARP % x: want 56 bytes, hardware type 32, length 20", b)
	}
	m, err := decodeARP(b)
	if err != nil || m.op != arp.OperationRequest || m.sha != sha || m.spa != spa || m.tpa != tpa || !m.tha.IsZero() {
		t.Fatalf("decode: %+v, %v", m, err)
	}
	eth := []byte{0, 1, 8, 0, 6, 4, 0, 1, 1, 2, 3, 4, 5, 6, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2}
	for name, bad := range map[string][]byte{"ethernet": eth, "truncated": b[:40], "op 3": append(append([]byte{}, b[:7]...), append([]byte{3}, b[8:]...)...)} {
		if _, err := decodeARP(bad); err == nil {
			t.Errorf("%s ARP accepted", name)
		}
	}
}

func TestNDP(t *testing.T) {
	ll := ipoib.MakeHwAddr(0, 0xabcdef, ipoib.GID{0xfe, 0x80, 15: 2})
	src, target := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	ns := encodeNDP(ndpNeighborSolict, 0, src, solicitedNode(target), target, ll)
	if !isNDP(ns) {
		t.Fatal("NS not recognised as NDP")
	}
	if got := solicitedNode(target).String(); got != "ff02::1:ff00:2" {
		t.Errorf("solicited-node group %s", got)
	}
	m, err := decodeNDP(ns)
	if err != nil || m.typ != ndpNeighborSolict || m.src != src || m.target != target || !m.hasLL || m.ll != ll {
		t.Fatalf("NS decoded as %+v, %v", m, err)
	}
	na := encodeNDP(ndpNeighborAdvert, naSolicited|naOverride, target, src, target, ll)
	if m, err := decodeNDP(na); err != nil || m.typ != ndpNeighborAdvert || m.flags != naSolicited|naOverride || m.ll != ll {
		t.Fatalf("NA decoded as %+v, %v", m, err)
	}
	// An Ethernet-sized (8-byte) option, a bad checksum, a hop limit
	// other than 255 and a zero-length option are refused.
	eth := append([]byte{}, ns[:ipv6HdrLen+ndpBodyLen]...)
	eth = append(eth, optSourceLL, 1, 1, 2, 3, 4, 5, 6)
	eth[5] = ndpBodyLen + 8
	fixChecksum(eth)
	badSum := append([]byte{}, ns...)
	badSum[len(badSum)-1] ^= 1
	hop := append([]byte{}, ns...)
	hop[7] = 64
	fixChecksum(hop)
	zero := append([]byte{}, ns...)
	zero[ipv6HdrLen+ndpBodyLen+1] = 0
	fixChecksum(zero)
	for name, bad := range map[string][]byte{"ethernet option": eth, "checksum": badSum, "hop limit": hop, "zero-length option": zero, "truncated": ns[:50]} {
		if _, err := decodeNDP(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// fixChecksum recomputes an NDP packet's ICMPv6 checksum.
func fixChecksum(ip []byte) {
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	icmp := ip[ipv6HdrLen : ipv6HdrLen+plen]
	icmp[2], icmp[3] = 0, 0
	binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(csum.Pseudo(ip[8:24], ip[24:40], icmpv6, plen), icmp)))
}
