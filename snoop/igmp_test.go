package snoop

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/testutil"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// IGMPv3 report (RFC 3376 §4.2) from 10.0.0.1 to 224.0.0.22 with a router
// alert: CHANGE_TO_EXCLUDE({}) for 239.1.1.1 (a join), CHANGE_TO_INCLUDE({})
// for 239.2.2.2 (a leave), ALLOW_NEW_SOURCES(10.9.9.9) for 232.1.1.1. The
// checksums (IPv4 header faa4, IGMP f4de) were computed apart from the
// code under test.
const igmpv3Report = `4600 003c 0000 4000 0102 faa4 0a000001 e0000016 94040000 |
	2200 f4de 0000 0003 |
	04 00 0000 ef010101 |
	03 00 0000 ef020202 |
	05 00 0001 e8010101 0a090909`

// IGMPv2 report and leave for 239.1.1.1 (RFC 2236 §2), IGMPv1 report.
const (
	igmpv2Report = `4600 0020 0000 4000 0102 ead4 0a000001 ef010101 94040000 | 1600 f9fc ef010101`
	igmpv2Leave  = `4600 0020 0000 4000 0102 fad4 0a000001 e0000002 94040000 | 1700 f8fc ef010101`
	igmpv1Report = `4500 001c 0000 4000 0102 7fdd 0a000001 ef010101 | 1200 fdfc ef010101`
)

// records walks all of recs.
func records(recs Records) []Record {
	var out []Record
	for r, ok := recs.Next(); ok; r, ok = recs.Next() {
		out = append(out, r)
	}
	return out
}

// igmpSum recomputes the IGMP checksum of an IPv4 packet a test changed.
func igmpSum(pkt []byte) []byte {
	msg := header.IPv4(pkt).Payload()
	msg[2], msg[3] = 0, 0
	binary.BigEndian.PutUint16(msg[2:], csum.Fold(csum.Sum(0, msg)))
	return pkt
}

func TestParseIGMP(t *testing.T) {
	recs, err := ParseIGMP(testutil.Unhex(t, igmpv3Report))
	got := records(recs)
	want := []Record{{netip.MustParseAddr("239.1.1.1"), false}, {netip.MustParseAddr("239.2.2.2"), true}, {netip.MustParseAddr("232.1.1.1"), false}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("IGMPv3: %v %v, want %v", got, err, want)
	}
	g := netip.MustParseAddr("239.1.1.1")
	for name, tc := range map[string]struct {
		hex   string
		leave bool
	}{"v2 report": {igmpv2Report, false}, "v2 leave": {igmpv2Leave, true}, "v1 report": {igmpv1Report, false}} {
		recs, err := ParseIGMP(testutil.Unhex(t, tc.hex))
		if got := records(recs); err != nil || !slices.Equal(got, []Record{{g, tc.leave}}) {
			t.Errorf("%s: %v %v", name, got, err)
		}
	}
	// Trailing link-layer padding is not part of the message.
	if recs, err := ParseIGMP(append(testutil.Unhex(t, igmpv2Report), 0xaa, 0xbb)); err != nil || len(records(recs)) != 1 {
		t.Errorf("padded v2 report: %v", err)
	}
}

// TestParseIGMPv3Records covers the record walk: auxiliary data stepped
// over, BLOCK_OLD_SOURCES ignored, IS_INCLUDE({}) a leave and
// MODE_IS_EXCLUDE a join.
func TestParseIGMPv3Records(t *testing.T) {
	pkt := igmpSum(testutil.Unhex(t, `4600 0048 0000 4000 0102 0000 0a000001 e0000016 94040000 |
		2200 0000 0000 0004 |
		02 01 0000 ef010101 deadbeef |
		06 00 0001 ef030303 0a090909 |
		01 00 0000 ef020202 |
		02 00 0000 ef040404`))
	recs, err := ParseIGMP(pkt)
	want := []Record{{netip.MustParseAddr("239.1.1.1"), false}, {netip.MustParseAddr("239.2.2.2"), true}, {netip.MustParseAddr("239.4.4.4"), false}}
	if got := records(recs); err != nil || !slices.Equal(got, want) {
		t.Fatalf("records %v %v, want %v", got, err, want)
	}
}

func TestParseIGMPRejects(t *testing.T) {
	badSum := testutil.Unhex(t, igmpv2Report)
	badSum[len(badSum)-1] ^= 1
	fragment := testutil.Unhex(t, igmpv2Report)
	fragment[6] |= 0x20 // MF
	badType := igmpSum(testutil.Unhex(t, igmpv3Report))
	badType[24+8] = 7
	igmpSum(badType)
	short := testutil.Unhex(t, igmpv3Report)
	short[24+7] = 4 // four records stated, three there
	igmpSum(short)
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"empty":          {nil, ErrNotReport},
		"query":          {AppendIGMPv3Query(nil, netip.Addr{}, 2, 125*time.Second, time.Second), ErrNotReport},
		"truncated":      {testutil.Unhex(t, igmpv3Report)[:40], ErrMalformed},
		"unicast group":  {testutil.Unhex(t, `4500 001c 0000 4000 0102 0000 0a000001 0a000002 | 1600 dffd 0a000002`), ErrMalformed},
		"bad checksum":   {badSum, ErrChecksum},
		"fragment":       {fragment, ErrMalformed},
		"record type 7":  {badType, ErrMalformed},
		"record missing": {short, ErrMalformed},
		"short message":  {testutil.Unhex(t, `4500 0018 0000 4000 0102 0000 0a000001 ef010101 | 1600 0000`), ErrMalformed},
	} {
		if r, err := ParseIGMP(tc.b); err != tc.want {
			t.Errorf("%s: %v %v, want %v", name, records(r), err, tc.want)
		}
	}
}

func FuzzParseIGMP(f *testing.F) {
	for _, h := range []string{igmpv3Report, igmpv2Report, igmpv2Leave, igmpv1Report} {
		f.Add(testutil.Unhex(f, h))
	}
	f.Add(testutil.Unhex(f, igmpv3Report)[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseIGMP(b)
		if err != nil {
			if r := records(recs); r != nil {
				t.Fatalf("records %v with error %v", r, err)
			}
			return
		}
		for _, r := range records(recs) {
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
