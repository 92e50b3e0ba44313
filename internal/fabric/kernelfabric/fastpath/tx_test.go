package fastpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/ipoib"
)

var (
	guestMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	remac    = net.HardwareAddr{0x02, 0x00, 0x00, 0xab, 0xcd, 0xef}
	strayMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x99, 0x99}
	remoteIB = ipoib.HwAddr{0x00, 0x00, 0x12, 0x34, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}
)

const (
	childIfindex = 4242
	childMTU     = 2044
	tcActRedir   = 7 // TC_ACT_REDIRECT
)

// loadTX loads the program with one guest and one REMAC, or fails (never
// skips) under EIPOIB_REQUIRE_NETNS=1 without root.
func loadTX(t testing.TB) *TX {
	t.Helper()
	nstest.Require(t)
	tx, err := LoadTX()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Close() })
	if err := tx.PutGuest(guestMAC, Guest{Ifindex: childIfindex, MTU: childMTU}); err != nil {
		t.Fatal(err)
	}
	if err := tx.PutREMAC(remac, remoteIB); err != nil {
		t.Fatal(err)
	}
	return tx
}

func eth(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := append(append(append([]byte{}, dst...), src...), byte(typ>>8), byte(typ))
	return append(f, payload...)
}

// ipv4 is a 20-byte IPv4 header (no checksum: the program never reads
// it) with the given fragment field and protocol, then payload.
func ipv4(frag uint16, proto byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8], h[9] = 64, proto
	copy(h[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	return append(h, payload...)
}

func ipv6(next byte, payload []byte) []byte {
	h := make([]byte, 40, 40+len(payload))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h[6], h[7] = next, 64
	h[8], h[23] = 0xfd, 1
	h[24], h[39] = 0xfd, 2
	return append(h, payload...)
}

func udp(sport, dport uint16, n int) []byte {
	u := make([]byte, 8+n)
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+n))
	return u
}

// tcp is a TCP segment whose header carries 12 bytes of options
// (doff 8, 32 bytes) and n payload bytes.
func tcp(n int) []byte {
	s := make([]byte, 32+n)
	binary.BigEndian.PutUint16(s[0:], 40000)
	binary.BigEndian.PutUint16(s[2:], 5201)
	s[12] = 8 << 4
	for i := 32; i < len(s); i++ {
		s[i] = byte(i)
	}
	return s
}

func icmpv6(typ byte) []byte { return []byte{typ, 0, 0, 0, 0, 0, 0, 0} }

// skbCtx is a struct __sk_buff for BPF_PROG_TEST_RUN; convert___skb_to_skb
// (net/bpf/test_run.c) copies gso_segs and gso_size into skb_shinfo.
func skbCtx(gsoSize, gsoSegs uint32) []byte {
	c := make([]byte, 192)
	binary.NativeEndian.PutUint32(c[164:], gsoSegs)
	binary.NativeEndian.PutUint32(c[176:], gsoSize)
	return c
}

// ipoibFrame is what the program must emit for an Ethernet frame of the
// given EtherType and L3 packet.
func ipoibFrame(typ uint16, l3 []byte) []byte {
	f := append(remoteIB[:], byte(typ>>8), byte(typ), 0, 0)
	return append(f, l3...)
}

