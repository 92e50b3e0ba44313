// Package nsenter runs Go code inside a named network namespace, for the
// tests and the emulation tools that build topologies of namespaces.
package nsenter

import (
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on a thread in namespace ns (as "ip netns" names it) and
// returns fn's error, or why it could not enter ns. Sockets, devices and
// attachments fn makes belong to ns, whichever thread uses them later.
func Do(ns string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread() // a thread left in ns dies with its goroutine
		}
	}()
	return fn()
}
