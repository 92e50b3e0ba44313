package shim

import (
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/internal/warnlimit"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestUndeclaredLocal: in --learn declared, frames with no VIF from the
// MACs SetLocalMACs names (the bridge's, say) count as
// drop_undeclared_local, others as drop_undeclared, exactly one each.
// None takes a QP or reaches the fabric. SetLocalMACs replaces the set,
// and a local MAC that is declared is served.
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
		testutil.WaitFor(t, step+": the drops counted", func() bool {
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

// TestUndeclaredLogged: in --learn declared, housekeeping logs the
// frames dropped from undeclared MACs, at most once a warnlimit.Interval
// (of the shim's clock). The line names the last one's MAC and VLAN and
// how many were dropped since the last line. Frames from a local MAC
// are not in it.
func TestUndeclaredLogged(t *testing.T) {
	f := memFab(t, 2048)
	var log syncBuffer
	a := newHV(t, f, "fe80::a", func(c *Config) {
		c.Learn = LearnDeclared
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	from := func(src ether.MAC) []byte {
		return arpFrame(t, layers.ARPRequest, src, ipA1, ether.Broadcast, ether.MAC{}, ipB1)
	}
	const msg = `level=WARN msg="frames from a MAC no one declared dropped (--learn declared; one line a minute at most)"`
	lines := func() []string {
		var l []string
		for _, s := range strings.Split(log.String(), "\n") {
			if strings.Contains(s, msg) {
				_, rest, _ := strings.Cut(s, msg+" ")
				l = append(l, rest)
			}
		}
		return l
	}
	// rounds waits for two housekeeping rounds to end after now: the
	// second began after now.
	rounds := func() {
		t.Helper()
		for range 2 {
			t0 := time.Now().UnixNano()
			testutil.WaitFor(t, "a housekeeping round", func() bool { return a.s.lastRound.Load() > t0 })
		}
	}

	a.dev.Inject(from(macA1))
	testutil.WaitFor(t, "the first line", func() bool { return len(lines()) == 1 })
	if l := lines(); l[0] != "mac="+macA1.String()+" vlan=0 dropped=1" {
		t.Fatalf("line %q", l[0])
	}
	// Within the interval: counted, not logged; a local MAC's frame is
	// neither.
	a.s.SetLocalMACs([]ether.MAC{macB1})
	a.dev.Inject(from(macA2))
	a.waitCounter(t, DropUndeclared, 2)
	a.dev.Inject(from(macA1))
	a.dev.Inject(from(macB1))
	a.waitCounter(t, DropUndeclaredLocal, 1)
	a.waitCounter(t, DropUndeclared, 3)
	rounds()
	if l := lines(); len(l) != 1 {
		t.Fatalf("lines within the interval: %q", l)
	}
	// One interval on, one line for the two: the last was macA1's.
	a.clk.Advance(warnlimit.Interval)
	testutil.WaitFor(t, "the second line", func() bool { return len(lines()) == 2 })
	if l := lines(); l[1] != "mac="+macA1.String()+" vlan=0 dropped=2" {
		t.Fatalf("line %q", l[1])
	}
	// Nothing dropped since: no line, however long.
	a.clk.Advance(2 * warnlimit.Interval)
	rounds()
	if l := lines(); len(l) != 2 {
		t.Fatalf("lines with no drop since: %q", l)
	}
}
