package vswitch

import (
	"context"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/eipoib/eipoibd/ether"
)

// LocalMACs returns the hypervisor's own MACs on its switch: those of
// the devices named that exist (the TAP; the Linux bridge, or the Open
// vSwitch bridge's internal port of the same name). Frames from these
// MACs are the host's own, not a guest's. A bridge port's MAC is not
// among them. What the host sends on a port leaves by it and never
// enters the bridge, so none reaches the TAP: br_input.c
// br_handle_frame, the port's rx_handler, sees what the port receives,
// never what is sent on it.
func LocalMACs(devs ...string) ([]ether.MAC, error) {
	links, err := dump("list links", netlink.LinkList)
	if err != nil {
		return nil, err
	}
	var out []ether.MAC
	for _, l := range links {
		if !slices.Contains(devs, l.Attrs().Name) {
			continue
		}
		if a := l.Attrs().HardwareAddr; len(a) == 6 {
			if m := ether.MAC(a); !m.IsZero() && !m.IsMulticast() && !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// WatchLocalMACs calls fn with LocalMACs(devs...) now and again after
// each change of any link (a port added or gone, an address changed: a
// Linux bridge takes its lowest port's address unless given one) that
// changes them, until ctx ends. A failed listing, or a lost
// subscription, goes to fail, and the watch goes on (subscribing again a
// second later); it returns an error only if subscribing fails.
func WatchLocalMACs(ctx context.Context, fn func([]ether.MAC), fail func(error), devs ...string) error {
	var last []ether.MAC
	told := false
	refresh := func() {
		macs, err := LocalMACs(devs...)
		if err != nil {
			fail(err)
			return
		}
		if !told || !slices.Equal(macs, last) {
			last, told = macs, true
			fn(macs)
		}
	}
	return watchLinks(ctx, "links for local MACs", nil, refresh, fail)
}
