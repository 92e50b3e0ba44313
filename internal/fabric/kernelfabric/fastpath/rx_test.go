package fastpath

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/nstest"
)

const (
	rxChild    = 4343 // the IPoIB child the packets arrive on
	rxTAP      = 4444 // the guest's TAP, the redirect target
	rxTAPMTU   = 1500
	otherChild = rxChild + 1
)

var (
	// The senders of the ipv4 and ipv6 helpers' packets, and one known
	// only to another child.
	sender4     = netip.MustParseAddr("10.0.0.1")
	sender6     = netip.MustParseAddr("fd00::1")
	otherSender = netip.MustParseAddr("10.0.0.7")
)

// loadRX loads the RX program with one guest behind rxChild and the two
// senders, or fails (never skips) under EIPOIB_REQUIRE_NETNS=1 without
// root.
func loadRX(t testing.TB) *RX {
	t.Helper()
	nstest.RequireRoot(t)
	rx, err := LoadRX()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.Close() })
	if err := rx.PutGuest(rxChild, RXGuest{MAC: guestMAC, TAP: rxTAP, MTU: rxTAPMTU}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		child uint32
		ip    netip.Addr
	}{{rxChild, sender4}, {rxChild, sender6}, {otherChild, otherSender}} {
		if err := rx.PutSender(s.child, s.ip, remac); err != nil {
			t.Fatal(err)
		}
	}
	return rx
}

// ipoibRX is a packet as the RX program sees it at the child's tc
// ingress: the 20-byte pseudo header, the IPoIB header, L3. ipoib zeroes
// the pseudo header and sets skb->protocol from the IPoIB header;
// bpf_prog_test_run_skb instead takes skb->protocol (eth_type_trans) and
// pkt_type from the first 14 bytes, so the pseudo header carries the
// EtherType at bytes 12-13 and dst as bytes 0-5 (zero: PACKET_HOST, the
// loopback device's address). The program reads neither.
func ipoibRX(dst []byte, typ uint16, l3 []byte) []byte {
	f := make([]byte, 24, 24+len(l3))
	copy(f, dst)
	binary.BigEndian.PutUint16(f[12:], typ)
	binary.BigEndian.PutUint16(f[20:], typ)
	return append(f, l3...)
}

// rxCtx is a struct __sk_buff with the receiving child as
// ingress_ifindex (skb->skb_iif, which convert___skb_to_skb copies) and
// the given gso_size.
func rxCtx(child, gsoSize uint32) []byte {
	c := skbCtx(gsoSize, 0)
	if gsoSize != 0 {
		c = skbCtx(gsoSize, 2)
	}
	binary.NativeEndian.PutUint32(c[36:], child)
	return c
}

// withDst returns an IP packet with its destination address replaced.
func withDst(l3 []byte, dst netip.Addr) []byte {
	out := append([]byte{}, l3...)
	if dst.Is4() {
		a := dst.As4()
		copy(out[16:20], a[:])
	} else {
		a := dst.As16()
		copy(out[24:40], a[:])
	}
	return out
}

// withSrc returns an IPv4 packet with its source address replaced.
func withSrc(l3 []byte, src netip.Addr) []byte {
	out := append([]byte{}, l3...)
	a := src.As4()
	copy(out[12:16], a[:])
	return out
}

