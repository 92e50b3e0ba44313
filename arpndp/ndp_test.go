package arpndp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
)

func TestNDPVector(t *testing.T) {
	// RFC 4861 §4.3 NS with RFC 2464 §6 SLLA (type 1, length 1) becomes the
	// RFC 4391 §9.3.1 option: type 1, length 3, 2 zero bytes, 20-byte address.
	body := ndpBodies()[TypeNeighborSolicitation]
	eth := ndpPacket(TypeNeighborSolicitation, body, ethOpt(OptSLLA, guestMAC))
	want := ndpPacket(TypeNeighborSolicitation, body, testutil.Unhex(t, `01 03 0000 00000148 fe800000000000000000000000000001`))
	got, err := NDPToIB(roomy(eth), newTr())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("NDPToIB\n got %x %v\nwant %x", got, err, want)
	}
	if len(got) != len(eth)+16 {
		t.Fatalf("grew by %d, want 16", len(got)-len(eth))
	}
	checkICMPv6(t, got)
}

func TestNDPRoundTrip(t *testing.T) {
	tr := newTr()
	mtu := []byte{5, 1, 0, 0, 0, 0, 0x05, 0xdc}
	prefix := append([]byte{3, 4, 64, 0xc0, 0, 0, 0x0e, 0x10, 0, 0, 0x0e, 0x10, 0, 0, 0, 0}, make([]byte, 16)...)
	redirected := append([]byte{4, 2, 0, 0, 0, 0, 0, 0}, make([]byte, 8)...)
	optionSets := map[byte][][][]byte{
		TypeRouterSolicitation:    {nil, {ethOpt(OptSLLA, guestMAC)}},
		TypeRouterAdvertisement:   {nil, {ethOpt(OptSLLA, guestMAC)}, {ethOpt(OptSLLA, guestMAC), mtu, prefix}, {mtu, ethOpt(OptSLLA, guestMAC), prefix}},
		TypeNeighborSolicitation:  {nil, {ethOpt(OptSLLA, guestMAC)}},
		TypeNeighborAdvertisement: {nil, {ethOpt(OptTLLA, guestMAC)}},
		TypeRedirect:              {nil, {ethOpt(OptTLLA, remoteMAC)}, {ethOpt(OptTLLA, remoteMAC), redirected}, {redirected, ethOpt(OptTLLA, remoteMAC)}},
	}
	for typ, body := range ndpBodies() {
		for i, opts := range optionSets[typ] {
			orig := ndpPacket(typ, body, opts...)
			checkICMPv6(t, orig)
			ib, err := NDPToIB(roomy(orig), tr)
			if err != nil {
				t.Fatalf("type %d set %d: NDPToIB: %v", typ, i, err)
			}
			checkICMPv6(t, ib)
			nLL := 0
			for _, o := range opts {
				if o[0] == OptSLLA || o[0] == OptTLLA {
					nLL++
				}
			}
			if len(ib) != len(orig)+16*nLL {
				t.Fatalf("type %d set %d: %d → %d bytes", typ, i, len(orig), len(ib))
			}
			back, err := NDPToEth(roomy(ib), tr)
			if err != nil {
				t.Fatalf("type %d set %d: NDPToEth: %v", typ, i, err)
			}
			checkICMPv6(t, back)
			if !bytes.Equal(back, orig) {
				t.Fatalf("type %d set %d: round trip\n got %x\nwant %x", typ, i, back, orig)
			}
		}
	}
}

func TestNDPBadInput(t *testing.T) {
	tr := newTr()
	ns := ndpBodies()[TypeNeighborSolicitation]
	good := ndpPacket(TypeNeighborSolicitation, ns, ethOpt(OptSLLA, guestMAC))
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		finishICMPv6(b)
		return b
	}
	tests := []struct {
		name string
		pkt  []byte
		to   func([]byte, Translator) ([]byte, error)
		want Reason
	}{
		{"empty", nil, NDPToIB, ErrTruncated},
		{"short IPv6", good[:39], NDPToIB, ErrTruncated},
		{"payload length past packet", good[:len(good)-1], NDPToIB, ErrTruncated},
		{"fixed part truncated", ndpPacket(TypeNeighborSolicitation, ns[:10]), NDPToIB, ErrTruncated},
		{"echo request", ndpPacket(128, make([]byte, 4)), NDPToIB, ErrNotNDP},
		{"IPv4", append([]byte{0x45}, good[1:]...), NDPToIB, ErrNotNDP},
		{"option length 0", mutate(func(b []byte) { b[65] = 0 }), NDPToIB, ErrOptLenZero},
		{"option past packet", mutate(func(b []byte) { b[65] = 2 }), NDPToIB, ErrOptOverrun},
		{"half an option", ndpPacket(TypeNeighborSolicitation, ns, []byte{1}), NDPToIB, ErrOptOverrun},
		{"IB-size option from guest", ndpPacket(TypeNeighborSolicitation, ns, ibOpt(OptSLLA, guestHw)), NDPToIB, ErrBadOptLen},
		{"Eth-size option from fabric", good, NDPToEth, ErrBadOptLen},
		{"unknown MAC", ndpPacket(TypeNeighborSolicitation, ns, ethOpt(OptSLLA, [6]byte{9})), NDPToIB, ErrUnknownAddr},
		{"bad checksum", func() []byte { b := append([]byte(nil), good...); b[42]++; return b }(), NDPToIB, ErrBadChecksum},
		{"too many options", func() []byte {
			var opts [][]byte
			for i := 0; i <= maxLLOpts; i++ {
				opts = append(opts, ethOpt(OptSLLA, guestMAC))
			}
			return ndpPacket(TypeNeighborSolicitation, ns, opts...)
		}(), NDPToIB, ErrTooManyOpts},
	}
	var c Counters
	for _, tc := range tests {
		_, err := tc.to(roomy(tc.pkt), tr)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		c.Count(err)
	}
	if c.Get(ErrOptLenZero) != 1 || c.Get(ErrOptOverrun) != 2 {
		t.Errorf("counters %v", c.Snapshot())
	}
	if _, err := NDPToIB(good, tr); !errors.Is(err, ErrNoRoom) {
		t.Errorf("no capacity: %v", err)
	}
}
