package daemon

// The guests of a Linux bridge: its static FDB entries (libvirt's, with
// macTableManager='libvirt') become declared VIFs, each on the shim's
// VLAN that the bridge's VLAN filtering gives it (vswitch.GuestVLAN).
// With VLAN filtering one guest has several entries (without a VLAN and
// on each VLAN of its port): they are counted, so that the guest is
// declared when the first maps to its VLAN and freed when the last goes.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/vswitch"
	"github.com/eipoib/eipoibd/mactrans"
)

// vifSink declares and frees guests' VIFs: the shim.
type vifSink interface {
	DeclareVIF(mac ether.MAC, vlan uint16, origin mactrans.Origin) error
	RemoveVIF(mac ether.MAC, vlan uint16, by mactrans.Origin) (bool, error)
}

// fdbKey is what keys a bridge's FDB entry: a MAC and a VLAN (0: none).
type fdbKey struct {
	mac ether.MAC
	vid uint16
}

// bridgeGuests follows the static entries of a bridge's FDB and its
// VLANs, and keeps the set of guests declared to the shim equal to what
// they map to. Its methods may be called from several goroutines.
type bridgeGuests struct {
	mu       sync.Mutex
	sink     vifSink
	log      *slog.Logger
	list     func() ([]vswitch.Guest, error) // the FDB afresh (vswitch.BridgeGuests)
	read     func() (vswitch.VLANs, error)   // the VLANs afresh (vswitch.BridgeVLANs)
	vlans    vswitch.VLANs
	static   map[fdbKey]int               // static entries: their port
	declared map[mactrans.VIFKey]bool     // guests declared from them
	failed   map[mactrans.VIFKey]struct{} // guests the shim refused (warned once)
	unserved map[fdbKey]string            // static entries that declare no guest, and why (logged once)
	restored []mactrans.VIFKey            // VIFs a state file restored, declared from static entries, not yet listed
	logged   bool                         // setVLANs has logged the VLANs at info level
}

// newBridgeGuests returns a bridgeGuests that declares to sink, with the
// bridge's VLANs vlans, listing the FDB afresh with list and reading the
// VLANs afresh with read.
func newBridgeGuests(sink vifSink, log *slog.Logger, vlans vswitch.VLANs, list func() ([]vswitch.Guest, error), read func() (vswitch.VLANs, error)) *bridgeGuests {
	return &bridgeGuests{sink: sink, log: log, list: list, read: read, vlans: vlans,
		static: map[fdbKey]int{}, declared: map[mactrans.VIFKey]bool{}, failed: map[mactrans.VIFKey]struct{}{}, unserved: map[fdbKey]string{}}
}

// entry takes an FDB entry the bridge gained (added) or lost. A static
// entry counts towards its guest. A learned one declares nothing: its
// guest's frames reach the shim anyway, and a guest may forge them,
// which would turn a MAC flood into a flood of declarations. Yet a
// learned entry going frees its guest's VIF if that VIF was learned too
// (not declared by a static entry, OVS or the control socket).
func (bg *bridgeGuests) entry(g vswitch.Guest, added bool) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	k := fdbKey{g.MAC, g.VLAN}
	port, known := bg.static[k]
	switch {
	case added && g.Static:
		if known && port == g.Port {
			return // the same entry again (refreshed, or listed afresh)
		}
		bg.static[k] = g.Port
		if _, ok := bg.vlans.Ports[g.Port]; bg.vlans.Filtering && !ok {
			// An entry added just after its port joined may come
			// before the port's VLANs (the watch's next read).
			if v, err := bg.read(); err == nil {
				bg.useVLANs(v)
			}
		}
		if _, err := bg.vlans.GuestVLAN(g.Port, g.VLAN); err != nil {
			bg.logUnserved(g, err)
		}
		bg.reconcile()
	case added:
	case known:
		delete(bg.static, k)
		bg.reconcile()
	default:
		vlan, err := bg.vlans.GuestVLAN(g.Port, g.VLAN)
		if err != nil || bg.declared[mactrans.VIFKey{MAC: g.MAC, VLAN: vlan}] {
			return
		}
		removed, err := bg.sink.RemoveVIF(g.MAC, vlan, mactrans.OriginLearned)
		if err != nil {
			bg.log.Warn("VIF of a switch guest", "origin", mactrans.OriginBridge, "mac", g.MAC, "vlan", vlan, "added", false, "err", err)
			return
		}
		if removed {
			bg.log.Info("guest gone", "origin", mactrans.OriginBridge, "mac", g.MAC, "vlan", vlan, "bridge_vlan", g.VLAN)
		}
	}
}

// setVLANs takes the bridge's VLANs as they are now. The FDB is listed
// afresh and every static entry mapped again: VLAN filtering turned on
// or off, a PVID changed, a VLAN added to or taken off the TAP's port, a
// guest's port added or gone. The first call, and a change of what the
// bridge and the TAP's port say, log at info level. A change of guests'
// ports alone logs at debug level, as every libvirt guest's start and
// stop brings one.
func (bg *bridgeGuests) setVLANs(v vswitch.VLANs) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	bg.useVLANs(v)
	bg.relistLocked()
}

// useVLANs makes v the bridge's VLANs, and logs them (bg.mu held).
func (bg *bridgeGuests) useVLANs(v vswitch.VLANs) {
	old, now := tapView(&bg.vlans), tapView(&v)
	level := slog.LevelDebug
	if !bg.logged || old != now {
		level, bg.logged = slog.LevelInfo, true
	}
	bg.vlans = v
	bg.log.Log(context.Background(), level, "bridge VLANs", "vlan_filtering", now.filtering, "default_pvid", now.defaultPVID,
		"tap_pvid", now.pvid, "tap_untagged", now.untagged, "tap_tagged", now.tagged)
}