func TestRXVerdicts(t *testing.T) {
	rx := loadRX(t)
	var unicast []byte // zero: PACKET_HOST in TEST_RUN
	tcp4 := ipv4(0x4000, 6, tcp(100))
	tcp6 := ipv6(6, tcp(100))
	echo6 := ipv6(58, append(icmpv6(128), make([]byte, 56)...))
	atMTU := ipv4(0, 17, udp(40000, 5201, rxTAPMTU-28))
	overMTU := ipv4(0, 17, udp(40000, 5201, rxTAPMTU-27))
	// bpf_skb_adjust_room shrinks an IPv4 packet of at least 30 bytes,
	// an IPv6 one of at least 50.
	short4 := ipv4(0, 1, make([]byte, 10))
	tooShort4 := ipv4(0, 1, make([]byte, 9))
	short6 := ipv6(59, make([]byte, 10))
	tooShort6 := ipv6(59, make([]byte, 9))
	super := ipv4(0x4000, 6, tcp(2900))

	cases := []struct {
		name   string
		frame  []byte
		ctx    []byte // rxCtx(rxChild, 0) when nil
		reason RXReason
		want   []byte // the Ethernet frame for RXRedirected
	}{
		{name: "ipv4 tcp", frame: ipoibRX(unicast, 0x0800, tcp4), reason: RXRedirected, want: eth(guestMAC, remac, 0x0800, tcp4)},
		{name: "ipv6 tcp", frame: ipoibRX(unicast, 0x86dd, tcp6), reason: RXRedirected, want: eth(guestMAC, remac, 0x86dd, tcp6)},
		{name: "ipv6 echo", frame: ipoibRX(unicast, 0x86dd, echo6), reason: RXRedirected, want: eth(guestMAC, remac, 0x86dd, echo6)},
		{name: "ipv4 fragment", frame: ipoibRX(unicast, 0x0800, ipv4(0x2000, 17, udp(5000, 5001, 100))), reason: RXRedirected, want: eth(guestMAC, remac, 0x0800, ipv4(0x2000, 17, udp(5000, 5001, 100)))},
		{name: "ipv4 at tap mtu", frame: ipoibRX(unicast, 0x0800, atMTU), reason: RXRedirected, want: eth(guestMAC, remac, 0x0800, atMTU)},
		{name: "ipv4 over tap mtu", frame: ipoibRX(unicast, 0x0800, overMTU), reason: RXFallbackTooBig},
		{name: "ipv4 shortest shrinkable", frame: ipoibRX(unicast, 0x0800, short4), reason: RXRedirected, want: eth(guestMAC, remac, 0x0800, short4)},
		{name: "ipv4 too short to shrink", frame: ipoibRX(unicast, 0x0800, tooShort4), reason: RXFallbackShort},
		{name: "ipv6 shortest shrinkable", frame: ipoibRX(unicast, 0x86dd, short6), reason: RXRedirected, want: eth(guestMAC, remac, 0x86dd, short6)},
		{name: "ipv6 too short to shrink", frame: ipoibRX(unicast, 0x86dd, tooShort6), reason: RXFallbackShort},
		// TEST_RUN leaves gso_type 0, which bpf_skb_net_shrink refuses
		// as it refuses UFO: the packet must come back unchanged.
		{name: "gso type adjust_room refuses", frame: ipoibRX(unicast, 0x0800, super), ctx: rxCtx(rxChild, 1400), reason: RXFallbackShrink},
		{name: "arp", frame: ipoibRX(unicast, 0x0806, make([]byte, 56)), reason: RXFallbackARP},
		{name: "not ip", frame: ipoibRX(unicast, 0x88cc, make([]byte, 46)), reason: RXFallbackNotIP},
		{name: "ib multicast", frame: ipoibRX([]byte{0x01, 0, 0x5e, 0, 0, 1}, 0x0800, tcp4), reason: RXFallbackMulticast},
		{name: "ib broadcast", frame: ipoibRX([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0800, tcp4), reason: RXFallbackMulticast},
		{name: "ipv4 group destination", frame: ipoibRX(unicast, 0x0800, withDst(tcp4, netip.MustParseAddr("224.0.0.251"))), reason: RXFallbackMulticast},
		{name: "ipv4 limited broadcast", frame: ipoibRX(unicast, 0x0800, withDst(tcp4, netip.MustParseAddr("255.255.255.255"))), reason: RXFallbackMulticast},
		{name: "ipv6 group destination", frame: ipoibRX(unicast, 0x86dd, withDst(tcp6, netip.MustParseAddr("ff02::1"))), reason: RXFallbackMulticast},
		{name: "nd neighbour solicitation", frame: ipoibRX(unicast, 0x86dd, ipv6(58, append(icmpv6(135), make([]byte, 40)...))), reason: RXFallbackND},
		{name: "nd router advertisement", frame: ipoibRX(unicast, 0x86dd, ipv6(58, append(icmpv6(134), make([]byte, 40)...))), reason: RXFallbackND},
		{name: "dhcp reply", frame: ipoibRX(unicast, 0x0800, ipv4(0, 17, udp(67, 68, 300))), reason: RXFallbackDHCP},
		{name: "dhcpv6 reply", frame: ipoibRX(unicast, 0x86dd, ipv6(17, udp(547, 546, 40))), reason: RXFallbackDHCPv6},
		{name: "ipv6 hop-by-hop", frame: ipoibRX(unicast, 0x86dd, ipv6(0, make([]byte, 16))), reason: RXFallbackIPv6Ext},
		{name: "unknown child", frame: ipoibRX(unicast, 0x0800, tcp4), ctx: rxCtx(999, 0), reason: RXFallbackUnknownGuest},
		{name: "unknown sender", frame: ipoibRX(unicast, 0x0800, withSrc(tcp4, netip.MustParseAddr("10.0.0.9"))), reason: RXFallbackUnknownSender},
		{name: "sender known to another child", frame: ipoibRX(unicast, 0x0800, withSrc(tcp4, otherSender)), reason: RXFallbackUnknownSender},
		{name: "ipv4 bad ihl", frame: ipoibRX(unicast, 0x0800, append([]byte{0x44}, make([]byte, 40)...)), reason: RXFallbackMalformed},
		{name: "ipv6 says version 4", frame: ipoibRX(unicast, 0x86dd, append([]byte{0x40}, make([]byte, 40)...)), reason: RXFallbackMalformed},
		{name: "udp header missing", frame: ipoibRX(unicast, 0x0800, ipv4(0, 17, []byte{0, 67})), reason: RXFallbackMalformed},
		{name: "skb protocol not the ipoib header's", frame: func() []byte {
			f := ipoibRX(unicast, 0x0800, tcp6)
			binary.BigEndian.PutUint16(f[20:], 0x86dd)
			return f
		}(), reason: RXFallbackMalformed},
		{name: "link header truncated", frame: ipoibRX(unicast, 0x88cc, nil)[:20], reason: RXFallbackMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := c.ctx
			if ctx == nil {
				ctx = rxCtx(rxChild, 0)
			}
			want := c.frame
			if c.reason == RXRedirected {
				want = c.want
			}
			checkRun(t, rxUnderTest(t, rx), c.frame, ctx,
				int(c.reason), c.reason == RXRedirected, want, rxTAP)
		})
	}
}

