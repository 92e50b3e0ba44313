package fakekernel

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// TestLinkQueueOverrun: a subscription whose queue is full when a
// notification comes is overrun: its subscriber is told ENOBUFS, reads
// what was queued before, and then finds the channel closed; the
// notification that did not fit is lost.
func TestLinkQueueOverrun(t *testing.T) {
	k := NewFabric().NewHost(ipoib.GID{0xfe, 0x80, 15: 1}, "ib0", 2044)
	k.LinkQueue = 1
	done := make(chan struct{})
	defer close(done)
	var got error
	ch, err := k.SubscribeLinks(done, func(err error) { got = err })
	if err != nil {
		t.Fatal(err)
	}
	k.SetCarrier(false)
	if got != nil {
		t.Fatalf("one notification in a queue of one: %v", got)
	}
	k.SetCarrier(true)
	if !errors.Is(got, unix.ENOBUFS) {
		t.Fatalf("overrun: told %v, want ENOBUFS", got)
	}
	if l, ok := <-ch; !ok || l.Carrier {
		t.Fatalf("queued before the overrun: %+v %v, want carrier off", l, ok)
	}
	if l, ok := <-ch; ok {
		t.Fatalf("after the overrun: %+v, want the channel closed", l)
	}
}
