package netns

import (
	"testing"
	"time"
)

// waitMetric waits up to 20 s for metric name of h to reach want.
func waitMetric(t *testing.T, h *hypervisor, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := h.metrics(t)
		if m[name] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s = %v, want %v", h.name, name, m[name], want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBridgeWatch: the daemon follows the bridge's forwarding database.
// A static entry, as libvirt adds for a guest, creates the guest's VIF
// before it sends anything. Deleting the entry frees it. When a guest's
// port leaves the bridge, the VIF of the MAC learned on it is freed at
// once instead of after --vif-idle.
func TestBridgeWatch(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21 := h1.guests[0], h1.guests[1], h2.guests[0]
	ping(t, g11, g21.ip4)
	ping(t, g12, g21.ip4)
	created := h1.metrics(t)["vifs_created"]

	const silent = "02:00:00:00:aa:01"
	sh(t, in(h1.ns, "bridge", "fdb", "add", silent, "dev", "vg1", "master", "static")...)
	waitMetric(t, h1, "vifs_created", created+1)
	if h1.vifMACs()[silent] != 1 {
		t.Fatalf("no VIF created for the static entry %s: %v", silent, h1.vifMACs())
	}
	sh(t, in(h1.ns, "bridge", "fdb", "del", silent, "dev", "vg1", "master")...)
	waitMetric(t, h1, "vifs_removed", 1)

	sh(t, in(h1.ns, "ip", "link", "set", "vg2", "nomaster")...)
	waitMetric(t, h1, "vifs_removed", 2)
	if m := h1.metrics(t); m["vifs_aged"] != 0 {
		t.Fatalf("vifs_aged %v: the VIFs went by aging, not by the bridge", m["vifs_aged"])
	}
	ping(t, g11, g21.ip4) // the others keep working
}

// TestLearnDeclared: with --learn declared a guest is served only once
// its MAC has a static entry in the bridge's FDB (as libvirt adds).
// Before that, and for a guest that never gets one, its frames are
// dropped and counted, and no VIF (no QP) is made for its MAC. With the
// entries in place on both sides, pings pass without loss.
func TestLearnDeclared(t *testing.T) {
	tp := newTopo(t, 2, false, "--learn", "declared")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21 := h1.guests[0], h1.guests[1], h2.guests[0]
	unanswered(t, g11, g21.ip4)
	if m := h1.metrics(t); m["drop_undeclared"] == 0 || m["vifs_created"] != 0 {
		t.Fatalf("h1: drop_undeclared %v, vifs_created %v; want drops and no VIF", m["drop_undeclared"], m["vifs_created"])
	}
	sh(t, in(h1.ns, "bridge", "fdb", "replace", g11.mac(t).String(), "dev", "vg1", "master", "static")...)
	sh(t, in(h2.ns, "bridge", "fdb", "replace", g21.mac(t).String(), "dev", "vg1", "master", "static")...)
	waitMetric(t, h1, "vifs_created", 1)
	waitMetric(t, h2, "vifs_created", 1)
	// The failed pings left the guests' ARP entries FAILED, which the
	// kernel answers with "host unreachable" for a while: start afresh.
	for _, g := range []*guest{g11, g21} {
		sh(t, in(g.ns, "ip", "neigh", "flush", "all")...)
	}
	pingN(t, g11, g21.ip4, 5)
	before := h1.metrics(t)["drop_undeclared"]
	unanswered(t, g12, g21.ip4)
	if m := h1.metrics(t); m["drop_undeclared"] <= before || m["vifs_created"] != 1 || h1.vifMACs()[g12.mac(t).String()] != 0 {
		t.Fatalf("h1 after the undeclared guest: drop_undeclared %v (was %v), vifs_created %v; want more drops and still one VIF", m["drop_undeclared"], before, m["vifs_created"])
	}
}
