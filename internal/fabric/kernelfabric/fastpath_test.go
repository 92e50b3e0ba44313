package kernelfabric_test

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// fakeMaps are fast-path maps in Go maps, counting the calls made.
type fakeMaps struct {
	guests   map[ether.MAC]fastpath.Guest
	remacs   map[ether.MAC]ipoib.HwAddr
	children map[int]fastpath.RXGuest
	senders  map[string]ether.MAC // "child/ip"
	calls    int
	fail     error // returned by every Put while set
	tx       [fastpath.NumReasons]uint64
	rx       [fastpath.NumRXReasons]uint64
}

func newFakeMaps() *fakeMaps {
	return &fakeMaps{guests: map[ether.MAC]fastpath.Guest{}, remacs: map[ether.MAC]ipoib.HwAddr{}, children: map[int]fastpath.RXGuest{}, senders: map[string]ether.MAC{}}
}

func (m *fakeMaps) Entries() (fastpath.Entries, error) {
	e := fastpath.Entries{Guests: map[[6]byte]fastpath.Guest{}, REMACs: map[[6]byte]ipoib.HwAddr{}, Children: map[int]fastpath.RXGuest{}, Senders: map[fastpath.Sender][6]byte{}}
	for mac, g := range m.guests {
		e.Guests[mac] = g
	}
	for mac, a := range m.remacs {
		e.REMACs[mac] = a
	}
	maps.Copy(e.Children, m.children)
	for k, remac := range m.senders {
		child, ip, _ := strings.Cut(k, "/")
		var s fastpath.Sender
		if _, err := fmt.Sscan(child, &s.Child); err != nil {
			return e, err
		}
		s.IP = netip.MustParseAddr(ip)
		e.Senders[s] = remac
	}
	return e, nil
}

func (m *fakeMaps) Counts() ([fastpath.NumReasons]uint64, [fastpath.NumRXReasons]uint64, error) {
	return m.tx, m.rx, nil
}

func (m *fakeMaps) PutGuest(mac net.HardwareAddr, g fastpath.Guest) error {
	m.calls++
	if m.fail != nil {
		return m.fail
	}
	m.guests[ether.MAC(mac)] = g
	return nil
}
func (m *fakeMaps) DeleteGuest(mac net.HardwareAddr) error {
	m.calls++
	delete(m.guests, ether.MAC(mac))
	return nil
}
func (m *fakeMaps) PutREMAC(mac net.HardwareAddr, a ipoib.HwAddr) error {
	m.calls++
	if m.fail != nil {
		return m.fail
	}
	m.remacs[ether.MAC(mac)] = a
	return nil
}
func (m *fakeMaps) DeleteREMAC(mac net.HardwareAddr) error {
	m.calls++
	delete(m.remacs, ether.MAC(mac))
	return nil
}
func (m *fakeMaps) PutChild(child int, g fastpath.RXGuest) error {
	m.calls++
	if m.fail != nil {
		return m.fail
	}
	m.children[child] = g
	return nil
}
func (m *fakeMaps) DeleteChild(child int) error {
	m.calls++
	delete(m.children, child)
	return nil
}
func (m *fakeMaps) PutSender(child uint32, ip netip.Addr, remac net.HardwareAddr) error {
	m.calls++
	if m.fail != nil {
		return m.fail
	}
	m.senders[fmt.Sprintf("%d/%s", child, ip)] = ether.MAC(remac)
	return nil
}
func (m *fakeMaps) DeleteSender(child uint32, ip netip.Addr) error {
	m.calls++
	delete(m.senders, fmt.Sprintf("%d/%s", child, ip))
	return nil
}

// round states one round to f and commits it.
func round(f *kf.FastPath, guests map[ether.MAC]uint32, neigh map[ether.MAC]ipoib.HwAddr, senders map[netip.Addr]ether.MAC) error {
	f.Begin()
	for mac, qpn := range guests {
		f.Guest(mac, qpn)
	}
	for remac, rimac := range neigh {
		f.Neighbour(remac, rimac)
	}
	for ip, remac := range senders {
		f.Sender(ip, remac)
	}
	return f.Commit()
}

