package vswitch

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// requireFilteringEnv, set to 1, makes TestBridgeVLANsKernel fail where
// the kernel refuses vlan_filtering (test/netns's TestVLANFilterVM sets
// it in the QEMU guest, whose Debian kernel has it).
const requireFilteringEnv = "EIPOIB_REQUIRE_VLAN_FILTERING"

// TestBridgeVLANsKernel reads a real bridge's VLANs and FDB in a network
// namespace: a bridge br0, a veth tap0 as eipoibd's TAP and a veth gport
// as a guest's port.
//
// Where the kernel refuses vlan_filtering (no
// CONFIG_BRIDGE_VLAN_FILTERING: this development machine), BridgeVLANs
// says filtering is off with no port VLANs. A static entry then exists
// once, without a VLAN.
//
// Where it accepts it (the QEMU guest's Debian kernel), it checks what
// the kernel answers:
//   - filtering on with default_pvid 1 and both ports on PVID 1
//     untagged;
//   - a static entry added without a VLAN listed twice (none and 1:
//     br_fdb_add's copy), both the untagged partition's;
//   - WatchBridgeVLANs telling each change: VLAN 10 added tagged to
//     tap0, vlan_filtering off and on, default_pvid 2, and VLAN 10 PVID
//     untagged on gport, whose entry without a VLAN then maps to VLAN
//     10.
func TestBridgeVLANsKernel(t *testing.T) {
	nstest.Require(t, "bridge")
	ns := fmt.Sprintf("vsv%d", os.Getpid())
	nstest.Add(t, ns)
	run := func(args ...string) { t.Helper(); nstest.Must(t, nstest.In(ns, args...)...) }
	run("ip", "link", "add", "br0", "type", "bridge")
	run("ip", "link", "add", "tap0", "type", "veth", "peer", "name", "tpeer")
	run("ip", "link", "add", "gport", "type", "veth", "peer", "name", "gpeer")
	for _, p := range []string{"tap0", "gport"} {
		run("ip", "link", "set", p, "master", "br0", "up")
	}
	run("ip", "link", "set", "br0", "up")
	mac := ether.MAC{0x52, 0x54, 0, 0xaa, 0, 1}
	run("bridge", "fdb", "add", mac.String(), "dev", "gport", "master", "static")

	var vlans VLANs
	var guests []Guest
	read := func() {
		t.Helper()
		nstest.Do(t, ns, func() {
			var err error
			if vlans, err = BridgeVLANs("br0", "tap0"); err != nil {
				t.Fatal(err)
			}
			if guests, err = BridgeGuests("br0", "tap0"); err != nil {
				t.Fatal(err)
			}
		})
	}
	// guestVLANs returns the shim's VLAN of each entry of mac, by the
	// entry's VLAN.
	guestVLANs := func(mac ether.MAC) map[uint16]string {
		m := map[uint16]string{}
		for _, g := range guests {
			if g.MAC == mac && g.Static {
				vlan, err := vlans.GuestVLAN(g.Port, g.VLAN)
				m[g.VLAN] = fmt.Sprint(vlan, err)
			}
		}
		return m
	}

	_, err := nstest.Run(nstest.In(ns, "ip", "link", "set", "br0", "type", "bridge", "vlan_filtering", "1")...)
	if err != nil {
		if os.Getenv(requireFilteringEnv) == "1" {
			t.Fatalf("the kernel refused vlan_filtering: %v", err)
		}
		t.Logf("the kernel refused vlan_filtering (%v): checking a bridge without it", err)
		read()
		if vlans.Filtering || vlans.DefaultPVID != 0 || len(vlans.Ports) != 0 {
			t.Errorf("a kernel without VLAN filtering: %+v, want filtering off, no default_pvid, no port VLANs", vlans)
		}
		if got := guestVLANs(mac); len(got) != 1 || got[0] != "0 <nil>" {
			t.Errorf("the static entry's VLANs: %v, want one entry without a VLAN, VLAN 0", got)
		}
		return
	}

	read()
	idx := func(name string) int {
		for _, g := range guests {
			if g.MAC == mac {
				return g.Port
			}
		}
		t.Fatalf("no FDB entry of %s on %s", mac, name)
		return 0
	}
	gport := idx("gport")
	pvid1 := PortVLANs{PVID: 1, VIDs: map[uint16]bool{1: true}}
	want := VLANs{Filtering: true, DefaultPVID: 1, TAP: vlans.TAP, Ports: map[int]PortVLANs{vlans.TAP: pvid1, gport: pvid1}}
	if !vlans.Equal(&want) {
		t.Errorf("a filtering bridge: %+v, want %+v", vlans, want)
	}
	if got := guestVLANs(mac); len(got) != 2 || got[0] != "0 <nil>" || got[1] != "0 <nil>" {
		t.Errorf("the static entry's copies by VLAN: %v, want VLAN 0 and 1 both the untagged partition (0)", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan VLANs, 16)
	watched := make(chan error, 1)
	go func() {
		watched <- nstest.DoErr(ns, func() error {
			return WatchBridgeVLANs(ctx, "br0", "tap0", func(v VLANs) { changes <- v },
				func(err error) { t.Errorf("WatchBridgeVLANs warned: %v", err) })
		})
	}()
	defer func() {
		cancel()
		if err := <-watched; err != nil {
			t.Errorf("WatchBridgeVLANs: %v", err)
		}
	}()
	next := func(step string, ok func(v VLANs) bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case v := <-changes:
				if ok(v) {
					vlans = v
					return
				}
			case <-deadline:
				t.Fatalf("%s: WatchBridgeVLANs told no such change", step)
			}
		}
	}
	next("start", func(v VLANs) bool { return v.Equal(&want) })

	run("bridge", "vlan", "add", "vid", "10", "dev", "tap0")
	next("VLAN 10 tagged on tap0", func(v VLANs) bool {
		u, ok := v.Ports[v.TAP].VIDs[10]
		return ok && !u
	})
	run("ip", "link", "set", "br0", "type", "bridge", "vlan_filtering", "0")
	next("vlan_filtering 0", func(v VLANs) bool { return !v.Filtering })
	run("ip", "link", "set", "br0", "type", "bridge", "vlan_filtering", "1")
	next("vlan_filtering 1", func(v VLANs) bool { return v.Filtering })
	run("ip", "link", "set", "br0", "type", "bridge", "vlan_default_pvid", "2")
	next("default_pvid 2", func(v VLANs) bool { return v.DefaultPVID == 2 && v.Ports[v.TAP].PVID == 2 })
	run("bridge", "vlan", "add", "vid", "10", "dev", "gport", "pvid", "untagged")
	next("VLAN 10 PVID untagged on gport", func(v VLANs) bool { return v.Ports[gport].PVID == 10 })
	if got, err := vlans.GuestVLAN(gport, 0); err != nil || got != 10 {
		t.Errorf("the entry without a VLAN on a port whose PVID is VLAN 10, tagged on the TAP: %d, %v; want 10", got, err)
	}
	if vids := slices.Sorted(func(yield func(uint16) bool) {
		for vid := range vlans.Ports[vlans.TAP].VIDs {
			if !yield(vid) {
				return
			}
		}
	}); !slices.Equal(vids, []uint16{2, 10}) {
		t.Errorf("tap0's VLANs after default_pvid 2: %v, want 2 (moved from 1) and 10", vids)
	}
}
