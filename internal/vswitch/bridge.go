// Package vswitch attaches eipoibd's TAP to the hypervisor's virtual
// switch and reads what the switch knows about guests: the Linux bridge
// over netlink (enslaving, the forwarding database and its changes).
package vswitch

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ether"
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

// Guest is a MAC the bridge knows on one of its ports (learned, or a
// static entry such as libvirt adds).
type Guest struct {
	MAC  ether.MAC
	VLAN uint16
	// Port is the interface index of the bridge port the entry is on
	// (0 for Open vSwitch guests).
	Port int
	// Static: the entry was added by hand or by libvirt (NUD_NOARP),
	// not learned from the guest's traffic.
	Static bool
}

// BridgeGuests returns the guests in the FDB of bridge br on ports other
// than except, learned and static.
func BridgeGuests(br, except string) ([]Guest, error) {
	b, err := netlink.LinkByName(br)
	if err != nil {
		return nil, fmt.Errorf("vswitch: bridge %q: %w", br, err)
	}
	skip := -1
	if l, err := netlink.LinkByName(except); err == nil {
		skip = l.Attrs().Index
	}
	entries, err := dump("bridge FDB", func() ([]netlink.Neigh, error) { return netlink.NeighList(0, unix.AF_BRIDGE) })
	if err != nil {
		return nil, err
	}
	var out []Guest
	for i := range entries {
		if g, ok := guestOf(&entries[i], b.Attrs().Index, skip); ok {
			out = append(out, g)
		}
	}
	return out, nil
}

// guestOf reports whether FDB entry e belongs to a guest behind bridge
// br (an interface index): learned or static on a port other than skip,
// unicast, and not local (permanent, the ports' own addresses).
func guestOf(e *netlink.Neigh, br, skip int) (Guest, bool) {
	if e.Family != unix.AF_BRIDGE || e.MasterIndex != br || e.LinkIndex == skip || e.State&netlink.NUD_PERMANENT != 0 || len(e.HardwareAddr) != 6 {
		return Guest{}, false
	}
	mac := ether.MAC(e.HardwareAddr)
	if mac.IsMulticast() || mac.IsZero() {
		return Guest{}, false
	}
	return Guest{MAC: mac, VLAN: uint16(e.Vlan), Port: e.LinkIndex, Static: e.State&netlink.NUD_NOARP != 0}, true
}

// WatchBridge calls fn for each guest the forwarding database of bridge
// br gains (added) or loses on ports other than except, starting with
// those it holds, until ctx ends or the subscription fails for good.
// When the kernel drops events because they came faster than they were
// read (ENOBUFS, e.g. under a MAC flood), it subscribes again, listing
// the database afresh, and tells resync.
func WatchBridge(ctx context.Context, br, except string, fn func(g Guest, added bool), resync func(err error)) error {
	b, err := netlink.LinkByName(br)
	if err != nil {
		return fmt.Errorf("vswitch: bridge %q: %w", br, err)
	}
	skip := -1
	if l, err := netlink.LinkByName(except); err == nil {
		skip = l.Attrs().Index
	}
	for {
		err := watchOnce(ctx, b.Attrs().Index, skip, fn)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, unix.ENOBUFS) {
			return fmt.Errorf("vswitch: watch the FDB of %s: %w", br, err)
		}
		resync(err)
	}
}

// watchOnce follows one subscription until ctx ends (nil) or it fails.
func watchOnce(ctx context.Context, br, skip int, fn func(g Guest, added bool)) error {
	ch := make(chan netlink.NeighUpdate, 1024)
	done := make(chan struct{})
	defer close(done)
	var subErr error
	opts := netlink.NeighSubscribeOptions{ListExisting: true, ErrorCallback: func(err error) { subErr = err },
		ReceiveBufferSize: 4 << 20, ReceiveBufferForceSize: true}
	if err := netlink.NeighSubscribeWithOptions(ch, done, opts); err != nil {
		return err
	}
	err := consume(ctx, ch, func(u netlink.NeighUpdate) {
		if g, ok := guestOf(&u.Neigh, br, skip); ok {
			fn(g, u.Type == unix.RTM_NEWNEIGH)
		}
	})
	if err != nil && subErr != nil {
		return subErr // ENOBUFS, for one
	}
	return err
}

// errClosed is consume's error when its channel closes: a netlink
// subscription ended (its ErrorCallback may say why).
var errClosed = errors.New("subscription closed")

// consume calls fn with each value of ch until ctx ends (nil) or ch
// closes (errClosed).
func consume[T any](ctx context.Context, ch <-chan T, fn func(T)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case v, ok := <-ch:
			if !ok {
				return errClosed
			}
			fn(v)
		}
	}
}