// TestFastPathMaps: the maps get each default-partition guest's child
// (TX: MAC → child and its IPoIB MTU; RX: child → MAC, TAP and its MTU),
// each REMAC's address and each sender once per child; a guest of
// another partition gets nothing; a round that changes nothing makes no
// map call; what goes is deleted; a failed put is tried again next round;
// and an empty round (the shim stopping) empties every map.
func TestFastPathMaps(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	p := open(t, k)
	qa, erra := p.AllocQP(0xffff, 0)
	qb, errb := p.AllocQP(0xffff, 0)
	qc, errc := p.AllocQP(0x8001, 0)
	if err := errors.Join(erra, errb, errc); err != nil {
		t.Fatal(err)
	}
	la, _ := k.Link("ib0.e1")
	lb, _ := k.Link("ib0.e2")
	ia, ib := la.Index, lb.Index
	macA, macB, macC := ether.MAC{0x52, 0x54, 0, 0, 0, 0xa}, ether.MAC{0x52, 0x54, 0, 0, 0, 0xb}, ether.MAC{0x52, 0x54, 0, 0, 0, 0xc}
	remac := ether.MAC{0x02, 0, 0, 0, 0, 1}
	rimac := ipoib.MakeHwAddr(0, 0x123456, testutil.GID("fe80::b"))
	ip4, ip6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	m := newFakeMaps()
	f := p.NewFastPath(m, 77, 9000)

	guests := map[ether.MAC]uint32{macA: qa, macB: qb, macC: qc}
	neigh := map[ether.MAC]ipoib.HwAddr{remac: rimac}
	senders := map[netip.Addr]ether.MAC{ip4: remac, ip6: remac}
	if err := round(f, guests, neigh, senders); err != nil {
		t.Fatal(err)
	}
	mtu := uint32(p.PartitionMTU(0xffff) - ipoib.HeaderLen)
	if want := (map[ether.MAC]fastpath.Guest{macA: {Ifindex: uint32(ia), MTU: mtu}, macB: {Ifindex: uint32(ib), MTU: mtu}}); !maps.Equal(m.guests, want) || mtu != 2044 {
		t.Errorf("TX guests %v (MTU %d), want %v", m.guests, mtu, want)
	}
	if !maps.Equal(m.remacs, neigh) {
		t.Errorf("REMACs %v, want %v", m.remacs, neigh)
	}
	if len(m.children) != 2 || m.children[ia].TAP != 77 || m.children[ia].MTU != 9000 || ether.MAC(m.children[ia].MAC) != macA || ether.MAC(m.children[ib].MAC) != macB {
		t.Errorf("RX children %v, want %d → %s and %d → %s, TAP 77 MTU 9000", m.children, ia, macA, ib, macB)
	}
	wantSenders := map[string]ether.MAC{
		fmt.Sprintf("%d/%s", ia, ip4): remac, fmt.Sprintf("%d/%s", ia, ip6): remac,
		fmt.Sprintf("%d/%s", ib, ip4): remac, fmt.Sprintf("%d/%s", ib, ip6): remac,
	}
	if !maps.Equal(m.senders, wantSenders) {
		t.Errorf("senders %v, want %v", m.senders, wantSenders)
	}
	if m.calls != 2+2+1+4 {
		t.Errorf("%d map calls, want 9", m.calls)
	}

	m.calls = 0
	if err := round(f, guests, neigh, senders); err != nil || m.calls != 0 {
		t.Errorf("the same round again: %d map calls (%v), want none", m.calls, err)
	}

	// Guest B and the IPv6 sender go.
	delete(guests, macB)
	delete(senders, ip6)
	if err := round(f, guests, neigh, senders); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.guests[macB]; ok || len(m.children) != 1 || !maps.Equal(m.senders, map[string]ether.MAC{fmt.Sprintf("%d/%s", ia, ip4): remac}) {
		t.Errorf("after B and the IPv6 sender went: guests %v children %v senders %v", m.guests, m.children, m.senders)
	}

	// A failed put is counted in Commit's error and tried again.
	guests[macB] = qb
	m.fail = errors.New("no memory")
	if err := round(f, guests, neigh, senders); err == nil {
		t.Error("a failed put: Commit returned no error")
	}
	m.fail = nil
	if err := round(f, guests, neigh, senders); err != nil || len(m.children) != 2 || len(m.senders) != 2 {
		t.Errorf("the round after a failed put: %v; children %v senders %v", err, m.children, m.senders)
	}

	// The shim stopping states nothing: every map empties.
	if err := round(f, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(m.guests)+len(m.remacs)+len(m.children)+len(m.senders) != 0 {
		t.Errorf("after an empty round: guests %v REMACs %v children %v senders %v", m.guests, m.remacs, m.children, m.senders)
	}
}

// TestFastPathCounters: from NewFastPath until Stop, the port's counters
// hold every verdict of both programs, zero or not, under
// fast_path_tx_<reason> and fast_path_rx_<reason>.
func TestFastPathCounters(t *testing.T) {
	p := open(t, fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044))
	if _, ok := p.Counters().Stats[kf.StatFastPathTX+"redirected"]; ok {
		t.Fatal("fast-path counters before any fast path")
	}
	m := newFakeMaps()
	m.tx[fastpath.Redirected], m.tx[fastpath.FallbackARP] = 7, 2
	m.rx[fastpath.RXRedirected], m.rx[fastpath.RXFallbackUnknownSender] = 5, 3
	f := p.NewFastPath(m, 77, 9000)
	st := p.Counters().Stats
	n := 0
	for k := range st {
		if strings.HasPrefix(k, "fast_path_") {
			n++
		}
	}
	if n != int(fastpath.NumReasons)+int(fastpath.NumRXReasons) || st["fast_path_tx_redirected"] != 7 || st["fast_path_tx_arp"] != 2 ||
		st["fast_path_rx_redirected"] != 5 || st["fast_path_rx_unknown_sender"] != 3 || st["fast_path_tx_too_big"] != 0 {
		t.Errorf("%d fast-path counters, want %d; tx redirected %d arp %d, rx redirected %d unknown_sender %d",
			n, int(fastpath.NumReasons)+int(fastpath.NumRXReasons), st["fast_path_tx_redirected"], st["fast_path_tx_arp"], st["fast_path_rx_redirected"], st["fast_path_rx_unknown_sender"])
	}
	f.Stop()
	if _, ok := p.Counters().Stats["fast_path_tx_redirected"]; ok {
		t.Error("fast-path counters after Stop")
	}
}

