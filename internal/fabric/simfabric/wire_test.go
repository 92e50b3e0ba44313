package simfabric

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"slices"
	"testing"
)

var (
	gidA = netip.MustParseAddr("fe80::1").As16()
	gidB = netip.MustParseAddr("fe80::2").As16()
)

// icrcVector is a UD SEND-only from QPN 0x48 of fe80::1 to QPN 0x49 of
// fe80::2, P_Key 0xffff, PSN 1, Q_Key 0x0B1B, payload 08000000 "abcdef"
// (2 bytes of pad). Its ICRC was computed independently of this code, in
// Python, straight from the docs/architecture.md text:
//
//	crc = zlib.crc32(b'\xff'*8 + ip6 + udp + bth_with_byte4_ff + deth + payload + pad)
//	ip6 = 6fffffff | udp length 0x28 | 11 ff | src | dst;  udp = 12b7 12b7 0028 ffff
//
// and appended least significant byte first.
const icrcVector = "6420ffff00000049000000010000" + "0b1b00000048" + "0800000061626364656600" + "00" + "ab7ccae5"

func TestEncodeVector(t *testing.T) {
	payload := append([]byte{8, 0, 0, 0}, "abcdef"...)
	buf := make([]byte, 32, 64)
	buf = append(buf, payload...)
	p := Packet{PKey: 0xffff, DestQPN: 0x49, PSN: 1, QKey: 0x0B1B, SrcQPN: 0x48}
	out := new(Codec).Encode(buf, 32, &p, &gidA, &gidB, UDPPort, UDPPort)
	want, _ := hex.DecodeString(icrcVector)
	if !bytes.Equal(out, want) {
		t.Fatalf("Encode\n got %x\nwant %x", out, want)
	}
	var d Packet
	if err := new(Codec).Decode(want, &gidA, &gidB, UDPPort, UDPPort, &d); err != nil {
		t.Fatal(err)
	}
	if d.PKey != 0xffff || d.DestQPN != 0x49 || d.SrcQPN != 0x48 || d.QKey != 0x0B1B || d.PSN != 1 || !bytes.Equal(d.Payload, payload) {
		t.Fatalf("Decode = %+v", d)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := hex.DecodeString(icrcVector)
	mod := func(f func(b []byte)) []byte { b := append([]byte(nil), good...); f(b); return b }
	tests := []struct {
		name string
		b    []byte
		src  [16]byte
		want DecodeError
	}{
		{"empty", nil, gidA, ErrTruncated},
		{"short", good[:20], gidA, ErrTruncated},
		{"not a multiple of 4", good[:len(good)-1], gidA, ErrTruncated},
		{"RC send opcode", mod(func(b []byte) { b[0] = 0x04 }), gidA, ErrOpcode},
		{"TVer 1", mod(func(b []byte) { b[1] |= 1 }), gidA, ErrVersion},
		{"payload bit flip", mod(func(b []byte) { b[25] ^= 1 }), gidA, ErrICRC},
		{"wrong source GID", good, gidB, ErrICRC},
		{"ICRC byte order", mod(func(b []byte) { n := len(b); b[n-1], b[n-4] = b[n-4], b[n-1] }), gidA, ErrICRC},
	}
	for _, tc := range tests {
		var d Packet
		err := new(Codec).Decode(tc.b, &tc.src, &gidB, UDPPort, UDPPort, &d)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// The masked fields do not matter: FECN/BECN byte (BTH byte 4).
	var d Packet
	if err := new(Codec).Decode(mod(func(b []byte) { b[4] = 0xc0 }), &gidA, &gidB, UDPPort, UDPPort, &d); err != nil {
		t.Fatalf("BTH byte 4 is masked in the ICRC: %v", err)
	}
}

// FuzzDecode decodes arbitrary datagrams; with fix set their ICRC is
// made right first, so that the opcode, TVer, pad and length checks are
// reached. Whatever Decode accepts has the fields its bytes say, and
// re-encodes to the same bytes up to the bits a receiver ignores (SE, M,
// the reserved fields, the pad bytes' contents).
func FuzzDecode(f *testing.F) {
	good, _ := hex.DecodeString(icrcVector)
	f.Add(good, false)
	f.Add(good[:24], false)
	f.Add([]byte{0x64, 0x30, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, true)
	f.Add([]byte{0x64, 0xc0, 0xff, 0xff, 0xc0, 0, 0, 0x49, 0x80, 0, 0, 1, 0, 0, 0x0b, 0x1b, 0xff, 0, 0, 0x48, 8, 0, 0, 0, 0, 0, 0, 0}, true)
	f.Add([]byte{0x65, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, true)
	f.Fuzz(func(t *testing.T, b []byte, fix bool) {
		if fix {
			fixICRC(b, &gidA, &gidB, UDPPort)
		}
		var d Packet
		if err := new(Codec).Decode(b, &gidA, &gidB, UDPPort, UDPPort, &d); err != nil {
			if _, ok := err.(DecodeError); !ok {
				t.Fatalf("error %v is not a DecodeError", err)
			}
			return
		}
		n := len(b) - ICRCLen
		pad := int(b[1]>>4) & 3
		switch {
		case len(b) < HeaderLen+ICRCLen || len(b)%4 != 0:
			t.Fatalf("accepted a %d-byte datagram", len(b))
		case b[0] != OpUDSendOnly || b[1]&0x0f != 0:
			t.Fatalf("accepted opcode %#x TVer %d", b[0], b[1]&0x0f)
		case binary.LittleEndian.Uint32(b[n:]) != refICRC(b[:n], &gidA, &gidB, UDPPort, UDPPort):
			t.Fatalf("accepted a bad ICRC %x", b[n:])
		case n-HeaderLen < pad:
			t.Fatalf("accepted pad %d with %d bytes of payload", pad, n-HeaderLen)
		}
		want := Packet{PKey: u16(b[2:4]), DestQPN: u24(b[5:8]), PSN: u24(b[9:12]),
			QKey: binary.BigEndian.Uint32(b[12:16]), SrcQPN: u24(b[17:20])}
		if d.PKey != want.PKey || d.DestQPN != want.DestQPN || d.PSN != want.PSN || d.QKey != want.QKey || d.SrcQPN != want.SrcQPN ||
			len(d.Payload) != n-HeaderLen-pad || (len(d.Payload) > 0 && &d.Payload[0] != &b[HeaderLen]) {
			t.Fatalf("decoded %+v, want %+v with payload b[%d:%d]", d, want, HeaderLen, n-pad)
		}
		// Re-encoding gives the datagram back with the ignored bits zero.
		norm := bytes.Clone(b)
		norm[1] &= 0x30
		norm[4], norm[8], norm[16] = 0, 0, 0
		clear(norm[n-pad : n])
		fixICRC(norm, &gidA, &gidB, UDPPort)
		buf := make([]byte, 32, 32+len(d.Payload)+TailRoom)
		buf = append(buf, d.Payload...)
		if out := new(Codec).Encode(buf, 32, &d, &gidA, &gidB, UDPPort, UDPPort); !bytes.Equal(out, norm) {
			t.Fatalf("re-encoded\n got %x\nwant %x", out, norm)
		}
	})
}

// TestICRCPrefixReused: one Codec, whose prefix CRC is kept from packet
// to packet, computes the reference ICRC for a run of packets. In the
// run, each field the prefix covers changes in turn (length, addresses,
// ports, opcode byte, P_Key) and changes back. It also computes it for
// bytes after the prefix alone.
func TestICRCPrefixReused(t *testing.T) {
	var c Codec
	body := make([]byte, 64)
	for i := range body {
		body[i] = byte(i * 7)
	}
	type key struct {
		n            int
		src, dst     [16]byte
		sport, dport uint16
		b0, b2       byte
	}
	base := key{n: 64, src: gidA, dst: gidB, sport: 0xc000, dport: UDPPort, b0: OpUDSendOnly, b2: 0xff}
	otherGID := gidA
	otherGID[15] ^= 1
	keys := []key{base, base}
	for _, change := range []func(*key){
		func(k *key) { k.n = 60 },
		func(k *key) { k.src = otherGID },
		func(k *key) { k.dst = otherGID },
		func(k *key) { k.sport++ },
		func(k *key) { k.dport++ },
		func(k *key) { k.b0 = 0 },
		func(k *key) { k.b2 = 0x7f },
	} {
		k := base
		change(&k)
		keys = append(keys, k, base)
	}
	for i, k := range keys {
		b := slices.Clone(body[:k.n])
		b[0], b[2] = k.b0, k.b2
		b[9] = byte(i) // a byte past the prefix: the PSN
		if got, want := c.ICRC(b, &k.src, &k.dst, k.sport, k.dport, udpHeaderLen+k.n+ICRCLen), refICRC(b, &k.src, &k.dst, k.sport, k.dport); got != want {
			t.Fatalf("packet %d (%+v): ICRC %#08x, reference %#08x", i, k, got, want)
		}
	}
}

func BenchmarkEncodeDecode(b *testing.B) {
	payload := make([]byte, 1500)
	buf := make([]byte, 32+len(payload), 32+len(payload)+TailRoom)
	p := Packet{PKey: 0xffff, DestQPN: 0x49, PSN: 1, QKey: 0x0B1B, SrcQPN: 0x48}
	var c Codec
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	for i := 0; i < b.N; i++ {
		out := c.Encode(buf, 32, &p, &gidA, &gidB, UDPPort, UDPPort)
		var d Packet
		if err := c.Decode(out, &gidA, &gidB, UDPPort, UDPPort, &d); err != nil {
			b.Fatal(err)
		}
	}
}
