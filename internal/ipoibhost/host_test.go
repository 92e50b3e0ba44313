package ipoibhost

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestMain fails the package if a test leaves a goroutine behind: Run
// must end everything it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// link is a settable Config.Link.
type link struct {
	mu sync.Mutex
	st LinkState
}

func (l *link) set(st LinkState) { l.mu.Lock(); l.st = st; l.mu.Unlock() }
func (l *link) get() (LinkState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st, nil
}

// testHost is a running host on an in-memory fabric and device.
type testHost struct {
	*Host
	dev  *tap.Mem
	link *link
	port *memfabric.Port
}

// startHosts runs one host per address set on one in-memory fabric and
// stops them (checking a clean return) at the end of the test.
func startHosts(t *testing.T, addrs ...[]netip.Prefix) []*testHost {
	t.Helper()
	f, err := memfabric.New(4096)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var hosts []*testHost
	for i, a := range addrs {
		port, err := f.NewPort(ipoib.GID{0xfe, 0x80, 15: byte(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		th := &testHost{dev: tap.NewMem(64), link: &link{st: LinkState{Addrs: a}}, port: port}
		th.Host, err = New(Config{Device: th.dev, Port: port, Link: th.link.get, Name: "ib0", Poll: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := th.Run(ctx); err != nil {
				t.Errorf("host %d: %v", i, err)
			}
		}()
		hosts = append(hosts, th)
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i, th := range hosts {
		testutil.WaitFor(t, fmt.Sprintf("host %d's QP, addresses and groups", i), th.ready)
	}
	return hosts
}

// ready reports whether the host has taken its addresses: each one
// announced (from its QP, so after Run allocated it) and the
// solicited-node group of each IPv6 one joined.
func (th *testHost) ready() bool {
	st, _ := th.link.get()
	if th.Get(Gratuitous) < uint64(len(st.Addrs)) {
		return false
	}
	for _, p := range st.Addrs {
		if a := p.Addr(); a.Is6() && !th.port.Joined(groupMGID(solicitedNode(a), th.pkey, th.cfg.Scope)) {
			return false
		}
	}
	return true
}

// udp builds an IPv4 or IPv6 UDP packet from src to dst with payload.
func udp(src, dst netip.Addr, payload string) []byte {
	hl := 20
	if src.Is6() {
		hl = ipv6HdrLen
	}
	b := make([]byte, hl+8+len(payload))
	u := b[hl:]
	binary.BigEndian.PutUint16(u[0:], 1000)
	binary.BigEndian.PutUint16(u[2:], 2000)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	copy(u[8:], payload)
	if src.Is4() {
		b[0] = 0x45
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		b[8], b[9] = 64, 17
		s, d := src.As4(), dst.As4()
		copy(b[12:], s[:])
		copy(b[16:], d[:])
		csum.IPv4Header(b[:20])
		return b
	}
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	b[6], b[7] = 17, 64
	s, d := src.As16(), dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return b
}

// expect waits for the device to receive want.
func expect(t *testing.T, dev *tap.Mem, want []byte) {
	t.Helper()
	select {
	case got := <-dev.Sent():
		if string(got) != string(want) {
			t.Fatalf("device got % x\nwant % x", got, want)
		}
	case <-time.After(testutil.Settle):
		t.Fatalf("device got nothing, want % x", want)
	}
}

// TestResolveAndDeliver: a packet to an unknown neighbour waits while the
// host resolves it (ARP for IPv4, NS for IPv6), then arrives whole; both
// hosts then know each other at their QPN and GID; a reply needs no
// resolution.
func TestResolveAndDeliver(t *testing.T) {
	a4, b4 := netip.MustParsePrefix("10.0.0.1/24"), netip.MustParsePrefix("10.0.0.2/24")
	a6, b6 := netip.MustParsePrefix("fd00::1/64"), netip.MustParsePrefix("fd00::2/64")
	hs := startHosts(t, []netip.Prefix{a4, a6}, []netip.Prefix{b4, b6})
	a, b := hs[0], hs[1]
	for _, c := range []struct{ src, dst netip.Prefix }{{a4, b4}, {a6, b6}} {
		p := udp(c.src.Addr(), c.dst.Addr(), "hello")
		a.dev.Inject(p)
		expect(t, b.dev, p)
		if hw, ok := a.neigh.lookup(c.dst.Addr()); !ok || hw != b.HwAddr() {
			t.Errorf("A resolved %s to %s, want %s", c.dst.Addr(), hw, b.HwAddr())
		}
		if hw, ok := b.neigh.lookup(c.src.Addr()); !ok || hw != a.HwAddr() {
			t.Errorf("B learned %s as %s, want %s", c.src.Addr(), hw, a.HwAddr())
		}
		r := udp(c.dst.Addr(), c.src.Addr(), "back")
		b.dev.Inject(r)
		expect(t, a.dev, r)
	}
	if got := a.Get(TxQueued); got != 2 {
		t.Errorf("tx_queued %d, want 2 (the first packet of each family)", got)
	}
	if got := b.Get(TxQueued); got != 0 {
		t.Errorf("B queued %d, want 0: it learned A from A's solicitations", got)
	}
}

// TestMulticastAndBroadcast: a group the stack joins is joined on the
// fabric and its traffic delivered; a subnet broadcast goes to the
// broadcast group; a group left stops arriving.
func TestMulticastAndBroadcast(t *testing.T) {
	a4, b4 := netip.MustParsePrefix("10.0.0.1/24"), netip.MustParsePrefix("10.0.0.2/24")
	hs := startHosts(t, []netip.Prefix{a4}, []netip.Prefix{b4})
	a, b := hs[0], hs[1]
	group := netip.MustParseAddr("239.1.2.3")
	b.link.set(LinkState{Addrs: []netip.Prefix{b4}, Groups: []netip.Addr{group}})
	mgid := groupMGID(group, ipoib.DefaultPKey, ipoib.ScopeLinkLocal)
	testutil.WaitFor(t, "B joins "+mgid.String(), func() bool { return b.port.Joined(mgid) })
	p := udp(a4.Addr(), group, "to the group")
	a.dev.Inject(p)
	expect(t, b.dev, p)
	bc := udp(a4.Addr(), netip.MustParseAddr("10.0.0.255"), "to all")
	a.dev.Inject(bc)
	expect(t, b.dev, bc)
	b.link.set(LinkState{Addrs: []netip.Prefix{b4}})
	testutil.WaitFor(t, "B leaves "+mgid.String(), func() bool { return !b.port.Joined(mgid) })
	if got := a.Get(TxMulticast) + a.Get(TxBroadcast); got != 2 {
		t.Errorf("A sent %d multicast and broadcast packets, want 2", got)
	}
}

// TestUnresolved: packets to a neighbour that never answers are dropped
// and counted after three solicitations, a second apart.
func TestUnresolved(t *testing.T) {
	hs := startHosts(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.1/24")})
	a := hs[0]
	for range 4 {
		a.dev.Inject(udp(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.9"), "x"))
	}
	testutil.WaitFor(t, "4 packets dropped as unresolved", func() bool { return a.Get(DropUnresolved) == 4 })
	if q, r := a.Get(TxQueued), a.Get(ARPRequests); q != 3 || r != 3 {
		t.Errorf("tx_queued %d, arp_requests %d; want 3 and 3", q, r)
	}
}
