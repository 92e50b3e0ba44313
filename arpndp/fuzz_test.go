package arpndp

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// Every fuzz target checks that the rewriter never panics and that each
// output it returns is valid (and, where the direction allows, converts
// back to the input); everything else must be a counted Reason.

func mustReason(t *testing.T, err error) {
	t.Helper()
	if _, ok := err.(Reason); !ok {
		t.Fatalf("error %v is not a Reason", err)
	}
}

func arpSeeds(f *testing.F) {
	for _, s := range []string{arpEthRequest, arpEthReply, arpIBRequest, arpIBReply} {
		f.Add(testutil.Unhex(f, s))
	}
	f.Add([]byte{0, 1, 8, 0, 6, 4, 0, 1})
	f.Add([]byte{0, 32, 8, 0, 20, 4, 0, 2, 1})
	f.Add([]byte{})
}

// arpWant is what converting a to the other link layer and back must
// give: every field as it was. The exception is a target hardware
// address the translator does not know (zero, broadcast, or a stranger
// in a request), which comes back zero.
func arpWant(a ARP, known bool) []byte {
	want := append([]byte(nil), a[:a.Len()]...)
	if !known {
		clear(ARP(want).TargetHw())
	}
	return want
}

// checkARPFields checks that out, in the other link layer, carries in's
// opcode and protocol addresses and the translated hardware addresses.
func checkARPFields(t *testing.T, in, out ARP, htype uint16, sha, tha []byte) {
	t.Helper()
	if err := out.Validate(); err != nil || out.HwType() != htype || len(out) != out.Len() {
		t.Fatalf("invalid output %x: %v", []byte(out), err)
	}
	if binary.BigEndian.Uint16(out[2:4]) != 0x0800 || out[5] != 4 || out.Op() != in.Op() ||
		out.SenderIP() != in.SenderIP() || out.TargetIP() != in.TargetIP() ||
		!bytes.Equal(out.SenderHw(), sha) || !bytes.Equal(out.TargetHw(), tha) {
		t.Fatalf("fields of %x not carried into %x", []byte(in[:in.Len()]), []byte(out))
	}
}

// The round trips: Ethernet → IPoIB → Ethernet and IPoIB → Ethernet →
// IPoIB restore htype, ptype, hlen, plen, op and all four addresses.

func FuzzARPToIB(f *testing.F) {
	arpSeeds(f)
	tr := newTr()
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := ARPToIB(roomy(in), tr)
		if err != nil {
			mustReason(t, err)
			return
		}
		a := ARP(in)
		if len(out) != ARPIBLen || a.HwType() != HwTypeEthernet {
			t.Fatalf("%d-byte output from hardware type %d", len(out), a.HwType())
		}
		sha, _ := tr.EthToIB(ether.MAC(a.SenderHw()))
		tha, known := tr.EthToIB(ether.MAC(a.TargetHw()))
		if !known && !isRequest(a.Op()) && !ether.MAC(a.TargetHw()).IsZero() && !ether.MAC(a.TargetHw()).IsBroadcast() {
			t.Fatalf("reply to unknown target %x accepted", a.TargetHw())
		}
		checkARPFields(t, a, out, HwTypeInfiniBand, sha[:], tha[:])
		back, err := ARPToEth(roomy(out), tr)
		if err != nil {
			t.Fatalf("output does not convert back: %v", err)
		}
		if want := arpWant(a, known); !bytes.Equal(back, want) {
			t.Fatalf("round trip\n got %x\nwant %x", back, want)
		}
	})
}

