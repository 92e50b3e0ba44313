package mactrans

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/ipoib"
)

var _ arpndp.Translator = (*View)(nil)

var (
	localGID  = ipoib.GID(netip.MustParseAddr("fe80::1").As16())
	remoteGID = ipoib.GID(netip.MustParseAddr("fe80::2").As16())
	t0        = time.Unix(1_000_000, 0)
)

func mac(i int) ether.MAC { return ether.MAC{0x52, 0x54, 0, byte(i >> 16), byte(i >> 8), byte(i)} }

// allocator hands out QPNs and counts calls.
type allocator struct{ n atomic.Uint32 }

func (a *allocator) alloc(ipoib.PKey, uint32) (uint32, error) { return 0x100 + a.n.Add(1), nil }

func TestVIFCreateLookupBound(t *testing.T) {
	tbl := NewVIFTable(localGID, 2)
	var al allocator
	v, created, err := tbl.Create(VIFKey{mac(1), 0}, 0xffff, OriginLearned, t0, al.alloc)
	if err != nil || !created {
		t.Fatal(err)
	}
	if v.LIMAC != ipoib.MakeHwAddr(0, v.QPN, localGID) {
		t.Fatalf("LIMAC %s", v.LIMAC)
	}
	if again, created, _ := tbl.Create(VIFKey{mac(1), 0}, 0xffff, OriginLearned, t0, al.alloc); created || again != v {
		t.Fatal("second Create made a new VIF")
	}
	// Same MAC on another VLAN is another VIF.
	if _, created, err := tbl.Create(VIFKey{mac(1), 10}, 0x800a, OriginLearned, t0, al.alloc); err != nil || !created {
		t.Fatal("per-VLAN VIF not created", err)
	}
	if _, _, err := tbl.Create(VIFKey{mac(2), 0}, 0xffff, OriginLearned, t0, al.alloc); !errors.Is(err, ErrFull) {
		t.Fatalf("third VIF: %v, want ErrFull", err)
	}
	if c := tbl.Counters(); c.Overflow != 1 || c.Created != 2 {
		t.Fatalf("counters %+v", c)
	}
	if got, ok := tbl.LookupQPN(v.QPN); !ok || got != v {
		t.Fatal("LookupQPN")
	}
	if _, ok := tbl.Lookup(VIFKey{mac(2), 0}); ok {
		t.Fatal("refused VIF present")
	}
	if al.n.Load() != 2 {
		t.Fatalf("%d QPs allocated, want 2 (none for the refused VIF)", al.n.Load())
	}
	if r, ok := tbl.Remove(VIFKey{mac(1), 10}, OriginDeclared); !ok || tbl.Len() != 1 {
		t.Fatal("Remove", r)
	}
	if _, ok := tbl.LookupQPN(0x102); ok {
		t.Fatal("removed VIF still found by QPN")
	}
}

// TestVIFReservePublish: a reservation takes a place (Full, ErrFull and
// ErrExists count it) without being found; Unreserve gives it back; a
// published VIF is found but not Ready until SetReady; Full counts a
// refusal as overflow and follows SetMax.
func TestVIFReservePublish(t *testing.T) {
	tbl := NewVIFTable(localGID, 2)
	k1, k2, k3 := VIFKey{mac(1), 0}, VIFKey{mac(2), 0}, VIFKey{mac(3), 0}
	if err := tbl.Reserve(k1); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Reserve(k1); !errors.Is(err, ErrExists) {
		t.Fatalf("second reservation: %v, want ErrExists", err)
	}
	if _, ok := tbl.Lookup(k1); ok || tbl.Len() != 0 || tbl.Full() {
		t.Fatalf("a reservation is found, counted in Len (%d) or fills the table", tbl.Len())
	}
	if err := tbl.Reserve(k2); err != nil {
		t.Fatal(err)
	}
	if !tbl.Full() || !errors.Is(tbl.Reserve(k3), ErrFull) || tbl.Counters().Overflow != 2 {
		t.Fatalf("two reservations of two: full %v, overflow %d", tbl.Full(), tbl.Counters().Overflow)
	}
	tbl.Unreserve(k2)
	if tbl.Full() {
		t.Fatal("still full after Unreserve")
	}
	v := tbl.NewVIF(k1, 0xffff, 0x42, OriginLearned, t0)
	tbl.Publish(v)
	if got, ok := tbl.Lookup(k1); !ok || got != v || v.Ready() || tbl.Len() != 1 {
		t.Fatalf("published VIF: found %v, ready %v, len %d", ok, v.Ready(), tbl.Len())
	}
	v.SetReady()
	if !v.Ready() {
		t.Fatal("SetReady")
	}
	tbl.SetMax(1)
	if !tbl.Full() {
		t.Fatal("not full at the lowered bound")
	}
}

