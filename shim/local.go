package shim

// The hypervisor's own MACs in --learn declared: the bridge (or the
// Open vSwitch bridge's internal port) and the TAP are no
// guests, and nothing declares them, so their frames (the host stack's
// IPv6 router solicitations, MLD reports and neighbour discovery on br0,
// an ARP from the host) are dropped like a forged MAC's. They are counted
// apart, as drop_undeclared_local, so that drop_undeclared stays what an
// operator watches for: guests sending from MACs no one declared.

import (
	"slices"

	"github.com/eipoib/eipoibd/ether"
)

// localMACs is the set SetLocalMACs gave, read on the drop path only.
type localMACs []ether.MAC

// SetLocalMACs replaces the MACs that are the hypervisor's own (the
// bridge's or the OVS internal port's, the TAP's): in --learn declared, a frame from one
// of them that has no VIF is counted as drop_undeclared_local instead of
// drop_undeclared. It changes nothing else: such a frame is still
// dropped, and a local MAC that is declared is served as any guest.
func (s *Shim) SetLocalMACs(macs []ether.MAC) {
	l := localMACs(slices.Clone(macs))
	s.local.Store(&l)
}

// dropUndeclared counts a frame from src, which has no VIF, in
// --learn declared.
func (s *Shim) dropUndeclared(src ether.MAC) {
	if l := s.local.Load(); l != nil && slices.Contains(*l, src) {
		s.ctr.inc(DropUndeclaredLocal)
		return
	}
	s.ctr.inc(DropUndeclared)
}
