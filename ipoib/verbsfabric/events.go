package verbsfabric

import "github.com/eipoib/eipoibd/ipoib"

// Events reports the port's state as ibv_get_async_event gives it
// (IBV_EVENT_PORT_ACTIVE up, IBV_EVENT_PORT_ERR down; the state at open
// first) and, on InfiniBand, each partition's MTU as its broadcast
// group's join or rejoin gives it (setPart). The channel is closed on
// Close.
func (p *Port) Events() <-chan ipoib.Event { return p.events.Events() }

// asyncEvent follows an async event of the device (portEvent), then
// reports a change of the port state: after PORT_ACTIVE's flush has
// rejoined the groups, as the IPoIB driver turns its carrier on only once
// the broadcast group is joined again (ipoib_mcast_join_task →
// ipoib_mcast_carrier_on_task).
func (p *Port) asyncEvent(ev portEvent) {
	p.portEvent(ev)
	switch ev {
	case eventPortActive:
		p.events.Link(true)
	case eventPortDown:
		p.events.Link(false)
	}
}