func TestVIFAllocError(t *testing.T) {
	tbl := NewVIFTable(localGID, 4)
	_, _, err := tbl.Create(VIFKey{mac(1), 0}, 0xffff, OriginLearned, t0, func(ipoib.PKey, uint32) (uint32, error) { return 0, errors.New("no QPs") })
	if err == nil || tbl.Len() != 0 {
		t.Fatalf("err %v len %d", err, tbl.Len())
	}
}

func TestVIFExpire(t *testing.T) {
	clk := clock.NewFake(t0)
	tbl := NewVIFTable(localGID, 10)
	var al allocator
	busy, _, _ := tbl.Create(VIFKey{mac(1), 0}, 0xffff, OriginLearned, clk.Now(), al.alloc)
	idle, _, _ := tbl.Create(VIFKey{mac(2), 0}, 0xffff, OriginLearned, clk.Now(), al.alloc)
	clk.Advance(200 * time.Second)
	busy.Touch(clk.Now())
	clk.Advance(200 * time.Second)
	gone := tbl.Expire(clk.Now(), 300*time.Second)
	if len(gone) != 1 || gone[0] != idle {
		t.Fatalf("expired %v, want only the idle VIF", gone)
	}
	if _, ok := tbl.LookupQPN(idle.QPN); ok {
		t.Fatal("expired VIF found by QPN")
	}
	if _, ok := tbl.Lookup(busy.Key); !ok {
		t.Fatal("VIF in use aged out")
	}
	if tbl.Len() != 1 || tbl.Counters().Aged != 1 {
		t.Fatalf("len %d counters %+v", tbl.Len(), tbl.Counters())
	}
}

// TestVIFDeclaredStays: only learned VIFs age; a removal frees a VIF
// only when its source may (Origin.Frees): the control socket any, a
// switch what it declared or what was learned, a learned FDB entry only
// a learned VIF.
func TestVIFDeclaredStays(t *testing.T) {
	clk := clock.NewFake(t0)
	tbl := NewVIFTable(localGID, 10)
	var al allocator
	byOrigin := map[Origin]*VIF{}
	for o := OriginLearned; o <= OriginOVS; o++ {
		v, _, err := tbl.Create(VIFKey{mac(int(o) + 1), 0}, 0xffff, o, clk.Now(), al.alloc)
		if err != nil {
			t.Fatal(err)
		}
		byOrigin[o] = v
	}
	clk.Advance(time.Hour)
	if gone := tbl.Expire(clk.Now(), time.Minute); len(gone) != 1 || gone[0] != byOrigin[OriginLearned] {
		t.Fatalf("expired %v, want only the learned VIF", gone)
	}
	for _, c := range []struct {
		by, held Origin
		frees    bool
	}{
		{OriginLearned, OriginDeclared, false}, {OriginLearned, OriginBridge, false}, {OriginLearned, OriginOVS, false},
		{OriginBridge, OriginDeclared, false}, {OriginBridge, OriginOVS, false},
		{OriginOVS, OriginDeclared, false}, {OriginOVS, OriginBridge, false},
		{OriginBridge, OriginBridge, true}, {OriginOVS, OriginOVS, true}, {OriginDeclared, OriginDeclared, true},
	} {
		v := byOrigin[c.held]
		if _, ok := tbl.Remove(v.Key, c.by); ok != c.frees {
			t.Fatalf("a removal by %v of a VIF declared by %v: freed %v, want %v", c.by, c.held, ok, c.frees)
		}
		if c.frees { // put it back for the cases after
			byOrigin[c.held], _, _ = tbl.Create(v.Key, 0xffff, c.held, clk.Now(), al.alloc)
		}
	}
	for _, by := range []Origin{OriginLearned, OriginBridge, OriginOVS, OriginDeclared} {
		if !by.Frees(OriginLearned) {
			t.Fatalf("a removal by %v keeps a learned VIF", by)
		}
	}
	if _, ok := tbl.Remove(byOrigin[OriginOVS].Key, OriginDeclared); !ok {
		t.Fatal("the control socket could not free an OVS guest's VIF")
	}
}

