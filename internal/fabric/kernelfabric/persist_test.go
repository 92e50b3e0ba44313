package kernelfabric_test

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// indexes maps the names of the links under the parent to their
// ifindexes.
func indexes(k *fakekernel.Kernel) map[string]int {
	links, _ := k.Links()
	out := map[string]int{}
	for _, l := range links {
		if l.ParentIndex != 0 {
			out[l.Name] = l.Index
		}
	}
	return out
}

// TestPersistAdoptsChildren: under Config.Persist a port that Keep was
// called on leaves its children at FreeQP and Close. The next port
// adopts the group child by name at once, and a VIF child when AllocQP
// wishes for its QPN in its partition: same ifindex, same QPN, and it
// receives again. A wish in another partition adopts nothing; a new
// child takes no leftover's name; EndAdoption deletes the leftover no
// VIF claimed, counted, and frees its name. A port without Persist
// deletes every leftover.
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
	before := indexes(k)
	p1.Keep()
	if err := p1.FreeQP(qa); err != nil { // as the shim frees its VIFs as it stops
		t.Fatal(err)
	}
	p1.Close()
	if got := indexes(k); !maps.Equal(got, before) {
		t.Fatalf("children after a kept stop %v, want %v", got, before)
	}

	p2 := openCfg(t, k, kf.Config{Persist: true})
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 1 || s[kf.StatReclaimed] != 0 {
		t.Fatalf("at start: adopted %d reclaimed %d, want 1 (ib0.mffff) and 0", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if q, err := p2.AllocQP(0xffff, qa); err != nil || q != qa {
		t.Fatalf("AllocQP wishing for %#x: %#x %v", qa, q, err)
	}
	if q, err := p2.AllocQP(0x8001, qb); err != nil || q == qb {
		t.Fatalf("AllocQP in partition 0x8001 wishing for %#x (of 0xffff): %#x %v, want a new child", qb, q, err)
	}
	now := indexes(k)
	if now["ib0.e1"] != before["ib0.e1"] || now["ib0.mffff"] != before["ib0.mffff"] || now["ib0.e2"] != before["ib0.e2"] || now["ib0.e3"] == 0 {
		t.Fatalf("children %v, want ib0.e1, ib0.e2 and ib0.mffff as before (%v) and the new one ib0.e3", now, before)
	}
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 2 || s[kf.StatReclaimed] != 0 {
		t.Fatalf("adopted %d reclaimed %d, want 2 and 0", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if err := p2.EndAdoption(); err != nil {
		t.Fatal(err)
	}
	if _, ok := now["ib0.e2"]; ok && indexes(k)["ib0.e2"] != 0 {
		t.Fatal("the leftover no VIF claimed (ib0.e2) is still there")
	}
	if s := p2.Counters().Stats; s[kf.StatAdopted] != 2 || s[kf.StatReclaimed] != 1 {
		t.Fatalf("after EndAdoption: adopted %d reclaimed %d, want 2 and 1", s[kf.StatAdopted], s[kf.StatReclaimed])
	}
	if _, err := p2.AllocQP(0xffff, 0); err != nil || indexes(k)["ib0.e2"] == 0 {
		t.Fatalf("a new child after EndAdoption: %v, children %v, want ib0.e2 again", err, indexes(k))
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
// for adoption (the adopted child's round makes no call), and
// EndAdoption deletes those of the leftover no VIF claimed.
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
	if q, err := p2.AllocQP(0xffff, qa); err != nil || q != qa {
		t.Fatalf("AllocQP wishing for %#x: %#x %v", qa, q, err)
	}
	if err := round(f2, map[ether.MAC]uint32{macA: qa}, neigh, senders); err != nil {
		t.Fatal(err)
	}
	// The round deletes guest B's entries (not stated): 2 + its sender.
	if m.Calls != 3 {
		t.Fatalf("first round made %d map calls, want 3 (guest B's guest, child and sender entries)", m.Calls)
	}
	m.Calls = 0
	if err := p2.EndAdoption(); err != nil || m.Calls != 0 {
		t.Fatalf("EndAdoption: %v, %d map calls, want none left to delete", err, m.Calls)
	}
	la, _ := k.Link("ib0.e1")
	if g, ok := m.Guests[macA]; !ok || int(g.Ifindex) != la.Index || len(m.Guests) != 1 || len(m.Senders) != 1 {
		t.Fatalf("guests %v senders %v, want guest A's entries on ifindex %d", m.Guests, m.Senders, la.Index)
	}
}