func TestTXVerdicts(t *testing.T) {
	tx := loadTX(t)

	dhcpDiscover := ipv4(0, 17, udp(68, 67, 300))
	tcp4 := ipv4(0x4000, 6, tcp(100)) // DF set: not a fragment
	tcp6 := ipv6(6, tcp(100))
	// A TSO super-frame: 20 + 32 + 2900 bytes, segments of 1400.
	super := ipv4(0x4000, 6, tcp(2900))
	// gso_size whose segment is exactly the MTU, and one byte over.
	gsoFits := childMTU - 20 - 32
	v4vlan := append([]byte{0x00, 0x05, 0x08, 0x00}, tcp4...)
	// A guest's VXLAN TSO frame (SKB_GSO_UDP_TUNNEL): gso_size 2000
	// counts only the inner TCP payload, so each segment is 2000 + 102
	// bytes of outer, VXLAN and inner headers, over the MTU, although
	// outer IPv4 + UDP + gso_size (2028) is not.
	vxlan := append([]byte{0x08, 0, 0, 0, 0, 0, 42, 0}, eth(remac, guestMAC, 0x0800, ipv4(0x4000, 6, tcp(2900)))...)
	tunnel := ipv4(0x4000, 17, append(udp(41000, 4789, 0), vxlan...))
	udpAtMTU := ipv4(0, 17, udp(40000, 5201, childMTU-28))
	udpOverMTU := ipv4(0, 17, udp(40000, 5201, childMTU-27))
	// IPv6 UDP GSO leaves room for the fragment header of UFO.
	udp6Fits := ipv6(17, udp(40000, 5201, childMTU-8-48))
	udp6Over := ipv6(17, udp(40000, 5201, childMTU-8-47))

	cases := []struct {
		name   string
		frame  []byte
		ctx    []byte
		reason Reason
		want   []byte // output for Redirected; the input itself otherwise
	}{
		{name: "ipv4 tcp", frame: eth(remac, guestMAC, 0x0800, tcp4), reason: Redirected, want: ipoibFrame(0x0800, tcp4)},
		{name: "ipv6 tcp", frame: eth(remac, guestMAC, 0x86dd, tcp6), reason: Redirected, want: ipoibFrame(0x86dd, tcp6)},
		{name: "ipv6 icmp echo", frame: eth(remac, guestMAC, 0x86dd, ipv6(58, icmpv6(128))), reason: Redirected, want: ipoibFrame(0x86dd, ipv6(58, icmpv6(128)))},
		{name: "ipv4 at mtu", frame: eth(remac, guestMAC, 0x0800, udpAtMTU), reason: Redirected, want: ipoibFrame(0x0800, udpAtMTU)},
		{name: "ipv4 over mtu", frame: eth(remac, guestMAC, 0x0800, udpOverMTU), reason: FallbackTooBig},
		{name: "gso segment at mtu", frame: eth(remac, guestMAC, 0x0800, super), ctx: skbCtx(uint32(gsoFits), 2), reason: Redirected, want: ipoibFrame(0x0800, super)},
		{name: "gso segment over mtu", frame: eth(remac, guestMAC, 0x0800, super), ctx: skbCtx(uint32(gsoFits+1), 2), reason: FallbackTooBig},
		{name: "gso ipv6 tcp", frame: eth(remac, guestMAC, 0x86dd, ipv6(6, tcp(2900))), ctx: skbCtx(1400, 3), reason: Redirected, want: ipoibFrame(0x86dd, ipv6(6, tcp(2900)))},
		{name: "gso udp tunnel segment over mtu", frame: eth(remac, guestMAC, 0x0800, tunnel), ctx: skbCtx(2000, 2), reason: FallbackTooBig},
		{name: "gso udp whole packet at mtu", frame: eth(remac, guestMAC, 0x0800, udpAtMTU), ctx: skbCtx(1000, 3), reason: Redirected, want: ipoibFrame(0x0800, udpAtMTU)},
		{name: "gso udp whole packet over mtu", frame: eth(remac, guestMAC, 0x0800, udpOverMTU), ctx: skbCtx(1000, 3), reason: FallbackTooBig},
		{name: "gso ipv6 udp with room for a fragment header", frame: eth(remac, guestMAC, 0x86dd, udp6Fits), ctx: skbCtx(1000, 2), reason: Redirected, want: ipoibFrame(0x86dd, udp6Fits)},
		{name: "gso ipv6 udp without room for a fragment header", frame: eth(remac, guestMAC, 0x86dd, udp6Over), ctx: skbCtx(1000, 2), reason: FallbackTooBig},
		{name: "gso neither tcp nor udp", frame: eth(remac, guestMAC, 0x0800, ipv4(0, 47, make([]byte, 2900))), ctx: skbCtx(1400, 3), reason: FallbackTooBig},
		{name: "arp", frame: eth(remac, guestMAC, 0x0806, make([]byte, 28)), reason: FallbackARP},
		{name: "arp broadcast", frame: eth(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, guestMAC, 0x0806, make([]byte, 28)), reason: FallbackARP},
		{name: "nd neighbour advertisement", frame: eth(remac, guestMAC, 0x86dd, ipv6(58, icmpv6(136))), reason: FallbackND},
		{name: "nd router solicitation", frame: eth(remac, guestMAC, 0x86dd, ipv6(58, icmpv6(133))), reason: FallbackND},
		{name: "nd redirect", frame: eth(remac, guestMAC, 0x86dd, ipv6(58, icmpv6(137))), reason: FallbackND},
		{name: "dhcp unicast", frame: eth(remac, guestMAC, 0x0800, dhcpDiscover), reason: FallbackDHCP},
		{name: "dhcp server reply", frame: eth(remac, guestMAC, 0x0800, ipv4(0, 17, udp(67, 68, 300))), reason: FallbackDHCP},
		{name: "dhcpv6", frame: eth(remac, guestMAC, 0x86dd, ipv6(17, udp(546, 547, 40))), reason: FallbackDHCPv6},
		{name: "vlan", frame: eth(remac, guestMAC, 0x8100, v4vlan), reason: FallbackVLAN},
		{name: "qinq", frame: eth(remac, guestMAC, 0x88a8, v4vlan), reason: FallbackVLAN},
		{name: "broadcast ipv4", frame: eth(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, guestMAC, 0x0800, dhcpDiscover), reason: FallbackMulticast},
		{name: "ipv6 multicast", frame: eth(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, guestMAC, 0x86dd, tcp6), reason: FallbackMulticast},
		{name: "unknown guest", frame: eth(remac, strayMAC, 0x0800, tcp4), reason: FallbackUnknownGuest},
		{name: "unknown remac", frame: eth(strayMAC, guestMAC, 0x0800, tcp4), reason: FallbackUnknownREMAC},
		{name: "not ip", frame: eth(remac, guestMAC, 0x88cc, make([]byte, 46)), reason: FallbackNotIP},
		{name: "ipv4 fragment offset", frame: eth(remac, guestMAC, 0x0800, ipv4(0x0010, 17, udp(5000, 5001, 8))), reason: FallbackFragment},
		// The flags/offset half-word differs between byte orders: offset
		// 0x40 reads as DF (0x4000) when the program swaps wrongly, and
		// DF alone (the tcp cases) as offset 0x40; offset 0xc0 has only
		// bits that a mask written for the other order drops.
		{name: "ipv4 fragment offset 0x40", frame: eth(remac, guestMAC, 0x0800, ipv4(0x0040, 17, udp(5000, 5001, 8))), reason: FallbackFragment},
		{name: "ipv4 fragment offset 0xc0", frame: eth(remac, guestMAC, 0x0800, ipv4(0x00c0, 17, udp(5000, 5001, 8))), reason: FallbackFragment},
		{name: "ipv4 more fragments", frame: eth(remac, guestMAC, 0x0800, ipv4(0x2000, 6, tcp(8))), reason: FallbackFragment},
		{name: "ipv6 fragment header", frame: eth(remac, guestMAC, 0x86dd, ipv6(44, make([]byte, 16))), reason: FallbackIPv6Ext},
		{name: "ipv6 hop-by-hop", frame: eth(remac, guestMAC, 0x86dd, ipv6(0, make([]byte, 16))), reason: FallbackIPv6Ext},
		{name: "ipv4 bad ihl", frame: eth(remac, guestMAC, 0x0800, append([]byte{0x44}, make([]byte, 40)...)), reason: FallbackMalformed},
		{name: "ipv6 says version 4", frame: eth(remac, guestMAC, 0x86dd, append([]byte{0x40}, make([]byte, 40)...)), reason: FallbackMalformed},
		{name: "udp header missing", frame: eth(remac, guestMAC, 0x0800, ipv4(0, 17, []byte{0, 67})), reason: FallbackMalformed},
		// bpf_prog_test_run_skb refuses an IP frame shorter than its IP
		// header (EINVAL), so a truncated L4 header stands for it.
		{name: "tcp header truncated under gso", frame: eth(remac, guestMAC, 0x0800, ipv4(0, 6, make([]byte, 12))), ctx: skbCtx(1400, 2), reason: FallbackMalformed},
		{name: "ethernet header only", frame: eth(remac, guestMAC, 0x88cc, nil), reason: FallbackNotIP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.frame
			if c.reason == Redirected {
				want = c.want
			}
			checkRun(t, txUnderTest(t, tx), c.frame, c.ctx,
				int(c.reason), c.reason == Redirected, want, childIfindex)
		})
	}
}