func rxUnderTest(t *testing.T, rx *RX) progUnderTest {
	return progUnderTest{rx.Program, rx.LastRedirect,
		func() ([]uint64, error) { c, err := rx.Counts(); return c[:], err },
		func() [2]uint64 {
			m := must(t)
			return [2]uint64{m(rx.ChildHits(rxChild)),
				m(rx.SenderHits(rxChild, sender4)) + m(rx.SenderHits(rxChild, sender6)) + m(rx.SenderHits(otherChild, otherSender))}
		}}
}

// TestRXDelete checks that deleting a sender and then the guest turns
// the same packet from a redirect into those two fallbacks.
func TestRXDelete(t *testing.T) {
	rx := loadRX(t)
	l3 := ipv4(0x4000, 6, tcp(100))
	p := rxUnderTest(t, rx)
	frame, ctx := ipoibRX(nil, 0x0800, l3), rxCtx(rxChild, 0)
	checkRun(t, p, frame, ctx, int(RXRedirected), true, eth(guestMAC, remac, 0x0800, l3), rxTAP)
	if err := rx.DeleteSender(rxChild, sender4); err != nil {
		t.Fatal(err)
	}
	checkRun(t, p, frame, ctx, int(RXFallbackUnknownSender), false, frame, 0)
	if err := rx.DeleteGuest(rxChild); err != nil {
		t.Fatal(err)
	}
	checkRun(t, p, frame, ctx, int(RXFallbackUnknownGuest), false, frame, 0)
}

