package ipoib

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/ether"
)

// RFC 4391 §4: IPv4 MGID = ff1S:401b:PPPP:0000:0000:0000:GGGG:GGGG (low 28
// bits of the group), broadcast = ff1S:401b:PPPP::ffff:ffff, IPv6 MGID =
// ff1S:601b:PPPP: + low 80 bits of the group. Scope 2 (link-local); the
// P_Key always with the full-membership bit. Vectors worked out by hand.
func TestMGIDVectors(t *testing.T) {
	tests := []struct {
		group string // "" = broadcast
		pkey  PKey
		want  string
	}{
		// §4, IPv4: 224.0.0.1 = 0xe0000001, low 28 bits 0x00000001.
		{"224.0.0.1", 0xffff, "ff12:401b:ffff:0000:0000:0000:0000:0001"},
		{"224.0.0.1", 0x8001, "ff12:401b:8001:0000:0000:0000:0000:0001"},
		// §4, IPv4: 239.1.2.3 = 0xef010203, low 28 bits 0x0f010203.
		{"239.1.2.3", 0xffff, "ff12:401b:ffff:0000:0000:0000:0f01:0203"},
		{"239.1.2.3", 0x8001, "ff12:401b:8001:0000:0000:0000:0f01:0203"},
		// §4, a limited member's P_Key 0x0001 is written with the full bit.
		{"239.1.2.3", 0x0001, "ff12:401b:8001:0000:0000:0000:0f01:0203"},
		// §4, IPv6: ff02::1, low 80 bits 0000:0000:0000:0000:0001.
		{"ff02::1", 0xffff, "ff12:601b:ffff:0000:0000:0000:0000:0001"},
		{"ff02::1", 0x8001, "ff12:601b:8001:0000:0000:0000:0000:0001"},
		// §4, IPv6: ff02::1:ff00:1 = ff02:0:0:0:0:1:ff00:1, low 80 bits 0:0:1:ff00:1.
		{"ff02::1:ff00:1", 0xffff, "ff12:601b:ffff:0000:0000:0001:ff00:0001"},
		{"ff02::1:ff00:1", 0x8001, "ff12:601b:8001:0000:0000:0001:ff00:0001"},
		// §4, broadcast group.
		{"", 0xffff, "ff12:401b:ffff:0000:0000:0000:ffff:ffff"},
		{"", 0x8001, "ff12:401b:8001:0000:0000:0000:ffff:ffff"},
		// §4, 255.255.255.255 uses the broadcast group.
		{"255.255.255.255", 0xffff, "ff12:401b:ffff:0000:0000:0000:ffff:ffff"},
	}
	for _, tc := range tests {
		var got GID
		switch {
		case tc.group == "":
			got = BroadcastMGID(tc.pkey, ScopeLinkLocal)
		case strings.Contains(tc.group, ":"):
			got = IPv6MGID(netip.MustParseAddr(tc.group), tc.pkey, ScopeLinkLocal)
		default:
			got = IPv4MGID(netip.MustParseAddr(tc.group), tc.pkey, ScopeLinkLocal)
		}
		want := GID(netip.MustParseAddr(tc.want).As16())
		if got != want {
			t.Errorf("MGID(%q, %s) = %s, want %s", tc.group, tc.pkey, got, want)
		}
		if MGIDPKey(got) != tc.pkey.Full() {
			t.Errorf("MGIDPKey(%s) = %s, want %s", got, MGIDPKey(got), tc.pkey.Full())
		}
	}
	// Scope goes into the low nibble of byte 1 (§4).
	if g := BroadcastMGID(0xffff, ScopeSiteLocal); g.String() != "ff15:401b:ffff::ffff:ffff" {
		t.Errorf("site-local broadcast = %s", g)
	}
}