func TestVIFConcurrentCreate(t *testing.T) {
	tbl := NewVIFTable(localGID, 1024)
	var al allocator
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if _, _, err := tbl.Create(VIFKey{mac(i), 0}, 0xffff, OriginLearned, t0, al.alloc); err != nil {
					t.Error(err)
				}
				tbl.Lookup(VIFKey{mac(i), 0})
			}
		}()
	}
	wg.Wait()
	if tbl.Len() != 200 || al.n.Load() != 200 {
		t.Fatalf("len %d allocs %d, want 200 each", tbl.Len(), al.n.Load())
	}
}

func TestQPNHint(t *testing.T) {
	k := VIFKey{mac(1), 0}
	h := QPNHint(k)
	if h < 2 || h >= ipoib.MaxQPN || QPNHint(k) != h {
		t.Fatalf("hint %#x", h)
	}
	if QPNHint(VIFKey{mac(1), 10}) == h || QPNHint(VIFKey{mac(2), 0}) == h {
		t.Fatal("VLAN or MAC does not change the hint")
	}
	var got uint32
	tbl := NewVIFTable(localGID, 4)
	tbl.Create(k, 0xffff, OriginLearned, t0, func(_ ipoib.PKey, hint uint32) (uint32, error) { got = hint; return hint, nil })
	if got != h {
		t.Fatalf("Create passed hint %#x, want %#x", got, h)
	}
}

func TestDeriveREMAC(t *testing.T) {
	m := DeriveREMAC(remoteGID, 0x48, 0)
	if m[0]&0x02 == 0 || m[0]&0x01 != 0 {
		t.Fatalf("REMAC %s not locally administered unicast", m)
	}
	if DeriveREMAC(remoteGID, 0x48, 0) != m {
		t.Fatal("not deterministic")
	}
	if DeriveREMAC(remoteGID, 0x49, 0) == m || DeriveREMAC(remoteGID, 0x48, 1) == m {
		t.Fatal("QPN or attempt does not change the REMAC")
	}
	// 100k endpoints: every one locally administered unicast.
	for q := uint32(0); q < 100_000; q++ {
		if r := DeriveREMAC(remoteGID, q, 0); r[0]&0x03 != 0x02 {
			t.Fatalf("REMAC %s for QPN %d", r, q)
		}
	}
}

func TestNeighLearn(t *testing.T) {
	clk := clock.NewFake(t0)
	tbl := NewNeighTable(100)
	hw := ipoib.MakeHwAddr(0, 0x48, remoteGID)
	n, err := tbl.Learn(0xffff, hw, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if n.REMAC != DeriveREMAC(remoteGID, 0x48, 0) {
		t.Fatalf("REMAC %s", n.REMAC)
	}
	// The connected-mode flag does not make another endpoint.
	if n2, _ := tbl.Learn(0xffff, ipoib.MakeHwAddr(ipoib.FlagConnected, 0x48, remoteGID), clk.Now()); n2 != n {
		t.Fatal("flags byte changed the identity")
	}
	if got, ok := tbl.LookupREMAC(0xffff, n.REMAC); !ok || got != n {
		t.Fatal("LookupREMAC")
	}
	// Partitions are separate: same endpoint in 0x8001 is another entry,
	// and not found by the other partition's lookups.
	if _, ok := tbl.LookupREMAC(0x8001, n.REMAC); ok {
		t.Fatal("entry leaked into another partition")
	}
	n3, _ := tbl.Learn(0x0001, hw, clk.Now()) // limited member key, same partition as 0x8001
	if n3 == n || n3.PKey != 0x8001 || tbl.Len() != 2 {
		t.Fatalf("partition entry %+v len %d", n3, tbl.Len())
	}
	if got, ok := tbl.LookupRIMAC(0x8001, hw); !ok || got != n3 {
		t.Fatal("LookupRIMAC normalises the P_Key")
	}
	// A forgotten endpoint comes back with the same REMAC (restarts, LID
	// changes and aging are invisible to guests).
	clk.Advance(time.Hour)
	if gone := tbl.Expire(clk.Now(), time.Minute); gone != 2 || tbl.Len() != 0 {
		t.Fatalf("expired %d, len %d", gone, tbl.Len())
	}
	n4, _ := tbl.Learn(0xffff, hw, clk.Now())
	if n4.REMAC != n.REMAC {
		t.Fatal("REMAC not stable across re-learning")
	}
}

func TestNeighCollision(t *testing.T) {
	tbl := NewNeighTable(100)
	fixed := ether.MAC{0x02, 0, 0, 0, 0, 1}
	tbl.derive = func(g ipoib.GID, q uint32, attempt int) ether.MAC {
		m := fixed
		m[5] += byte(attempt)
		return m
	}
	a, _ := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, 1, remoteGID), t0)
	b, _ := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, 2, remoteGID), t0)
	if a == b || a.REMAC == b.REMAC {
		t.Fatalf("collision merged: %s %s", a.REMAC, b.REMAC)
	}
	if tbl.Counters().Collisions != 1 {
		t.Fatalf("collisions %d", tbl.Counters().Collisions)
	}
	if got, _ := tbl.LookupREMAC(0xffff, b.REMAC); got.RIMAC.QPN() != 2 {
		t.Fatal("second endpoint not reachable by its REMAC")
	}
	// Exhaust every attempt: refused and counted, never merged.
	tbl.derive = func(ipoib.GID, uint32, int) ether.MAC { return fixed }
	if _, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, 3, remoteGID), t0); err == nil {
		t.Fatal("unresolvable collision accepted")
	}
	if tbl.Counters().Unresolved != 1 {
		t.Fatalf("unresolved %d", tbl.Counters().Unresolved)
	}
}

