package kernelfabric_test

import (
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// TestEvents: on the fake kernel, the port first reports the parent's
// carrier, then the default partition's MTU as its group child joined
// the broadcast group. It reports a new partition's MTU as its group
// child joins. It reports, in order, the parent's carrier going and
// coming back, and the MTU the SM gave the partition's broadcast group
// meanwhile, as the children join again (ipoib_mcast_join_finish). A
// reader that does not read never blocks the link notifications. Close
// closes the channel.
func TestEvents(t *testing.T) {
	f := fakekernel.NewFabric()
	k := f.NewHost(testutil.GID("fe80::a"), "ib0", 4092)
	p := open(t, k)
	ch := p.Events()
	eventtest.Expect(t, ch, eventtest.Link(true), eventtest.MTU(0xffff, 4096))
	if _, err := p.AllocQP(0x8002, 0); err != nil {
		t.Fatal(err)
	}
	eventtest.Expect(t, ch, eventtest.MTU(0x8002, 4096))
	f.SetGroupMTU(0x8002, 2048)
	k.SetCarrier(false)
	k.SetCarrier(true)
	eventtest.Expect(t, ch, eventtest.Link(false), eventtest.Link(true), eventtest.MTU(0x8002, 2048))

	// Each change waits for the backend to have taken it (IsDown), so
	// that the mark, a new partition's group child, comes after them.
	setUp := func(up bool) {
		k.SetCarrier(up)
		for p.IsDown() == up {
			time.Sleep(time.Millisecond)
		}
	}
	mark := eventtest.SlowReader(t, ch, setUp, func() { _, _ = p.AllocQP(0x8003, 0) })
	if mark != eventtest.MTU(0x8003, 4096) {
		t.Fatalf("mark %+v", mark)
	}
	p.Close()
	eventtest.Closed(t, ch)
}

// TestEventsStartDown: a port opened while the parent has no carrier
// reports the link down first. When the carrier comes, it reports the
// link up, then the default partition's MTU as its group child, made
// while the port was down, joins. The fake notifies the parent's carrier
// before the children join again, as ipoib_ib_dev_up follows the port.
func TestEventsStartDown(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	k.SetCarrier(false)
	p := open(t, k)
	ch := p.Events()
	eventtest.Expect(t, ch, eventtest.Link(false))
	k.SetCarrier(true)
	eventtest.Expect(t, ch, eventtest.Link(true), eventtest.MTU(0xffff, 2048))
}
