package shim

// The hypervisor's own MACs in --learn declared. The bridge (or the
// Open vSwitch bridge's internal port) and the TAP are no guests, and
// nothing declares them. So their frames are dropped like a forged
// MAC's: the host stack's IPv6 router solicitations, MLD reports and
// neighbour discovery on br0, an ARP from the host. They are counted
// apart, as drop_undeclared_local, so that drop_undeclared stays what an
// operator watches for: guests sending from MACs no one declared.
// Housekeeping logs them too (logUndeclared), at most once a
// warnlimit.Interval, naming the last such MAC: the data path only
// stores it.

import (
	"encoding/binary"
	"slices"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/warnlimit"
	"github.com/eipoib/eipoibd/mactrans"
)

// localMACs is the set SetLocalMACs gave, read on the drop path only.
type localMACs []ether.MAC

// SetLocalMACs replaces the MACs that are the hypervisor's own (the
// bridge's or the OVS internal port's, the TAP's): in --learn declared, a
// frame from one of them that has no VIF is counted as
// drop_undeclared_local instead of drop_undeclared. It changes nothing
// else: such a frame is still dropped, and a local MAC that is declared is
// served as any guest.
func (s *Shim) SetLocalMACs(macs []ether.MAC) {
	l := localMACs(slices.Clone(macs))
	s.local.Store(&l)
}

// dropUndeclared drops a frame from k, which has no VIF, in --learn
// declared, and leaves k for logUndeclared.
func (s *Shim) dropUndeclared(k mactrans.VIFKey) verdict {
	if l := s.local.Load(); l != nil && slices.Contains(*l, k.MAC) {
		return verdict(DropUndeclaredLocal)
	}
	// Stored before tx counts the verdict, so that logUndeclared, seeing
	// the count, sees a source (atomics are sequentially consistent).
	s.undeclared.last.Store(packKey(k))
	return verdict(DropUndeclared)
}

// undeclaredLog is the state of the drop_undeclared log line.
type undeclaredLog struct {
	last   atomic.Uint64 // packKey of the last frame's source; the TX workers store it
	logged uint64        // drop_undeclared at the last line; housekeeping's
	next   time.Time     // no line before; housekeeping's
}

// packKey packs a guest's MAC and VLAN into one word the data path can
// store without a lock: the MAC in the top 48 bits, the VLAN in the low
// 12.
func packKey(k mactrans.VIFKey) uint64 {
	var b [8]byte
	copy(b[:], k.MAC[:])
	return binary.BigEndian.Uint64(b[:]) | uint64(k.VLAN&0xfff)
}

// unpackKey is packKey's inverse.
func unpackKey(w uint64) mactrans.VIFKey {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], w)
	k := mactrans.VIFKey{VLAN: uint16(w & 0xfff)}
	copy(k.MAC[:], b[:6])
	return k
}

// logUndeclared logs how many frames from undeclared MACs were dropped
// since its last line, naming the last one's MAC and VLAN. It logs only
// when there were some, at most once a warnlimit.Interval. The docs call
// drop_undeclared worth an alert, and the operator needs to know whose.
// Housekeeping calls it.
func (s *Shim) logUndeclared(now time.Time) {
	u := &s.undeclared
	n := s.Get(DropUndeclared)
	if n == u.logged || now.Before(u.next) {
		return
	}
	k := unpackKey(u.last.Load())
	s.log.Warn("frames from a MAC no one declared dropped (--learn declared; one line a minute at most)",
		"mac", k.MAC, "vlan", k.VLAN, "dropped", n-u.logged)
	u.logged, u.next = n, now.Add(warnlimit.Interval)
}
