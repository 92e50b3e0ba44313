package ipoib_test

import (
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestEventQueueOrder: the first event is the link state the queue was
// made with; a reader that keeps up gets every change in order, a
// partition's P_Key with its full-membership bit; a call repeating the
// last state queued makes no event.
func TestEventQueueOrder(t *testing.T) {
	q := ipoib.NewEventQueue(false)
	defer q.Close()
	ch := q.Events()
	eventtest.Expect(t, ch, eventtest.Link(false))
	q.Link(true)
	q.PartitionMTU(0x0001, 2048)
	q.Link(false)
	eventtest.Expect(t, ch, eventtest.Link(true), ipoib.Event{Kind: ipoib.EventPartitionMTU, PKey: 0x8001, MTU: 2048}, eventtest.Link(false))
	q.Link(false)                // the state it is in: no event
	q.PartitionMTU(0x8001, 2048) // likewise
	q.PartitionMTU(0x8001, 4096)
	q.Link(true)
	eventtest.Expect(t, ch, eventtest.MTU(0x8001, 4096), eventtest.Link(true))
	if q.Events() != ch {
		t.Fatal("Events returned another channel")
	}
}

// TestEventQueueSlowReader: a reader that does not read never blocks the
// sender. The link's changes are coalesced to at most the buffer and
// two, the last the current state. A partition's MTU set twice while
// unread comes once, as set last. Each state's events come in the order
// they were sent.
func TestEventQueueSlowReader(t *testing.T) {
	q := ipoib.NewEventQueue(true)
	defer q.Close()
	ch := q.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	mark := eventtest.SlowReader(t, ch, q.Link, func() {
		q.PartitionMTU(0x8001, 2048)
		q.PartitionMTU(0x8002, 2048)
		q.PartitionMTU(0x8001, 4096)
	})
	if want := eventtest.MTU(0x8001, 4096); mark != want {
		t.Fatalf("first partition event %+v, want %+v (the later MTU in the earlier one's place)", mark, want)
	}
	eventtest.Expect(t, ch, eventtest.MTU(0x8002, 2048))
	q.Link(false)
	eventtest.Expect(t, ch, eventtest.Link(false))
}

// TestEventQueueClose: Close closes the channel even when nobody ever
// read it, or asked for it; events after Close are ignored; a second
// Close does nothing.
func TestEventQueueClose(t *testing.T) {
	t.Run("unread", func(t *testing.T) {
		q := ipoib.NewEventQueue(true)
		ch := q.Events()
		for i := range eventtest.Flips {
			q.Link(i%2 == 1)
		}
		closeWithin(t, q)
		eventtest.Closed(t, ch)
		q.Link(false)
		closeWithin(t, q)
	})
	t.Run("never asked", func(t *testing.T) {
		q := ipoib.NewEventQueue(true)
		q.Link(false)
		closeWithin(t, q)
		eventtest.Closed(t, q.Events())
	})
}

// closeWithin closes q, failing t when Close does not return within 5 s.
func closeWithin(t *testing.T, q *ipoib.EventQueue) {
	t.Helper()
	done := make(chan struct{})
	go func() { q.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked")
	}
}
