package kernelfabric_test

import (
	"errors"
	"maps"
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
	m := fakekernel.NewFastMaps()
	f := p.NewFastPath(m, 77, 9000)

	guests := map[ether.MAC]uint32{macA: qa, macB: qb, macC: qc}
	neigh := map[ether.MAC]ipoib.HwAddr{remac: rimac}
	senders := map[netip.Addr]ether.MAC{ip4: remac, ip6: remac}
	if err := round(f, guests, neigh, senders); err != nil {
		t.Fatal(err)
	}
	mtu := uint32(p.PartitionMTU(0xffff) - ipoib.HeaderLen)
	if want := (map[ether.MAC]fastpath.Guest{macA: {Ifindex: uint32(ia), MTU: mtu}, macB: {Ifindex: uint32(ib), MTU: mtu}}); !maps.Equal(m.Guests, want) || mtu != 2044 {
		t.Errorf("TX guests %v (MTU %d), want %v", m.Guests, mtu, want)
	}
	if !maps.Equal(m.REMACs, neigh) {
		t.Errorf("REMACs %v, want %v", m.REMACs, neigh)
	}
	if len(m.Children) != 2 || m.Children[ia].TAP != 77 || m.Children[ia].MTU != 9000 || ether.MAC(m.Children[ia].MAC) != macA || ether.MAC(m.Children[ib].MAC) != macB {
		t.Errorf("RX children %v, want %d → %s and %d → %s, TAP 77 MTU 9000", m.Children, ia, macA, ib, macB)
	}
	wantSenders := map[fakekernel.FastSender]ether.MAC{
		{Child: uint32(ia), IP: ip4}: remac, {Child: uint32(ia), IP: ip6}: remac,
		{Child: uint32(ib), IP: ip4}: remac, {Child: uint32(ib), IP: ip6}: remac,
	}
	if !maps.Equal(m.Senders, wantSenders) {
		t.Errorf("senders %v, want %v", m.Senders, wantSenders)
	}
	if m.Calls != 2+2+1+4 {
		t.Errorf("%d map calls, want 9", m.Calls)
	}

	m.Calls = 0
	if err := round(f, guests, neigh, senders); err != nil || m.Calls != 0 {
		t.Errorf("the same round again: %d map calls (%v), want none", m.Calls, err)
	}

	// Guest B and the IPv6 sender go.
	delete(guests, macB)
	delete(senders, ip6)
	if err := round(f, guests, neigh, senders); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Guests[macB]; ok || len(m.Children) != 1 || !maps.Equal(m.Senders, map[fakekernel.FastSender]ether.MAC{{Child: uint32(ia), IP: ip4}: remac}) {
		t.Errorf("after B and the IPv6 sender went: guests %v children %v senders %v", m.Guests, m.Children, m.Senders)
	}

	// A failed put is counted in Commit's error and tried again.
	guests[macB] = qb
	m.Fail = errors.New("no memory")
	if err := round(f, guests, neigh, senders); err == nil {
		t.Error("a failed put: Commit returned no error")
	}
	m.Fail = nil
	if err := round(f, guests, neigh, senders); err != nil || len(m.Children) != 2 || len(m.Senders) != 2 {
		t.Errorf("the round after a failed put: %v; children %v senders %v", err, m.Children, m.Senders)
	}

	// The shim stopping states nothing: every map empties.
	if err := round(f, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(m.Guests)+len(m.REMACs)+len(m.Children)+len(m.Senders) != 0 {
		t.Errorf("after an empty round: guests %v REMACs %v children %v senders %v", m.Guests, m.REMACs, m.Children, m.Senders)
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
	m := fakekernel.NewFastMaps()
	m.TX[fastpath.Redirected], m.TX[fastpath.FallbackARP] = 7, 2
	m.RX[fastpath.RXRedirected], m.RX[fastpath.RXFallbackUnknownSender] = 5, 3
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
	key := func(child int, ip netip.Addr) fakekernel.FastSender {
		return fakekernel.FastSender{Child: uint32(child), IP: ip}
	}

	m := fakekernel.NewFastMaps()
	m.Guests[macA] = fastpath.Guest{Ifindex: uint32(ia), MTU: mtu}
	m.Guests[macOld] = fastpath.Guest{Ifindex: uint32(gone), MTU: mtu}
	m.Children[ia] = fastpath.RXGuest{MAC: macA[:], TAP: 77, MTU: 9000}
	m.Children[gone] = fastpath.RXGuest{MAC: macOld[:], TAP: 77, MTU: 9000}
	m.REMACs[remac], m.REMACs[stale] = rimac, rimac
	m.Senders[key(ia, ip4)], m.Senders[key(ia, ip6)], m.Senders[key(gone, ip4)] = remac, remac, remac

	f := p.NewFastPath(m, 77, 9000)
	if _, ok := m.Guests[macOld]; ok || len(m.Guests) != 1 || len(m.Children) != 1 || m.Children[gone].MAC != nil || len(m.Senders) != 2 || m.Calls != 3 {
		t.Fatalf("after NewFastPath (%d calls): guests %v children %v senders %v; want the gone child's 3 entries deleted", m.Calls, m.Guests, m.Children, m.Senders)
	}

	m.Calls = 0
	if err := round(f, map[ether.MAC]uint32{macA: qa}, map[ether.MAC]ipoib.HwAddr{remac: rimac, fresh: rimac}, map[netip.Addr]ether.MAC{ip4: remac}); err != nil {
		t.Fatal(err)
	}
	if want := map[ether.MAC]ipoib.HwAddr{remac: rimac, fresh: rimac}; !maps.Equal(m.REMACs, want) {
		t.Errorf("REMACs %v, want %v", m.REMACs, want)
	}
	if want := map[fakekernel.FastSender]ether.MAC{key(ia, ip4): remac}; !maps.Equal(m.Senders, want) {
		t.Errorf("senders %v, want %v", m.Senders, want)
	}
	if want := (map[ether.MAC]fastpath.Guest{macA: {Ifindex: uint32(ia), MTU: mtu}}); !maps.Equal(m.Guests, want) || len(m.Children) != 1 {
		t.Errorf("guests %v children %v, want %v and child %d", m.Guests, m.Children, want, ia)
	}
	if m.Calls != 3 {
		t.Errorf("first Commit made %d map calls, want 3 (delete a sender, delete a REMAC, put a REMAC)", m.Calls)
	}
}

// TestFastPathUsed: GuestUsed and NeighbourUsed report exactly whether
// the programs redirected frames using the guest's or the REMAC's entries
// since the last ask, TX and RX apart for a neighbour; nothing for what
// the maps do not hold; and they may be asked while rounds are committed.
func TestFastPathUsed(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	p := open(t, k)
	qa, erra := p.AllocQP(0xffff, 0)
	qc, errc := p.AllocQP(0x8001, 0)
	if err := errors.Join(erra, errc); err != nil {
		t.Fatal(err)
	}
	la, _ := k.Link("ib0.e1")
	macA, macC := ether.MAC{0x52, 0x54, 0, 0, 0, 0xa}, ether.MAC{0x52, 0x54, 0, 0, 0, 0xc}
	remac, other := ether.MAC{0x02, 0, 0, 0, 0, 1}, ether.MAC{0x02, 0, 0, 0, 0, 2}
	ip4, ip6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	m := fakekernel.NewFastMaps()
	f := p.NewFastPath(m, 77, 9000)
	guests := map[ether.MAC]uint32{macA: qa, macC: qc}
	neigh := map[ether.MAC]ipoib.HwAddr{remac: ipoib.MakeHwAddr(0, 0x123456, testutil.GID("fe80::b")), other: ipoib.MakeHwAddr(0, 0x654321, testutil.GID("fe80::c"))}
	senders := map[netip.Addr]ether.MAC{ip4: remac, ip6: remac}
	if err := round(f, guests, neigh, senders); err != nil {
		t.Fatal(err)
	}
	type used struct{ guest, sent, received bool }
	ask := func() used {
		s, r := f.NeighbourUsed(remac)
		return used{f.GuestUsed(macA), s, r}
	}
	check := func(what string, want used) {
		t.Helper()
		if got := ask(); got != want {
			t.Errorf("%s: guest, sent, received %v, want %v", what, got, want)
		}
	}
	check("nothing carried", used{})
	m.HitTX(macA, remac, 3)
	check("3 frames sent", used{true, true, false})
	check("asked again", used{})
	m.HitRX(la.Index, ip6, 2)
	check("2 packets received", used{true, false, true})
	check("asked again", used{})
	if s, r := f.NeighbourUsed(other); s || r {
		t.Errorf("a REMAC nothing used: sent %v received %v", s, r)
	}
	m.HitTX(macC, remac, 1) // another partition's guest: not in the maps, a fallback
	if f.GuestUsed(macC) {
		t.Error("a guest the maps do not hold was used")
	}
	check("a fallback", used{})

	// Asked while rounds come and go: the race detector watches.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			ask()
		}
	}()
	for i := range 200 {
		if i%2 == 0 {
			_ = round(f, guests, neigh, senders)
		} else {
			_ = round(f, guests, nil, nil)
		}
	}
	<-done
	if err := round(f, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	m.HitTX(macA, remac, 1)
	check("after the maps emptied", used{})
}

// TestFastPathTakeOverHits: the hit counts of entries taken over count
// the earlier process's redirects, which are no use since: a guest, a
// REMAC and a sender taken over with counts already up are not used
// until the programs redirect again; then a packet from the sender is
// seen (the sender taken over is indexed under its REMAC).
func TestFastPathTakeOverHits(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	p := open(t, k)
	if _, err := p.AllocQP(0xffff, 0); err != nil {
		t.Fatal(err)
	}
	la, _ := k.Link("ib0.e1")
	mac, remac := ether.MAC{0x52, 0x54, 0, 0, 0, 0xa}, ether.MAC{0x02, 0, 0, 0, 0, 1}
	ip := netip.MustParseAddr("10.0.0.2")
	m := fakekernel.NewFastMaps()
	m.Guests[mac] = fastpath.Guest{Ifindex: uint32(la.Index), MTU: uint32(p.PartitionMTU(0xffff) - ipoib.HeaderLen)}
	m.Children[la.Index] = fastpath.RXGuest{MAC: mac[:], TAP: 77, MTU: 9000}
	m.REMACs[remac] = ipoib.MakeHwAddr(0, 0x123456, testutil.GID("fe80::b"))
	m.Senders[fakekernel.FastSender{Child: uint32(la.Index), IP: ip}] = remac
	m.HitTX(mac, remac, 5) // the earlier process's
	m.HitRX(la.Index, ip, 3)

	f := p.NewFastPath(m, 77, 9000)
	if g := f.GuestUsed(mac); g {
		t.Error("guest used right after the takeover, with no redirect since")
	}
	if s, r := f.NeighbourUsed(remac); s || r {
		t.Errorf("neighbour right after the takeover: sent %v received %v, want neither", s, r)
	}
	m.HitRX(la.Index, ip, 1)
	if s, r := f.NeighbourUsed(remac); s || !r {
		t.Errorf("after a packet from the sender taken over: sent %v received %v, want received", s, r)
	}
	if !f.GuestUsed(mac) {
		t.Error("guest not used after a packet it received")
	}
}
