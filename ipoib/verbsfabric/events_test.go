package verbsfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/internal/eventtest"
)

// TestEventsRoCE: an ACTIVE port first reports its link up; PORT_ERR and
// PORT_ACTIVE report down and up in order, a GID change or another
// event nothing; Close closes the channel.
func TestEventsRoCE(t *testing.T) {
	p, d := openPort(t, newHub(), gid1)
	ch := p.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	for _, ev := range []portEvent{eventPortDown, eventGIDChange, eventOther, eventPortActive, eventPortDown} {
		d.events <- ev
	}
	eventtest.Expect(t, ch, eventtest.Link(false), eventtest.Link(true), eventtest.Link(false))
	p.Close()
	eventtest.Closed(t, ch)
}

// TestEventsIB: on InfiniBand a partition's MTU is reported from its
// broadcast group's join (2048 on 4096-byte ports) and again when the
// SM restarted with another MTU and the port rejoined
// (CLIENT_REREGISTER); a reader that does not read never blocks the
// async event loop, and the link changes it missed come coalesced, the
// last one the port's state.
func TestEventsIB(t *testing.T) {
	sm := newSM()
	sm.mtu = 2048
	n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
	ch := n.p1.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	if _, err := n.p1.AllocQP(0xffff, 0); err != nil {
		t.Fatal(err)
	}
	eventtest.Expect(t, ch, eventtest.MTU(0xffff, 2048))
	// eventOther after each: the loop has taken it, so it is done with
	// the change before (events are handled one at a time).
	setUp := func(up bool) {
		ev := eventPortDown
		if up {
			ev = eventPortActive
		}
		n.d1.events <- ev
		n.d1.events <- eventOther
	}
	mark := eventtest.SlowReader(t, ch, setUp, func() {
		sm.restart(ipoib.QKey, 4096)
		n.d1.events <- eventClientReregister
	})
	if mark != eventtest.MTU(0xffff, 4096) {
		t.Fatalf("mark %+v", mark)
	}
}