func TestNeighEviction(t *testing.T) {
	clk := clock.NewFake(t0)
	tbl := NewNeighTable(50)
	for i := 0; i < 200; i++ {
		clk.Advance(time.Second)
		if _, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(i), remoteGID), clk.Now()); err != nil {
			t.Fatal(err)
		}
		if tbl.Len() > 50 {
			t.Fatalf("len %d over bound", tbl.Len())
		}
	}
	if c := tbl.Counters(); c.Evicted != 150 || c.Learned != 200 {
		t.Fatalf("counters %+v", c)
	}
	// The newest entry always survives its own insertion.
	if _, ok := tbl.LookupRIMAC(0xffff, ipoib.MakeHwAddr(0, 199, remoteGID)); !ok {
		t.Fatal("newest entry evicted")
	}
}

// TestNeighEvictionSparesUsed: endpoints local guests send to survive
// a flood of endpoints that only speak, whatever the table's size;
// with every entry in use, the least recently used goes.
func TestNeighEvictionSparesUsed(t *testing.T) {
	for _, max := range []int{8, 1000} {
		clk := clock.NewFake(t0)
		tbl := NewNeighTable(max)
		var used []*Neighbour
		for i := range 3 {
			n, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(i), remoteGID), clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			used = append(used, n)
		}
		for i := 0; i < 20*max; i++ {
			clk.Advance(10 * time.Millisecond)
			if i%50 == 0 {
				for _, n := range used {
					n.Use(clk.Now())
				}
			}
			if _, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(0x100000+i), remoteGID), clk.Now()); err != nil {
				t.Fatal(err)
			}
		}
		for i, n := range used {
			if got, ok := tbl.LookupRIMAC(0xffff, n.RIMAC); !ok || got != n {
				t.Errorf("max %d: endpoint %d, in use, was evicted by the flood", max, i)
			}
		}
		if tbl.Len() != max {
			t.Errorf("max %d: %d entries", max, tbl.Len())
		}
	}
	// All in use: the least recently used is the one to go.
	clk := clock.NewFake(t0)
	tbl := NewNeighTable(2)
	a, _ := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, 1, remoteGID), clk.Now())
	b, _ := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, 2, remoteGID), clk.Now())
	a.Use(clk.Now())
	clk.Advance(2 * time.Second)
	b.Use(clk.Now())
	tbl.Learn(0xffff, ipoib.MakeHwAddr(0, 3, remoteGID), clk.Now())
	if _, ok := tbl.LookupRIMAC(0xffff, a.RIMAC); ok {
		t.Error("the least recently used entry survived")
	}
	if _, ok := tbl.LookupRIMAC(0xffff, b.RIMAC); !ok {
		t.Error("the most recently used entry was evicted")
	}
}

func TestNeighConcurrent(t *testing.T) {
	tbl := NewNeighTable(1000)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				hw := ipoib.MakeHwAddr(0, uint32(i%1500), remoteGID)
				n, err := tbl.Learn(0xffff, hw, t0.Add(time.Duration(i)*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				if g == 0 && i%100 == 0 {
					tbl.Expire(t0.Add(time.Duration(i)*time.Second), time.Hour)
				}
				tbl.LookupREMAC(0xffff, n.REMAC)
			}
		}(g)
	}
	wg.Wait()
	if tbl.Len() > 1000 {
		t.Fatalf("len %d over bound", tbl.Len())
	}
}

