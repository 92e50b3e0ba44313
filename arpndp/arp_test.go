package arpndp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
)

// RFC 826 Ethernet ARP request 10.0.0.1 (52:54:00:00:00:01) asking for
// 10.0.0.2, and its RFC 4391 §9.2 IPoIB form: hardware type 32, length 20,
// sender LIMAC 00:00:01:48:fe80::1, target address zero. Checked by hand.
const (
	arpEthRequest = `0001 0800 06 04 0001 | 525400000001 | 0a000001 | 000000000000 | 0a000002`
	arpIBRequest  = `0020 0800 14 04 0001 |
		00000148 fe800000000000000000000000000001 | 0a000001 |
		00000000 00000000000000000000000000000000 | 0a000002`
	// The reply from the remote endpoint (QPN 0x249 of fe80::2).
	arpIBReply = `0020 0800 14 04 0002 |
		00000249 fe800000000000000000000000000002 | 0a000002 |
		00000148 fe800000000000000000000000000001 | 0a000001`
	arpEthReply = `0001 0800 06 04 0002 | 02aabbccddee | 0a000002 | 525400000001 | 0a000001`
)

func TestARPVectors(t *testing.T) {
	tr := newTr()
	// RFC 4391 §9.2: Ethernet request → IPoIB request.
	got, err := ARPToIB(roomy(testutil.Unhex(t, arpEthRequest)), tr)
	if err != nil || !bytes.Equal(got, testutil.Unhex(t, arpIBRequest)) {
		t.Fatalf("ARPToIB = %x, %v\nwant     %x", got, err, testutil.Unhex(t, arpIBRequest))
	}
	// RFC 4391 §9.2: IPoIB reply → Ethernet reply.
	got, err = ARPToEth(roomy(testutil.Unhex(t, arpIBReply)), tr)
	if err != nil || !bytes.Equal(got, testutil.Unhex(t, arpEthReply)) {
		t.Fatalf("ARPToEth = %x, %v\nwant      %x", got, err, testutil.Unhex(t, arpEthReply))
	}
	// An Ethernet frame's padding after the ARP packet is ignored.
	padded := append(testutil.Unhex(t, arpEthRequest), make([]byte, 18)...)
	if got, err := ARPToIB(roomy(padded), tr); err != nil || len(got) != ARPIBLen {
		t.Fatalf("padded request: %d bytes, %v", len(got), err)
	}
}

func TestARPRoundTrip(t *testing.T) {
	tr := newTr()
	for _, name := range []string{"request", "reply", "rarp-request", "rarp-reply"} {
		orig := testutil.Unhex(t, arpEthReply)
		switch name {
		case "request":
			orig = testutil.Unhex(t, arpEthRequest)
		case "rarp-request":
			orig[7] = OpRARPRequest
		case "rarp-reply":
			orig[7] = OpRARPReply
		}
		ib, err := ARPToIB(roomy(orig), tr)
		if err != nil {
			t.Fatalf("%s: ARPToIB: %v", name, err)
		}
		back, err := ARPToEth(roomy(ib), tr)
		if err != nil || !bytes.Equal(back, orig) {
			t.Fatalf("%s: round trip %x, %v, want %x", name, back, err, orig)
		}
	}
}

func TestARPBadInput(t *testing.T) {
	tr := newTr()
	eth := func(f func(b []byte)) []byte { b := testutil.Unhex(t, arpEthRequest); f(b); return b }
	tests := []struct {
		name string
		pkt  []byte
		to   func([]byte, Translator) ([]byte, error)
		want Reason
	}{
		{"empty", nil, ARPToIB, ErrTruncated},
		{"truncated header", testutil.Unhex(t, arpEthRequest)[:7], ARPToIB, ErrTruncated},
		{"truncated addresses", testutil.Unhex(t, arpEthRequest)[:27], ARPToIB, ErrTruncated},
		{"truncated IB", testutil.Unhex(t, arpIBReply)[:55], ARPToEth, ErrTruncated},
		{"hw len 8", eth(func(b []byte) { b[4] = 8 }), ARPToIB, ErrBadHwLen},
		{"hw len 0", eth(func(b []byte) { b[4] = 0 }), ARPToIB, ErrBadHwLen},
		{"hw len 20 on Ethernet type", eth(func(b []byte) { b[4] = 20 }), ARPToIB, ErrBadHwLen},
		{"hw type 6", eth(func(b []byte) { b[1] = 6 }), ARPToIB, ErrBadHwType},
		{"IB packet to IB", testutil.Unhex(t, arpIBReply), ARPToIB, ErrBadHwType},
		{"Eth packet to Eth", testutil.Unhex(t, arpEthReply), ARPToEth, ErrBadHwType},
		{"IPv6 protocol", eth(func(b []byte) { b[2], b[3] = 0x86, 0xdd }), ARPToIB, ErrBadProto},
		{"plen 16", eth(func(b []byte) { b[5] = 16 }), ARPToIB, ErrBadProto},
		{"op 9", eth(func(b []byte) { b[7] = 9 }), ARPToIB, ErrBadOp},
		{"unknown sender", eth(func(b []byte) { b[8] = 0xee }), ARPToIB, ErrUnknownAddr},
		{"reply to unknown target", testutil.Unhex(t, `0001 0800 06 04 0002 | 525400000001 | 0a000001 | 0000000000aa | 0a000002`), ARPToIB, ErrUnknownAddr},
	}
	var c Counters
	for _, tc := range tests {
		_, err := tc.to(roomy(tc.pkt), tr)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if !c.Count(err) {
			t.Errorf("%s: error %v not countable", tc.name, err)
		}
	}
	if c.Get(ErrTruncated) != 4 || c.Snapshot()["bad_hw_len"] != 3 {
		t.Errorf("counters %v", c.Snapshot())
	}
	// No room to grow.
	if _, err := ARPToIB(testutil.Unhex(t, arpEthRequest), tr); !errors.Is(err, ErrNoRoom) {
		t.Errorf("no capacity: %v", err)
	}
	// A request to an unknown target MAC still goes out, target zeroed.
	b := eth(func(b []byte) { b[18] = 0x77 })
	if out, err := ARPToIB(roomy(b), tr); err != nil || !bytes.Equal(out[32:52], make([]byte, 20)) {
		t.Errorf("request with unknown target: %x, %v", out, err)
	}
}
