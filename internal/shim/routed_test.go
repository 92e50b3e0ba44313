package shim

import (
	"testing"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/routedtest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestRouted runs the routed topology (internal/routedtest) over every
// backend, and over the in-memory fabric with its senders hidden: a
// guest pings, pings over IPv6 and streams TCP to an address behind a
// native IPoIB router, and gets its routed multicast. Where the port
// cannot name the router, what X sends arrives from the partition's
// stand-in MAC, counted, and nothing is asked for X; where it can, from
// the router's REMAC.
func TestRouted(t *testing.T) {
	run := func(t *testing.T, f fabric) {
		h := newHV(t, f, "fe80::a", nil)
		s := routedtest.Setup{Guest: h.dev, Counters: h.s.Counters, Joined: h.port.Joined, Router: f.port(t, testutil.GID("fe80::1"))}
		if f.hidesSources() {
			s.Anon = mactrans.DeriveREMAC(ipoib.BroadcastMGID(ipoib.DefaultPKey, ipoib.ScopeLinkLocal), ipoib.MulticastQPN, 0)
		}
		routedtest.Run(t, s)
	}
	forEachBackend(t, run)
	t.Run("memfabric-hidden", func(t *testing.T) { run(t, memFabHidden(t, 2048)) })
}

// TestStandInMAC: the stand-in source MAC is one per partition, locally
// administered and unicast, so a bridge learns one entry per partition
// and never a multicast source.
func TestStandInMAC(t *testing.T) {
	h := newHV(t, memFab(t, 2048), "fe80::a", func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{10: 0x800a, 20: 0x8014} })
	seen := map[ether.MAC]bool{}
	for _, p := range h.s.partitions() {
		if p.anon[0]&0x03 != 0x02 || seen[p.anon] {
			t.Fatalf("partition %s: stand-in %s (seen %v)", p.pkey, p.anon, seen)
		}
		seen[p.anon] = true
	}
	if len(seen) != 3 { // untagged and the two VLANs
		t.Fatalf("%d stand-ins for partitions %v, want 3", len(seen), h.s.partitions())
	}
}
