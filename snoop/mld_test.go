package snoop

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
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

func TestParseMLD(t *testing.T) {
	got, err := ParseMLD(unhex(t, mldv2Report))
	want := []Record{{netip.MustParseAddr("ff02::1:ff00:22"), false}, {netip.MustParseAddr("ff02::1:ff00:33"), true}}
	if err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("MLDv2: %v %v", got, err)
	}
	got, err = ParseMLD(unhex(t, mldv1Report))
	if err != nil || len(got) != 1 || got[0] != (Record{netip.MustParseAddr("ff02::1:ff00:44"), false}) {
		t.Fatalf("MLDv1: %v %v", got, err)
	}
	done := unhex(t, mldv1Report)
	done[40] = 132
	if got, err := ParseMLD(done); err != nil || len(got) != 1 || !got[0].Leave {
		t.Fatalf("MLDv1 done: %v %v", got, err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": unhex(t, mldv2Report)[:70],
		"echo":      append(unhex(t, mldv1Report)[:40], 0x80, 0, 0, 0, 0, 0, 0, 0),
	} {
		if g, err := ParseMLD(b); err == nil {
			t.Errorf("%s: accepted, %v", name, g)
		}
	}
}

func FuzzParseMLD(f *testing.F) {
	f.Add(unhex(f, mldv2Report))
	f.Add(unhex(f, mldv1Report))
	f.Add(unhex(f, mldv2Report)[:60])
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseMLD(b)
		if err != nil {
			return
		}
		for _, r := range recs {
			if !r.Group.Is6() || !r.Group.IsMulticast() {
				t.Fatalf("record for non-multicast %s", r.Group)
			}
		}
	})
}
