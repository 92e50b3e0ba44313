package vswitch

import (
	"errors"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// The ports of the fake bridge below: eipoibd's TAP, and guests' ports.
const (
	fakeBridge  = 1
	fakeTAP     = 5
	portPVID1   = 6  // default: VLAN 1 PVID untagged
	portPVID10  = 7  // VLAN 10 PVID untagged only
	portNoPVID  = 8  // VLAN 10 tagged only
	portGone    = 9  // not in the table
	otherBridge = 10 // another bridge (cni0, virbr0)
	otherPort   = 11 // a port of otherBridge
)

// fakeVLANs is a filtering bridge with default_pvid 1 whose TAP port has
// VLAN 1 PVID untagged, 10 and 20 tagged, and 30 untagged (not its PVID).
func fakeVLANs() VLANs {
	return VLANs{Filtering: true, DefaultPVID: 1, TAP: fakeTAP, Ports: map[int]PortVLANs{
		fakeTAP:    {PVID: 1, VIDs: map[uint16]bool{1: true, 10: false, 20: false, 30: true}},
		portPVID1:  {PVID: 1, VIDs: map[uint16]bool{1: true}},
		portPVID10: {PVID: 10, VIDs: map[uint16]bool{10: true}},
		portNoPVID: {VIDs: map[uint16]bool{10: false}},
	}}
}

// TestGuestVLAN: each FDB entry of a filtering bridge maps to the shim's
// VLAN its frames reach eipoibd on. The TAP's untagged PVID maps to 0,
// with the entry without a VLAN on a port whose PVID it is. Tagged VLANs
// map to themselves, as does an entry without a VLAN on a port whose
// PVID is one. VLANs that cannot reach eipoibd both ways map to a
// NotCarriedError naming the VLAN. Without filtering, an entry without a
// VLAN is 0 and one with a VLAN is ErrUnfiltered.
func TestGuestVLAN(t *testing.T) {
	v := fakeVLANs()
	off := fakeVLANs()
	off.Filtering = false
	for _, c := range []struct {
		name    string
		v       *VLANs
		port    int
		vid     uint16
		want    uint16
		wantErr string // "": none; "unfiltered"; else the VLAN NotCarriedError names
	}{
		{"PVID entry", &v, portPVID1, 1, 0, ""},
		{"entry without a VLAN on a PVID-1 port", &v, portPVID1, 0, 0, ""},
		{"tagged VLAN", &v, portPVID10, 10, 10, ""},
		{"entry without a VLAN on a PVID-10 port", &v, portPVID10, 0, 10, ""},
		{"second tagged VLAN, from a port that lacks it", &v, portPVID1, 20, 20, ""},
		{"entry without a VLAN on a port without PVID", &v, portNoPVID, 0, 0, "0"},
		{"entry without a VLAN on a port without VLANs", &v, portGone, 0, 0, "0"},
		{"VLAN the TAP lacks", &v, portPVID1, 40, 0, "40"},
		{"untagged on the TAP, not its PVID", &v, portPVID1, 30, 0, "30"},
		{"no filtering, no VLAN", &off, portPVID1, 0, 0, ""},
		{"no filtering, per-VLAN copy", &off, portPVID1, 1, 0, "unfiltered"},
		{"no filtering, tagged VLAN", &off, portPVID10, 10, 0, "unfiltered"},
	} {
		got, err := c.v.GuestVLAN(c.port, c.vid)
		var nc *NotCarriedError
		switch {
		case c.wantErr == "":
			if err != nil || got != c.want {
				t.Errorf("%s: GuestVLAN(%d, %d) = %d, %v; want %d", c.name, c.port, c.vid, got, err, c.want)
			}
		case c.wantErr == "unfiltered":
			if err != ErrUnfiltered {
				t.Errorf("%s: GuestVLAN(%d, %d) = %d, %v; want ErrUnfiltered", c.name, c.port, c.vid, got, err)
			}
		case !errors.As(err, &nc):
			t.Errorf("%s: GuestVLAN(%d, %d) = %d, %v; want a NotCarriedError", c.name, c.port, c.vid, got, err)
		case c.wantErr != strconv.Itoa(int(nc.VID)):
			t.Errorf("%s: NotCarriedError for VLAN %d (%v), want %s", c.name, nc.VID, err, c.wantErr)
		}
	}
	// The TAP's PVID tagged on egress is a tagged VLAN like any other.
	v.Ports[fakeTAP].VIDs[1] = false
	if got, err := v.GuestVLAN(portPVID1, 1); err != nil || got != 1 {
		t.Errorf("a PVID that leaves the TAP tagged: GuestVLAN = %d, %v; want 1", got, err)
	}
}

// TestVLANsOf: the bridge's attributes and BridgeVlanList's answer
// (BRIDGE_VLAN_INFO_PVID 2, BRIDGE_VLAN_INFO_UNTAGGED 4) become VLANs.
// They hold the bridge's own VLANs, leaving out another bridge's port
// (BridgeVlanList lists every bridge's) and VIDs 0 and 4095. The PVID is
// found whatever its order. No attributes read as no filtering.
func TestVLANsOf(t *testing.T) {
	on, pvid := true, uint16(1)
	b := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: fakeBridge}, VlanFiltering: &on, VlanDefaultPVID: &pvid}
	list := map[int32][]*nl.BridgeVlanInfo{
		fakeBridge: {{Flags: 6, Vid: 1}},
		fakeTAP:    {{Flags: 0, Vid: 10}, {Flags: 6, Vid: 1}, {Flags: 0, Vid: 4095}, {Flags: 0, Vid: 0}},
		portPVID10: {{Flags: 6, Vid: 10}},
		otherPort:  {{Flags: 6, Vid: 1}},
	}
	masters := map[int]int{fakeTAP: fakeBridge, portPVID10: fakeBridge, otherPort: otherBridge}
	got := vlansOf(b, fakeTAP, masters, list)
	want := VLANs{Filtering: true, DefaultPVID: 1, TAP: fakeTAP, Ports: map[int]PortVLANs{
		fakeTAP:    {PVID: 1, VIDs: map[uint16]bool{1: true, 10: false}},
		portPVID10: {PVID: 10, VIDs: map[uint16]bool{10: true}},
	}}
	if !got.Equal(&want) {
		t.Errorf("vlansOf = %+v, want %+v", got, want)
	}
	bare := vlansOf(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: fakeBridge}}, fakeTAP, nil, nil)
	if bare.Filtering || bare.DefaultPVID != 0 || len(bare.Ports) != 0 {
		t.Errorf("a bridge without VLAN attributes: %+v, want no filtering and no ports", bare)
	}
}

// TestVLANsEqual: Equal tells apart each change the watch must follow.
func TestVLANsEqual(t *testing.T) {
	a, b := fakeVLANs(), fakeVLANs()
	if !a.Equal(&b) {
		t.Fatal("two equal tables differ")
	}
	for name, change := range map[string]func(v *VLANs){
		"filtering":      func(v *VLANs) { v.Filtering = false },
		"default PVID":   func(v *VLANs) { v.DefaultPVID = 2 },
		"TAP":            func(v *VLANs) { v.TAP = 4 },
		"a port's PVID":  func(v *VLANs) { p := v.Ports[portPVID10]; p.PVID = 0; v.Ports[portPVID10] = p },
		"a VLAN's flag":  func(v *VLANs) { v.Ports[fakeTAP].VIDs[10] = true },
		"a VLAN removed": func(v *VLANs) { delete(v.Ports[fakeTAP].VIDs, 20) },
		"a port removed": func(v *VLANs) { delete(v.Ports, portNoPVID) },
	} {
		c := fakeVLANs()
		change(&c)
		if a.Equal(&c) || c.Equal(&a) {
			t.Errorf("a change of %s is not seen", name)
		}
	}
}
