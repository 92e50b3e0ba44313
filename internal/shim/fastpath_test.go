package shim

import (
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// fastView is what a FastPath was told to carry in one round.
type fastView struct {
	guests  map[ether.MAC]uint32
	neigh   map[ether.MAC]ipoib.HwAddr
	senders map[netip.Addr]ether.MAC
}

func (v fastView) String() string {
	return fmt.Sprintf("guests %v neighbours %v senders %v", v.guests, v.neigh, v.senders)
}

func (v fastView) equal(w fastView) bool {
	return maps.Equal(v.guests, w.guests) && maps.Equal(v.neigh, w.neigh) && maps.Equal(v.senders, w.senders)
}

// fakeFastPath records the last committed round and counts rounds, and
// answers GuestUsed and NeighbourUsed from what use set (each answer
// clears it, as "since the last ask" does), counting the asks.
type fakeFastPath struct {
	mu       sync.Mutex
	building fastView
	state    fastView
	commits  int

	guestUse          map[ether.MAC]bool
	sentUse, recvdUse map[ether.MAC]bool
	guestAsks, nbAsks int
}

// use records that the fast path carried frames of the guest mac, or
// (sent, received) to and from the endpoint shown as mac.
func (f *fakeFastPath) use(mac ether.MAC, guest, sent, received bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.guestUse == nil {
		f.guestUse, f.sentUse, f.recvdUse = map[ether.MAC]bool{}, map[ether.MAC]bool{}, map[ether.MAC]bool{}
	}
	f.guestUse[mac], f.sentUse[mac], f.recvdUse[mac] = guest, sent, received
}

func (f *fakeFastPath) GuestUsed(mac ether.MAC) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.guestAsks++
	u := f.guestUse[mac]
	delete(f.guestUse, mac)
	return u
}

func (f *fakeFastPath) NeighbourUsed(remac ether.MAC) (sent, received bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nbAsks++
	sent, received = f.sentUse[remac], f.recvdUse[remac]
	delete(f.sentUse, remac)
	delete(f.recvdUse, remac)
	return sent, received
}

func (f *fakeFastPath) asks() (guests, neighbours int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.guestAsks, f.nbAsks
}

func (f *fakeFastPath) Begin() {
	f.building = fastView{map[ether.MAC]uint32{}, map[ether.MAC]ipoib.HwAddr{}, map[netip.Addr]ether.MAC{}}
}
func (f *fakeFastPath) Guest(mac ether.MAC, qpn uint32) { f.building.guests[mac] = qpn }
func (f *fakeFastPath) Neighbour(remac ether.MAC, rimac ipoib.HwAddr) {
	f.building.neigh[remac] = rimac
}
func (f *fakeFastPath) Sender(ip netip.Addr, remac ether.MAC) { f.building.senders[ip] = remac }
func (f *fakeFastPath) Commit() error {
	f.mu.Lock()
	f.state, f.commits = f.building, f.commits+1
	f.mu.Unlock()
	return nil
}

// waitState waits until a round after the commits already counted
// stated want.
func (f *fakeFastPath) waitState(t *testing.T, what string, want fastView) {
	t.Helper()
	f.mu.Lock()
	after := f.commits
	f.mu.Unlock()
	var got fastView
	testutil.WaitFor(t, what, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = f.state
		return f.commits > after && got.equal(want)
	})
}

func (f *fakeFastPath) view() fastView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

