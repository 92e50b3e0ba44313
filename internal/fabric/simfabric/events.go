package simfabric

import "github.com/eipoib/eipoibd/ipoib"

// Events reports the port's link state: up when opened, then as the
// injected port-down fault (SetDown) takes it down and brings it back.
// Every partition has the port's MTU, so no partition MTU event comes.
// The channel is closed on Close.
func (p *Port) Events() <-chan ipoib.Event { return p.events.Events() }

// SetDown sets the injected port-down fault: while down, nothing is sent
// or delivered (counted as port_down); Events reports the change.
func (p *Port) SetDown(down bool) {
	p.downMu.Lock()
	defer p.downMu.Unlock()
	p.down.Store(down)
	p.events.Link(!down)
}
