package shim

// The in-kernel fast path. A backend may carry a guest's ordinary unicast
// IP between the TAP and the fabric without eipoibd (the kernel backend's
// tc BPF programs, internal/fabric/kernelfabric/fastpath): Config.FastPath.
// The control goroutine alone keeps it in step with the tables. After a
// VIF is made, before any QP is freed (the VIF already unpublished), and
// every control round (neighbours and sources are learned, aged, evicted
// and flushed by the data path, housekeeping and the control socket
// meanwhile), syncFastPath states in full what the fast path may carry,
// and the fast path applies the difference. The data path is untouched:
// no frame waits for it and no table gains a hook.
//
// The fast path may carry only what the user-space path would do no more
// to than re-frame. It carries nothing at all (fastPathOff) while
//   - --clamp-mss is on: every TCP SYN must cross user space to be clamped;
//   - a capture runs: it must see every frame (from the next control
//     round on);
//   - the shim is stopping: the QPs are about to go;
//
// and of the rest only
//   - guests of the untagged partition (VLAN 0, the default P_Key): the
//     programs take untagged frames only and deliver untagged ones;
//   - guests whose VIF is ready and whose announcement window is over:
//     within it, user space learns the addresses they show (announce.go);
//   - neighbours of that partition no local guest moved from (moved.go):
//     frames to them may belong to a local VIF;
//   - the sources (IP → REMAC, srcip.go) of that partition.
//
// What the user-space path does per frame and the fast path does not: it
// counts the guest's frames (show vif) and touches the VIF and the
// neighbour. The fast path counts its own use instead (the programs' hit
// counts), and the tables ask for it only when they are about to drop an
// entry (watchFastPath): a VIF idle for --vif-idle, a neighbour not seen
// for the neighbour TTL or chosen for eviction. One the fast path used
// since the last ask is touched instead (a neighbour sent to is marked
// used, as a guest's frame to it would) and stays, counted
// (vifs_kept_fast_path, neighbours_kept_fast_path). So a guest only the
// fast path carries keeps its VIF, and its neighbours age and are evicted
// as if user space had carried its frames, at the cost of a map lookup or
// a few per entry about to go, not a walk of the maps.

import (
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// FastPath is an in-kernel fast path that the control goroutine keeps in
// step with the tables. Each round states in full what it may carry:
// Begin, then any number of Guest, Neighbour and Sender, then Commit,
// which applies the difference from the last round and returns its first
// error (the rest of the round is applied all the same). The shim calls
// it from its control goroutine only, never from the data path.
type FastPath interface {
	Begin()
	// Guest: the guest with this MAC sends from the QP qpn.
	Guest(mac ether.MAC, qpn uint32)
	// Neighbour: the remote endpoint shown to guests as remac has the
	// 20-byte address rimac.
	Neighbour(remac ether.MAC, rimac ipoib.HwAddr)
	// Sender: packets from ip come from the endpoint shown as remac.
	Sender(ip netip.Addr, remac ether.MAC)
	Commit() error

	// GuestUsed reports whether the fast path carried frames of the
	// guest with this MAC since it was last asked about it (or since it
	// took the guest). NeighbourUsed reports whether it carried frames
	// from a guest to the endpoint shown as remac (sent) or from that
	// endpoint to a guest (received), likewise. Both are safe for
	// concurrent use with each other and with the rounds: the tables
	// ask them when they age or evict, from the goroutines that do.
	GuestUsed(mac ether.MAC) bool
	NeighbourUsed(remac ether.MAC) (sent, received bool)
}

// watchFastPath makes the tables ask Config.FastPath, before they drop a
// VIF or a neighbour of the untagged partition (the only ones it
// carries), whether it used them meanwhile (see the top of this file).
func (s *Shim) watchFastPath() {
	fp := s.cfg.FastPath
	if fp == nil {
		return
	}
	s.vifs.UseElsewhere(func(v *mactrans.VIF) bool {
		if v.Key.VLAN != 0 || !fp.GuestUsed(v.Key.MAC) {
			return false
		}
		s.ctr.inc(VIFsKeptFastPath)
		return true
	})
	s.neigh.UseElsewhere(func(n *mactrans.Neighbour) (sent, received bool) {
		if p := s.byVLAN[0].Load(); p == nil || n.PKey != p.pkey.Full() {
			return false, false
		}
		sent, received = fp.NeighbourUsed(n.REMAC)
		if sent || received {
			s.ctr.inc(NeighboursKeptFastPath)
		}
		return sent, received
	})
}

// fastPathOff says why the fast path carries nothing now, or "" when it
// may carry the untagged partition's ordinary unicast traffic.
func (s *Shim) fastPathOff() string {
	switch {
	case s.cfg.ClampMSS:
		return "clamp_mss"
	case s.capture.Load() != nil:
		return "capture"
	case s.stopping.Load():
		return "stopping"
	}
	return ""
}

// syncFastPath states to Config.FastPath what it may carry now (see the
// top of this file). Call with ctl.own held.
func (s *Shim) syncFastPath(now time.Time) {
	fp := s.cfg.FastPath
	if fp == nil {
		return
	}
	off := s.fastPathOff()
	if off != s.ctl.fastOff {
		s.log.Info("fast path", "carries", off == "", "off_for", off)
		s.ctl.fastOff = off
	}
	fp.Begin()
	if p := s.byVLAN[0].Load(); p != nil && off == "" {
		for _, v := range s.vifs.All() {
			if v.Key.VLAN == 0 && v.Ready() && !v.Announcing(now) {
				fp.Guest(v.Key.MAC, v.QPN)
			}
		}
		for _, n := range s.neigh.All() {
			if n.PKey == p.pkey.Full() && n.MovedTo() == nil {
				fp.Neighbour(n.REMAC, n.RIMAC.WithoutFlags())
			}
		}
		s.srcs.mu.RLock()
		for k, mac := range s.srcs.m {
			if k.pkey == p.pkey {
				fp.Sender(k.ip, mac)
			}
		}
		s.srcs.mu.RUnlock()
	}
	if err := fp.Commit(); err != nil && s.fastWarn.Allow(now) {
		s.log.Warn("fast path: tables not all applied", "err", err, "suppressed", s.fastWarn.Suppressed())
	}
}
