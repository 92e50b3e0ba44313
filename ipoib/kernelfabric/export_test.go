package kernelfabric

import (
	"log/slog"

	"github.com/eipoib/eipoibd/ipoib"
)

// The unexported pieces the external tests (conformance_test.go) check.
var (
	// HostOffSysctls is hostOffSysctls.
	HostOffSysctls = hostOffSysctls
	// SetOptions is setOptions.
	SetOptions = setOptions
	// SubscribeLinksBuf is subscribeLinks: System.SubscribeLinks with
	// a receive buffer of the given size.
	SubscribeLinksBuf = subscribeLinks
)

// FollowParent runs a Port's link following (follow, as New starts it)
// for parent over updates, a subscription of k ended by done, without
// making any child, and returns the port's Events; stop closes done,
// waits for follow to end and closes the events.
func FollowParent(k Kernel, parent Link, updates <-chan Link, done chan struct{}) (events <-chan ipoib.Event, stop func()) {
	p := &Port{k: k, log: slog.New(slog.DiscardHandler), parent: parent, done: done, drops: map[string]uint64{}, stats: map[string]uint64{}}
	p.down.Store(!parent.Carrier)
	p.events = ipoib.NewEventQueue(parent.Carrier)
	p.wg.Add(1)
	go p.follow(updates)
	return p.events.Events(), func() {
		close(done)
		p.wg.Wait()
		p.events.Close()
	}
}
