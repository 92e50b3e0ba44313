package tap

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestOperUp: a real TAP, up, is operationally up once its carrier is on
// and the kernel has acted on it, and not while the carrier is off. This
// holds in the caller's network namespace: the TAP's is one of its own
// here, while /sys stays the initial namespace's.
func TestOperUp(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("tapo%d", os.Getpid())
	nstest.Add(t, ns)
	nstest.Do(t, ns, func() {
		tp, err := Create(Config{Name: "otap0", MTU: 1500})
		if err != nil {
			t.Fatal(err)
		}
		defer tp.Close()
		l, err := netlink.LinkByName("otap0")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		wait := func(want bool) {
			t.Helper()
			// linkwatch acts on a carrier change within a second
			// (net/core/link_watch.c linkwatch_schedule_work).
			for deadline := time.Now().Add(5 * time.Second); tp.OperUp() != want; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("OperUp stayed %v", !want)
				}
			}
		}
		if !tp.OperUp() {
			t.Fatal("a new TAP, up, with its carrier on from the start (state UNKNOWN): not operationally up")
		}
		for _, up := range []bool{false, true, false, true} {
			if err := tp.SetCarrier(up); err != nil {
				t.Fatal(err)
			}
			wait(up)
		}
	})
}