// bindRecorder is a fake kernel that records the protocol each packet
// socket is bound to, by ifindex.
type bindRecorder struct {
	*fakekernel.Kernel
	mu    sync.Mutex
	binds map[int][]uint16
}

func (k *bindRecorder) OpenPacketWith(ifindex int, o kf.PacketOptions) (kf.Socket, error) {
	k.mu.Lock()
	k.binds[ifindex] = append(k.binds[ifindex], o.Protocol)
	k.mu.Unlock()
	return k.Kernel.OpenPacketWith(ifindex, o)
}

// TestFastPathSocketsPerProtocol: under the fast path a VIF child's
// packet sockets are bound to IPv4, IPv6, ARP and RARP, one each, not to
// every protocol (a socket bound to every protocol gets each packet
// before the RX program can take it), and IPv4 is read from them; the
// partition's group child keeps one socket for every protocol, as every
// child does without the fast path.
func TestFastPathSocketsPerProtocol(t *testing.T) {
	for _, fast := range []bool{true, false} {
		f := fakekernel.NewFabric()
		ka := &bindRecorder{Kernel: f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), binds: map[int][]uint16{}}
		a, b := openCfg(t, ka, kf.Config{FastPath: fast}), open(t, f.NewHost(testutil.GID("fe80::b"), "ib0", 2044))
		qa, erra := a.AllocQP(0xffff, 0)
		qb, errb := b.AllocQP(0xffff, 0)
		if err := errors.Join(erra, errb); err != nil {
			t.Fatal(err)
		}
		vif, _ := ka.Link("ib0.e1")
		group, _ := ka.Link("ib0.mffff")
		want := []uint16{0}
		if fast {
			want = []uint16{0x0800, 0x86dd, 0x0806, 0x8035}
		}
		ka.mu.Lock()
		gotVIF, gotGroup := ka.binds[vif.Index], ka.binds[group.Index]
		ka.mu.Unlock()
		if !slices.Equal(gotVIF, want) || !slices.Equal(gotGroup, []uint16{0}) {
			t.Errorf("fast path %v: the VIF child's sockets are bound to %#04x, the group child's to %#04x; want %#04x and [0]", fast, gotVIF, gotGroup, want)
		}
		if unicast(b, qb, 0xffff, ipoib.MakeHwAddr(0, qa, a.LocalGID()), 200) != 1 {
			t.Fatal("IPv4 not sent")
		}
		if n := readOne(t, a); n != ipoib.HeaderLen+200 {
			t.Errorf("fast path %v: read %d bytes, want %d", fast, n, ipoib.HeaderLen+200)
		}
	}
}

