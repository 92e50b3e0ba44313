package vswitch

// A Linux bridge with VLAN filtering (vlan_filtering=1, which libvirt's
// macTableManager='libvirt' turns on) classifies every frame into a
// VLAN. An untagged frame entering a port goes into that port's PVID. A
// frame leaves a port untagged on the VLANs the port has with the
// untagged flag.
//
// Its forwarding database is keyed by MAC and VLAN. A static entry added
// without a VLAN exists once without and once for each VLAN of its port
// (net/bridge/br_fdb.c br_fdb_add: "We have vlans configured on this
// port and user didn't specify a VLAN. To be nice, add/update entry for
// every vlan on this port."). So a libvirt guest on a port with the
// default PVID 1 has two entries: VLAN 0 and VLAN 1.
//
// eipoibd sees frames as they leave its TAP's port. On the port's PVID
// with the untagged flag they arrive untagged (the shim's VLAN 0, the
// untagged partition). On a VLAN the port carries tagged, they arrive
// with that tag. VLANs reads what says which is which, and GuestVLAN
// maps an FDB entry to the shim's VLAN.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// PortVLANs are the VLANs of one bridge port.
type PortVLANs struct {
	// PVID is the VLAN untagged frames entering the port are put in; 0:
	// none (they are dropped).
	PVID uint16
	// VIDs holds the VLANs the port is a member of, each with its
	// egress flag: true if frames leave the port untagged on it.
	VIDs map[uint16]bool
}

// VLANs is what a Linux bridge's VLAN filtering says about its ports.
type VLANs struct {
	// Filtering is the bridge's vlan_filtering (IFLA_BR_VLAN_FILTERING).
	Filtering bool
	// DefaultPVID is the bridge's default_pvid (IFLA_BR_VLAN_DEFAULT_PVID;
	// 0 where the kernel has no VLAN filtering and sends none).
	DefaultPVID uint16
	// TAP is the interface index of eipoibd's TAP.
	TAP int
	// Ports holds the VLANs of the ports that have any, by interface
	// index.
	Ports map[int]PortVLANs
}

// Equal reports whether v and w say the same.
func (v *VLANs) Equal(w *VLANs) bool {
	return v.Filtering == w.Filtering && v.DefaultPVID == w.DefaultPVID && v.TAP == w.TAP &&
		maps.EqualFunc(v.Ports, w.Ports, func(a, b PortVLANs) bool { return a.PVID == b.PVID && maps.Equal(a.VIDs, b.VIDs) })
}

// ErrUnfiltered is GuestVLAN's answer for an FDB entry with a VLAN on a
// bridge without VLAN filtering. Frames are then not classified into
// VLANs: their entries and the learned ones have none. So the entry is
// one of br_fdb_add's per-VLAN copies of an entry without a VLAN, which
// declares the guest.
var ErrUnfiltered = errors.New("vswitch: VLAN filtering is off: the bridge forwards by the entry without a VLAN")

// NotCarriedError is GuestVLAN's answer for an FDB entry on a VLAN whose
// frames cannot reach eipoibd's TAP and come back on the same VLAN.
type NotCarriedError struct {
	VID    uint16
	Reason string
}

func (e *NotCarriedError) Error() string {
	return fmt.Sprintf("vswitch: VLAN %d: %s", e.VID, e.Reason)
}