// tapVLANs is what a bridge's VLANs say about eipoibd's TAP.
type tapVLANs struct {
	filtering   bool
	defaultPVID uint16
	pvid        uint16
	untagged    bool   // the PVID leaves the TAP untagged
	tagged      string // the VLANs the TAP carries tagged, as "[10 20]"
}

func tapView(v *vswitch.VLANs) tapVLANs {
	tap := v.Ports[v.TAP]
	var tagged []uint16
	for vid, untagged := range tap.VIDs {
		if !untagged {
			tagged = append(tagged, vid)
		}
	}
	slices.Sort(tagged)
	return tapVLANs{filtering: v.Filtering, defaultPVID: v.DefaultPVID, pvid: tap.PVID,
		untagged: tap.PVID != 0 && tap.VIDs[tap.PVID], tagged: fmt.Sprint(tagged)}
}

// relist lists the FDB afresh (its events were lost) and declares and
// frees guests to match.
func (bg *bridgeGuests) relist() {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	bg.relistLocked()
}

// restore takes the VIFs that --persist restored with origin bridge as
// declared from the bridge, and lists the FDB. Those whose entry went
// while eipoibd was down are freed: the watch lists only what is there
// and would never see them go. The others keep their VIF and its QPN.
// Should the listing fail, they are taken with the first that succeeds
// (a relist, or the VLAN watch's first read); until then no removal
// frees them.
func (bg *bridgeGuests) restore(keys []mactrans.VIFKey) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	bg.restored = keys
	bg.relistLocked()
}

func (bg *bridgeGuests) relistLocked() {
	gs, err := bg.list()
	if err != nil {
		bg.log.Warn("read bridge FDB", "err", err)
	} else {
		for _, k := range bg.restored {
			bg.declared[k] = true
		}
		bg.restored = nil
		bg.static = make(map[fdbKey]int, len(gs))
		for _, g := range gs {
			if g.Static {
				bg.static[fdbKey{g.MAC, g.VLAN}] = g.Port
				if _, err := bg.vlans.GuestVLAN(g.Port, g.VLAN); err != nil {
					bg.logUnserved(g, err)
				}
			}
		}
	}
	bg.reconcile()
}

// logUnserved says why static entry g declares no guest, once for as
// long as that reason holds (every relist maps it again). It logs at
// debug level for the per-VLAN copies of a bridge without VLAN
// filtering, whose entry without a VLAN declares the guest; else at
// info.
func (bg *bridgeGuests) logUnserved(g vswitch.Guest, err error) {
	k := fdbKey{g.MAC, g.VLAN}
	if bg.unserved[k] == err.Error() {
		return
	}
	bg.unserved[k] = err.Error()
	level := slog.LevelInfo
	if errors.Is(err, vswitch.ErrUnfiltered) {
		level = slog.LevelDebug
	}
	bg.log.Log(context.Background(), level, "bridge entry declares no guest", "mac", g.MAC, "bridge_vlan", g.VLAN, "port", g.Port, "reason", err)
}

// reconcile declares the guests the static entries map to and frees
// those they no longer do.
func (bg *bridgeGuests) reconcile() {
	want := make(map[mactrans.VIFKey]bool, len(bg.static))
	for k, port := range bg.static {
		if vlan, err := bg.vlans.GuestVLAN(port, k.vid); err == nil {
			want[mactrans.VIFKey{MAC: k.mac, VLAN: vlan}] = true
		}
	}
	for _, k := range sortedKeys(want) {
		if bg.declared[k] {
			continue
		}
		if err := bg.sink.DeclareVIF(k.MAC, k.VLAN, mactrans.OriginBridge); err != nil {
			if _, warned := bg.failed[k]; !warned {
				bg.failed[k] = struct{}{}
				bg.log.Warn("VIF of a switch guest", "origin", mactrans.OriginBridge, "mac", k.MAC, "vlan", k.VLAN, "added", true, "err", err)
			}
			continue
		}
		delete(bg.failed, k)
		bg.declared[k] = true
		bg.log.Info("guest declared", "origin", mactrans.OriginBridge, "mac", k.MAC, "vlan", k.VLAN)
	}
	for k := range bg.failed {
		if !want[k] {
			delete(bg.failed, k)
		}
	}
	for k := range bg.unserved {
		if port, ok := bg.static[k]; !ok {
			delete(bg.unserved, k)
		} else if _, err := bg.vlans.GuestVLAN(port, k.vid); err == nil {
			delete(bg.unserved, k)
		}
	}
	for _, k := range sortedKeys(bg.declared) {
		if want[k] {
			continue
		}
		delete(bg.declared, k)
		removed, err := bg.sink.RemoveVIF(k.MAC, k.VLAN, mactrans.OriginBridge)
		if err != nil {
			bg.log.Warn("VIF of a switch guest", "origin", mactrans.OriginBridge, "mac", k.MAC, "vlan", k.VLAN, "added", false, "err", err)
			continue
		}
		if removed {
			bg.log.Info("guest gone", "origin", mactrans.OriginBridge, "mac", k.MAC, "vlan", k.VLAN)
		} else {
			bg.log.Info("guest's static entry gone; no VIF freed (none, or another source declared it)", "mac", k.MAC, "vlan", k.VLAN)
		}
	}
}

// sortedKeys returns m's keys by MAC and VLAN, so that the log follows
// one order.
func sortedKeys(m map[mactrans.VIFKey]bool) []mactrans.VIFKey {
	return slices.SortedFunc(maps.Keys(m), func(a, b mactrans.VIFKey) int {
		if c := slices.Compare(a.MAC[:], b.MAC[:]); c != 0 {
			return c
		}
		return int(a.VLAN) - int(b.VLAN)
	})
}
