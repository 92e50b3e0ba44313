package netns

import (
	"maps"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childLine matches a child in "ip -o link show": its ifindex and name.
var childLine = regexp.MustCompile(`(?m)^(\d+): (ib0\.[em][0-9a-f]+)@`)

// emuChildren maps the names of hypervisor h's IPoIB children (the
// emulated ones, veths) to their ifindexes.
func emuChildren(t *testing.T, h *hypervisor) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range childLine.FindAllStringSubmatch(sh(t, in(h.ns, "ip", "-o", "link", "show")...), -1) {
		out[m[2]], _ = strconv.Atoi(m[1])
	}
	return out
}

// TestKernelBackendEmulatedPersist: eipoibd's kernel backend with the
// fast path on, under --persist (its TAP's queues held by a keeper),
// over the emulated IPoIB wire. A clean stop leaves hypervisor 1's IPoIB
// children and the fast path's maps, so that while its daemon is down
// the fast path alone carries its guest's pings to and from the other
// hypervisor's, every one answered. The next start adopts the children
// (same ifindexes, same QPNs; none reclaimed), pings are answered and
// the fast path carries again. A crash (SIGKILL) leaves the same, and
// the start after it adopts them the same; a guest new after it gets a
// child of its own and is answered. A start without --persist deletes
// them.
func TestKernelBackendEmulatedPersist(t *testing.T) {
	tp := newEmuTopo(t, "on")
	g1, g2 := tp.guests[0], tp.guests[1]
	h1, h2 := tp.hvs[0], tp.hvs[1]
	// The guests' ARP entries stay reachable across the test: while
	// eipoibd is down nothing answers ARP, and this test is about what
	// the fast path carries meanwhile.
	for _, g := range tp.guests {
		sh(t, in(g.ns, "sysctl", "-qw", "net.ipv4.neigh.eth0.base_reachable_time_ms=3600000")...)
	}
	pins := t.TempDir()
	sh(t, "mount", "-t", "bpf", "bpf", pins)
	t.Cleanup(func() { shErr("umount", pins) })
	socket := filepath.Join(h1.logDir, "keeper.sock")
	startKeeper(t, socket, filepath.Join(h1.logDir, "keeper.log"))
	h1.stop(t, true)
	persist := []string{"--persist", "--fd-store", socket, "--bpf-dir", pins}
	h1.extra = persist
	h1.start(t)

	pingN(t, g1, g2.ip4, 5)
	tp.waitFastPath(t)
	mac := g1.mac(t).String()
	qpn := h1.vifQPN(mac, 0)
	before := emuChildren(t, h1)
	// The group child and one VIF child per MAC the TAP saw: the
	// guest's, and the bridge's own (br0 sends too).
	kids := float64(len(before))
	if before["ib0.e1"] == 0 || before["ib0.mffff"] == 0 || qpn == 0 {
		t.Fatalf("h1's children %v, guest's QPN %#x: want ib0.e1 and ib0.mffff among them", before, qpn)
	}

	// A clean stop under --persist.
	if err := h1.terminate(t, true); err != nil {
		t.Fatalf("eipoibd in h1 exited with %v\n%s", err, h1.log())
	}
	if got := emuChildren(t, h1); !maps.Equal(got, before) {
		t.Fatalf("h1's children after a --persist stop: %v, want %v", got, before)
	}
	t.Run("down", func(t *testing.T) {
		for _, dir := range [][2]*guest{{g1, g2}, {g2, g1}} {
			b := h2.metrics(t)
			r, err := runPing(dir[0], dir[1].ip4, 5, 10*time.Second)
			a := h2.metrics(t)
			if err != nil || !r.lossless(5) {
				t.Fatalf("ping %s → %s while h1's eipoibd is down: replies to %v (%d sent, %d received)\n%s", dir[0].ns, dir[1].ip4, sortedKeys(r.seqs), r.tx, r.rx, r.out)
			}
			// Every request and every reply crossed h2's fast path too:
			// h2 received the requests g1 sent (or sent g2's) and sent
			// the replies (or received them).
			in, out := r.tx, r.rx
			if dir[0] == g2 {
				in, out = r.rx, r.tx
			}
			if d := a["port_fast_path_rx_redirected"] - b["port_fast_path_rx_redirected"]; d != float64(in) {
				t.Errorf("ping %s → %s: h2's RX program redirected %v packets, want %d", dir[0].ns, dir[1].ip4, d, in)
			}
			if d := a["port_fast_path_tx_redirected"] - b["port_fast_path_tx_redirected"]; d != float64(out) {
				t.Errorf("ping %s → %s: h2's TX program redirected %v frames, want %d", dir[0].ns, dir[1].ip4, d, out)
			}
		}
	})

	h1.start(t)
	t.Run("adopted", func(t *testing.T) {
		m := h1.metrics(t)
		if m["port_children_adopted"] != kids || m["port_children_reclaimed"] != 0 {
			t.Errorf("h1: %v children adopted, %v reclaimed, want %v and 0\n%s", m["port_children_adopted"], m["port_children_reclaimed"], kids, h1.log())
		}
		if got := emuChildren(t, h1); !maps.Equal(got, before) {
			t.Errorf("h1's children after the restart: %v, want %v", got, before)
		}
		if got := h1.vifQPN(mac, 0); got != qpn {
			t.Errorf("guest's VIF QPN %#x after the restart, %#x before", got, qpn)
		}
		if n := strings.Count(h1.log(), `msg="adopted a child left by a previous run"`); n != len(before) {
			t.Errorf("h1 logged %d adoptions, want %d\n%s", n, len(before), h1.log())
		}
	})
	t.Run("after", func(t *testing.T) {
		pingN(t, g1, g2.ip4, 5)
		pingN(t, g2, g1.ip4, 5)
		tp.waitFastPath(t)
	})

	// A crash leaves the children and the maps as they were: the fast
	// path carries meanwhile, and the next start adopts them the same.
	t.Run("killed", func(t *testing.T) {
		h1.cmd.Process.Signal(syscall.SIGKILL)
		<-h1.done
		h1.cmd = nil
		pingN(t, g1, g2.ip4, 5)
		pingN(t, g2, g1.ip4, 5)
		h1.start(t)
		if m := h1.metrics(t); m["port_children_adopted"] != kids || m["port_children_reclaimed"] != 0 {
			t.Errorf("h1 after a crash: %v children adopted, %v reclaimed, want %v and 0", m["port_children_adopted"], m["port_children_reclaimed"], kids)
		}
		if got := emuChildren(t, h1); !maps.Equal(got, before) {
			t.Errorf("h1's children after the crash and restart: %v, want %v", got, before)
		}
		pingN(t, g1, g2.ip4, 5)
	})

	// A guest new after the restart gets a child of its own beside the
	// adopted ones (the emulation's fabric end names go on past theirs)
	// and is answered both ways. It then counts among h1's children.
	t.Run("new guest", func(t *testing.T) {
		g3 := &guest{ns: tp.pfx + "h1g2", ip4: "10.77.0.12"}
		sh(t, "ip", "netns", "add", g3.ns)
		// Deleted when the whole test ends, not this step: its veth
		// would go with it, and the bridge's "guest gone" would remove
		// its VIF and child while the next step counts them.
		tp.t.Cleanup(func() { shErr("ip", "netns", "delete", g3.ns) })
		sh(t, in(g3.ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")...)
		sh(t, "ip", "link", "add", "eth0", "netns", g3.ns, "type", "veth", "peer", "name", "vg2", "netns", h1.ns)
		// A port's MAC above the others', so that br0 keeps its own
		// (br_stp_recalculate_bridge_id takes the lowest port's): a
		// new bridge MAC would become one more child, at a time of the
		// bridge's choosing.
		sh(t, in(h1.ns, "ip", "link", "set", "vg2", "address", "fe:ff:ff:ff:ff:f2")...)
		sh(t, in(h1.ns, "ip", "link", "set", "vg2", "master", "br0", "up")...)
		sh(t, in(g3.ns, "ip", "link", "set", "eth0", "up")...)
		sh(t, in(g3.ns, "ip", "addr", "add", g3.ip4+"/24", "dev", "eth0")...)
		pingN(t, g3, g2.ip4, 5)
		pingN(t, g2, g3.ip4, 5)
		now := emuChildren(t, h1)
		if len(now) != len(before)+1 || h1.vifQPN(g3.mac(t).String(), 0) == 0 {
			t.Fatalf("h1's children %v (were %v), new guest's QPN %#x: want one new child", now, before, h1.vifQPN(g3.mac(t).String(), 0))
		}
		for name, index := range before {
			if now[name] != index {
				t.Errorf("h1's child %s has ifindex %d, was %d", name, now[name], index)
			}
		}
		before, kids = now, float64(len(now))
	})

	// Without --persist a start deletes the children the --persist stop
	// left.
	t.Run("reclaimed", func(t *testing.T) {
		if err := h1.terminate(t, true); err != nil {
			t.Fatalf("eipoibd in h1 exited with %v\n%s", err, h1.log())
		}
		if got := emuChildren(t, h1); !maps.Equal(got, before) {
			t.Fatalf("h1's children after the second --persist stop: %v, want %v", got, before)
		}
		// The keeper still hands the TAP's queues back; without
		// --persist the pins in --bpf-dir are removed too.
		h1.extra = []string{"--fd-store", socket, "--bpf-dir", pins}
		h1.start(t)
		m := h1.metrics(t)
		if m["port_children_adopted"] != 0 || m["port_children_reclaimed"] != kids {
			t.Errorf("h1 without --persist: %v children adopted, %v reclaimed, want 0 and %v", m["port_children_adopted"], m["port_children_reclaimed"], kids)
		}
		if got := emuChildren(t, h1); got["ib0.mffff"] == before["ib0.mffff"] {
			t.Errorf("h1's group child kept its ifindex %d without --persist: %v", before["ib0.mffff"], got)
		}
		pingN(t, g1, g2.ip4, 5)
		if got := emuChildren(t, h1); got["ib0.e1"] == 0 || got["ib0.e1"] == before["ib0.e1"] {
			t.Errorf("h1's children %v, want a new ib0.e1 (was ifindex %d)", got, before["ib0.e1"])
		}
	})
}