func TestView(t *testing.T) {
	vifs := NewVIFTable(localGID, 10)
	neigh := NewNeighTable(10)
	var al allocator
	v, _, _ := vifs.Create(VIFKey{mac(1), 10}, 0x800a, OriginLearned, t0, al.alloc)
	view := &View{VIFs: vifs, Neigh: neigh, Clock: clock.NewFake(t0), GID: localGID, VLAN: 10, PKey: 0x800a}
	if hw, ok := view.EthToIB(mac(1)); !ok || hw != v.LIMAC {
		t.Fatal("LEMAC → LIMAC")
	}
	if m, ok := view.IBToEth(v.LIMAC); !ok || m != mac(1) {
		t.Fatal("LIMAC → LEMAC")
	}
	remote := ipoib.MakeHwAddr(0, 0x77, remoteGID)
	remac, ok := view.IBToEth(remote)
	if !ok || remac != DeriveREMAC(remoteGID, 0x77, 0) {
		t.Fatal("RIMAC → REMAC learning")
	}
	if hw, ok := view.EthToIB(remac); !ok || hw != remote {
		t.Fatal("REMAC → RIMAC")
	}
	if _, ok := view.EthToIB(mac(9)); ok {
		t.Fatal("unknown MAC translated")
	}
	// Our VIF seen from another VLAN's view is not that VLAN's guest.
	other := &View{VIFs: vifs, Neigh: neigh, Clock: view.Clock, GID: localGID, VLAN: 20, PKey: 0x8014}
	if _, ok := other.EthToIB(mac(1)); ok {
		t.Fatal("VIF visible in another VLAN")
	}
}

func benchNeigh(b *testing.B, size, active int) {
	tbl := NewNeighTable(size)
	remacs := make([]ether.MAC, size)
	for i := 0; i < size; i++ {
		n, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(i), remoteGID), t0)
		if err != nil {
			b.Fatal(err)
		}
		remacs[i] = n.REMAC
	}
	b.ReportAllocs()
	b.SetBytes(1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := tbl.LookupREMAC(0xffff, remacs[i%active]); !ok {
			b.Fatal("miss")
		}
	}
}

// BenchmarkNeighLookup shows the REMAC lookup at 1,000 and 100,000
// entries. "active=1000" cycles over 1,000 destinations in both: the
// cost of the lookup itself, which should not grow with the table.
// "active=all" cycles over every entry; at 100,000 that is dominated by
// cache misses.
func BenchmarkNeighLookup(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("entries=%d/active=1000", n), func(b *testing.B) { benchNeigh(b, n, 1000) })
		b.Run(fmt.Sprintf("entries=%d/active=all", n), func(b *testing.B) { benchNeigh(b, n, n) })
	}
}

func BenchmarkNeighLearnKnown(b *testing.B) {
	tbl := NewNeighTable(1000)
	hw := ipoib.MakeHwAddr(0, 0x48, remoteGID)
	tbl.Learn(0xffff, hw, t0)
	b.ReportAllocs()
	b.SetBytes(1)
	for i := 0; i < b.N; i++ {
		tbl.Learn(0xffff, hw, t0)
	}
}

func BenchmarkVIFLookup(b *testing.B) {
	tbl := NewVIFTable(localGID, 1024)
	var al allocator
	for i := 0; i < 1024; i++ {
		tbl.Create(VIFKey{mac(i), 0}, 0xffff, OriginLearned, t0, al.alloc)
	}
	b.ResetTimer()
	b.ReportAllocs()
	b.SetBytes(1)
	for i := 0; i < b.N; i++ {
		if _, ok := tbl.Lookup(VIFKey{mac(i % 1024), 0}); !ok {
			b.Fatal("miss")
		}
	}
}

