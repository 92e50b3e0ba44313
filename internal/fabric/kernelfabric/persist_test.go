package kernelfabric_test

import (
	"errors"
	"maps"
	"net/netip"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestPersistAdoptsChildren: under Config.Persist a port that Keep was
// called on leaves its children at FreeQP and Close. The next port
// adopts the group child by name at once, and a VIF child when AdoptQP
// asks for its QPN in its partition: same ifindex, same QPN, and it
// receives again. AllocQP wishing for a leftover's QPN (a new guest
// whose MAC hashes to it) and AdoptQP in another partition adopt
// nothing; a new child takes no leftover's name; EndAdoption deletes
// the leftover no VIF claimed, counted, and frees its name. A port
// without Persist deletes every leftover.
func TestPersistAdoptsChildren(t *testing.T) {
	fab := fakekernel.NewFabric()
	k := fab.NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	k.SetPKeys(0xffff, 0x8001)
	p1 := openCfg(t, k, kf.Config{Persist: true})
	qa, errA := p1.AllocQP(0xffff, 0)
	qb, errB := p1.AllocQP(0xffff, 0)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	before := k.ChildIndexes()
	p1.Keep()
	if err := p1.FreeQP(qa); err != nil { // as the shim frees its VIFs as it stops
		t.Fatal(err)
	}
	p1.Close()
	if got := k.ChildIndexes(); !maps.Equal(got, before) {
		t.Fatalf("children after a kept stop %v, want %v", got, before)
	}

	p2 := openCfg(t, k, kf.Config{Persist: true})
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 1 || s[kf.StatReclaimed] != 0 {
		t.Fatalf("at start: adopted %d reclaimed %d, want 1 (ib0.mffff) and 0", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if q, err := p2.AllocQP(0xffff, qb); err != nil || q == qb {
		t.Fatalf("AllocQP wishing for %#x (a leftover's): %#x %v, want a new child", qb, q, err)
	}
	if q, err := p2.AdoptQP(0xffff, qa); err != nil || q != qa {
		t.Fatalf("AdoptQP of %#x: %#x %v", qa, q, err)
	}
	if q, err := p2.AdoptQP(0x8001, qb); err != nil || q == qb {
		t.Fatalf("AdoptQP in partition 0x8001 of %#x (of 0xffff): %#x %v, want a new child", qb, q, err)
	}
	now := k.ChildIndexes()
	if now["ib0.e1"] != before["ib0.e1"] || now["ib0.mffff"] != before["ib0.mffff"] || now["ib0.e2"] != before["ib0.e2"] || now["ib0.e3"] == 0 || now["ib0.e4"] == 0 {
		t.Fatalf("children %v, want ib0.e1, ib0.e2 and ib0.mffff as before (%v) and the new ones ib0.e3 and ib0.e4", now, before)
	}
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 2 || s[kf.StatReclaimed] != 0 {
		t.Fatalf("adopted %d reclaimed %d, want 2 and 0", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if err := p2.EndAdoption(); err != nil {
		t.Fatal(err)
	}
	if _, ok := now["ib0.e2"]; ok && k.ChildIndexes()["ib0.e2"] != 0 {
		t.Fatal("the leftover no VIF claimed (ib0.e2) is still there")
	}
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 2 || s[kf.StatReclaimed] != 1 {
		t.Fatalf("after EndAdoption: adopted %d reclaimed %d, want 2 and 1", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if _, err := p2.AllocQP(0xffff, 0); err != nil || k.ChildIndexes()["ib0.e2"] == 0 {
		t.Fatalf("a new child after EndAdoption: %v, children %v, want ib0.e2 again", err, k.ChildIndexes())
	}

	// The adopted child receives: a packet from another host to qa.
	kb := fab.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	pb := open(t, kb)
	qpb, err := pb.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := unicast(pb, qpb, 0xffff, ipoib.MakeHwAddr(0, qa, testutil.GID("fe80::a")), 100); n != 1 {
		t.Fatalf("sent %d", n)
	}
	if n := readOne(t, p2); n != ipoib.HeaderLen+100 {
		t.Fatalf("read %d bytes, want %d", n, ipoib.HeaderLen+100)
	}

	p2.Close() // no Keep: deletes them
	if got := children(k); len(got) != 0 {
		t.Fatalf("children after a stop without Keep: %v", got)
	}
	// A port without Persist deletes what a kept stop leaves.
	p3 := openCfg(t, k, kf.Config{Persist: true})
	if _, err := p3.AllocQP(0xffff, 0); err != nil {
		t.Fatal(err)
	}
	p3.Keep()
	p3.Close()
	p4 := openCfg(t, k, kf.Config{})
	if s := p4.Counters().Stats; s[kf.StatAdopted] != 0 || s[kf.StatReclaimed] != 2 {
		t.Fatalf("without Persist: adopted %d reclaimed %d, want 0 and 2", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
}

// TestFastPathPersist: once the port keeps its children (Keep), Commit
// changes nothing, so a stop that states no guest leaves the maps
// full. The next port's FastPath keeps the entries of the children left
// for adoption, EndAdoption (called before any round, as the daemon
// does) deletes those of the leftover no VIF claimed, and the first
// round, stating the adopted child's guest, makes no call.
func TestFastPathPersist(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	p1 := openCfg(t, k, kf.Config{Persist: true})
	qa, errA := p1.AllocQP(0xffff, 0)
	qb, errB := p1.AllocQP(0xffff, 0)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	macA, macB := ether.MAC{0x52, 0x54, 0, 0, 0, 0xa}, ether.MAC{0x52, 0x54, 0, 0, 0, 0xb}
	remac := ether.MAC{0x02, 0, 0, 0, 0, 1}
	rimac := ipoib.MakeHwAddr(0, 0x123456, testutil.GID("fe80::b"))
	ip := netip.MustParseAddr("10.0.0.2")
	guests := map[ether.MAC]uint32{macA: qa, macB: qb}
	neigh := map[ether.MAC]ipoib.HwAddr{remac: rimac}
	senders := map[netip.Addr]ether.MAC{ip: remac}
	m := fakekernel.NewFastMaps()
	f1 := p1.NewFastPath(m, 77, 9000)
	if err := round(f1, guests, neigh, senders); err != nil {
		t.Fatal(err)
	}
	if len(m.Guests) != 2 || len(m.Children) != 2 || len(m.REMACs) != 1 || len(m.Senders) != 2 {
		t.Fatalf("maps %v %v %v %v", m.Guests, m.Children, m.REMACs, m.Senders)
	}
	p1.Keep()
	m.Calls = 0
	if err := round(f1, nil, nil, nil); err != nil || m.Calls != 0 { // the shim stopping
		t.Fatalf("a round after Keep made %d map calls (%v), want 0", m.Calls, err)
	}
	f1.Stop()
	p1.Close()

	p2 := openCfg(t, k, kf.Config{Persist: true})
	f2 := p2.NewFastPath(m, 77, 9000)
	if m.Calls != 0 {
		t.Fatalf("NewFastPath made %d map calls, want 0: both children are left for adoption", m.Calls)
	}
	if q, err := p2.AdoptQP(0xffff, qa); err != nil || q != qa {
		t.Fatalf("AdoptQP of %#x: %#x %v", qa, q, err)
	}
	// As the daemon does, before any round: guest B's child was not
	// claimed, so its guest, child and sender entries go.
	if err := p2.EndAdoption(); err != nil || m.Calls != 3 {
		t.Fatalf("EndAdoption: %v, %d map calls, want 3 (guest B's guest, child and sender entries)", err, m.Calls)
	}
	if _, ok := m.Guests[macB]; ok || len(m.Children) != 1 || len(m.Senders) != 1 {
		t.Fatalf("after EndAdoption: guests %v children %v senders %v, want guest A's alone", m.Guests, m.Children, m.Senders)
	}
	m.Calls = 0
	if err := round(f2, map[ether.MAC]uint32{macA: qa}, neigh, senders); err != nil || m.Calls != 0 {
		t.Fatalf("first round: %v, %d map calls, want 0: guest A's entries are in place", err, m.Calls)
	}
	la, _ := k.Link("ib0.e1")
	if g, ok := m.Guests[macA]; !ok || int(g.Ifindex) != la.Index || len(m.Guests) != 1 || len(m.Senders) != 1 {
		t.Fatalf("guests %v senders %v, want guest A's entries on ifindex %d", m.Guests, m.Senders, la.Index)
	}
}

// TestPersistUnadoptable: under Config.Persist a leftover that cannot
// serve as the child asked for is deleted, counted reclaimed, and a new
// child made in its place: a group child whose P_Key is not its name's
// (New would otherwise fail on its name, EEXIST), and VIF children in
// connected mode or with user multicast on. The group child left in a
// partition the P_Key table refuses is deleted, counted as refused and
// not as reclaimed.
func TestPersistUnadoptable(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	k.SetPKeys(0xffff, 0x8001)
	spec := map[string]ipoib.PKey{"ib0.mffff": 0x8001, "ib0.e1": 0xffff, "ib0.e2": 0xffff, "ib0.m8002": 0x8002}
	for _, name := range []string{"ib0.mffff", "ib0.e1", "ib0.e2", "ib0.m8002"} {
		if err := k.AddChild(kf.ChildSpec{Name: name, Parent: 1, PKey: spec[name]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(k.SetChildMode("ib0.e1", kf.ModeConnected, 0), k.SetChildMode("ib0.e2", kf.ModeDatagram, 1)); err != nil {
		t.Fatal(err)
	}
	before := k.ChildIndexes()
	qpn := func(name string) uint32 { l, _ := k.LinkByName(name); return l.HwAddr.QPN() }
	q1, q2 := qpn("ib0.e1"), qpn("ib0.e2")

	p := openCfg(t, k, kf.Config{Persist: true})
	if s := p.Counters().Stats; s[kf.StatAdopted] != 0 || s[kf.StatReclaimed] != 1 {
		t.Fatalf("at start: adopted %d reclaimed %d, want 0 and 1 (ib0.mffff of P_Key 0x8001)", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if st, ok := k.Link("ib0.mffff"); !ok || st.PKey != 0xffff || st.Index == before["ib0.mffff"] {
		t.Fatalf("group child %+v (was ifindex %d), want a new one of P_Key 0xffff", st, before["ib0.mffff"])
	}
	for _, q := range []uint32{q1, q2} {
		if got, err := p.AdoptQP(0xffff, q); err != nil || got == q {
			t.Fatalf("AdoptQP of %#x (connected or umcast): %#x %v, want a new child", q, got, err)
		}
	}
	if _, err := p.AllocQP(0x8002, 0); !errors.Is(err, kf.ErrPKeyNotInTable) {
		t.Fatalf("AllocQP in partition 0x8002, not in the table: %v", err)
	}
	s := p.Counters().Stats
	if s[kf.StatAdopted] != 0 || s[kf.StatReclaimed] != 3 || s[kf.StatRefusedPKey] != 1 {
		t.Fatalf("adopted %d reclaimed %d refused_pkey %d, want 0, 3 and 1", s[kf.StatAdopted], s[kf.StatReclaimed], s[kf.StatRefusedPKey])
	}
	now := k.ChildIndexes()
	if len(now) != 3 || now["ib0.e1"] == before["ib0.e1"] || now["ib0.e2"] == before["ib0.e2"] || now["ib0.m8002"] != 0 {
		t.Fatalf("children %v (were %v), want ib0.mffff, ib0.e1 and ib0.e2 new, ib0.m8002 gone", now, before)
	}
}

// TestPersistConnectedParent: with the parent in connected mode the
// port's MTU is read from its first child, so the default group child a
// previous run left, whose MTU its partition's broadcast group lowered,
// is deleted and a new one made: the port keeps the UD MTU (4096).
func TestPersistConnectedParent(t *testing.T) {
	f := fakekernel.NewFabric()
	k := f.NewHost(testutil.GID("fe80::a"), "ib0", 4092)
	k.SetConnected()
	f.SetGroupMTU(0xffff, 2048)
	p1 := openCfg(t, k, kf.Config{Persist: true})
	if p1.MTU() != 4096 || p1.PartitionMTU(0xffff) != 2048 {
		t.Fatalf("first run: MTU %d partition %d, want 4096 and 2048", p1.MTU(), p1.PartitionMTU(0xffff))
	}
	before := k.ChildIndexes()["ib0.mffff"]
	p1.Keep()
	p1.Close()

	p2 := openCfg(t, k, kf.Config{Persist: true})
	if p2.MTU() != 4096 {
		t.Fatalf("after the restart: MTU %d, want 4096 (the UD MTU)", p2.MTU())
	}
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 0 || s[kf.StatReclaimed] != 1 || k.ChildIndexes()["ib0.mffff"] == before {
		t.Fatalf("adopted %d reclaimed %d, ib0.mffff ifindex %d (was %d): want the group child deleted and made again", s[kf.StatAdopted], s[kf.StatReclaimed], k.ChildIndexes()["ib0.mffff"], before)
	}
}
