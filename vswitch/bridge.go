// Package vswitch attaches eipoibd's TAP to the hypervisor's virtual
// switch and reads what the switch knows about guests: the Linux bridge
// over netlink (enslaving, the forwarding database).
package vswitch

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/ether"
)

// AttachBridge enslaves the interface port to the existing Linux bridge br.
func AttachBridge(port, br string) error {
	p, err := netlink.LinkByName(port)
	if err != nil {
		return fmt.Errorf("vswitch: %s: %w", port, err)
	}
	b, err := netlink.LinkByName(br)
	if err != nil {
		return fmt.Errorf("vswitch: bridge %q not found: %w", br, err)
	}
	if _, ok := b.(*netlink.Bridge); !ok {
		return fmt.Errorf("vswitch: %s is a %s, not a Linux bridge", br, b.Type())
	}
	if err := netlink.LinkSetMaster(p, b); err != nil {
		return fmt.Errorf("vswitch: enslave %s to %s: %w", port, br, err)
	}
	return nil
}

// Guest is a MAC the bridge learned on one of its ports.
type Guest struct {
	MAC  ether.MAC
	VLAN uint16
}

// BridgeGuests returns the dynamic FDB entries of bridge br learned on
// ports other than except: the guests behind the bridge. Local
// (permanent) entries, such as the ports' own addresses, are left out.
func BridgeGuests(br, except string) ([]Guest, error) {
	b, err := netlink.LinkByName(br)
	if err != nil {
		return nil, fmt.Errorf("vswitch: bridge %q: %w", br, err)
	}
	skip := -1
	if l, err := netlink.LinkByName(except); err == nil {
		skip = l.Attrs().Index
	}
	entries, err := netlink.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("vswitch: bridge FDB: %w", err)
	}
	var out []Guest
	for _, e := range entries {
		if e.MasterIndex != b.Attrs().Index || e.LinkIndex == skip || e.State&netlink.NUD_PERMANENT != 0 || len(e.HardwareAddr) != 6 {
			continue
		}
		mac := ether.MAC(e.HardwareAddr)
		if mac.IsMulticast() || mac.IsZero() {
			continue
		}
		out = append(out, Guest{MAC: mac, VLAN: uint16(e.Vlan)})
	}
	return out, nil
}