// TestVIFREMAC: a VIF's REMAC is the one a remote neighbour table
// derives for its LIMAC. It finds the VIF until the VIF is removed or
// aged out. A neighbour records the local VIF its guest moved to, and a
// VIF that it moved in.
func TestVIFREMAC(t *testing.T) {
	tbl := NewVIFTable(localGID, 4)
	var al allocator
	v, _, _ := tbl.Create(VIFKey{mac(1), 0}, 0xffff, OriginLearned, t0, al.alloc)
	w, _, _ := tbl.Create(VIFKey{mac(2), 0}, 0xffff, OriginLearned, t0.Add(time.Minute), al.alloc)
	remote := NewNeighTable(8) // another hypervisor's table
	nb, err := remote.Learn(0xffff, v.LIMAC, t0)
	if err != nil || nb.REMAC != v.REMAC {
		t.Fatalf("VIF REMAC %s, a peer shows %s (%v)", v.REMAC, nb.REMAC, err)
	}
	for _, x := range []*VIF{v, w} {
		if got, ok := tbl.LookupREMAC(x.REMAC); !ok || got != x {
			t.Fatalf("LookupREMAC(%s) = %v, %v", x.REMAC, got, ok)
		}
	}
	tbl.Remove(v.Key, OriginDeclared)
	if _, ok := tbl.LookupREMAC(v.REMAC); ok {
		t.Fatal("removed VIF still found by REMAC")
	}
	if gone := tbl.Expire(t0.Add(2*time.Minute), time.Minute); len(gone) != 1 {
		t.Fatalf("%d aged out, want 1", len(gone))
	}
	if _, ok := tbl.LookupREMAC(w.REMAC); ok {
		t.Fatal("aged-out VIF still found by REMAC")
	}
	if nb.MovedTo() != nil || !nb.MoveTo(w) || nb.MoveTo(w) || nb.MovedTo() != w {
		t.Fatal("MoveTo: news once, then recorded")
	}
	if w.MovedIn() {
		t.Fatal("moved in before SetMovedIn")
	}
	if w.SetMovedIn(); !w.MovedIn() || v.MovedIn() {
		t.Fatal("SetMovedIn not recorded on its VIF alone")
	}
}

// TestNeighIndexesAgree: evictions, aging and a flush move entries about
// in the table's sweep order. After them, every entry All returns is
// found by both lookups, and the indexes hold as many entries as Len.
// The entries aged or flushed are found by neither. An emptied table
// gives back the room a flood made.
func TestNeighIndexesAgree(t *testing.T) {
	clk := clock.NewFake(t0)
	tbl := NewNeighTable(300)
	agree := func(when string, want int) {
		t.Helper()
		all := tbl.All()
		if len(all) != want || tbl.Len() != want || tbl.byRIMAC.Size() != want || tbl.byREMAC.Size() != want {
			t.Fatalf("%s: All %d, Len %d, indexes %d and %d; want %d", when, len(all), tbl.Len(), tbl.byRIMAC.Size(), tbl.byREMAC.Size(), want)
		}
		for _, n := range all {
			if got, ok := tbl.LookupRIMAC(n.PKey, n.RIMAC); !ok || got != n {
				t.Fatalf("%s: %s not found by its RIMAC", when, n.RIMAC)
			}
			if got, ok := tbl.LookupREMAC(n.PKey, n.REMAC); !ok || got != n {
				t.Fatalf("%s: %s not found by its REMAC", when, n.REMAC)
			}
		}
	}
	var learned []*Neighbour
	for i := range 1000 {
		clk.Advance(time.Second)
		n, err := tbl.Learn(0xffff, ipoib.MakeHwAddr(0, uint32(i), remoteGID), clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		learned = append(learned, n)
	}
	agree("after 700 evictions", 300)
	held := make(map[*Neighbour]bool)
	old := 0
	for _, n := range tbl.All() {
		held[n] = true
		if clk.Now().Sub(n.LastSeen()) >= 100*time.Second {
			old++
		}
	}
	if gone := tbl.Expire(clk.Now(), 100*time.Second); gone != old || old == 0 {
		t.Fatalf("Expire removed %d, want the %d not seen for 100 s", gone, old)
	}
	agree("after aging", 300-old)
	for _, n := range learned {
		if _, ok := tbl.LookupREMAC(n.PKey, n.REMAC); ok != (held[n] && clk.Now().Sub(n.LastSeen()) < 100*time.Second) {
			t.Fatalf("%s found: %v, held before aging: %v, seen at %v", n.RIMAC, ok, held[n], n.LastSeen())
		}
	}
	if gone := tbl.Flush(); gone != 300-old {
		t.Fatalf("Flush removed %d, want %d", gone, 300-old)
	}
	agree("after a flush", 0)
	if tbl.all != nil {
		t.Fatal("the flushed table keeps the array its entries were in")
	}
}