func FuzzARPToEth(f *testing.F) {
	arpSeeds(f)
	tr := newTr()
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := ARPToEth(roomy(in), tr)
		if err != nil {
			mustReason(t, err)
			return
		}
		a := ARP(in)
		if len(out) != ARPEthLen || a.HwType() != HwTypeInfiniBand {
			t.Fatalf("%d-byte output from hardware type %d", len(out), a.HwType())
		}
		sha, _ := tr.IBToEth(ipoib.HwAddr(a.SenderHw()))
		tha, known := tr.IBToEth(ipoib.HwAddr(a.TargetHw()))
		if !known && !isRequest(a.Op()) && !ipoib.HwAddr(a.TargetHw()).IsZero() {
			t.Fatalf("reply to unknown target %x accepted", a.TargetHw())
		}
		checkARPFields(t, a, out, HwTypeEthernet, sha[:], tha[:])
		back, err := ARPToIB(roomy(out), tr)
		if err != nil {
			t.Fatalf("output does not convert back: %v", err)
		}
		if want := arpWant(a, known); !bytes.Equal(back, want) {
			t.Fatalf("round trip\n got %x\nwant %x", back, want)
		}
	})
}

// fixNDP makes the fuzzer's input internally consistent (payload length
// and checksum) when asked, so that it reaches the option parser.
func fixNDP(in []byte, fix bool) []byte {
	b := roomy(in)
	if fix && IsNDP(b) && len(b) >= 44 {
		finishICMPv6(b)
	}
	return b
}

func ndpSeeds(f *testing.F) {
	bodies := ndpBodies()
	for _, typ := range []byte{TypeRouterSolicitation, TypeRouterAdvertisement, TypeNeighborSolicitation, TypeNeighborAdvertisement, TypeRedirect} {
		f.Add(ndpPacket(typ, bodies[typ]), true)
		f.Add(ndpPacket(typ, bodies[typ], ethOpt(OptSLLA, guestMAC)), true)
		f.Add(ndpPacket(typ, bodies[typ], ibOpt(OptTLLA, remoteHw)), true)
	}
	f.Add(ndpPacket(TypeNeighborSolicitation, bodies[TypeNeighborSolicitation], []byte{1, 0, 0, 0, 0, 0, 0, 0}), true)
	f.Add([]byte{0x60}, false)
}

func checkNDPOutput(t *testing.T, out []byte, llLen byte) {
	t.Helper()
	end, opts, err := ndpBounds(out)
	if err != nil || end != len(out) || !ICMPv6ChecksumOK(out) {
		t.Fatalf("invalid output %x: %v", out, err)
	}
	var ll [maxLLOpts]int
	if _, err := scanOpts(out, opts, end, llLen, &ll); err != nil {
		t.Fatalf("output options invalid: %v", err)
	}
}

func FuzzNDPToIB(f *testing.F) {
	ndpSeeds(f)
	tr := newTr()
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		b := fixNDP(in, fix)
		orig := append([]byte(nil), b...)
		out, err := NDPToIB(b, tr)
		if err != nil {
			mustReason(t, err)
			return
		}
		checkNDPOutput(t, out, 3)
		back, err := NDPToEth(roomy(out), tr)
		if err != nil {
			t.Fatalf("output does not convert back: %v", err)
		}
		end := 40 + int(binary.BigEndian.Uint16(orig[4:6]))
		if !bytes.Equal(back, orig[:end]) {
			t.Fatalf("round trip\n got %x\nwant %x", back, orig[:end])
		}
	})
}

func FuzzNDPToEth(f *testing.F) {
	ndpSeeds(f)
	tr := newTr()
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		out, err := NDPToEth(fixNDP(in, fix), tr)
		if err != nil {
			mustReason(t, err)
			return
		}
		checkNDPOutput(t, out, 1)
	})
}

// fixDHCP recomputes the IPv4 header checksum and clears the UDP checksum
// (zero: none) when asked, so that the fuzzer reaches the DHCP parser.
func fixDHCP(in []byte, fix bool) []byte {
	b := roomy(in)
	if fix && len(b) >= 28 && b[0]>>4 == 4 {
		ihl := int(b[0]&0x0f) * 4
		if ihl >= 20 && len(b) >= ihl+8 {
			b[10], b[11] = 0, 0
			binary.BigEndian.PutUint16(b[10:12], csum.Fold(csum.Sum(0, b[:ihl])))
			b[ihl+6], b[ihl+7] = 0, 0
		}
	}
	return b
}

func dhcpSeeds(f *testing.F) {
	f.Add(dhcpRequest(f, false), false)
	f.Add(dhcpRequest(f, true), false)
	f.Add(dhcpReply(f), false)
	f.Add(dhcpRequest(f, false)[:200], true)
	f.Add([]byte{0x45, 0, 0, 20}, true)
}

