package arpndp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/csum"
)

func TestSetBroadcastFlag(t *testing.T) {
	pkt := dhcpRequest(t, false)
	if !IsDHCPClient(pkt) || IsDHCPServer(pkt) {
		t.Fatal("direction not recognised")
	}
	if err := SetBroadcastFlag(pkt); err != nil {
		t.Fatal(err)
	}
	d := checkUDP(t, pkt)
	if d.Flags&0x8000 == 0 {
		t.Fatalf("flags %#x", d.Flags)
	}
	if !bytes.Equal(d.ClientHWAddr, guestMAC[:]) || d.HardwareType != layers.LinkTypeEthernet {
		t.Fatal("SetBroadcastFlag changed more than the flag")
	}
}

func TestDHCPToIB(t *testing.T) {
	for _, withCID := range []bool{false, true} {
		pkt := dhcpRequest(t, withCID)
		n := len(pkt)
		out, err := DHCPToIB(pkt, ClientIDMAC)
		if err != nil {
			t.Fatalf("cid %v: %v", withCID, err)
		}
		d := checkUDP(t, out)
		// RFC 4390 §2.1: htype 32, hlen 0, chaddr zero, broadcast flag.
		if d.HardwareType != HwTypeInfiniBand || d.HardwareLen != 0 || d.Flags&0x8000 == 0 {
			t.Fatalf("htype %d hlen %d flags %#x", d.HardwareType, d.HardwareLen, d.Flags)
		}
		if !bytes.Equal(out[28+28:28+44], make([]byte, 16)) {
			t.Fatalf("chaddr not zeroed: %x", out[56:72])
		}
		// RFC 4390 §2.1: a client-identifier is present (added when missing).
		cids := 0
		for _, o := range d.Options {
			if o.Type == layers.DHCPOptClientID {
				cids++
				if !bytes.Equal(o.Data, append([]byte{1}, guestMAC[:]...)) {
					t.Fatalf("client-id %x", o.Data)
				}
			}
		}
		if cids != 1 {
			t.Fatalf("cid %v: %d client-identifiers", withCID, cids)
		}
		if want := map[bool]int{false: n + 9, true: n}[withCID]; len(out) != want {
			t.Fatalf("cid %v: length %d, want %d", withCID, len(out), want)
		}
		if m, ok := DHCPClientID(out); !ok || m != guestMAC {
			t.Fatalf("DHCPClientID = %s %v", m, ok)
		}
	}
}

// mlnxCID is the Mellanox-form client-identifier of guestMAC, as
// OpenStack's networking-mlnx writes it into dnsmasq's host file:
// ff:00:00:00:00:00:02:00:00:02:c9:00 + MAC[0:3] + 00:00 + MAC[3:6].
func mlnxCID() []byte {
	return append([]byte{0xff, 0, 0, 0, 0, 0, 0x02, 0, 0, 0x02, 0xc9, 0, guestMAC[0], guestMAC[1], guestMAC[2], 0, 0},
		guestMAC[3], guestMAC[4], guestMAC[5])
}

// TestDHCPToIBMlnx: the Mellanox form is added where the guest sent no
// client-identifier and replaces the guest's own, leaving one
// client-identifier, the other options and a valid packet; a reply
// carrying it names the guest.
func TestDHCPToIBMlnx(t *testing.T) {
	for _, withCID := range []bool{false, true} {
		pkt := dhcpRequest(t, withCID)
		n := len(pkt)
		before := checkUDP(t, pkt)
		out, err := DHCPToIB(pkt, ClientIDMlnx)
		if err != nil {
			t.Fatalf("cid %v: %v", withCID, err)
		}
		d := checkUDP(t, out)
		if d.HardwareType != HwTypeInfiniBand || d.HardwareLen != 0 || d.Flags&0x8000 == 0 {
			t.Fatalf("htype %d hlen %d flags %#x", d.HardwareType, d.HardwareLen, d.Flags)
		}
		var others, was []layers.DHCPOption
		cids := 0
		for _, o := range d.Options {
			if o.Type == layers.DHCPOptClientID {
				cids++
				if !bytes.Equal(o.Data, mlnxCID()) {
					t.Fatalf("cid %v: client-id %x, want %x", withCID, o.Data, mlnxCID())
				}
				continue
			}
			others = append(others, o)
		}
		for _, o := range before.Options {
			if o.Type != layers.DHCPOptClientID {
				was = append(was, o)
			}
		}
		if cids != 1 || len(others) != len(was) {
			t.Fatalf("cid %v: %d client-identifiers, %d other options (was %d)", withCID, cids, len(others), len(was))
		}
		for i := range was {
			if others[i].Type != was[i].Type || !bytes.Equal(others[i].Data, was[i].Data) {
				t.Fatalf("cid %v: option %d is %v, was %v", withCID, i, others[i], was[i])
			}
		}
		// 22 bytes added, less the guest's own 9-byte type-1 option.
		if want := map[bool]int{false: n + 22, true: n + 22 - 9}[withCID]; len(out) != want {
			t.Fatalf("cid %v: length %d, want %d", withCID, len(out), want)
		}
		if m, ok := DHCPClientID(out); !ok || m != guestMAC {
			t.Fatalf("DHCPClientID = %s %v", m, ok)
		}
		// Already in the Mellanox form: unchanged but for the IPoIB fields.
		again := append(slices.Clip(append([]byte(nil), out...)), make([]byte, 64)...)[:len(out)]
		again[28+1], again[28+2] = HwTypeEthernet, 6
		copy(again[28+28:], guestMAC[:])
		fixForTest(again)
		if out2, err := DHCPToIB(again, ClientIDMlnx); err != nil || !bytes.Equal(out2, out) {
			t.Fatalf("cid %v: a request in the Mellanox form changed: %v\n%x\n%x", withCID, err, out2, out)
		}
	}
}

