package netns

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestParallelReceive (parallel receive): with --rx-workers 4
// each daemon receives on four sockets bound to UDP 4791 (SO_REUSEPORT)
// and sends each flow from one of eight source ports. Eight TCP
// connections from g1 to g2, 16 MiB each, and it asserts:
//   - each connection's bytes arrive, as many as sent (iperf 2 at both
//     ends);
//   - h1's unicast packets sent (port_tx_packets less
//     port_tx_multicast_packets) rose as much as h2's unicast packets
//     received (port_rx_packets less port_rx_multicast_packets). Both
//     are read once they have stopped moving. So every unicast packet h1
//     sent arrived at h2 once (its only unicast peer), and nothing more.
//     Multicast is left out: a guest's MLD reports and the like go to
//     groups h2 may not join;
//   - h2's per-socket counters (port_rx_socket_<i>_packets) show the
//     flows over more than one socket;
//   - no drop counter of either daemon and no checksum error counter of
//     either guest rises.
//
// Not claimed: per-flow order. It is asserted where nothing else can
// reorder: through the sockets of one port (simfabric
// TestSocketsSpreadFlows: each flow on one socket, its packets in order)
// and through the shim's receive workers to the TAP (shim
// TestRxQueuesRace). Here the guests' TcpExtTCPOFOQueue and
// TcpRetransSegs are only logged. With the TAP's offloads off they rise
// in about half the runs, with --rx-workers 1 as with 4, on this 2-core
// host; in the run looked at, no daemon or link counted a drop. The
// reordering is after the daemon, most likely in the guest veth's
// netif_rx. That queues each packet on the backlog of the CPU the
// writing thread is on (veth_xmit → __netif_rx → enqueue_to_backlog), so
// a thread that moves between CPUs mid-flow reorders it. The underlay
// veth can do the same before the daemon.
//
// Eight connections, not four: each lands on a socket by the kernel's
// secret hash, and four all on one socket would happen about once in
// 64 runs.
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
	n1, n2 := nstat(t, g1), nstat(t, g2)
	m1 := h1.metrics(t)
	before := h2.metrics(t)
	unicast := func(m map[string]float64, way string) float64 {
		return m["port_"+way+"_packets"] - m["port_"+way+"_multicast_packets"]
	}
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
	t.Logf("%s: TcpExtTCPOFOQueue rose by %d; %s: TcpRetransSegs rose by %d (not claimed: see the comment)",
		g2.ns, nstat(t, g2)["TcpExtTCPOFOQueue"]-n2["TcpExtTCPOFOQueue"], g1.ns, nstat(t, g1)["TcpRetransSegs"]-n1["TcpRetransSegs"])
	// The counters settle once the last packets are through: they are
	// compared when neither moved for a second (the transfers are over,
	// the guests idle), not at the first sample that happens to match
	// while they move. One more received than sent then is a duplicate;
	// fewer may be a receive worker not yet scheduled, so the wait goes
	// on, up to 20 s.
	var sent, rcvd float64
	for deadline, prevS, prevR := time.Now().Add(20*time.Second), -1.0, -1.0; ; prevS, prevR = sent, rcvd {
		sent, rcvd = unicast(h1.metrics(t), "tx")-unicast(m1, "tx"), unicast(h2.metrics(t), "rx")-unicast(before, "rx")
		stable := sent == prevS && rcvd == prevR
		if stable && rcvd >= sent {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if sent != rcvd {
		t.Errorf("%s sent %v unicast packets to the fabric, %s received %v", h1.name, sent, h2.name, rcvd)
	}
	after := h2.metrics(t)
	var used int
	bySocket := make([]float64, sockets)
	for i := range sockets {
		k := fmt.Sprintf("port_rx_socket_%d_packets", i)
		if _, ok := after[k]; !ok {
			t.Fatalf("%s: no %s in the metrics", h2.name, k)
		}
		bySocket[i] = after[k] - before[k]
		if bySocket[i] > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("%s: %d connections all arrived on one socket: %v", h2.name, flows, bySocket)
	}
	t.Logf("%s: packets by socket %v; unicast %v sent by %s, %v received", h2.name, bySocket, sent, h1.name, rcvd)
}