func checkDHCPOutput(t *testing.T, out []byte) dhcpMsg {
	t.Helper()
	m, err := parseDHCP(out)
	if err != nil || m.end != len(out) {
		t.Fatalf("invalid output: %v", err)
	}
	return m
}

// sameExcept fails unless a and b are equal outside the byte ranges
// skip (pairs of offsets, start and end).
func sameExcept(t *testing.T, a, b []byte, skip ...int) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("length %d, was %d", len(b), len(a))
	}
	for i := range a {
		changed := false
		for j := 0; j < len(skip); j += 2 {
			changed = changed || i >= skip[j] && i < skip[j+1]
		}
		if !changed && a[i] != b[i] {
			t.Fatalf("byte %d changed: %#02x → %#02x", i, a[i], b[i])
		}
	}
}

// dhcpToIBChecked runs DHCPToIB of form f on the fuzzer's input and
// checks what every output must be. RFC 4390 §2.1 asks for a valid
// message with htype 32, hlen 0, chaddr zero, BROADCAST set and a
// client-identifier. It returns the output and its offsets, and the
// input's offsets and bytes. It returns false where DHCPToIB refused the
// input (with a Reason).
func dhcpToIBChecked(t *testing.T, in []byte, fix bool, f ClientIDForm) (out []byte, m, orig dhcpMsg, was []byte, ok bool) {
	t.Helper()
	b := fixDHCP(in, fix)
	orig, _ = parseDHCP(b) // DHCPToIB succeeds only when this does
	was = append([]byte(nil), b...)
	out, err := DHCPToIB(b, f)
	if err != nil {
		mustReason(t, err)
		return nil, m, orig, was, false
	}
	m = checkDHCPOutput(t, out)
	bp := m.bootp
	if out[bp+1] != HwTypeInfiniBand || out[bp+2] != 0 || !bytes.Equal(out[bp+28:bp+44], make([]byte, 16)) ||
		binary.BigEndian.Uint16(out[bp+10:])&flagBroadcast == 0 || m.clientID < 0 {
		t.Fatalf("not the IPoIB form: htype %d hlen %d chaddr %x flags %#04x client-id at %d",
			out[bp+1], out[bp+2], out[bp+28:bp+44], binary.BigEndian.Uint16(out[bp+10:]), m.clientID)
	}
	return out, m, orig, was, true
}

func FuzzDHCPToIB(f *testing.F) {
	dhcpSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		out, m, orig, was, ok := dhcpToIBChecked(t, in, fix, ClientIDMAC)
		if !ok {
			return
		}
		bp := m.bootp
		// Nothing else changes: the fixed part but htype, hlen, flags and
		// chaddr; the options, but for a client-identifier (type 1 and the
		// guest's MAC) inserted before END when there was none.
		if bp != orig.bootp || out[bp+10]&0x7f != was[bp+10]&0x7f {
			t.Fatalf("flags %#04x from %#04x", binary.BigEndian.Uint16(out[bp+10:]), binary.BigEndian.Uint16(was[bp+10:]))
		}
		wantLen, head := orig.end, orig.end
		if orig.clientID < 0 {
			wantLen, head = orig.end+clientIDLen, orig.endOpt
			cid := append([]byte{optClientID, 7, HwTypeEthernet}, was[bp+28:bp+34]...)
			if m.clientID != orig.endOpt || !bytes.Equal(out[m.clientID:m.clientID+clientIDLen], cid) ||
				!bytes.Equal(out[orig.endOpt+clientIDLen:], was[orig.endOpt:orig.end]) {
				t.Fatalf("client-identifier %x at %d, END was at %d", out[m.clientID:m.clientID+clientIDLen], m.clientID, orig.endOpt)
			}
		}
		if len(out) != wantLen {
			t.Fatalf("length %d, want %d", len(out), wantLen)
		}
		ihl := orig.ihl
		sameExcept(t, was[:head], out[:head],
			2, 4, 10, 12, // IPv4 total length, header checksum
			ihl+4, ihl+8, // UDP length, checksum
			bp+1, bp+3, bp+10, bp+11, bp+28, bp+44) // htype, hlen, flags (high byte), chaddr
	})
}

