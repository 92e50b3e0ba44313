package netns

import (
	"strings"
	"testing"
)

// TestOVSWatch: with Open vSwitch and --learn declared, a guest is
// served once its OVS interface carries external_ids:attached-mac, as
// libvirt sets it. Before that its frames are dropped and counted, and
// it gets no VIF. A port added with an attached-mac gets its VIF before
// the guest sends anything, on the port's access VLAN. Deleting the port
// frees the VIF at once. The daemon logs each such guest with
// origin=ovs.
func TestOVSWatch(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{n: 2, ovs: []bool{true, true}, extra: []string{"--learn", "declared", "--vlan-pkey", "10=0x800a"}})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	unanswered(t, g11, g21.ip4)
	if m := h1.metrics(t); m["drop_undeclared"] == 0 || m["vifs_created"] != 0 {
		t.Fatalf("h1: drop_undeclared %v, vifs_created %v; want drops and no VIF", m["drop_undeclared"], m["vifs_created"])
	}
	for _, c := range []struct {
		h *hypervisor
		g *guest
	}{{h1, g11}, {h2, g21}} {
		sh(t, "ovs-vsctl", "--timeout=10", "--db="+c.h.ovsDB(), "set", "Interface", "vg1", "external_ids:attached-mac="+c.g.mac(t).String())
		waitMetric(t, c.h, "vifs_created", 1)
		if !strings.Contains(c.h.log(), `msg="guest declared" origin=ovs mac=`+c.g.mac(t).String()+" vlan=0") {
			t.Fatalf("%s: no log of the declared guest:\n%s", c.h.name, c.h.log())
		}
	}
	for _, g := range []*guest{g11, g21} {
		sh(t, in(g.ns, "ip", "neigh", "flush", "all")...)
	}
	pingN(t, g11, g21.ip4, 5)

	// A port added as libvirt adds one: the VIF exists before the guest
	// speaks, in VLAN 10's partition; removing the port removes it.
	const silent = "02:00:00:00:bb:01"
	sh(t, in(h1.ns, "ip", "link", "add", "vg9", "type", "veth", "peer", "name", "vg9p")...)
	sh(t, "ovs-vsctl", "--timeout=10", "--db="+h1.ovsDB(), "add-port", "obr", "vg9", "tag=10", "--",
		"set", "Interface", "vg9", "external_ids:attached-mac="+silent)
	waitMetric(t, h1, "vifs_created", 2)
	if q := h1.vifQPN(silent, 10); q == 0 {
		t.Fatalf("no VIF of %s in VLAN 10: %v", silent, h1.vifMACs())
	}
	sh(t, "ovs-vsctl", "--timeout=10", "--db="+h1.ovsDB(), "del-port", "obr", "vg9")
	waitMetric(t, h1, "vifs_removed", 1)
	if !strings.Contains(h1.log(), `msg="guest gone" origin=ovs mac=`+silent+" vlan=10") {
		t.Fatalf("no log of the removed guest:\n%s", h1.log())
	}
	pingN(t, g11, g21.ip4, 3) // the others keep working
}
