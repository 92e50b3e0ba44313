package daemon

// The switch policy: the TAP on a Linux bridge or an Open vSwitch
// bridge, and the guests the switch knows declared (and removed) ahead
// of their traffic.

import (
	"context"
	"log/slog"
	"sync"

	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/vswitch"
	"github.com/eipoib/eipoibd/mactrans"
)

// switchPort is the TAP's place on its switch, if it has one.
type switchPort struct {
	cfg *Config
	sh  *shim.Shim
	dev *tap.TAP
	log *slog.Logger
	ovs vswitch.OVS
	bg  *bridgeGuests // the Linux bridge's guests
	// ovsRestored are the VIFs --persist restored that Open vSwitch had
	// declared: those whose port went while eipoibd was down are freed
	// once the watch has listed the ports.
	ovsRestored []vswitch.Guest
	// dp is the Open vSwitch datapath last read (dpKnown once read).
	dp      vswitch.Datapath
	dpKnown bool
}

// attachSwitch attaches the TAP to cfg's bridge or Open vSwitch bridge.
// On a Linux bridge in auto mode, the guests the bridge already learned
// get their VIFs now, so traffic to them flows before they speak (after
// a restart, for one); static entries come through watch.
func attachSwitch(cfg *Config, dev *tap.TAP, sh *shim.Shim, log *slog.Logger) (*switchPort, error) {
	sw := &switchPort{cfg: cfg, sh: sh, dev: dev, log: log, ovs: vswitch.OVS{DB: cfg.OVSDB}}
	if cfg.OVSBridge != "" {
		// No super-frame is written before the datapath is known to
		// take them.
		dev.SetWriteSuper(false)
		// A kept TAP keeps its port: removing it first would flap it.
		if err := sw.ovs.Attach(cfg.Name, cfg.OVSBridge, dev.Start() != tap.Created); err != nil {
			return nil, err
		}
		log.Info("attached to Open vSwitch bridge", "tap", cfg.Name, "bridge", cfg.OVSBridge)
		if d, err := sw.ovs.Datapath(cfg.OVSBridge); err != nil {
			log.Warn("Open vSwitch datapath unknown: the TAP writes no super-frames", "bridge", cfg.OVSBridge, "err", err)
		} else {
			sw.datapath(d)
		}
		for _, k := range restoredKeys(sh, mactrans.OriginOVS) {
			sw.ovsRestored = append(sw.ovsRestored, vswitch.Guest{MAC: k.MAC, VLAN: k.VLAN, Static: true})
		}
	}
	if cfg.Bridge == "" {
		return sw, nil
	}
	if err := vswitch.AttachBridge(cfg.Name, cfg.Bridge); err != nil {
		return nil, err
	}
	log.Info("attached to bridge", "tap", cfg.Name, "bridge", cfg.Bridge)
	vlans, err := vswitch.BridgeVLANs(cfg.Bridge, cfg.Name)
	if err != nil {
		log.Warn("read bridge VLANs; taking VLAN filtering as off", "err", err)
	}
	sw.bg = newBridgeGuests(sh, log, vlans, func() ([]vswitch.Guest, error) { return vswitch.BridgeGuests(cfg.Bridge, cfg.Name) },
		func() (vswitch.VLANs, error) { return vswitch.BridgeVLANs(cfg.Bridge, cfg.Name) })
	sw.bg.restore(restoredKeys(sh, mactrans.OriginBridge))
	if cfg.Learn != shim.LearnAuto {
		return sw, nil
	}
	guests, err := vswitch.BridgeGuests(cfg.Bridge, cfg.Name)
	if err != nil {
		log.Warn("read bridge FDB", "err", err)
	}
	for _, g := range guests {
		if g.Static {
			continue // the watch declares them
		}
		vlan, err := vlans.GuestVLAN(g.Port, g.VLAN)
		if err != nil {
			continue
		}
		if err := sh.DeclareVIF(g.MAC, vlan, mactrans.OriginLearned); err != nil {
			log.Warn("declare VIF from bridge FDB", "mac", g.MAC, "vlan", vlan, "err", err)
		}
	}
	return sw, nil
}

// restoredKeys returns the keys of the shim's VIFs of origin o: at
// start, those --persist restored from the switch o.
func restoredKeys(sh *shim.Shim, o mactrans.Origin) []mactrans.VIFKey {
	var keys []mactrans.VIFKey
	for _, v := range sh.VIFs() {
		if v.Origin == o {
			keys = append(keys, mactrans.VIFKey{MAC: v.MAC, VLAN: v.VLAN})
		}
	}
	return keys
}

// detach takes the TAP off Open vSwitch at shutdown, unless --persist
// keeps it (and its port with it). A Linux bridge port goes with the TAP.
func (sw *switchPort) detach() {
	if sw.cfg.OVSBridge == "" || sw.cfg.Persist {
		return
	}
	if err := sw.ovs.Detach(sw.cfg.Name, sw.cfg.OVSBridge); err != nil {
		sw.log.Warn("detach from Open vSwitch", "err", err)
	} else {
		sw.log.Info("detached from Open vSwitch bridge", "bridge", sw.cfg.OVSBridge)
	}
}

