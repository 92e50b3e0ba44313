package tap

import (
	"fmt"
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestTxQueueLen: Create sets the TAP's txqueuelen to TxQueueLen, as the
// kernel reports it back, on a new TAP and when a persistent one is
// taken over with another; 0 leaves the length the TAP had.
func TestTxQueueLen(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("tapq%d", os.Getpid())
	nstest.Add(t, ns)
	nstest.Do(t, ns, func() {
		qlen := func() int {
			t.Helper()
			l, err := netlink.LinkByName("qtap0")
			if err != nil {
				t.Fatal(err)
			}
			return l.Attrs().TxQLen
		}
		tp, err := Create(Config{Name: "qtap0", MTU: 1500, TxQueueLen: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if got := qlen(); got != 8192 {
			t.Fatalf("new TAP: txqueuelen %d, want 8192", got)
		}
		tp.Close()
		tp, err = Create(Config{Name: "qtap0", MTU: 1500, Persist: true})
		if err != nil {
			t.Fatal(err)
		}
		before := qlen()
		tp.Close()
		if tp, err = Create(Config{Name: "qtap0", MTU: 1500, Persist: true, TxQueueLen: 300}); err != nil {
			t.Fatal(err)
		}
		if got := qlen(); got != 300 {
			t.Fatalf("persistent TAP taken over: txqueuelen %d, want 300", got)
		}
		tp.Close()
		if tp, err = Create(Config{Name: "qtap0", MTU: 1500, Persist: true}); err != nil {
			t.Fatal(err)
		}
		defer tp.Close() // the persistent TAP goes with the namespace
		if got := qlen(); got != 300 || before != 1000 {
			t.Fatalf("TxQueueLen 0: txqueuelen %d, want the 300 it had (a new TAP's %d, want netlink's 1000)", got, before)
		}
	})
}
