package verbsfabric

import "github.com/eipoib/eipoibd/ipoib"

// Events reports the port's state as ibv_get_async_event gives it
// (IBV_EVENT_PORT_ACTIVE up, IBV_EVENT_PORT_ERR down; the state at open
// first) and, on InfiniBand, each partition's MTU as its broadcast
// group's join or rejoin gives it (setPart). The channel is closed on
// Close.
func (p *Port) Events() <-chan ipoib.Event { return p.events.Events() }

// asyncEvent follows an async event of the device (portEvent), then
// reports a change of the port state. It reports after PORT_ACTIVE's
// flush has rejoined the groups, as the IPoIB driver turns its carrier
// on only once the broadcast group is joined again
// (ipoib_mcast_join_task → ipoib_mcast_carrier_on_task). One device
// context reports the events of every port of the HCA. An event of
// another port is counted (async_events_other_port) and ignored, as
// ipoib_verbs.c ipoib_event returns when record->element.port_num is not
// its port. A PORT_ERR of a dual-port HCA's other port must not take
// this port's guests down.
func (p *Port) asyncEvent(e asyncEvent) {
	if e.ev != eventOther && e.port != p.a.port {
		p.otherPortEvents.Add(1)
		return
	}
	p.portEvent(e.ev)
	switch e.ev {
	case eventPortActive:
		p.events.Link(true)
	case eventPortDown:
		p.events.Link(false)
	}
}