func TestMGIDToMAC(t *testing.T) {
	tests := []struct {
		group string
		want  string
	}{
		{"224.0.0.1", "01:00:5e:00:00:01"},       // RFC 1112 §6.4
		{"239.1.2.3", "01:00:5e:01:02:03"},       // RFC 1112 §6.4
		{"239.129.2.3", "01:00:5e:01:02:03"},     // only 23 bits survive
		{"ff02::1", "33:33:00:00:00:01"},         // RFC 2464 §7
		{"ff02::1:ff00:1", "33:33:ff:00:00:01"},  // RFC 2464 §7
		{"ff15::1:2:3:4", "33:33:00:03:00:04"},   // RFC 2464 §7
		{"255.255.255.255", "ff:ff:ff:ff:ff:ff"}, // broadcast group
	}
	for _, tc := range tests {
		a := netip.MustParseAddr(tc.group)
		var g GID
		if a.Is4() {
			g = IPv4MGID(a, 0x8001, ScopeLinkLocal)
		} else {
			g = IPv6MGID(a, 0x8001, ScopeLinkLocal)
		}
		mac, ok := MGIDToMAC(g)
		if !ok || mac.String() != tc.want {
			t.Errorf("MGIDToMAC(%s) = %s, %v; want %s", g, mac, ok, tc.want)
		}
	}
	for _, s := range []string{"fe80::1", "ff02::1", "ff12:401b:ffff:1::1", "ff12:1234:ffff::1", "ff12:401b:ffff::f000:0001"} {
		if mac, ok := MGIDToMAC(GID(netip.MustParseAddr(s).As16())); ok {
			t.Errorf("MGIDToMAC(%s) = %s, want rejection", s, mac)
		}
	}
}

func TestHwAddr(t *testing.T) {
	gid := GID(netip.MustParseAddr("fe80::1:2").As16())
	a := MakeHwAddr(FlagConnected, 0x123456, gid)
	const want = "80:12:34:56:fe:80:00:00:00:00:00:00:00:00:00:00:00:01:00:02"
	if a.String() != want {
		t.Fatalf("String = %s, want %s", a, want)
	}
	if a.QPN() != 0x123456 || a.GID() != gid || a.Flags() != 0x80 {
		t.Fatalf("accessors: qpn %#x gid %s flags %#x", a.QPN(), a.GID(), a.Flags())
	}
	b, err := ParseHwAddr(want)
	if err != nil || b != a {
		t.Fatalf("ParseHwAddr = %s, %v", b, err)
	}
	if a.WithoutFlags().Flags() != 0 || a.WithoutFlags().QPN() != a.QPN() {
		t.Fatal("WithoutFlags changed more than the flags")
	}
	m := map[HwAddr]int{a: 1}
	if m[b] != 1 {
		t.Fatal("HwAddr not usable as a map key")
	}
	for _, bad := range []string{"", "00:11:22:33:44:55", want + ":00", "zz" + want[2:]} {
		if _, err := ParseHwAddr(bad); err == nil {
			t.Errorf("ParseHwAddr(%q) accepted", bad)
		}
	}
}

func TestHeader(t *testing.T) {
	b := make([]byte, 4)
	PutHeader(b, ether.TypeIPv6)
	if h := Header(b); !h.IsValid() || h.EtherType() != ether.TypeIPv6 || b[2] != 0 || b[3] != 0 {
		t.Fatalf("header %x", b)
	}
	if Header([]byte{8, 0, 0}).IsValid() || Header([]byte{8, 0, 0, 1}).IsValid() {
		t.Fatal("short header or non-zero reserved bits accepted")
	}
}

func TestPKey(t *testing.T) {
	tests := []struct {
		a, b PKey
		want bool
	}{
		{0xffff, 0xffff, true},
		{0xffff, 0x7fff, true},  // full and limited member
		{0x7fff, 0x7fff, false}, // two limited members
		{0x8001, 0x8002, false}, // different partitions
		{0x8001, 0x0001, true},
		{0x8000, 0x8000, false}, // invalid P_Key
		{0x0000, 0x8000, false},
	}
	for _, tc := range tests {
		if got := CanTalk(tc.a, tc.b); got != tc.want {
			t.Errorf("CanTalk(%s, %s) = %v", tc.a, tc.b, got)
		}
	}
	if p, err := ParsePKey("0x800a"); err != nil || p != 0x800a {
		t.Errorf("ParsePKey = %s, %v", p, err)
	}
	for _, s := range []string{"010", "0010"} { // decimal, not octal
		if p, err := ParsePKey(s); err != nil || p != 10 {
			t.Errorf("ParsePKey(%q) = %s, %v; want 0x000a", s, p, err)
		}
	}
	for _, bad := range []string{"0x8000", "0", "0x10000", "ten", "0b1010", "0o12", "0x80_0a", "1_0", "0x", "+10"} {
		if _, err := ParsePKey(bad); err == nil {
			t.Errorf("ParsePKey(%q) accepted", bad)
		}
	}
}

