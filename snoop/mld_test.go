package snoop

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

func unhex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// An MLDv2 report as Linux sends it on address configuration (RFC 3810
// §5.2): hop-by-hop router alert, two records: CHANGE_TO_EXCLUDE for
// ff02::1:ff00:22 and CHANGE_TO_INCLUDE with no sources (a leave) for
// ff02::1:ff00:33.
const mldv2Report = `6000 0000 0038 00 01 | fe80 0000 0000 0000 0000 0000 0000 0001 | ff02 0000 0000 0000 0000 0000 0000 0016 |
	3a00 0502 0000 0100 |
	8f00 0000 0000 0002 |
	04 00 0000 ff02 0000 0000 0000 0000 0001 ff00 0022 |
	03 00 0000 ff02 0000 0000 0000 0000 0001 ff00 0033`

// An MLDv1 report for ff02::1:ff00:44 (RFC 2710 §3), without the
// hop-by-hop header.
const mldv1Report = `6000 0000 0018 3a 01 | fe80 0000 0000 0000 0000 0000 0000 0001 | ff02 0000 0000 0000 0000 0001 ff00 0044 |
	8300 0000 0000 0000 | ff02 0000 0000 0000 0000 0001 ff00 0044`

func TestMLDJoins(t *testing.T) {
	got, err := MLDJoins(unhex(t, mldv2Report))
	if err != nil || len(got) != 1 || got[0] != netip.MustParseAddr("ff02::1:ff00:22") {
		t.Fatalf("MLDv2: %v %v", got, err)
	}
	got, err = MLDJoins(unhex(t, mldv1Report))
	if err != nil || len(got) != 1 || got[0] != netip.MustParseAddr("ff02::1:ff00:44") {
		t.Fatalf("MLDv1: %v %v", got, err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": unhex(t, mldv2Report)[:70],
		"echo":      append(unhex(t, mldv1Report)[:40], 0x80, 0, 0, 0, 0, 0, 0, 0),
	} {
		if g, err := MLDJoins(b); err == nil {
			t.Errorf("%s: accepted, %v", name, g)
		}
	}
}

func FuzzMLDJoins(f *testing.F) {
	f.Add(unhex(f, mldv2Report))
	f.Add(unhex(f, mldv1Report))
	f.Add(unhex(f, mldv2Report)[:60])
	f.Fuzz(func(t *testing.T, b []byte) {
		groups, err := MLDJoins(b)
		if err != nil {
			return
		}
		for _, g := range groups {
			if !g.Is6() || !g.IsMulticast() {
				t.Fatalf("joined non-multicast %s", g)
			}
		}
	})
}

func TestMLDv2Query(t *testing.T) {
	src := netip.MustParseAddr("fe80::1")
	b := AppendMLDv2Query(nil, src, time.Second)
	if len(b) != MLDv2QueryLen {
		t.Fatalf("length %d", len(b))
	}
	p := gopacket.NewPacket(b, layers.LayerTypeIPv6, gopacket.Default)
	if el := p.ErrorLayer(); el != nil {
		t.Fatal(el.Error())
	}
	q, ok := p.Layer(layers.LayerTypeMLDv2MulticastListenerQuery).(*layers.MLDv2MulticastListenerQueryMessage)
	if !ok || !q.MulticastAddress.IsUnspecified() || q.QueriersRobustnessVariable != 2 || q.QueriersQueryIntervalCode != 125 || q.MaximumResponseCode != 1000 {
		t.Fatalf("query as decoded: %+v", p)
	}
	icmp := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	icmp.SetNetworkLayerForChecksum(p.NetworkLayer())
	if err, res := icmp.VerifyChecksum(); err != nil || !res.Valid {
		t.Fatal("checksum")
	}
	if ip := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ip.HopLimit != 1 || ip.DstIP.String() != "ff02::1" {
		t.Fatalf("IPv6 header %+v", ip)
	}
}
