package snoop

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// IGMPv3 report (RFC 3376 §4.2) from 10.0.0.1 to 224.0.0.22 with a router
// alert: CHANGE_TO_EXCLUDE({}) for 239.1.1.1 (a join), CHANGE_TO_INCLUDE({})
// for 239.2.2.2 (a leave), ALLOW_NEW_SOURCES(10.9.9.9) for 232.1.1.1.
const igmpv3Report = `4600 003c 0000 4000 0102 0000 0a000001 e0000016 94040000 |
	2200 0000 0000 0003 |
	04 00 0000 ef010101 |
	03 00 0000 ef020202 |
	05 00 0001 e8010101 0a090909`

// IGMPv2 report and leave for 239.1.1.1 (RFC 2236 §2).
const (
	igmpv2Report = `4600 0020 0000 4000 0102 0000 0a000001 ef010101 94040000 | 1600 0000 ef010101`
	igmpv2Leave  = `4600 0020 0000 4000 0102 0000 0a000001 e0000002 94040000 | 1700 0000 ef010101`
	igmpv1Report = `4500 001c 0000 4000 0102 0000 0a000001 ef010101 | 1200 0000 ef010101`
)

func TestParseIGMP(t *testing.T) {
	got, err := ParseIGMP(unhex(t, igmpv3Report))
	want := []Record{{netip.MustParseAddr("239.1.1.1"), false}, {netip.MustParseAddr("239.2.2.2"), true}, {netip.MustParseAddr("232.1.1.1"), false}}
	if err != nil || len(got) != 3 {
		t.Fatalf("IGMPv3: %v %v", got, err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("IGMPv3 record %d = %v, want %v", i, got[i], want[i])
		}
	}
	g := netip.MustParseAddr("239.1.1.1")
	for name, tc := range map[string]struct {
		hex   string
		leave bool
	}{"v2 report": {igmpv2Report, false}, "v2 leave": {igmpv2Leave, true}, "v1 report": {igmpv1Report, false}} {
		got, err := ParseIGMP(unhex(t, tc.hex))
		if err != nil || len(got) != 1 || got[0] != (Record{g, tc.leave}) {
			t.Errorf("%s: %v %v", name, got, err)
		}
	}
	query := AppendIGMPv3Query(nil, netip.Addr{}, 2, 125*time.Second, time.Second)
	for name, b := range map[string][]byte{"empty": nil, "query": query, "truncated": unhex(t, igmpv3Report)[:40], "unicast group": unhex(t, `4500 001c 0000 4000 0102 0000 0a000001 0a000002 | 1600 0000 0a000002`)} {
		if r, err := ParseIGMP(b); err == nil {
			t.Errorf("%s: accepted, %v", name, r)
		}
	}
}

func FuzzParseIGMP(f *testing.F) {
	for _, h := range []string{igmpv3Report, igmpv2Report, igmpv2Leave, igmpv1Report} {
		f.Add(unhex(f, h))
	}
	f.Add(unhex(f, igmpv3Report)[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseIGMP(b)
		if err != nil {
			return
		}
		for _, r := range recs {
			if !r.Group.Is4() || !r.Group.IsMulticast() {
				t.Fatalf("record for non-IPv4-multicast %s", r.Group)
			}
		}
	})
}

func TestQueries(t *testing.T) {
	src := netip.MustParseAddr("fe80::1")
	grp6 := netip.MustParseAddr("ff15::1234")
	for _, tc := range []struct {
		group netip.Addr
		dst   string
	}{{netip.Addr{}, "ff02::1"}, {grp6, "ff15::1234"}} {
		b := AppendMLDv2Query(nil, src, tc.group, 2, 125*time.Second, time.Second)
		if len(b) != MLDv2QueryLen {
			t.Fatalf("length %d", len(b))
		}
		p := gopacket.NewPacket(b, layers.LayerTypeIPv6, gopacket.Default)
		q, ok := p.Layer(layers.LayerTypeMLDv2MulticastListenerQuery).(*layers.MLDv2MulticastListenerQueryMessage)
		if !ok || q.QueriersRobustnessVariable != 2 || q.QueriersQueryIntervalCode != 125 || q.MaximumResponseCode != 1000 {
			t.Fatalf("MLD query as decoded: %v", p)
		}
		if tc.group.IsValid() != !q.MulticastAddress.IsUnspecified() {
			t.Fatalf("query address %s for group %v", q.MulticastAddress, tc.group)
		}
		icmp := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		icmp.SetNetworkLayerForChecksum(p.NetworkLayer())
		if err, res := icmp.VerifyChecksum(); err != nil || !res.Valid {
			t.Fatal("MLD query checksum")
		}
		if ip := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ip.HopLimit != 1 || ip.DstIP.String() != tc.dst {
			t.Fatalf("IPv6 header %+v", ip)
		}
	}
	grp4 := netip.MustParseAddr("239.1.1.1")
	for _, tc := range []struct {
		group netip.Addr
		dst   string
	}{{netip.Addr{}, "224.0.0.1"}, {grp4, "239.1.1.1"}} {
		b := AppendIGMPv3Query(nil, tc.group, 2, 125*time.Second, time.Second)
		if len(b) != IGMPv3QueryLen {
			t.Fatalf("length %d", len(b))
		}
		p := gopacket.NewPacket(b, layers.LayerTypeIPv4, gopacket.Default)
		ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if err, res := ip.VerifyChecksum(); err != nil || !res.Valid || ip.TTL != 1 || ip.DstIP.String() != tc.dst {
			t.Fatalf("IPv4 header %+v", ip)
		}
		q, ok := p.Layer(layers.LayerTypeIGMP).(*layers.IGMP)
		// gopacket decodes QQIC as tenths of a second; RFC 3376 §4.1.7 says
		// seconds, so the byte itself is checked.
		if !ok || q.Type != igmpQuery || q.MaxResponseTime != time.Second || q.RobustnessValue != 2 || b[24+9] != 125 {
			t.Fatalf("IGMP query as decoded: %v", p)
		}
		if tc.group.IsValid() != !q.GroupAddress.IsUnspecified() {
			t.Fatalf("query group %s", q.GroupAddress)
		}
	}
	if qqic(300*time.Second) != 0x92 || qqic(125*time.Second) != 125 { // 300 s ≈ (16+2)<<4 = 288 s
		t.Fatalf("qqic(300s) = %#x", qqic(300*time.Second))
	}
}
