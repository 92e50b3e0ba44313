package arpndp

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/eipoib/eipoibd/internal/csum"
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
		f.Add(unhex(f, s))
	}
	f.Add([]byte{0, 1, 8, 0, 6, 4, 0, 1})
	f.Add([]byte{0, 32, 8, 0, 20, 4, 0, 2, 1})
	f.Add([]byte{})
}

func FuzzARPToIB(f *testing.F) {
	arpSeeds(f)
	tr := newTr()
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := ARPToIB(roomy(in), tr)
		if err != nil {
			mustReason(t, err)
			return
		}
		if err := ARP(out).Validate(); err != nil || ARP(out).HwType() != HwTypeInfiniBand || len(out) != ARPIBLen {
			t.Fatalf("invalid output %x: %v", out, err)
		}
		back, err := ARPToEth(roomy(out), tr)
		if err != nil {
			t.Fatalf("output does not convert back: %v", err)
		}
		if !bytes.Equal(back[:14], in[:14]) || !bytes.Equal(back[24:28], in[24:28]) {
			t.Fatalf("round trip %x → %x", in[:28], back)
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
		if err := ARP(out).Validate(); err != nil || ARP(out).HwType() != HwTypeEthernet || len(out) != ARPEthLen {
			t.Fatalf("invalid output %x: %v", out, err)
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

func checkDHCPOutput(t *testing.T, out []byte) {
	t.Helper()
	if m, err := parseDHCP(out); err != nil || m.end != len(out) {
		t.Fatalf("invalid output: %v", err)
	}
}

func FuzzDHCPToIB(f *testing.F) {
	dhcpSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		out, err := DHCPToIB(fixDHCP(in, fix))
		if err != nil {
			mustReason(t, err)
			return
		}
		checkDHCPOutput(t, out)
		if _, ok := DHCPClientID(out); !ok && out[28+1] == HwTypeInfiniBand {
			// A client-id that was present but not type 1 is kept as is.
			if m, _ := parseDHCP(out); m.clientID < 0 {
				t.Fatal("no client-identifier after DHCPToIB")
			}
		}
	})
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
		if err := SetBroadcastFlag(b); err != nil {
			mustReason(t, err)
			return
		}
		m, _ := parseDHCP(b)
		checkDHCPOutput(t, b[:m.end])
	})
}