// TestFastPathSync: on the kernel backend (which names no senders, so
// the shim learns them from ARP), the fast path is told of the guest's
// VIF, the neighbour and its source IP once they are learned; of no
// neighbour nor source after a flush; of no guest once its VIF aged;
// of nothing during a capture; and of nothing after shutdown.
func TestFastPathSync(t *testing.T) {
	fp := &fakeFastPath{}
	f := kernelFabric{fakekernel.NewFabric()}
	a := newHV(t, f, "fe80::a", func(c *Config) { c.FastPath, c.VIFIdle = fp, time.Minute })
	b := newHV(t, f, "fe80::b", nil)
	_, remacB1 := arpExchange(t, a, b)
	va, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
	vb, _ := b.s.vifs.Lookup(mactrans.VIFKey{MAC: macB1})
	rimacB1 := ipoib.MakeHwAddr(0, vb.QPN, b.port.LocalGID())
	guest := map[ether.MAC]uint32{macA1: va.QPN}
	fp.waitState(t, "the guest, its neighbour and the neighbour's source", fastView{
		guests:  guest,
		neigh:   map[ether.MAC]ipoib.HwAddr{remacB1: rimacB1},
		senders: map[netip.Addr]ether.MAC{ipB1: remacB1},
	})

	c, err := a.s.StartCapture(CaptureTAP, 16)
	if err != nil {
		t.Fatal(err)
	}
	fp.waitState(t, "nothing during a capture", fastView{guests: map[ether.MAC]uint32{}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}})
	c.Stop()

	if n := a.s.FlushNeighbours(); n != 1 {
		t.Fatalf("flushed %d neighbours, want 1", n)
	}
	fp.waitState(t, "the guest alone after a flush", fastView{guests: guest, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}})

	a.clk.Advance(2 * time.Minute)
	a.waitCounter(t, VIFsAged, 1)
	if got := fp.view(); len(got.guests) != 0 {
		t.Fatalf("the aged VIF is still carried: %v", got)
	}

	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	testutil.WaitFor(t, "the guest back", func() bool { return len(fp.view().guests) == 1 })
	a.shutdown(t)
	if got := fp.view(); !got.equal(fastView{guests: map[ether.MAC]uint32{}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}}) {
		t.Fatalf("after shutdown the fast path still carries %v", got)
	}
}

// TestFastPathOffForClampMSS: with --clamp-mss every SYN must cross user
// space, so the fast path is told of nothing, round after round.
func TestFastPathOffForClampMSS(t *testing.T) {
	fp := &fakeFastPath{}
	f := kernelFabric{fakekernel.NewFabric()}
	a := newHV(t, f, "fe80::a", func(c *Config) { c.FastPath, c.ClampMSS = fp, true })
	b := newHV(t, f, "fe80::b", nil)
	arpExchange(t, a, b)
	empty := fastView{guests: map[ether.MAC]uint32{}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}}
	fp.waitState(t, "nothing with --clamp-mss", empty)
	if a.s.neigh.Len() != 1 || a.s.vifs.Len() != 1 {
		t.Fatalf("the tables hold %d neighbours and %d VIFs, want 1 and 1", a.s.neigh.Len(), a.s.vifs.Len())
	}
	fp.waitState(t, "still nothing a round later", empty)
}

// TestFastPathKeepsVIF: a guest whose frames only the fast path carries
// keeps its VIF past --vif-idle, counted; one the fast path did not
// carry ages out exactly as before, and so does the first once the fast
// path stops carrying it. Only the VIFs about to age are asked about.
func TestFastPathKeepsVIF(t *testing.T) {
	fp := &fakeFastPath{}
	s, _ := stillShim(t, memFab(t, 2048).Fabric, "fe80::a", func(c *Config) { c.FastPath, c.VIFIdle = fp, time.Minute })
	p, t0 := s.byVLAN[0].Load(), s.clk.Now()
	v1, err1 := s.vif(p, macA1, mactrans.OriginLearned, t0)
	v2, err2 := s.vif(p, macA2, mactrans.OriginLearned, t0)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	age := func(at time.Time) {
		s.ageVIFs(at)
		s.freeDrained()
	}
	age(t0.Add(30 * time.Second)) // neither idle for a minute: nothing asked
	if g, _ := fp.asks(); g != 0 {
		t.Fatalf("%d asks before any VIF was idle, want 0", g)
	}
	fp.use(macA1, true, false, false)
	age(t0.Add(2 * time.Minute))
	_, ok1 := s.vifs.Lookup(v1.Key)
	_, ok2 := s.vifs.Lookup(v2.Key)
	if !ok1 || ok2 || s.Get(VIFsAged) != 1 || s.Get(VIFsKeptFastPath) != 1 {
		t.Fatalf("A1 (fast path) kept %v, A2 kept %v; aged %d, kept %d; want true, false, 1, 1", ok1, ok2, s.Get(VIFsAged), s.Get(VIFsKeptFastPath))
	}
	age(t0.Add(150 * time.Second)) // A1 touched at 2 min: not idle yet
	if _, ok := s.vifs.Lookup(v1.Key); !ok {
		t.Fatal("A1 aged 30 s after the fast path was seen carrying it")
	}
	age(t0.Add(4 * time.Minute)) // idle, and the fast path carried nothing
	if _, ok := s.vifs.Lookup(v1.Key); ok || s.Get(VIFsAged) != 2 || s.Get(VIFsKeptFastPath) != 1 {
		t.Fatalf("A1 without fast-path use: still there %v; aged %d, kept %d; want false, 2, 1", ok, s.Get(VIFsAged), s.Get(VIFsKeptFastPath))
	}
	if g, _ := fp.asks(); g != 3 {
		t.Errorf("%d asks, want 3 (A1 and A2 at 2 min, A1 at 4)", g)
	}
}