// fixForTest recomputes the IPv4 and UDP checksums of a DHCP packet.
func fixForTest(b []byte) {
	ihl := int(b[0]&0x0f) * 4
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:12], csum.Fold(csum.Sum(0, b[:ihl])))
	b[ihl+6], b[ihl+7] = 0, 0
	m := dhcpMsg{ihl: ihl, end: int(binary.BigEndian.Uint16(b[2:4]))}
	binary.BigEndian.PutUint16(b[ihl+6:], udpSum(b, m))
}

func TestParseClientIDForm(t *testing.T) {
	for _, f := range []ClientIDForm{ClientIDMAC, ClientIDMlnx} {
		if g, ok := ParseClientIDForm(f.String()); !ok || g != f {
			t.Errorf("%s: %v %v", f, g, ok)
		}
	}
	if _, ok := ParseClientIDForm("duid"); ok {
		t.Error("duid accepted")
	}
}

func TestDHCPToEth(t *testing.T) {
	pkt := dhcpReply(t)
	if !IsDHCPServer(pkt) {
		t.Fatal("reply not recognised")
	}
	mac, ok := DHCPClientID(pkt)
	if !ok || mac != guestMAC {
		t.Fatalf("client-id %s %v", mac, ok)
	}
	if xid, ok := DHCPXID(pkt); !ok || xid != 0x12345678 {
		t.Fatalf("xid %#x %v", xid, ok)
	}
	n := len(pkt)
	if err := DHCPToEth(pkt, mac); err != nil {
		t.Fatal(err)
	}
	d := checkUDP(t, pkt)
	if d.HardwareType != layers.LinkTypeEthernet || d.HardwareLen != 6 || !bytes.Equal(d.ClientHWAddr, guestMAC[:]) || len(pkt) != n {
		t.Fatalf("restored htype %d hlen %d chaddr %x", d.HardwareType, d.HardwareLen, d.ClientHWAddr)
	}
	if d.YourClientIP.String() != "10.0.0.50" {
		t.Fatalf("yiaddr %s", d.YourClientIP)
	}
}

func TestDHCPBadInput(t *testing.T) {
	req := dhcpRequest(t, false)
	ihl := 20
	fix := func(b []byte) []byte {
		fixForTest(b) // so that only the intended fault remains
		return b
	}
	shorten := func(n int) []byte {
		b := append([]byte(nil), req[:n]...)
		binary.BigEndian.PutUint16(b[2:4], uint16(n))
		binary.BigEndian.PutUint16(b[ihl+4:], uint16(n-ihl))
		return fix(b)
	}
	mutate := func(f func(b []byte)) []byte { b := append([]byte(nil), req...); f(b); return fix(b) }
	endAt := bytes.LastIndexByte(req, optEnd)
	tests := []struct {
		name string
		pkt  []byte
		want Reason
	}{
		{"empty", nil, ErrTruncated},
		{"shorter than the fixed part", shorten(20 + 8 + 200), ErrTruncated},
		{"no cookie", mutate(func(b []byte) { b[28+236] = 0 }), ErrBadCookie},
		{"IP total length past packet", req[:100], ErrTruncated},
		{"UDP length wrong", mutate(func(b []byte) { b[ihl+5]-- }), ErrBadLength},
		{"TCP", mutate(func(b []byte) { b[9] = 6 }), ErrNotDHCP},
		{"other port", mutate(func(b []byte) { b[ihl+3] = 53 }), ErrNotDHCP},
		{"no END", mutate(func(b []byte) { b[endAt] = optPad }), ErrNoEnd},
		{"option past packet", mutate(func(b []byte) { b[28+240+1] = 200 }), ErrOptOverrun},
		{"bad UDP checksum", func() []byte { b := append([]byte(nil), req...); b[40]++; return b }(), ErrBadChecksum},
		{"IPoIB request", mutate(func(b []byte) { b[29] = HwTypeInfiniBand }), ErrBadHwType},
		// Adding the 9-byte client-identifier would take the IPv4 total
		// length past 65535, where it would wrap and leave a broken packet.
		{"too long for a client-identifier", dhcpOfLength(t, 0xffff-clientIDLen+1), ErrBadLength},
	}
	var c Counters
	for _, tc := range tests {
		_, err := DHCPToIB(roomy(tc.pkt), ClientIDMAC)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		c.Count(err)
	}
	if c.Get(ErrTruncated) != 3 {
		t.Errorf("counters %v", c.Snapshot())
	}
	if out, err := DHCPToIB(dhcpOfLength(t, 0xffff-clientIDLen), ClientIDMAC); err != nil || len(out) != 0xffff {
		t.Errorf("longest packet that takes a client-identifier: %d bytes, %v", len(out), err)
	} else {
		checkUDP(t, out)
	}
	if _, err := DHCPToIB(slices.Clip(append([]byte(nil), req...)), ClientIDMAC); !errors.Is(err, ErrNoRoom) {
		t.Errorf("no capacity: %v", err)
	}
	if err := DHCPToEth(req, guestMAC); !errors.Is(err, ErrBadHwType) {
		t.Errorf("DHCPToEth on a request: %v", err)
	}
}
