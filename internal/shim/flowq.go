package shim

import (
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/header"
)

// Received frames go to the guests through the TAP queue their flow
// hashes to. A multi-queue TAP steers a flow's frames from the guests to
// the queue its last received frame was written on (the kernel's
// automatic flow steering, tun_automq_select_queue). Writing all of a
// flow through one queue keeps its frames from the guests on that queue.
// One TX worker reads them there, in order, and flows spread over the
// workers.

// flowQueue returns the queue, of n, for frame f: by a hash of its
// addresses, protocol and ports (TCP and UDP, unfragmented), symmetric so
// that either direction gives the same queue (header.FlowHash); 0 for
// anything else.
func flowQueue(f ether.Frame, n int) int {
	if n == 1 {
		return 0
	}
	et := f.EtherType()
	if et != ether.TypeIPv4 && et != ether.TypeIPv6 {
		return 0
	}
	h, ok := header.FlowHash(f.Payload(), et == ether.TypeIPv6)
	if !ok {
		return 0
	}
	return int(h % uint64(n))
}