// TestFastPathKeepsNeighbours: a neighbour about to age (not seen for
// the TTL) that the fast path sent to is marked used and stays, one it
// received from is marked seen and stays, and one it did not carry ages
// out as before; a neighbour chosen for eviction that the fast path sent
// to is spared and the next choice goes instead.
func TestFastPathKeepsNeighbours(t *testing.T) {
	fp := &fakeFastPath{}
	s, _ := stillShim(t, memFab(t, 2048).Fabric, "fe80::a", func(c *Config) { c.FastPath, c.MaxNeighbours = fp, 3 })
	t0 := s.clk.Now()
	learn := func(qpn uint32, at time.Time) *mactrans.Neighbour {
		t.Helper()
		n, err := s.neigh.Learn(0xffff, ipoib.MakeHwAddr(0, qpn, testutil.GID("fe80::b")), at)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	has := func(n *mactrans.Neighbour) bool {
		_, ok := s.neigh.LookupREMAC(n.PKey, n.REMAC)
		return ok
	}
	n1, n2, n3 := learn(0x11, t0), learn(0x12, t0), learn(0x13, t0)
	fp.use(n1.REMAC, false, true, false)
	fp.use(n2.REMAC, false, false, true)
	ttl := 10 * time.Minute
	if gone := s.neigh.Expire(t0.Add(ttl), ttl); gone != 1 || !has(n1) || !has(n2) || has(n3) {
		t.Fatalf("aging: %d gone; n1 (sent to) %v, n2 (received from) %v, n3 %v; want 1, true, true, false", gone, has(n1), has(n2), has(n3))
	}
	if s.Get(NeighboursKeptFastPath) != 2 || s.neigh.Counters().Aged != 1 {
		t.Fatalf("kept %d, aged %d; want 2, 1", s.Get(NeighboursKeptFastPath), s.neigh.Counters().Aged)
	}
	if _, nb := fp.asks(); nb != 3 {
		t.Errorf("%d asks, want 3 (the three about to age)", nb)
	}
	if s.neigh.Expire(t0.Add(2*ttl), ttl) != 2 {
		t.Fatal("n1 and n2 did not age once the fast path carried nothing")
	}

	// Eviction: a full table of three no guest sent to through user
	// space; the oldest, which the fast path sent to, is spared.
	t1 := t0.Add(3 * ttl)
	e1, e2, e3 := learn(0x21, t1), learn(0x22, t1.Add(time.Second)), learn(0x23, t1.Add(2*time.Second))
	fp.use(e1.REMAC, false, true, false)
	e4 := learn(0x24, t1.Add(3*time.Second))
	if !has(e1) || has(e2) || !has(e3) || !has(e4) || s.neigh.Counters().Evicted != 1 {
		t.Fatalf("eviction: e1 (sent to) %v, e2 %v, e3 %v, e4 %v, evicted %d; want true, false, true, true, 1", has(e1), has(e2), has(e3), has(e4), s.neigh.Counters().Evicted)
	}
	if s.Get(NeighboursKeptFastPath) != 3 {
		t.Errorf("kept %d, want 3", s.Get(NeighboursKeptFastPath))
	}
}
