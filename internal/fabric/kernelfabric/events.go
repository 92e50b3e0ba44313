package kernelfabric

import "github.com/eipoib/eipoibd/ipoib"

// Events reports, from the link notifications follow reads, the parent's
// carrier as the link state. The IPoIB driver turns it off when the port
// leaves ACTIVE (ipoib_ib_dev_down), and on when it joins the broadcast
// group again (ipoib_mcast_join_task → ipoib_mcast_carrier_on_task).
// Events also reports each partition's MTU as its group child takes it
// from the partition's broadcast group, when the child first gets
// carrier and when the MTU changes; ipoib_mcast_join_finish sets the
// child's MTU before its carrier. The channel is closed on Close.
func (p *Port) Events() <-chan ipoib.Event { return p.events.Events() }

// partitionMTU reports the MTU of child c's partition when c is the
// partition's group child with carrier (its MTU known).
func (p *Port) partitionMTU(c *child) {
	if mtu := c.mtu.Load(); c.group && mtu != 0 {
		p.events.PartitionMTU(c.pkey, int(mtu))
	}
}
