package netns

import (
	"fmt"
	"sync"
	"testing"
)

// TestParallelReceive (issue 24, parallel receive): with --rx-workers 4
// each daemon receives on four sockets bound to UDP 4791 (SO_REUSEPORT)
// and sends each flow from one of eight source ports. Eight TCP
// connections between two guests, 16 MiB each, arrive exactly (iperf 2
// counts every byte at both ends, so a flow reordered across sockets
// or a packet lost or doubled would show); the receiving daemon's
// per-socket counters (port_rx_socket_<i>_packets) show the flows over
// more than one socket and sum to its port_rx_packets; no drop counter
// and no checksum error counter rises. Eight connections, not four: each
// lands on a socket by the kernel's secret hash, and four all on one
// socket would happen about once in 64 runs.
func TestParallelReceive(t *testing.T) {
	nstestRequire(t, "iperf")
	const flows, size = 8, 16 << 20
	const sockets = 4
	tp := newTopo(t, 2, false, "--rx-workers", fmt.Sprint(sockets))
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g1, g2 := h1.guests[0], h2.guests[0]
	ping(t, g1, g2.ip4)
	drops := watchDrops(t, h1, h2)
	csums := watchCsumErrors(t, g1, g2)
	before := h2.metrics(t)
	type result struct {
		sent, rcvd int64
		err        error
	}
	res := make([]result, flows)
	var wg sync.WaitGroup
	for i := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].sent, res[i].rcvd, res[i].err = tcpTransferOn(g2, g1, 5001+i, "-n", fmt.Sprint(size))
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.err != nil || r.sent != size || r.rcvd != size {
			t.Errorf("connection %d: %d bytes sent, %d received, want %d both: %v", i, r.sent, r.rcvd, size, r.err)
		}
	}
	csums.check(t)
	drops.check(t)
	after := h2.metrics(t)
	var used int
	var sum float64
	bySocket := make([]float64, sockets)
	for i := range sockets {
		k := fmt.Sprintf("port_rx_socket_%d_packets", i)
		if _, ok := after[k]; !ok {
			t.Fatalf("%s: no %s in the metrics", h2.name, k)
		}
		bySocket[i] = after[k] - before[k]
		sum += bySocket[i]
		if bySocket[i] > 0 {
			used++
		}
	}
	if rx := after["port_rx_packets"] - before["port_rx_packets"]; sum != rx {
		t.Errorf("%s: the sockets received %v packets (%v), the port counted %v", h2.name, sum, bySocket, rx)
	}
	if used < 2 {
		t.Errorf("%s: %d connections all arrived on one socket: %v", h2.name, flows, bySocket)
	}
	t.Logf("%s: packets by socket %v", h2.name, bySocket)
}
