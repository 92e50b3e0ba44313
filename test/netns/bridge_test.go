package netns

import (
	"testing"
	"time"
)

// waitMetric waits up to 3 s for metric name of h to reach want.
func waitMetric(t *testing.T, h *hypervisor, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
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
// before it sends anything; deleting the entry frees it; and when a
// guest's port leaves the bridge, the VIF of the MAC learned on it is
// freed at once instead of after --vif-idle.
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