// progUnderTest is a loaded program, its redirect-target map, its
// summed counters, and the hit counts of the test guest's entry and of
// the other side's entries (summed: the REMAC, or every sender).
type progUnderTest struct {
	prog   *ebpf.Program
	last   *ebpf.Map
	counts func() ([]uint64, error)
	hits   func() [2]uint64
}

func txUnderTest(t *testing.T, tx *TX) progUnderTest {
	return progUnderTest{tx.Program, tx.LastRedirect,
		func() ([]uint64, error) { c, err := tx.Counts(); return c[:], err },
		func() [2]uint64 { return [2]uint64{must(t)(tx.GuestHits(guestMAC)), must(t)(tx.REMACHits(remac))} }}
}

// must returns a function that fails t on an error and passes the value on.
func must(t *testing.T) func(uint64, error) uint64 {
	return func(v uint64, err error) uint64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// checkRun runs frame (with the __sk_buff ctx, if any) through p with
// BPF_PROG_TEST_RUN and checks the verdict (TC_ACT_REDIRECT to target
// when redirected, TC_ACT_OK otherwise), the exact output bytes, the
// recorded redirect target, that the counter at index reason, and only
// it, moved by one, and that the hit counts of the guest and of the other
// side each moved by one for a redirect and not at all otherwise.
func checkRun(t *testing.T, p progUnderTest, frame, ctx []byte, reason int, redirected bool, want []byte, target uint32) {
	t.Helper()
	if err := p.last.Put(uint32(0), make([]uint32, ebpf.MustPossibleCPU())); err != nil {
		t.Fatal(err)
	}
	before, err := p.counts()
	if err != nil {
		t.Fatal(err)
	}
	hitsBefore := p.hits()
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}
	if ctx != nil {
		opts.Context = ctx
	}
	ret, err := p.prog.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	after, err := p.counts()
	if err != nil {
		t.Fatal(err)
	}
	for r := range after {
		w := before[r]
		if r == reason {
			w++
		}
		if after[r] != w {
			t.Errorf("counter %d = %d, want %d", r, after[r], w)
		}
	}
	wantHits := hitsBefore
	if redirected {
		wantHits[0]++
		wantHits[1]++
	}
	if got := p.hits(); got != wantHits {
		t.Errorf("hit counts (guest, other side) %v, want %v", got, wantHits)
	}
	var targets []uint32
	if err := p.last.Lookup(uint32(0), &targets); err != nil {
		t.Fatal(err)
	}
	var got uint32
	for _, v := range targets {
		got |= v
	}
	wantRet, wantTarget := uint32(tcActOK), uint32(0)
	if redirected {
		wantRet, wantTarget = tcActRedir, target
	}
	if ret != wantRet {
		t.Errorf("verdict %d, want %d", ret, wantRet)
	}
	if got != wantTarget {
		t.Errorf("redirect target %d, want %d", got, wantTarget)
	}
	if !bytes.Equal(opts.DataOut, want) {
		t.Errorf("output %d bytes, want %d:\n got %x\nwant %x", len(opts.DataOut), len(want), head(opts.DataOut), head(want))
	}
}

