package simfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
)

// TestEvents: a port opened on a veth first reports its link up; the
// port-down fault reports down and up in order; a reader that does not
// read never blocks SetDown; Close closes the channel.
func TestEvents(t *testing.T) {
	a, _, _, _ := pair(t, 2048+UnderlayExtra)
	ch := a.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	a.SetDown(true)
	a.SetDown(false)
	a.SetDown(true)
	eventtest.Expect(t, ch, eventtest.Link(false), eventtest.Link(true), eventtest.Link(false))
	a.SetDown(false)
	eventtest.Expect(t, ch, eventtest.Link(true))
	eventtest.SlowReader(t, ch, func(up bool) { a.SetDown(!up) }, nil)
	a.Close()
	eventtest.Closed(t, ch)
}
