package netns

import (
	"strings"
	"testing"
)

// ovsDB returns the --ovs-db argument a hypervisor's daemon got.
func (h *hypervisor) ovsDB() string {
	for i, a := range h.switchArgs {
		if a == "--ovs-db" {
			return h.switchArgs[i+1]
		}
	}
	return ""
}

// TestOVSVLANs: Open vSwitch (userspace datapath) on both hypervisors,
// guests as access ports of VLAN 10 and 20, mapped to P_Keys 0x800a and
// 0x8014. Same-VLAN guests talk across the fabric; different-VLAN guests
// cannot, even in one subnet; the wire shows both partitions.
func TestOVSVLANs(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{
		n: 2, ovs: []bool{true, true}, tags: [][]int{{10, 20}, {10, 20}},
		extra: []string{"--vlan-pkey", "10=0x800a,20=0x8014"},
	})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	if out := sh(t, "ovs-vsctl", "--db="+h1.ovsDB(), "list-ports", "obr"); !strings.Contains(out, "eib0") {
		t.Fatalf("TAP not on the OVS bridge: %s", out)
	}

	pcap, stopCapture := capture(t, h1)

	ping(t, h1.guests[0], h2.guests[0].ip4) // VLAN 10
	ping(t, h1.guests[1], h2.guests[1].ip4) // VLAN 20
	ping(t, h2.guests[0], h1.guests[0].ip6)
	ping(t, h2.guests[1], h1.guests[1].ip6)
	for _, c := range [][2]*guest{{h1.guests[0], h2.guests[1]}, {h2.guests[1], h1.guests[0]}} {
		if out, err := shErr(in(c[0].ns, "ping", "-c", "2", "-i", "0.2", "-W", "1", c[1].ip4)...); err == nil {
			t.Errorf("VLAN %s reached %s in another VLAN:\n%s", c[0].ip4, c[1].ip4, out)
		}
	}
	stopCapture()

	out := stdout(t, "tshark", "-r", pcap, "-T", "fields", "-E", "separator=|", "-e", "infiniband.bth.p_key", "-e", "ipv6.dst")
	pkeys, dsts := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Split(l, "|"); len(f) == 2 {
			pkeys[f[0]], dsts[f[1]] = true, true
		}
	}
	for _, want := range []string{"32778", "32788"} { // 0x800a, 0x8014
		if !pkeys[want] {
			t.Errorf("P_Key %s not on the wire (saw %v)", want, pkeys)
		}
	}
	for _, want := range []string{"ff12:401b:800a::ffff:ffff", "ff12:401b:8014::ffff:ffff"} {
		if !dsts[want] {
			t.Errorf("broadcast group %s not on the wire", want)
		}
	}
	if pkeys["65535"] && len(pkeys) > 3 {
		t.Errorf("unexpected P_Keys %v", pkeys)
	}
	m := h2.metrics(t)
	if m["drop_vlan_unmapped"] != 0 {
		t.Errorf("frames on unmapped VLANs: %v", m["drop_vlan_unmapped"])
	}

	// Shutdown detaches the TAP from OVS.
	h1.stop(t, true)
	if out := sh(t, "ovs-vsctl", "--db="+h1.ovsDB(), "list-ports", "obr"); strings.Contains(out, "eib0") {
		t.Errorf("TAP still on the OVS bridge after shutdown: %s", out)
	}
}

// TestLinuxBridgeAndOVS: a guest behind a Linux bridge pings a guest
// behind OVS on another hypervisor, in the default partition.
func TestLinuxBridgeAndOVS(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{n: 2, ovs: []bool{false, true}})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	ping(t, h1.guests[0], h2.guests[0].ip4)
	ping(t, h2.guests[1], h1.guests[1].ip4)
	ping(t, h1.guests[1], h2.guests[0].ip6)
}
