package header

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/eipoib/eipoibd/internal/csum"
)

// igmpv2 is an IGMPv2 report for 239.1.1.1 with its checksum (f9fc,
// computed apart from this package).
var igmpv2 = []byte{0x16, 0, 0xf9, 0xfc, 239, 1, 1, 1}

func TestIGMP(t *testing.T) {
	h, ok := ParseIGMP(igmpv2)
	if !ok || h.Type() != 0x16 || h.Group() != netip.MustParseAddr("239.1.1.1") || !h.ChecksumValid() {
		t.Fatalf("IGMPv2 report: %v type %#x group %s checksum %v", ok, h.Type(), h.Group(), h.ChecksumValid())
	}
	bad := append([]byte(nil), igmpv2...)
	bad[7] = 2
	if h, _ := ParseIGMP(bad); h.ChecksumValid() {
		t.Fatal("changed message passes its checksum")
	}
	if _, ok := ParseIGMP(igmpv2[:7]); ok {
		t.Fatal("7 bytes parsed")
	}
	// IGMPv3 report header and one record.
	v3 := []byte{0x22, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 239, 2, 2, 2}
	h, _ = ParseIGMP(v3)
	if h.NumRecords() != 1 || len(h.Records()) != 8 {
		t.Fatalf("v3: %d records in %d bytes", h.NumRecords(), len(h.Records()))
	}
}

func TestMLD(t *testing.T) {
	src, dst := netip.MustParseAddr("fe80::1").As16(), netip.MustParseAddr("ff02::1:ff00:44").As16()
	// MLDv1 report for ff02::1:ff00:44 with its checksum (8199, computed
	// apart from this package).
	v1 := append([]byte{131, 0, 0x81, 0x99, 0, 0, 0, 0}, dst[:]...)
	h, ok := ParseMLD(v1)
	if !ok || h.Type() != MLDv1Report || h.Group() != netip.AddrFrom16(dst) || !h.ChecksumValid(src[:], dst[:]) {
		t.Fatalf("MLDv1 report: %v type %d group %s", ok, h.Type(), h.Group())
	}
	if h.ChecksumValid(src[:], src[:]) {
		t.Fatal("valid with another destination in the pseudo-header")
	}
	if _, ok := ParseMLD(v1[:23]); ok {
		t.Fatal("23-byte MLDv1 report parsed")
	}
	v2 := []byte{MLDv2Report, 0, 0, 0, 0, 0, 0, 0}
	if h, ok := ParseMLD(v2); !ok || h.NumRecords() != 0 || len(h.Records()) != 0 {
		t.Fatal("8-byte MLDv2 report header")
	}
	if _, ok := ParseMLD(v2[:7]); ok {
		t.Fatal("7 bytes parsed")
	}
}

func TestGroupRecord(t *testing.T) {
	// IGMPv3: ALLOW(10.9.9.9) for 232.1.1.1 with one word of aux data,
	// then a byte of what follows.
	b := []byte{5, 1, 0, 1, 232, 1, 1, 1, 10, 9, 9, 9, 0xde, 0xad, 0xbe, 0xef, 0x42}
	r, rest, ok := ParseGroupRecord(b, 4)
	if !ok || len(r) != 16 || len(rest) != 1 || r.Type() != 5 || r.NumSources() != 1 || r.Group() != netip.MustParseAddr("232.1.1.1") {
		t.Fatalf("IGMPv3 record %x rest %x", r, rest)
	}
	if _, _, ok := ParseGroupRecord(b[:15], 4); ok {
		t.Fatal("record without its aux data parsed")
	}
	// MLDv2: TO_EX({}) for ff15::1, no aux data.
	g := netip.MustParseAddr("ff15::1").As16()
	r, rest, ok = ParseGroupRecord(append([]byte{4, 0, 0, 0}, g[:]...), 16)
	if !ok || len(rest) != 0 || r.Group() != netip.AddrFrom16(g) || r.NumSources() != 0 {
		t.Fatalf("MLDv2 record %x", r)
	}
}

func FuzzParseIGMP(f *testing.F) {
	f.Add(igmpv2)
	f.Add([]byte{0x22, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 239, 2, 2, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := ParseIGMP(b)
		if !ok {
			return
		}
		h.Type()
		h.Group()
		h.NumRecords()
		h.Records()
		if h.ChecksumValid() != (csum.Fold(csum.Sum(0, b)) == 0) {
			t.Fatal("checksum")
		}
	})
}

func FuzzParseMLD(f *testing.F) {
	dst := netip.MustParseAddr("ff02::1:ff00:44").As16()
	f.Add(append([]byte{131, 0, 0x81, 0x99, 0, 0, 0, 0}, dst[:]...))
	f.Add([]byte{MLDv2Report, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := ParseMLD(b)
		if !ok {
			return
		}
		if h.Type() == MLDv1Report || h.Type() == MLDv1Done || h.Type() == MLDQuery {
			h.Group()
		}
		h.NumRecords()
		h.Records()
		h.ChecksumValid(dst[:], dst[:])
	})
}

func FuzzParseGroupRecord(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 232, 1, 1, 1, 10, 9, 9, 9, 0xde, 0xad, 0xbe, 0xef, 0x42}, false)
	f.Add([]byte{4, 0, 0, 0, 0xff, 0x15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, true)
	f.Fuzz(func(t *testing.T, b []byte, v6 bool) {
		addrLen := 4
		if v6 {
			addrLen = 16
		}
		r, rest, ok := ParseGroupRecord(b, addrLen)
		if !ok {
			return
		}
		if len(r)+len(rest) != len(b) || len(r) != 4+addrLen*(1+r.NumSources())+4*int(b[1]) {
			t.Fatalf("record of %d bytes, %d left, of %d", len(r), len(rest), len(b))
		}
		if g := r.Group(); g.Is6() != v6 || g.AsSlice()[0] != b[4] || binary.BigEndian.Uint16(r[2:]) != uint16(r.NumSources()) {
			t.Fatalf("group %s from %x", g, b)
		}
	})
}
