package shim

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// tally counts what went through a device or port and wakes a waiter,
// without allocating.
type tally struct {
	n    atomic.Uint64
	wake chan struct{}
}

func newTally() *tally { return &tally{wake: make(chan struct{}, 1)} }

func (c *tally) add(n int) {
	c.n.Add(uint64(n))
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// wait waits until the count reaches want, failing the test when timer
// (reset here: a waiter allocates no timer of its own) fires first.
func (c *tally) wait(tb testing.TB, want uint64, timer *time.Timer, kind, what string) {
	tb.Helper()
	timer.Reset(5 * time.Second)
	defer timer.Stop()
	for c.n.Load() < want {
		select {
		case <-c.wake:
		case <-timer.C:
			tb.Fatalf("%s: %s %d, want %d", kind, what, c.n.Load(), want)
		}
	}
}

// allocDev is a TAP that hands the shim the frames the test queues and
// counts what the shim writes, allocating nothing itself, so that
// testing.AllocsPerRun around running shims counts the shims'
// allocations alone. While keep is set (warm-up), copies of the frames
// written go to kept for the test to read.
type allocDev struct {
	in      chan []byte
	done    chan struct{}
	once    sync.Once
	carrier atomic.Bool
	written *tally
	keep    atomic.Bool
	kept    chan []byte
}

func newAllocDev() *allocDev {
	d := &allocDev{in: make(chan []byte, 64), done: make(chan struct{}), written: newTally(), kept: make(chan []byte, 256)}
	d.keep.Store(true)
	return d
}

func (d *allocDev) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n := 0
	select {
	case f := <-d.in:
		sizes[0] = copy(bufs[0][offset:], f)
		n++
	case <-d.done:
		return 0, net.ErrClosed
	}
	for n < len(bufs) {
		select {
		case f := <-d.in:
			sizes[n] = copy(bufs[n][offset:], f)
			n++
		default:
			return n, nil
		}
	}
	return n, nil
}

func (d *allocDev) Write(bufs [][]byte, offset int) (int, error) {
	if d.keep.Load() {
		for _, b := range bufs {
			select {
			case d.kept <- append([]byte(nil), b[offset:]...):
			default:
			}
		}
	}
	d.written.add(len(bufs))
	return len(bufs), nil
}

// ReadSuper is Read: the device gives no super-frames (Caps).
func (d *allocDev) ReadSuper(bufs [][]byte, sizes []int, super []tap.Super, offset int) (int, error) {
	n, err := d.Read(bufs, sizes, offset)
	clear(super[:n])
	return n, err
}

func (d *allocDev) Caps() tap.Caps              { return tap.Caps{} }
func (d *allocDev) Queues() []tap.Device        { return []tap.Device{d} }
func (d *allocDev) Counters() map[string]uint64 { return nil }
func (d *allocDev) BatchSize() int              { return 16 }
func (d *allocDev) SetCarrier(up bool) error    { d.carrier.Store(up); return nil }
func (d *allocDev) OperUp() bool                { return d.carrier.Load() }
func (d *allocDev) Close() error                { d.once.Do(func() { close(d.done) }); return nil }

// recv returns the next frame kept that is not one of the shim's queries.
func (d *allocDev) recv(t *testing.T) gopacket.Packet {
	t.Helper()
	for {
		select {
		case f := <-d.kept:
			if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); !isQuery(p) {
				return p
			}
		case <-time.After(testutil.Settle):
			t.Fatal("no frame delivered")
		}
	}
}

// countPort counts the packets the shim hands its port.
type countPort struct {
	testPort
	sent *tally
}

func (p *countPort) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	n, err := p.testPort.Write(bufs, meta, offset)
	p.sent.add(n)
	return n, err
}

// allocHV is a running shim on an allocDev and a countPort.
type allocHV struct {
	*hv
	dev  *allocDev
	port *countPort
}

