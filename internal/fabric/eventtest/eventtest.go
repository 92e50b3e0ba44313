// Package eventtest checks a backend's Port.Events in the backend's
// tests: the events in order, the channel closed by Close, and a reader
// that does not read never blocking the backend.
package eventtest

import (
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// wait bounds each wait for an event, a close or a backend call.
const wait = 5 * time.Second

// Link is the event of link state up.
func Link(up bool) ipoib.Event { return ipoib.Event{Kind: ipoib.EventLink, Up: up} }

// MTU is the event of partition pkey's IB MTU mtu.
func MTU(pkey ipoib.PKey, mtu int) ipoib.Event {
	return ipoib.Event{Kind: ipoib.EventPartitionMTU, PKey: pkey.Full(), MTU: mtu}
}

// Next returns the next event of ch; it fails t when ch is closed or no
// event comes within 5 s.
func Next(t testing.TB, ch <-chan ipoib.Event) ipoib.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the events channel is closed")
		}
		return ev
	case <-time.After(wait):
		t.Fatal("no event within 5 s")
	}
	return ipoib.Event{}
}

// Expect checks that the next events of ch are want, in order.
func Expect(t testing.TB, ch <-chan ipoib.Event, want ...ipoib.Event) {
	t.Helper()
	for i, w := range want {
		if got := Next(t, ch); got != w {
			t.Fatalf("event %d: %+v, want %+v", i, got, w)
		}
	}
}

// Closed checks that ch is closed within 5 s; it may still hold events.
func Closed(t testing.TB, ch <-chan ipoib.Event) {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the events channel is still open 5 s after Close")
		}
	}
}

// Flips is how many link changes SlowReader makes: four times the
// channel's buffer.
const Flips = 4 * ipoib.EventBuffer

// SlowReader checks that a backend whose events nobody reads never
// blocks. With ch unread (its first event, the link up, taken already),
// setUp takes the link down and up Flips times, ending up. It must
// return each time: SlowReader fails t when the calls have not all
// returned within 5 s.
//
// Then mark, a call that makes an event of another state (a partition's
// MTU), is made and ch read up to that event. The link events before it
// must number at most EventBuffer + 2 (the buffer, one in delivery, one
// queued: the rest were coalesced) and end with up, the state the link
// was left in. SlowReader returns the mark's event. A backend with no
// other state to mark gives mark nil: only its calls are checked then
// (the queue's own tests check what the reader gets).
func SlowReader(t testing.TB, ch <-chan ipoib.Event, setUp func(up bool), mark func()) ipoib.Event {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range Flips {
			setUp(i%2 == 1)
		}
		if mark != nil {
			mark()
		}
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("the backend blocked on a reader that does not read: %d link changes and a mark not done in 5 s", Flips)
	}
	if mark == nil {
		return ipoib.Event{}
	}
	var links []bool
	for {
		ev := Next(t, ch)
		if ev.Kind != ipoib.EventLink {
			if len(links) > ipoib.EventBuffer+2 || len(links) == 0 || !links[len(links)-1] {
				t.Fatalf("link events before the mark: %v; want at most %d, the last up", links, ipoib.EventBuffer+2)
			}
			return ev
		}
		links = append(links, ev.Up)
	}
}
