package csum

import (
	"encoding/hex"
	"strconv"
	"testing"
)

// RFC 1071 §3 example: the sum of 0001 f203 f4f5 f6f7 is ddf2 (folded),
// so the checksum is 220d.
func TestRFC1071(t *testing.T) {
	b, _ := hex.DecodeString("0001f203f4f5f6f7")
	if got := Fold(Sum(0, b)); got != 0x220d {
		t.Fatalf("checksum %#04x, want 0x220d", got)
	}
	if got := Fold(Sum(0, b[:7])); got != Fold(Sum(0, append(b[:7:7], 0))) {
		t.Fatal("odd length not padded with zero")
	}
}

func TestIPv4Header(t *testing.T) {
	// A header from a capture (checksum b861), with the checksum cleared.
	h, _ := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	IPv4Header(h)
	if h[10] != 0xb8 || h[11] != 0x61 {
		t.Fatalf("checksum %x, want b861", h[10:12])
	}
	if Fold(Sum(0, h)) != 0 {
		t.Fatal("header does not verify")
	}
}

// slowSum is RFC 1071's reference loop, 16 bits at a time, folded to 16
// bits at the end (its 64-bit sum cannot wrap).
func slowSum(acc uint32, b []byte) uint32 {
	s := uint64(acc)
	for len(b) >= 2 {
		s += uint64(b[0])<<8 | uint64(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint32(s)
}

// FuzzSum: the word-at-a-time sum folds to the reference checksum for any
// data, length and starting sum, and sums of halves chain like the sum
// of the whole (for an even split).
func FuzzSum(f *testing.F) {
	f.Add([]byte("0001f203f4f5f6f7"), uint32(0), 4)
	f.Add(make([]byte, 65535), uint32(0xffff), 100)
	ff := make([]byte, 4001)
	for i := range ff {
		ff[i] = 0xff
	}
	f.Add(ff, uint32(0x1fffe), 2000)
	f.Fuzz(func(t *testing.T, b []byte, acc uint32, split int) {
		acc &= 0xfffff // a running sum of a pseudo-header is small
		if got, want := Fold(Sum(acc, b)), Fold(slowSum(acc, b)); got != want {
			t.Fatalf("Sum %#04x, reference %#04x (%d bytes)", got, want, len(b))
		}
		if split = split &^ 1; split >= 0 && split <= len(b) {
			if got, want := Fold(Sum(Sum(acc, b[:split]), b[split:])), Fold(slowSum(acc, b)); got != want {
				t.Fatalf("chained at %d: %#04x, want %#04x", split, got, want)
			}
		}
	})
}

// BenchmarkSum: an IPv4 header, an Ethernet MSS, an IPoIB MTU's segment
// and a 64 KB super-frame.
func BenchmarkSum(b *testing.B) {
	for _, n := range []int{20, 1460, 4092, 65536} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i)
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				Sum(0, buf)
			}
		})
	}
}