func TestIPMTU(t *testing.T) {
	if m, _ := IPMTU(2048); m != MTU2044 {
		t.Errorf("IPMTU(2048) = %d", m)
	}
	if m, _ := IPMTU(4096); m != MTU4092 {
		t.Errorf("IPMTU(4096) = %d", m)
	}
	if _, err := IPMTU(1500); err == nil {
		t.Error("IPMTU(1500) accepted")
	}
}

func FuzzParseHwAddr(f *testing.F) {
	f.Add("80:12:34:56:fe:80:00:00:00:00:00:00:00:00:00:00:00:01:00:02")
	f.Add("00:00:00:00:00:00")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseHwAddr(s)
		if err != nil {
			return
		}
		b, err := ParseHwAddr(a.String())
		if err != nil || b != a {
			t.Fatalf("round trip of %q: %s, %v", s, b, err)
		}
	})
}

func FuzzMGIDToMAC(f *testing.F) {
	for _, g := range []GID{
		BroadcastMGID(0xffff, 2),
		IPv6MGID(netip.MustParseAddr("ff02::1"), 0xffff, 2),
		IPv4MGID(netip.MustParseAddr("239.1.2.3"), 0x8001, 2),
	} {
		f.Add(g[:])
	}
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		var g GID
		copy(g[:], b)
		mac, ok := MGIDToMAC(g)
		if ok && !mac.IsMulticast() {
			t.Fatalf("MGIDToMAC(%s) = unicast %s", g, mac)
		}
	})
}

func FuzzHeader(f *testing.F) {
	f.Add([]byte{0x08, 0x00, 0, 0})
	f.Add([]byte{0x86, 0xdd, 0, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := Header(b)
		if !h.IsValid() {
			return
		}
		c := make([]byte, 4)
		PutHeader(c, h.EtherType())
		if string(c) != string(b[:4]) {
			t.Fatalf("header %x re-encodes as %x", b[:4], c)
		}
	})
}

func TestQPTable(t *testing.T) {
	tbl := NewQPTable(0)
	q, err := tbl.Alloc(0xffff, 0)
	if err != nil || q < 2 {
		t.Fatalf("first QPN %#x, %v (0 and 1 are special)", q, err)
	}
	if h, _ := tbl.Alloc(0x8001, 0x4242); h != 0x4242 {
		t.Fatalf("hint not honoured: %#x", h)
	}
	if h, _ := tbl.Alloc(0x8001, 0x4242); h == 0x4242 {
		t.Fatal("hint honoured twice")
	}
	if h, _ := tbl.Alloc(0xffff, MulticastQPN); h == MulticastQPN {
		t.Fatal("multicast QPN handed out")
	}
	if p, ok := tbl.PKey(0x4242); !ok || p != 0x8001 {
		t.Fatalf("PKey = %s, %v", p, ok)
	}
	if _, err := tbl.Alloc(0x8000, 0); err == nil {
		t.Fatal("invalid P_Key accepted")
	}
	if err := tbl.Free(0x4242); err != nil || tbl.Free(0x4242) == nil {
		t.Fatal("Free twice")
	}
	if _, ok := tbl.PKey(0x4242); ok {
		t.Fatal("freed QP still known")
	}
}

func TestGroupTable(t *testing.T) {
	tbl := NewGroupTable()
	g := BroadcastMGID(0xffff, ScopeLinkLocal)
	attached, detached := 0, 0
	attach := func() error { attached++; return nil }
	detach := func() error { detached++; return nil }
	if err := tbl.JoinSendOnly(g); err != nil || !tbl.SendOnly(g) || tbl.Full(g) {
		t.Fatal("send-only join")
	}
	tbl.Join(g, attach)
	tbl.Join(g, attach)
	if attached != 1 || !tbl.Full(g) || tbl.SendOnly(g) {
		t.Fatalf("full join: attached %d", attached)
	}
	tbl.JoinSendOnly(g) // a full member stays one
	if tbl.SendOnly(g) {
		t.Fatal("full membership downgraded")
	}
	tbl.Leave(g, detach)
	tbl.Leave(g, detach)
	if detached != 1 || tbl.Full(g) {
		t.Fatalf("leave: detached %d", detached)
	}
	if err := tbl.Join(GID{0xfe, 0x80}, nil); err == nil {
		t.Fatal("unicast GID joined")
	}
	if err := tbl.Join(g, func() error { return ErrNoQPN }); err == nil || tbl.Full(g) {
		t.Fatal("failed attach recorded as a membership")
	}
}
