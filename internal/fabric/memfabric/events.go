package memfabric

import (
	"github.com/eipoib/eipoibd/ipoib"
)

// Events reports the port's link state (up when attached, then as
// SetDown sets it) and the partition MTUs SetPartitionMTU sets; it is
// closed on Close.
func (p *Port) Events() <-chan ipoib.Event { return p.events.Events() }

// SetDown takes the port down or up, as a cable pulled and put back:
// while down, nothing is sent or delivered (counted as port_down), and
// Events reports the change.
func (p *Port) SetDown(down bool) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	p.down.Store(down)
	p.events.Link(!down)
}

// SetPartitionMTU sets partition pkey's IB MTU, as a subnet manager sets
// the MTU of a partition's broadcast group (at most the fabric's MTU;
// 0 gives the partition the fabric's MTU again): PartitionMTU reports it
// and Events announces it. Packets are still checked against the
// fabric's MTU only.
func (p *Port) SetPartitionMTU(pkey ipoib.PKey, mtu int) {
	if mtu <= 0 || mtu > p.f.mtu {
		mtu = p.f.mtu
	}
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	p.partMTU[pkey.Full()] = mtu
	p.events.PartitionMTU(pkey, mtu)
}

// PartitionMTU is what SetPartitionMTU set for pkey, else the fabric's
// MTU.
func (p *Port) PartitionMTU(pkey ipoib.PKey) int {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if m, ok := p.partMTU[pkey.Full()]; ok {
		return m
	}
	return p.f.mtu
}