// TestRXSenderKeys checks the typed API's keys: IPv4 and IPv4-mapped
// IPv6 name the same sender, a zone or a bad MAC is refused.
func TestRXSenderKeys(t *testing.T) {
	a, err := sender(7, netip.MustParseAddr("10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := sender(7, netip.MustParseAddr("::ffff:10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	want := senderKey{Child: 7, Addr: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}
	if a != want || b != want {
		t.Errorf("keys %v and %v, want %v", a, b, want)
	}
	if _, err := sender(7, netip.MustParseAddr("fe80::1%eth0")); err == nil {
		t.Error("a zoned address was accepted")
	}
	if _, err := sender(7, netip.Addr{}); err == nil {
		t.Error("the zero address was accepted")
	}
	rx := loadRX(t)
	if err := rx.PutSender(rxChild, sender4, remac[:5]); err == nil {
		t.Error("a 5-byte REMAC was accepted")
	}
	if err := rx.PutGuest(rxChild, RXGuest{MAC: guestMAC[:4]}); err == nil {
		t.Error("a 4-byte guest MAC was accepted")
	}
}

func TestRXReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range NumRXReasons {
		n := r.String()
		if n == "" || seen[n] {
			t.Errorf("reason %d has name %q, empty or repeated", r, n)
		}
		seen[n] = true
	}
	if got := NumRXReasons.String(); got != "rx_reason(15)" {
		t.Errorf("NumRXReasons.String() = %q", got)
	}
}

// TestRXMapLayouts checks the Go types of both programs' map values
// against the offsets and sizes the programs and the map specs use.
func TestRXMapLayouts(t *testing.T) {
	var g rxGuest
	if got := [4]uintptr{unsafe.Offsetof(g.TAP), unsafe.Offsetof(g.MTU), unsafe.Offsetof(g.Hits), unsafe.Sizeof(g)}; got != [4]uintptr{rxGuestTAPOff, rxMTUOff, rxGuestHitsOff, 24} {
		t.Errorf("rxGuest TAP, MTU, Hits offsets and size %v, want [8 12 16 24]", got)
	}
	var s senderVal
	if got := [2]uintptr{unsafe.Offsetof(s.Hits), unsafe.Sizeof(s)}; got != [2]uintptr{senderHitsOff, 16} {
		t.Errorf("senderVal Hits offset and size %v, want [8 16]", got)
	}
	var tg txGuest
	if got := [2]uintptr{unsafe.Offsetof(tg.Hits), unsafe.Sizeof(tg)}; got != [2]uintptr{txGuestHitsOff, 16} {
		t.Errorf("txGuest Hits offset and size %v, want [8 16]", got)
	}
	var tr txREMAC
	if got := [2]uintptr{unsafe.Offsetof(tr.Hits), unsafe.Sizeof(tr)}; got != [2]uintptr{txREMACHitsOff, 32} {
		t.Errorf("txREMAC Hits offset and size %v, want [24 32]", got)
	}
	if n := binary.Size(senderKey{}); n != 20 {
		t.Errorf("senderKey is %d bytes, want 20", n)
	}
}

// TestRXHits: N redirected packets add exactly N to the child's and to
// their sender's hit counts, and nothing to the other senders'; N that
// fall back (ARP, too big, an unknown sender), none.
func TestRXHits(t *testing.T) {
	rx := loadRX(t)
	run := func(frame []byte, n int) {
		t.Helper()
		// One run each: Repeat would run the program again on the
		// frame it rewrote.
		for range n {
			if _, err := rx.Program.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64), Context: rxCtx(rxChild, 0)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	m := must(t)
	check := func(child, s4, s6 uint64) {
		t.Helper()
		got := [4]uint64{m(rx.ChildHits(rxChild)), m(rx.SenderHits(rxChild, sender4)), m(rx.SenderHits(rxChild, sender6)), m(rx.SenderHits(otherChild, otherSender))}
		if want := [4]uint64{child, s4, s6, 0}; got != want {
			t.Errorf("hits child, sender4, sender6, other %v; want %v", got, want)
		}
	}
	check(0, 0, 0)
	run(ipoibRX(nil, 0x0800, ipv4(0x4000, 6, tcp(100))), 5)
	check(5, 5, 0)
	run(ipoibRX(nil, 0x86dd, ipv6(6, tcp(100))), 3)
	check(8, 5, 3)
	run(ipoibRX(nil, 0x0806, make([]byte, 56)), 4)
	run(ipoibRX(nil, 0x0800, ipv4(0, 17, udp(40000, 5201, rxTAPMTU-27))), 4)
	run(ipoibRX(nil, 0x0800, withSrc(ipv4(0x4000, 6, tcp(100)), otherSender)), 4)
	check(8, 5, 3)
	if got, err := rx.Counts(); err != nil || got[RXRedirected] != 8 {
		t.Errorf("redirected %d (%v), want 8", got[RXRedirected], err)
	}
	if h := m(rx.ChildHits(otherChild)); h != 0 {
		t.Errorf("a child with no guest has %d hits", h)
	}
}