func head(b []byte) []byte { return b[:min(len(b), 64)] }

// TestTXDelete checks that deleting the REMAC and then the guest turns
// the same frame from a redirect into those two fallbacks.
func TestTXDelete(t *testing.T) {
	tx := loadTX(t)
	l3 := ipv4(0x4000, 6, tcp(100))
	p := txUnderTest(t, tx)
	frame := eth(remac, guestMAC, 0x0800, l3)
	checkRun(t, p, frame, nil, int(Redirected), true, ipoibFrame(0x0800, l3), childIfindex)
	if err := tx.DeleteREMAC(remac); err != nil {
		t.Fatal(err)
	}
	checkRun(t, p, frame, nil, int(FallbackUnknownREMAC), false, frame, 0)
	if err := tx.DeleteGuest(guestMAC); err != nil {
		t.Fatal(err)
	}
	checkRun(t, p, frame, nil, int(FallbackUnknownGuest), false, frame, 0)
	if err := tx.DeleteGuest(guestMAC[:5]); err == nil {
		t.Error("a 5-byte MAC was accepted")
	}
}

// TestTXCountsPerFrame checks that the counters count frames, not runs of
// the test: three runs of one frame add exactly three.
func TestTXCountsPerFrame(t *testing.T) {
	tx := loadTX(t)
	frame := eth(remac, guestMAC, 0x0806, make([]byte, 28))
	if _, err := tx.Program.Run(&ebpf.RunOptions{Data: frame, Repeat: 3}); err != nil {
		t.Fatal(err)
	}
	got, err := tx.Counts()
	if err != nil {
		t.Fatal(err)
	}
	want := [NumReasons]uint64{FallbackARP: 3}
	if got != want {
		t.Errorf("counts %v, want %v", got, want)
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range NumReasons {
		n := r.String()
		if n == "" || seen[n] {
			t.Errorf("reason %d has name %q, empty or repeated", r, n)
		}
		seen[n] = true
	}
	if got := NumReasons.String(); got != "reason(16)" {
		t.Errorf("NumReasons.String() = %q", got)
	}
}

// TestTXHits: N redirected frames add exactly N to the guest's and the
// REMAC's hit counts; N frames that fall back (ARP, too big), none; a
// guest or REMAC put again starts from 0.
func TestTXHits(t *testing.T) {
	tx := loadTX(t)
	run := func(frame []byte, n int) {
		t.Helper()
		// One run each: Repeat would run the program again on the
		// frame it rewrote.
		for range n {
			if _, err := tx.Program.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	m := must(t)
	check := func(guest, rem uint64) {
		t.Helper()
		if g, r := m(tx.GuestHits(guestMAC)), m(tx.REMACHits(remac)); g != guest || r != rem {
			t.Errorf("hits guest %d, remac %d; want %d, %d", g, r, guest, rem)
		}
	}
	check(0, 0)
	run(eth(remac, guestMAC, 0x0800, ipv4(0x4000, 6, tcp(100))), 5)
	check(5, 5)
	run(eth(remac, guestMAC, 0x86dd, ipv6(6, tcp(100))), 3)
	check(8, 8)
	run(eth(remac, guestMAC, 0x0806, make([]byte, 28)), 4)
	run(eth(remac, guestMAC, 0x0800, ipv4(0, 17, udp(40000, 5201, childMTU-27))), 4)
	run(eth(strayMAC, guestMAC, 0x0800, ipv4(0x4000, 6, tcp(100))), 4)
	check(8, 8)
	if got, err := tx.Counts(); err != nil || got[Redirected] != 8 {
		t.Errorf("redirected %d (%v), want 8", got[Redirected], err)
	}
	if err := tx.PutREMAC(remac, remoteIB); err != nil {
		t.Fatal(err)
	}
	check(8, 0)
	if h := m(tx.GuestHits(strayMAC)); h != 0 {
		t.Errorf("a guest with no entry has %d hits", h)
	}
}