// GuestVLAN returns the shim's VLAN of the guest behind the FDB entry
// with VLAN vid (0: none) on bridge port port: with VLAN filtering on,
//   - an entry without a VLAN is the guest's on its port's PVID (where
//     its untagged frames go), mapped as below: with the PVID entry of
//     the same MAC, one guest;
//   - the TAP port's PVID with the untagged flag: 0, the untagged
//     partition (its frames leave the TAP untagged, and the TAP's
//     untagged frames enter it);
//   - a VLAN the TAP port carries tagged: that VLAN (the shim maps it to
//     its P_Key through --vlan-pkey);
//   - any other VLAN never reaches eipoibd, or not both ways: a
//     *NotCarriedError says why.
//
// Without VLAN filtering an entry without a VLAN is VLAN 0, and one with
// a VLAN ErrUnfiltered.
func (v *VLANs) GuestVLAN(port int, vid uint16) (uint16, error) {
	if !v.Filtering {
		if vid != 0 {
			return 0, ErrUnfiltered
		}
		return 0, nil
	}
	if vid == 0 {
		vid = v.Ports[port].PVID
		if vid == 0 {
			return 0, &NotCarriedError{Reason: "the guest's port has no PVID, so its untagged frames are dropped, and the entry has no VLAN"}
		}
	}
	tap := v.Ports[v.TAP]
	untagged, member := tap.VIDs[vid]
	switch {
	case !member:
		return 0, &NotCarriedError{VID: vid, Reason: "eipoibd's TAP port is not a member (bridge vlan add vid N dev TAP)"}
	case !untagged:
		return vid, nil
	case vid == tap.PVID:
		return 0, nil
	default:
		return 0, &NotCarriedError{VID: vid, Reason: fmt.Sprintf("it leaves eipoibd's TAP port untagged but is not its PVID (%d), where the TAP's untagged frames go", tap.PVID)}
	}
}

// BridgeVLANs reads the VLAN filtering of bridge br and the VLANs of
// its ports; tap names eipoibd's TAP.
func BridgeVLANs(br, tap string) (VLANs, error) {
	b, err := netlink.LinkByName(br)
	if err != nil {
		return VLANs{}, fmt.Errorf("vswitch: bridge %q: %w", br, err)
	}
	bridge, ok := b.(*netlink.Bridge)
	if !ok {
		return VLANs{}, fmt.Errorf("vswitch: %s is a %s, not a Linux bridge", br, b.Type())
	}
	t, err := netlink.LinkByName(tap)
	if err != nil {
		return VLANs{}, fmt.Errorf("vswitch: %s: %w", tap, err)
	}
	// br_netlink.c br_getlink → br_fill_ifinfo: with RTEXT_FILTER_BRVLAN
	// each port's (and the bridge's own) VLANs, one
	// IFLA_BRIDGE_VLAN_INFO a VLAN with BRIDGE_VLAN_INFO_PVID and
	// BRIDGE_VLAN_INFO_UNTAGGED (br_fill_ifvlaninfo); none where the
	// kernel has no CONFIG_BRIDGE_VLAN_FILTERING.
	// It answers for every bridge port in the namespace (other bridges',
	// such as cni0's or virbr0's, too): the links' masters say which
	// are br's.
	list, err := dump("VLANs of the ports of "+br, netlink.BridgeVlanList)
	if err != nil {
		return VLANs{}, err
	}
	links, err := dump("list links", netlink.LinkList)
	if err != nil {
		return VLANs{}, err
	}
	masters := make(map[int]int, len(links))
	for _, l := range links {
		masters[l.Attrs().Index] = l.Attrs().MasterIndex
	}
	return vlansOf(bridge, t.Attrs().Index, masters, list), nil
}

// vlansOf builds VLANs from the bridge's attributes and
// BridgeVlanList's answer, keeping the TAP and the links whose master
// (in masters, by interface index) is the bridge.
func vlansOf(b *netlink.Bridge, tap int, masters map[int]int, list map[int32][]*nl.BridgeVlanInfo) VLANs {
	// br_netlink.c br_fill_info: IFLA_BR_VLAN_FILTERING always,
	// IFLA_BR_VLAN_DEFAULT_PVID with CONFIG_BRIDGE_VLAN_FILTERING.
	v := VLANs{TAP: tap, Ports: make(map[int]PortVLANs, len(list))}
	if b.VlanFiltering != nil {
		v.Filtering = *b.VlanFiltering
	}
	if b.VlanDefaultPVID != nil {
		v.DefaultPVID = *b.VlanDefaultPVID
	}
	for idx, infos := range list {
		if int(idx) != tap && masters[int(idx)] != b.Attrs().Index {
			continue // the bridge's own VLANs (bridge vlan … self), another bridge's port
		}
		p := PortVLANs{VIDs: make(map[uint16]bool, len(infos))}
		for _, in := range infos {
			if in.Vid == 0 || in.Vid >= 4095 {
				continue
			}
			p.VIDs[in.Vid] = in.EngressUntag()
			if in.PortVID() {
				p.PVID = in.Vid
			}
		}
		v.Ports[int(idx)] = p
	}
	return v
}

