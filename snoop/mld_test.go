package snoop

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// An MLDv2 report as Linux sends it on address configuration (RFC 3810
// §5.2): hop-by-hop router alert, two records: CHANGE_TO_EXCLUDE for
// ff02::1:ff00:22 and CHANGE_TO_INCLUDE with no sources (a leave) for
// ff02::1:ff00:33. The checksum (6f99) was computed apart from the code
// under test.
const mldv2Report = `6000 0000 0038 00 01 | fe80 0000 0000 0000 0000 0000 0000 0001 | ff02 0000 0000 0000 0000 0000 0000 0016 |
	3a00 0502 0000 0100 |
	8f00 6f99 0000 0002 |
	04 00 0000 ff02 0000 0000 0000 0000 0001 ff00 0022 |
	03 00 0000 ff02 0000 0000 0000 0000 0001 ff00 0033`

// An MLDv1 report for ff02::1:ff00:44 (RFC 2710 §3), without the
// hop-by-hop header; checksum 8199.
const mldv1Report = `6000 0000 0018 3a 01 | fe80 0000 0000 0000 0000 0000 0000 0001 | ff02 0000 0000 0000 0000 0001 ff00 0044 |
	8300 8199 0000 0000 | ff02 0000 0000 0000 0000 0001 ff00 0044`

// mldSum recomputes the ICMPv6 checksum of an IPv6 packet a test changed,
// whose MLD message starts at off.
func mldSum(pkt []byte, off int) []byte {
	ip := header.IPv6(pkt)
	msg := pkt[off : ip.PayloadLen()+header.IPv6Len]
	msg[2], msg[3] = 0, 0
	binary.BigEndian.PutUint16(msg[2:], csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), 58, len(msg)), msg)))
	return pkt
}

func TestParseMLD(t *testing.T) {
	recs, err := ParseMLD(testutil.Unhex(t, mldv2Report))
	want := []Record{{netip.MustParseAddr("ff02::1:ff00:22"), false}, {netip.MustParseAddr("ff02::1:ff00:33"), true}}
	if got := records(recs); err != nil || !slices.Equal(got, want) {
		t.Fatalf("MLDv2: %v %v", got, err)
	}
	recs, err = ParseMLD(testutil.Unhex(t, mldv1Report))
	if got := records(recs); err != nil || !slices.Equal(got, []Record{{netip.MustParseAddr("ff02::1:ff00:44"), false}}) {
		t.Fatalf("MLDv1: %v %v", got, err)
	}
	done := testutil.Unhex(t, mldv1Report)
	done[40] = 132
	recs, err = ParseMLD(mldSum(done, 40))
	if got := records(recs); err != nil || !slices.Equal(got, []Record{{netip.MustParseAddr("ff02::1:ff00:44"), true}}) {
		t.Fatalf("MLDv1 done: %v %v", got, err)
	}
	// An MLDv2 record with auxiliary data (one word, stepped over) and a
	// BLOCK_OLD_SOURCES record (ignored) before a MODE_IS_EXCLUDE one.
	aux := mldSum(testutil.Unhex(t, `6000 0000 0050 00 01 | fe80 0000 0000 0000 0000 0000 0000 0001 | ff02 0000 0000 0000 0000 0000 0000 0016 |
		3a00 0502 0000 0100 |
		8f00 0000 0000 0003 |
		04 01 0000 ff15 0000 0000 0000 0000 0000 0000 0001 deadbeef |
		06 00 0000 ff15 0000 0000 0000 0000 0000 0000 0002 |
		02 00 0000 ff15 0000 0000 0000 0000 0000 0000 0003`), 48)
	recs, err = ParseMLD(aux)
	want = []Record{{netip.MustParseAddr("ff15::1"), false}, {netip.MustParseAddr("ff15::3"), false}}
	if got := records(recs); err != nil || !slices.Equal(got, want) {
		t.Fatalf("MLDv2 with aux data: %v %v, want %v", got, err, want)
	}
}