func newAllocHV(t *testing.T, f fabric, gid string, mod func(*Config)) *allocHV {
	t.Helper()
	port := f.port(t, testutil.GID(gid))
	h := &allocHV{dev: newAllocDev(), port: &countPort{testPort: port, sent: newTally()}}
	h.hv = &hv{port: port, clk: clock.NewFake(time.Unix(1e6, 0)), done: make(chan error, 1)}
	cfg := Config{Device: h.dev, Port: h.port, Clock: h.clk, Logger: slog.New(slog.DiscardHandler), Housekeeping: 10 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	go func() { h.done <- s.Run(ctx) }()
	t.Cleanup(func() { h.shutdown(t) })
	deadline := time.Now().Add(testutil.Settle)
	for !h.dev.carrier.Load() {
		if time.Now().After(deadline) {
			t.Fatal("carrier never came up")
		}
		time.Sleep(time.Millisecond)
	}
	return h
}

// frameKind is a frame a guest behind from sends, to measure.
type frameKind struct {
	name     string
	frame    []byte
	from, to *allocHV
	// delivered: the guest behind to receives it (else it only goes
	// out on the fabric, to a group to has not joined).
	delivered bool
}

// measure checks, for each kind, that the frame going in at from's TAP,
// through from's TX path to the fabric and, when delivered, through to's
// RX path out of to's TAP, allocates nothing.
//
// It sends each frame once first and waits for it to come out, so that
// the VIF, neighbour and group it needs exist. (A frame of a guest whose
// VIF is not ready yet waits for it.) It checks what to's guest
// receives. Then it sends the frame 100 times more under
// testing.AllocsPerRun, and asserts that not one allocation happened in
// those 100 frames. With the race detector, whose runtime allocates for
// itself, it asserts that the mean per frame rounds down to 0. Every
// allocation of the process in that time counts: both shims' workers
// and housekeeping, the fabric.
func measure(t *testing.T, kinds []frameKind) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	race := raceEnabled()
	for _, k := range kinds {
		send := func() {
			sent, got := k.from.port.sent.n.Load(), k.to.dev.written.n.Load()
			k.from.dev.in <- k.frame
			k.from.port.sent.wait(t, sent+1, timer, k.name, "packets sent")
			if k.delivered {
				k.to.dev.written.wait(t, got+1, timer, k.name, "frames delivered")
			}
		}
		for len(k.to.dev.kept) > 0 {
			<-k.to.dev.kept
		}
		send()
		if k.delivered {
			checkDelivered(t, k, k.to.dev.recv(t))
		}
		k.from.dev.keep.Store(false)
		k.to.dev.keep.Store(false)
		if race {
			// The race detector's runtime allocates for its own
			// bookkeeping in the code it watches: the mean per frame,
			// rounded down, is the shim's.
			if n := testing.AllocsPerRun(100, send); n != 0 {
				t.Errorf("%s: %v allocations per frame (TX and RX)", k.name, n)
			}
		} else if n := testing.AllocsPerRun(1, func() {
			for range 100 {
				send()
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations in 100 frames (TX and RX)", k.name, n)
		}
		k.from.dev.keep.Store(true)
		k.to.dev.keep.Store(true)
	}
	hvs := map[*allocHV]bool{}
	for _, k := range kinds {
		hvs[k.from], hvs[k.to] = true, true
	}
	for h := range hvs {
		for _, d := range []Counter{DropUnresolved, DropBadMcastReport, DropTxRewrite, DropRxRewrite} {
			if n := h.s.Get(d); n != 0 {
				t.Errorf("%s: %s = %d", h.port.LocalGID(), d, n)
			}
		}
	}
}

// checkDelivered checks that p, what a guest received, is the frame of
// kind k: it decodes, has the frame's EtherType and, for IP, its
// destination address.
func checkDelivered(t *testing.T, k frameKind, p gopacket.Packet) {
	t.Helper()
	sent := gopacket.NewPacket(k.frame, layers.LayerTypeEthernet, gopacket.Default)
	e, ok := p.LinkLayer().(*layers.Ethernet)
	if p.ErrorLayer() != nil || !ok || e.EthernetType != sent.LinkLayer().(*layers.Ethernet).EthernetType {
		t.Fatalf("%s as delivered: %v", k.name, p)
	}
	if nl := sent.NetworkLayer(); nl != nil && (p.NetworkLayer() == nil || p.NetworkLayer().NetworkFlow().Dst() != nl.NetworkFlow().Dst()) {
		t.Fatalf("%s as delivered: %v", k.name, p)
	}
}

// TestNoAllocationsPerFrame measures the claim that nothing is allocated
// per frame, on two running shims on the in-memory fabric. Guest A1 is
// behind one and B1 behind the other. The frames are ARP, NDP, DHCP,
// IGMP and MLD reports of every version, IPv4 and IPv6 unicast and
// multicast, each through A's TX path and B's RX path (see measure).
func TestNoAllocationsPerFrame(t *testing.T) {
	f := memFab(t, 2048)
	a, b := newAllocHV(t, f, "fe80::a", nil), newAllocHV(t, f, "fe80::b", nil)
	la, lb := netip.MustParseAddr("fd00::a1"), netip.MustParseAddr("fd00::b1")
	g4, g6 := netip.MustParseAddr("239.1.1.1"), netip.MustParseAddr("ff15::1234")
	mac4, mac6 := ether.MAC{1, 0, 0x5e, 1, 1, 1}, ether.MAC{0x33, 0x33, 0, 0, 0x12, 0x34}
	snB := solicitedNode(lb)
	snMAC := ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xb1}
	bcast := ether.Broadcast

	// B's guest's VIF, its address's solicited-node group and the groups
	// A's guest sends to.
	b.dev.in <- fuzzEth(ether.MAC{0x33, 0x33, 0, 0, 0, 2}, macB1, 0, ether.TypeIPv6, seedNDP(t, layers.ICMPv6TypeRouterSolicitation, lb, netip.MustParseAddr("ff02::2"), netip.Addr{}, nil))
	b.dev.in <- fuzzEth(mac4, macB1, 0, ether.TypeIPv4, igmpV2(t, ipB1, g4))
	b.dev.in <- fuzzEth(mac6, macB1, 0, ether.TypeIPv6, mldV1(t, lb, g6))
	for _, mgid := range []ipoib.GID{ipoib.IPv6MGID(snB, 0xffff, 2), ipoib.IPv4MGID(g4, 0xffff, 2), ipoib.IPv6MGID(g6, 0xffff, 2)} {
		deadline := time.Now().Add(testutil.Settle)
		for !b.port.Joined(mgid) {
			if time.Now().After(deadline) {
				t.Fatalf("B never joined %s", mgid)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// The REMACs of each guest on the other side, by ARP.
	a.dev.in <- fuzzEth(bcast, macA1, 0, ether.TypeARP, seedARP(t, layers.ARPRequest, macA1, ipA1, ether.MAC{}, ipB1))
	remacA1 := ether.MAC(recvARP(t, b.dev).SourceHwAddress)
	b.dev.in <- fuzzEth(remacA1, macB1, 0, ether.TypeARP, seedARP(t, layers.ARPReply, macB1, ipB1, remacA1, ipA1))
	remacB1 := ether.MAC(recvARP(t, a.dev).SourceHwAddress)

	measure(t, []frameKind{
		{"ARP request", fuzzEth(bcast, macA1, 0, ether.TypeARP, seedARP(t, layers.ARPRequest, macA1, ipA1, ether.MAC{}, ipB1)), a, b, true},
		{"ARP reply", fuzzEth(remacB1, macA1, 0, ether.TypeARP, seedARP(t, layers.ARPReply, macA1, ipA1, remacB1, ipB1)), a, b, true},
		{"IPv4 unicast", fuzzEth(remacB1, macA1, 0, ether.TypeIPv4, seedUDP4(t, ipA1, ipB1, 5000, 6000, 0, gopacket.Payload(make([]byte, 1000)))), a, b, true},
		{"IPv4 multicast", fuzzEth(mac4, macA1, 0, ether.TypeIPv4, seedUDP4(t, ipA1, g4, 5000, 6000, 0, gopacket.Payload(make([]byte, 1000)))), a, b, true},
		{"IPv6 unicast", fuzzEth(remacB1, macA1, 0, ether.TypeIPv6, seedUDP6(t, la, lb, 1000)), a, b, true},
		{"IPv6 multicast", fuzzEth(mac6, macA1, 0, ether.TypeIPv6, seedUDP6(t, la, g6, 1000)), a, b, true},
		{"NDP NS", fuzzEth(snMAC, macA1, 0, ether.TypeIPv6, seedNDP(t, layers.ICMPv6TypeNeighborSolicitation, la, snB, lb, macA1[:])), a, b, true},
		{"NDP NA", fuzzEth(remacB1, macA1, 0, ether.TypeIPv6, seedNDP(t, layers.ICMPv6TypeNeighborAdvertisement, la, lb, la, macA1[:])), a, b, true},
		{"DHCP discover", fuzzEth(bcast, macA1, 0, ether.TypeIPv4, seedDHCP(t, false, false, macA1)), a, b, true},
		{"IGMPv2 report", fuzzEth(mac4, macA1, 0, ether.TypeIPv4, igmpV2(t, ipA1, g4)), a, b, true},
		{"IGMPv3 report", fuzzEth(ether.MAC{1, 0, 0x5e, 0, 0, 0x16}, macA1, 0, ether.TypeIPv4, seedIGMP(t, g4, 4)), a, b, false},
		{"MLDv1 report", fuzzEth(mac6, macA1, 0, ether.TypeIPv6, mldV1(t, netip.MustParseAddr("fe80::a1"), g6)), a, b, true},
		{"MLDv2 report", fuzzEth(ether.MAC{0x33, 0x33, 0, 0, 0, 0x16}, macA1, 0, ether.TypeIPv6, seedMLD(t, g6, 4)), a, b, false},
		// The other way: B's TX path and A's RX path.
		{"IPv4 unicast back", fuzzEth(remacA1, macB1, 0, ether.TypeIPv4, seedUDP4(t, ipB1, ipA1, 6000, 5000, 0, gopacket.Payload(make([]byte, 1000)))), b, a, true},
		{"IPv6 unicast back", fuzzEth(remacA1, macB1, 0, ether.TypeIPv6, seedUDP6(t, lb, la, 1000)), b, a, true},
	})
}

// TestNoAllocationsPerFrameRFC4390 is TestNoAllocationsPerFrame for the
// DHCP rewriting of --dhcp rfc4390. A guest's request is rewritten to
// the IPoIB form on TX (its transaction remembered). A server's reply in
// the IPoIB form (as a server on the fabric sends it; B's guest plays
// the server) is restored on RX for the guest that asked.
func TestNoAllocationsPerFrameRFC4390(t *testing.T) {
	f := memFab(t, 2048)
	mod := func(c *Config) { c.DHCP = DHCPRFC4390 }
	a, b := newAllocHV(t, f, "fe80::a", mod), newAllocHV(t, f, "fe80::b", mod)
	measure(t, []frameKind{
		{"DHCP discover", fuzzEth(ether.Broadcast, macA1, 0, ether.TypeIPv4, seedDHCP(t, false, false, macA1)), a, b, true},
		{"DHCP offer", fuzzEth(ether.Broadcast, macB1, 0, ether.TypeIPv4, seedDHCP(t, true, true, macA1)), b, a, true},
	})
}

// raceEnabled reports whether the test binary has the race detector.
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// recvARP returns the next ARP frame d delivered, skipping others.
func recvARP(t *testing.T, d *allocDev) *layers.ARP {
	t.Helper()
	for {
		if arp, ok := d.recv(t).Layer(layers.LayerTypeARP).(*layers.ARP); ok {
			return arp
		}
	}
}

// igmpV2 is an IGMPv2 report for group from src, sent to the group (RFC
// 2236 §2), with its checksum.
func igmpV2(tb testing.TB, src, group netip.Addr) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 1, Protocol: layers.IPProtocolIGMP, SrcIP: src.AsSlice(), DstIP: group.AsSlice()}
	msg := append([]byte{0x16, 0, 0, 0}, group.AsSlice()...)
	binary.BigEndian.PutUint16(msg[2:], csum.Fold(csum.Sum(0, msg)))
	return fuzzSerialize(tb, ip, gopacket.Payload(msg))
}

// mldV1 is an MLDv1 report for group from src, sent to the group (RFC
// 2710 §3).
func mldV1(tb testing.TB, src, group netip.Addr) []byte {
	return seedICMPv6(tb, src, group, 1, layers.ICMPv6TypeMLDv1MulticastListenerReportMessage, gopacket.Payload(append(make([]byte, 4), group.AsSlice()...)))
}