// TestFastPathTakeOver: maps an earlier process filled (pinned under
// --persist) are taken over. NewFastPath deletes at once the entries of
// a child that is not the port's (gone with the earlier process), and
// the first Commit deletes what is stale (a sender and a REMAC no longer
// stated) and puts what is missing (a new REMAC), making no call for
// what stayed.
func TestFastPathTakeOver(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	p := open(t, k)
	qa, err := p.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	la, _ := k.Link("ib0.e1")
	ia, gone := la.Index, 9999
	macA, macOld := ether.MAC{0x52, 0x54, 0, 0, 0, 0xa}, ether.MAC{0x52, 0x54, 0, 0, 0, 0xd}
	remac, stale, fresh := ether.MAC{0x02, 0, 0, 0, 0, 1}, ether.MAC{0x02, 0, 0, 0, 0, 2}, ether.MAC{0x02, 0, 0, 0, 0, 3}
	rimac := ipoib.MakeHwAddr(0, 0x123456, testutil.GID("fe80::b"))
	ip4, ip6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	mtu := uint32(p.PartitionMTU(0xffff) - ipoib.HeaderLen)
	key := func(child int, ip netip.Addr) string { return fmt.Sprintf("%d/%s", child, ip) }

	m := newFakeMaps()
	m.guests[macA] = fastpath.Guest{Ifindex: uint32(ia), MTU: mtu}
	m.guests[macOld] = fastpath.Guest{Ifindex: uint32(gone), MTU: mtu}
	m.children[ia] = fastpath.RXGuest{MAC: macA[:], TAP: 77, MTU: 9000}
	m.children[gone] = fastpath.RXGuest{MAC: macOld[:], TAP: 77, MTU: 9000}
	m.remacs[remac], m.remacs[stale] = rimac, rimac
	m.senders[key(ia, ip4)], m.senders[key(ia, ip6)], m.senders[key(gone, ip4)] = remac, remac, remac

	f := p.NewFastPath(m, 77, 9000)
	if _, ok := m.guests[macOld]; ok || len(m.guests) != 1 || len(m.children) != 1 || m.children[gone].MAC != nil || len(m.senders) != 2 || m.calls != 3 {
		t.Fatalf("after NewFastPath (%d calls): guests %v children %v senders %v; want the gone child's 3 entries deleted", m.calls, m.guests, m.children, m.senders)
	}

	m.calls = 0
	if err := round(f, map[ether.MAC]uint32{macA: qa}, map[ether.MAC]ipoib.HwAddr{remac: rimac, fresh: rimac}, map[netip.Addr]ether.MAC{ip4: remac}); err != nil {
		t.Fatal(err)
	}
	if want := map[ether.MAC]ipoib.HwAddr{remac: rimac, fresh: rimac}; !maps.Equal(m.remacs, want) {
		t.Errorf("REMACs %v, want %v", m.remacs, want)
	}
	if want := map[string]ether.MAC{key(ia, ip4): remac}; !maps.Equal(m.senders, want) {
		t.Errorf("senders %v, want %v", m.senders, want)
	}
	if want := (map[ether.MAC]fastpath.Guest{macA: {Ifindex: uint32(ia), MTU: mtu}}); !maps.Equal(m.guests, want) || len(m.children) != 1 {
		t.Errorf("guests %v children %v, want %v and child %d", m.guests, m.children, want, ia)
	}
	if m.calls != 3 {
		t.Errorf("first Commit made %d map calls, want 3 (delete a sender, delete a REMAC, put a REMAC)", m.calls)
	}
}