func TestParseMLDRejects(t *testing.T) {
	badSum := testutil.Unhex(t, mldv2Report)
	badSum[len(badSum)-1] ^= 1
	mapped := testutil.Unhex(t, mldv1Report) // group ::ffff:239.1.1.1
	copy(mapped[48:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 1})
	mldSum(mapped, 40)
	noMsg := testutil.Unhex(t, mldv2Report)
	noMsg[5] = 8                             // the payload ends with the hop-by-hop header
	padded := testutil.Unhex(t, mldv2Report) // the hop-by-hop header in link-layer padding
	padded[5] = 0
	short := testutil.Unhex(t, mldv1Report)[:56] // an MLDv1 report of 16 bytes
	short[5] = 16
	mldSum(short, 40)
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"empty":        {nil, ErrNotReport},
		"truncated":    {testutil.Unhex(t, mldv2Report)[:70], ErrMalformed},
		"echo":         {append(testutil.Unhex(t, mldv1Report)[:40], 0x80, 0, 0, 0, 0, 0, 0, 0), ErrNotReport},
		"bad checksum": {badSum, ErrChecksum},
		"mapped group": {mapped, ErrMalformed},
		"no message":   {noMsg, ErrMalformed},
		"short MLDv1":  {short, ErrMalformed},
		"padding":      {padded, ErrMalformed},
	} {
		if r, err := ParseMLD(tc.b); err != tc.want {
			t.Errorf("%s: %v %v, want %v", name, records(r), err, tc.want)
		}
	}
}

// TestParseAllocs: parsing a report and walking its records allocate
// nothing.
func TestParseAllocs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func([]byte) (Records, error)
		pkt   string
		recs  int
	}{{"IGMPv3", ParseIGMP, igmpv3Report, 3}, {"MLDv2", ParseMLD, mldv2Report, 2}} {
		pkt, n := testutil.Unhex(t, tc.pkt), 0
		if a := testing.AllocsPerRun(100, func() {
			recs, err := tc.parse(pkt)
			for _, ok := recs.Next(); ok && err == nil; _, ok = recs.Next() {
				n++
			}
		}); a != 0 {
			t.Errorf("%s: %v allocations per report", tc.name, a)
		}
		if n != tc.recs*101 { // AllocsPerRun runs once more to warm up
			t.Errorf("%s: %d records walked, want %d", tc.name, n, tc.recs*101)
		}
	}
}

// BenchmarkParse is parsing a report and walking its records.
func BenchmarkParse(b *testing.B) {
	for _, tc := range []struct {
		name  string
		parse func([]byte) (Records, error)
		pkt   string
	}{{"IGMPv3", ParseIGMP, igmpv3Report}, {"MLDv2", ParseMLD, mldv2Report}} {
		b.Run(tc.name, func(b *testing.B) {
			pkt := testutil.Unhex(b, tc.pkt)
			b.ReportAllocs()
			b.SetBytes(int64(len(pkt)))
			for b.Loop() {
				recs, err := tc.parse(pkt)
				for _, ok := recs.Next(); ok && err == nil; _, ok = recs.Next() {
				}
			}
		})
	}
}

func FuzzParseMLD(f *testing.F) {
	f.Add(testutil.Unhex(f, mldv2Report))
	f.Add(testutil.Unhex(f, mldv1Report))
	f.Add(testutil.Unhex(f, mldv2Report)[:60])
	padded := testutil.Unhex(f, mldv2Report) // the hop-by-hop header in the padding
	padded[5] = 0
	f.Add(padded)
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseMLD(b)
		if err != nil {
			if r := records(recs); r != nil {
				t.Fatalf("records %v with error %v", r, err)
			}
			return
		}
		for _, r := range records(recs) {
			if !r.Group.Is6() || r.Group.Is4In6() || !r.Group.IsMulticast() {
				t.Fatalf("record for non-multicast %s", r.Group)
			}
		}
	})
}