// FuzzDHCPToIBMlnx: with the Mellanox client-identifier the request is
// in the IPoIB form, and its first client-identifier is the Mellanox one
// of the guest's MAC. Its options are the guest's, with the guest's own
// first client-identifier taken out and the Mellanox one put before END.
// Where the guest's already was that, they are untouched.
func FuzzDHCPToIBMlnx(f *testing.F) {
	dhcpSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		out, m, orig, was, ok := dhcpToIBChecked(t, in, fix, ClientIDMlnx)
		if !ok {
			return
		}
		bp := m.bootp
		var cid [mlnxClientIDLen]byte
		putClientID(cid[:], ClientIDMlnx, ether.MAC(was[bp+28:bp+34]))
		if got := out[m.clientID : m.clientID+2+int(out[m.clientID+1])]; !bytes.Equal(got, cid[:]) {
			t.Fatalf("client-identifier %x, want %x", got, cid)
		}
		if mac, ok := DHCPClientID(out); !ok || mac != ether.MAC(was[bp+28:bp+34]) {
			t.Fatalf("DHCPClientID %s %v, want the guest's %x", mac, ok, was[bp+28:bp+34])
		}
		want := optionsOf(was, orig, -1)
		if orig.clientID < 0 || !bytes.Equal(was[orig.clientID:orig.clientID+2+int(was[orig.clientID+1])], cid[:]) {
			want = append(optionsOf(was, orig, orig.clientID), cid[:])
		}
		if got := optionsOf(out, m, -1); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("options %x, want %x", got, want)
		}
		if !bytes.Equal(out[m.endOpt:], was[orig.endOpt:orig.end]) {
			t.Fatalf("END and after: %x, was %x", out[m.endOpt:], was[orig.endOpt:orig.end])
		}
		ihl := orig.ihl
		head := bp + dhcpMinLen
		sameExcept(t, was[:head], out[:head], 2, 4, 10, 12, ihl+4, ihl+8, bp+1, bp+3, bp+10, bp+11, bp+28, bp+44)
	})
}

// optionsOf lists the options of a valid DHCP message before END, each
// as its bytes (a pad as one byte), leaving out the one at skip.
func optionsOf(pkt []byte, m dhcpMsg, skip int) [][]byte {
	var out [][]byte
	for o := m.bootp + dhcpMinLen; o < m.endOpt; {
		n := 1
		if pkt[o] != optPad {
			n = 2 + int(pkt[o+1])
		}
		if o != skip {
			out = append(out, pkt[o:o+n])
		}
		o += n
	}
	return out
}

func FuzzDHCPToEth(f *testing.F) {
	dhcpSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		b := fixDHCP(in, fix)
		xid, xok := DHCPXID(b)
		if err := DHCPToEth(b, guestMAC); err != nil {
			mustReason(t, err)
			return
		}
		m, _ := parseDHCP(b)
		checkDHCPOutput(t, b[:m.end])
		if x, ok := DHCPXID(b); !xok || !ok || x != xid {
			t.Fatalf("xid %#x/%v before, %#x/%v after", xid, xok, x, ok)
		}
	})
}

func FuzzSetBroadcastFlag(f *testing.F) {
	dhcpSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		b := fixDHCP(in, fix)
		was := append([]byte(nil), b...)
		if err := SetBroadcastFlag(b); err != nil {
			mustReason(t, err)
			return
		}
		m, err := parseDHCP(b)
		if err != nil {
			t.Fatalf("output does not parse: %v", err)
		}
		flags := binary.BigEndian.Uint16(b[m.bootp+10:])
		if want := binary.BigEndian.Uint16(was[m.bootp+10:]) | flagBroadcast; flags != want {
			t.Fatalf("flags %#04x, want %#04x", flags, want)
		}
		// Only the flags and the UDP checksum change.
		sameExcept(t, was, b, m.bootp+10, m.bootp+11, m.ihl+6, m.ihl+8)
	})
}
