package shim

import (
	"maps"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/gopacket/gopacket/layers"
)

// TestUndeclaredLocal: in --learn declared, frames with no VIF from the
// MACs SetLocalMACs names (the bridge's, say) count as
// drop_undeclared_local, others as drop_undeclared, exactly one each,
// and none takes a QP or reaches the fabric; SetLocalMACs replaces the
// set, and a local MAC that is declared is served.
func TestUndeclaredLocal(t *testing.T) {
	f := memFab(t, 2048)
	a := newHV(t, f, "fe80::a", func(c *Config) { c.Learn = LearnDeclared })
	b := newHV(t, f, "fe80::b", nil)
	bridge := ether.MAC{0x5a, 0x11, 0, 0, 0, 1}
	from := func(src ether.MAC) []byte {
		return arpFrame(t, layers.ARPRequest, src, ipA1, ether.Broadcast, ether.MAC{}, ipB1)
	}
	drops := func() map[string]uint64 {
		return map[string]uint64{"local": a.s.Get(DropUndeclaredLocal), "undeclared": a.s.Get(DropUndeclared), "vifs": a.s.Get(VIFsCreated)}
	}
	check := func(step string, want map[string]uint64) {
		t.Helper()
		// TxFrames counts a frame before tx drops it: wait for the drops.
		a.waitCounter(t, TxFrames, want["frames"])
		delete(want, "frames")
		waitFor(t, step+": the drops counted", func() bool {
			return a.s.Get(DropUndeclaredLocal)+a.s.Get(DropUndeclared) >= want["local"]+want["undeclared"]
		})
		if got := drops(); !maps.Equal(got, want) {
			t.Fatalf("%s: counters %v, want %v", step, got, want)
		}
	}

	// No local MACs yet: the bridge's frame is an undeclared one.
	a.dev.Inject(from(bridge))
	check("no local MACs", map[string]uint64{"frames": 1, "local": 0, "undeclared": 1, "vifs": 0})

	a.s.SetLocalMACs([]ether.MAC{bridge, macA2})
	a.dev.Inject(from(bridge))
	a.dev.Inject(from(macA2))
	a.dev.Inject(from(macA1)) // a guest's, never declared
	check("bridge and macA2 local", map[string]uint64{"frames": 4, "local": 2, "undeclared": 2, "vifs": 0})
	b.quiet(t)

	// A new set replaces the old one.
	a.s.SetLocalMACs([]ether.MAC{macA2})
	a.dev.Inject(from(bridge))
	a.dev.Inject(from(macA2))
	check("macA2 alone local", map[string]uint64{"frames": 6, "local": 3, "undeclared": 3, "vifs": 0})

	// Declared, a local MAC is served like a guest.
	if err := a.s.DeclareVIF(macA2, 0, mactrans.OriginDeclared); err != nil {
		t.Fatal(err)
	}
	a.dev.Inject(from(macA2))
	if p := b.recv(t); p.Layer(layers.LayerTypeARP) == nil {
		t.Fatalf("the declared local MAC's ARP not delivered: %v", p)
	}
	check("macA2 declared", map[string]uint64{"frames": 7, "local": 3, "undeclared": 3, "vifs": 1})
}
