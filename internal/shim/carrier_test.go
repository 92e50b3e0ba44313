package shim

import (
	"sync"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestCarrierFollowsPortEvents: the TAP's carrier (and the carrier
// PortInfo reports) follows the port's link events as they come, not a
// housekeeping poll: the period here is an hour, so no round runs within
// the test after the first.
func TestCarrierFollowsPortEvents(t *testing.T) {
	h := newHV(t, memFab(t, 2048), "fe80::a", func(c *Config) { c.Housekeeping = time.Hour })
	p := h.port.(*memfabric.Port)
	for _, up := range []bool{false, true, false, true} {
		p.SetDown(!up)
		testutil.WaitFor(t, "the carrier to follow the port", func() bool { return h.dev.Carrier() == up && h.s.Port().Up == up })
	}
}

// eventPort is a port whose events the test sends itself.
type eventPort struct {
	testPort
	ch   chan ipoib.Event
	once sync.Once
}

func (p *eventPort) Events() <-chan ipoib.Event { return p.ch }

func (p *eventPort) Close() error {
	p.once.Do(func() { close(p.ch) })
	return p.testPort.Close()
}

// TestPortEventsChecked: an event of a kind the shim does not know
// changes nothing. A partition MTU event for a P_Key no VLAN maps is
// ignored. One above the port's MTU reads as the port's. One for a
// mapped partition (given without its full-membership bit) lowers that
// partition's MTU only. Run ends the goroutine reading the events (the
// package's TestMain checks no goroutine is left).
func TestPortEventsChecked(t *testing.T) {
	var ep *eventPort
	h := newHV(t, memFab(t, 4096), "fe80::a", func(c *Config) {
		ep = &eventPort{testPort: c.Port.(testPort), ch: make(chan ipoib.Event, 8)}
		ep.ch <- ipoib.Event{Kind: ipoib.EventLink, Up: true}
		c.Port = ep
		c.Partitions = map[uint16]ipoib.PKey{20: 0x8014}
		c.Housekeeping = time.Hour
	})
	ep.ch <- ipoib.Event{Kind: 99, Up: false}
	ep.ch <- ipoib.Event{Kind: ipoib.EventPartitionMTU, PKey: 0x8099, MTU: 2048}
	ep.ch <- ipoib.Event{Kind: ipoib.EventPartitionMTU, PKey: 0xffff, MTU: 8192}
	ep.ch <- ipoib.Event{Kind: ipoib.EventPartitionMTU, PKey: 0x0014, MTU: 2048}
	testutil.WaitFor(t, "VLAN 20's MTU to become 2044", func() bool { return h.s.Port().PartitionMTUs[20] == 2044 })
	if pi := h.s.Port(); !pi.Up || !h.dev.Carrier() || pi.PartitionMTUs[0] != 4092 || len(pi.PartitionMTUs) != 2 {
		t.Fatalf("after the events: %+v, TAP carrier %v", pi, h.dev.Carrier())
	}
}
