package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestReadWriteClose: on a real TAP, with and without busy polling (a
// spin of 1 µs, over at once: the reader spins, then waits in the
// netpoller). Read returns the ARP request the kernel sends out of the
// TAP for an address on its subnet. Write hands a frame to the kernel.
// Close wakes a reader waiting on the empty queue, which returns
// net.ErrClosed.
func TestReadWriteClose(t *testing.T) {
	nstest.Require(t, "ip")
	for i, busy := range []time.Duration{0, time.Microsecond} {
		ns := fmt.Sprintf("tapb%d-%d", os.Getpid(), i)
		nstest.Add(t, ns)
		nstest.Do(t, ns, func() {
			tp, err := Create(Config{Name: "btap0", MTU: 1500, BusyPoll: busy})
			if err != nil {
				t.Fatal(err)
			}
			defer tp.Close()
			nstest.Must(t, nstest.In(ns, "ip", "addr", "add", "10.77.0.1/24", "dev", "btap0")...)
			c, err := net.Dial("udp4", "10.77.0.2:9")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			bufs, sizes := [][]byte{make([]byte, Headroom+2048)}, []int{0}
			for {
				n, err := tp.Read(bufs, sizes, Headroom)
				if err != nil {
					t.Fatalf("busy %v: Read: %v", busy, err)
				}
				if n == 1 && ether.Frame(bufs[0][Headroom:Headroom+sizes[0]]).EtherType() == ether.TypeARP {
					break // the ARP request for 10.77.0.2
				}
			}
			frame := make([]byte, Headroom+60)
			copy(frame[Headroom:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06})
			if n, err := tp.Write([][]byte{frame}, Headroom); n != 1 || err != nil {
				t.Fatalf("busy %v: Write = %d, %v; want 1 frame taken", busy, n, err)
			}
			done := make(chan error)
			go func() {
				for {
					if _, err := tp.Read(bufs, sizes, Headroom); err != nil {
						done <- err
						return
					}
				}
			}()
			time.Sleep(20 * time.Millisecond) // most likely waiting by now; either way it must wake
			if err := tp.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, net.ErrClosed) {
				t.Fatalf("busy %v: Read after Close returned %v, want net.ErrClosed", busy, err)
			}
		})
	}
}