// WatchBridgeVLANs calls fn with the VLANs of bridge br (BridgeVLANs)
// now and whenever they change, until ctx ends. It follows the link
// notifications of the bridge and its ports.
//   - A change of vlan_filtering or default_pvid comes as the bridge's
//     RTM_NEWLINK (rtnetlink.c __rtnl_newlink → br_changelink, then
//     do_setlink's netdev_state_change).
//   - A port's VLANs changing, or the port joining or leaving, comes as
//     the port's RTM_NEWLINK or RTM_DELLINK of family AF_BRIDGE
//     (br_netlink.c br_setlink, br_dellink, br_if.c br_add_if and
//     del_nbp → br_ifinfo_notify).
//
// Each notification, or burst of them, makes it read the VLANs afresh;
// fn hears only of a change. A failed read or a lost subscription goes
// to warn. The watch goes on, subscribing again a second later, unless
// subscribing fails.
func WatchBridgeVLANs(ctx context.Context, br, tap string, fn func(VLANs), warn func(error)) error {
	b, err := netlink.LinkByName(br)
	if err != nil {
		return fmt.Errorf("vswitch: bridge %q: %w", br, err)
	}
	brIdx := b.Attrs().Index
	var last *VLANs
	read := func() {
		v, err := BridgeVLANs(br, tap)
		if err != nil {
			warn(err)
			return
		}
		if last == nil || !last.Equal(&v) {
			last = &v
			fn(v)
		}
	}
	concerns := func(u *netlink.LinkUpdate) bool {
		a := u.Attrs()
		if a == nil || a.Index == brIdx || a.MasterIndex == brIdx {
			return true
		}
		if last == nil {
			return true
		}
		_, known := last.Ports[a.Index] // a port that left
		return known
	}
	return watchLinks(ctx, "the VLANs of "+br, concerns, read, warn)
}

// watchLinks calls read after subscribing to link notifications, then
// once for each burst of them of which one concerns it (nil: all), until
// ctx ends. When the subscription ends (ENOBUFS: notifications came
// faster than they were read, and some were lost), it tells warn and
// subscribes again a second later, reading afresh. It returns an error
// only when subscribing fails.
func watchLinks(ctx context.Context, what string, concerns func(*netlink.LinkUpdate) bool, read func(), warn func(error)) error {
	if concerns == nil {
		concerns = func(*netlink.LinkUpdate) bool { return true }
	}
	for ctx.Err() == nil {
		ch := make(chan netlink.LinkUpdate, 256)
		done := make(chan struct{})
		var subErr error
		opts := netlink.LinkSubscribeOptions{ErrorCallback: func(err error) { subErr = err },
			ReceiveBufferSize: 1 << 20, ReceiveBufferForceSize: true}
		if err := netlink.LinkSubscribeWithOptions(ch, done, opts); err != nil {
			return fmt.Errorf("vswitch: watch %s: %w", what, err)
		}
		read() // after subscribing: no change falls in between
		err := followLinks(ctx, ch, concerns, read)
		close(done)
		if err != nil {
			if subErr != nil {
				err = fmt.Errorf("%w: %v", err, subErr)
			}
			warn(fmt.Errorf("vswitch: watch %s: %w; subscribing again in a second", what, err))
			select { // no tight loop (and log flood) if it fails at once again
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// followLinks calls read for each burst of link notifications that
// concern the bridge until ctx ends (nil) or ch closes (errClosed).
func followLinks(ctx context.Context, ch <-chan netlink.LinkUpdate, concerns func(*netlink.LinkUpdate) bool, read func()) error {
	return consume(ctx, ch, func(u netlink.LinkUpdate) {
		if !concerns(&u) {
			return
		}
		for more := true; more; { // the rest of the burst
			select {
			case _, more = <-ch:
			default:
				more = false
			}
		}
		read()
	})
}
