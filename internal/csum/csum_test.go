package csum

import (
	"encoding/hex"
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