// watch follows the switch's guests until ctx ends, in goroutines wg
// counts. Guests the bridge knows, now and from now on, get their VIFs
// before they speak (after a restart, or when libvirt adds a static
// entry), on the VLAN its VLAN filtering gives them (followed as it
// changes), and lose them as soon as the bridge forgets them (their port
// went). The same for Open vSwitch: a port whose interface carries
// external_ids:attached-mac (as libvirt and os-vif set it) is a
// declared guest, on the port's access VLAN.
func (sw *switchPort) watch(ctx context.Context, wg *sync.WaitGroup) {
	cfg, log := sw.cfg, sw.log
	if cfg.Bridge != "" {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := vswitch.WatchBridge(ctx, cfg.Bridge, cfg.Name, sw.bg.entry,
				func(err error) {
					log.Debug("bridge FDB events dropped by the kernel; listed afresh", "err", err)
					sw.bg.relist()
				}); err != nil {
				log.Warn("bridge guests are learned from their traffic only", "err", err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := vswitch.WatchBridgeVLANs(ctx, cfg.Bridge, cfg.Name, sw.bg.setVLANs,
				func(err error) { log.Warn("watching the bridge's VLANs", "err", err) }); err != nil {
				log.Warn("bridge VLAN changes are not followed", "err", err)
			}
		}()
	}
	if cfg.OVSBridge != "" {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := sw.ovs.WatchDatapath(ctx, cfg.OVSBridge, sw.datapath,
				func(err error) { log.Warn("watching the Open vSwitch datapath", "err", err) }); err != nil {
				log.Warn("Open vSwitch datapath changes are not followed", "err", err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := sw.ovs.Watch(ctx, cfg.OVSBridge, cfg.Name, sw.ovsRestored, sw.guest,
				func(err error) { log.Warn("watching Open vSwitch guests", "err", err) }); err != nil {
				log.Warn("Open vSwitch guests are learned from their traffic only", "err", err)
			}
		}()
	}
}

// datapath makes the TAP write super-frames (merged received segments)
// only where the Open vSwitch bridge's datapath takes them: the kernel
// datapath does, the userspace one only where ovs-vswitchd runs every
// port of the bridge with TSO; elsewhere every frame written is at most
// the MTU (see vswitch.Datapath and tap.TAP.SetWriteSuper).
//
// OVSDB's userspace-tso-enable alone does not say that: ovs-vswitchd
// latches it (userspace_tso_init, lib/userspace-tso.c) and gives a port
// TSO only when it adds the port (netdev_linux_construct,
// netdev_linux_rxq_construct), so the key set on a running switch
// leaves its ports without, and super-frames written then would be
// dropped ("Too big", "No TSO support"). The datapath is read afresh on
// every change, never kept from the first read: each read looks at what
// the ports actually have (vswitch.Datapath).
func (sw *switchPort) datapath(d vswitch.Datapath) {
	sw.dev.SetWriteSuper(d.TakesGSO())
	if sw.dpKnown && d == sw.dp || !sw.dev.Offload() {
		return // known already, or nothing is merged anyway
	}
	sw.dp, sw.dpKnown = d, true
	attrs := []any{"bridge", sw.cfg.OVSBridge, "datapath_type", d.Type, "userspace_tso", d.UserspaceTSO,
		"write_super_frames", sw.dev.WriteSuper()}
	if d.NoGSO != "" {
		attrs = append(attrs, "why_not", d.NoGSO)
	}
	sw.log.Info("Open vSwitch datapath", attrs...)
	if d.UserspaceTSO && !d.TakesGSO() {
		sw.log.Info("Open vSwitch has userspace-tso-enable, but not every port of the bridge has TSO: ovs-vswitchd gives it only to ports it adds after it took the key, and to all once it restarts; no super-frames are written until then",
			"bridge", sw.cfg.OVSBridge)
	}
}

// guest declares or removes the VIF of a guest Open vSwitch (its
// OVSDB's attached-macs) gained or lost; a Linux bridge's guests go
// through bridgeGuests.
func (sw *switchPort) guest(g vswitch.Guest, added bool) {
	const origin = mactrans.OriginOVS
	var err error
	if added && !g.Static {
		return
	}
	changed := true
	if added {
		err = sw.sh.DeclareVIF(g.MAC, g.VLAN, origin)
	} else {
		changed, err = sw.sh.RemoveVIF(g.MAC, g.VLAN, origin)
	}
	switch {
	case err != nil:
		sw.log.Warn("VIF of a switch guest", "origin", origin, "mac", g.MAC, "vlan", g.VLAN, "added", added, "err", err)
	case added:
		sw.log.Info("guest declared", "origin", origin, "mac", g.MAC, "vlan", g.VLAN)
	case changed:
		sw.log.Info("guest gone", "origin", origin, "mac", g.MAC, "vlan", g.VLAN)
	}
}
