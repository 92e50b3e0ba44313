package simfabric

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestBusyPoll: a port opened with BusyPoll has SO_BUSY_POLL at that
// many microseconds and SO_PREFER_BUSY_POLL on, as the kernel reads them
// back. Without it both are the defaults: 0, the net.core.busy_read
// sysctl of a new namespace, and off. Its reader, busy-polling and then
// waiting on the empty socket, is woken by Close and leaves.
func TestBusyPoll(t *testing.T) {
	nstest.Require(t, "ip")
	ns := fmt.Sprintf("sfbp%d", os.Getpid()%10000)
	nstest.Add(t, ns)
	nstest.Must(t, nstest.In(ns, "ip", "link", "add", "ulp", "mtu", "9000", "type", "veth", "peer", "name", "ulq", "mtu", "9000")...)
	nstest.Must(t, nstest.In(ns, "ip", "link", "set", "ulq", "up")...)
	nstest.Must(t, nstest.In(ns, "ip", "link", "set", "ulp", "up")...)
	for _, busy := range []time.Duration{0, 50 * time.Microsecond} {
		var p *Port
		var err error
		nstest.Do(t, ns, func() { p, err = Open(Config{Underlay: "ulp", IBMTU: 2048, BusyPoll: busy}) })
		if err != nil {
			t.Fatal(err)
		}
		var usecs, prefer int
		var gerr error
		rc, err := p.conns[0].SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		err = rc.Control(func(fd uintptr) {
			if usecs, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BUSY_POLL); gerr == nil {
				prefer, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PREFER_BUSY_POLL)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := int(busy / time.Microsecond); gerr != nil || usecs != want || (prefer == 1) != (busy > 0) {
			t.Errorf("busy %v: SO_BUSY_POLL %d, SO_PREFER_BUSY_POLL %d (%v); want %d and %v", busy, usecs, prefer, gerr, want, busy > 0)
		}
		got := reader(p)
		time.Sleep(20 * time.Millisecond) // most likely waiting by now; either way it must wake
		p.Close()
		if r, ok := <-got; ok {
			t.Fatalf("busy %v: received %x on an idle socket", busy, r.payload)
		}
	}
}
