package ether

import (
	"bytes"
	"testing"
)

func TestFrame(t *testing.T) {
	dst, src := MAC{1, 0, 0x5e, 0, 0, 1}, MAC{0x52, 0x54, 0, 0, 0, 1}
	b := make([]byte, 64)
	n := PutHeader(b, dst, src, 0, TypeIPv4)
	f := Frame(b)
	if n != 14 || !f.IsValid() || f.Tagged() || f.VLAN() != 0 || f.EtherType() != TypeIPv4 || f.Dst() != dst || f.Src() != src || len(f.Payload()) != 50 {
		t.Fatalf("untagged: n %d %x", n, b[:14])
	}
	n = PutHeader(b, dst, src, 10, TypeIPv6)
	if n != 18 || !f.Tagged() || f.VLAN() != 10 || f.EtherType() != TypeIPv6 || f.HeaderLen() != 18 {
		t.Fatalf("tagged: n %d %x", n, b[:18])
	}
	if Frame(b[:16]).IsValid() || Frame(b[:13]).IsValid() {
		t.Fatal("short frames valid")
	}
	if !dst.IsMulticast() || src.IsMulticast() || !Broadcast.IsBroadcast() || !(MAC{}).IsZero() {
		t.Fatal("MAC predicates")
	}
	if m, err := ParseMAC("52:54:00:00:00:01"); err != nil || m != src || m.String() != "52:54:00:00:00:01" {
		t.Fatalf("ParseMAC %s %v", m, err)
	}
	if _, err := ParseMAC("00:00:00:00:00:00:00:00"); err == nil {
		t.Fatal("8-byte MAC accepted")
	}
}

func FuzzFrame(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0, 10, 0x86, 0xdd, 1})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr := Frame(b)
		if !fr.IsValid() {
			return
		}
		out := make([]byte, 18)
		n := PutHeader(out, fr.Dst(), fr.Src(), fr.VLAN(), fr.EtherType())
		if fr.VLAN() != 0 && !bytes.Equal(out[:n], b[:n]) {
			// Re-encoding drops only the PCP/DEI bits of the tag.
			if !bytes.Equal(out[:14], b[:14]) || !bytes.Equal(out[16:18], b[16:18]) {
				t.Fatalf("%x re-encodes as %x", b[:n], out[:n])
			}
		}
		if fr.HeaderLen()+len(fr.Payload()) != len(b) {
			t.Fatal("payload length")
		}
	})
}
