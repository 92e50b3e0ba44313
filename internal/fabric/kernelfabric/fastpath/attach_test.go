package fastpath

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// attachedIDs are the IDs of the programs attached with tcx at ifindex.
func attachedIDs(t *testing.T, ifindex int, at ebpf.AttachType) []ebpf.ProgramID {
	t.Helper()
	r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		t.Fatalf("query tcx of ifindex %d: %v", ifindex, err)
	}
	var ids []ebpf.ProgramID
	for _, p := range r.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

// TestAttach: Attach puts TX at the TAP's egress, PutChild RX at a
// child's ingress (once, however often it is called), DeleteChild takes
// it off, a delete of what is not there succeeds, and Close detaches
// everything. A TUN stands for the child.
func TestAttach(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("fpat%d", os.Getpid())
	nstest.Add(t, ns)
	nstest.Do(t, ns, func() {
		openTun(t, "fpattap", unix.IFF_TAP)
		openTun(t, "fpatch", unix.IFF_TUN)
		tap, err := net.InterfaceByName("fpattap")
		if err != nil {
			t.Fatal(err)
		}
		ch, err := net.InterfaceByName("fpatch")
		if err != nil {
			t.Fatal(err)
		}
		a, err := Attach(tap.Index)
		if err != nil {
			t.Fatal(err)
		}
		txInfo, _ := a.TX.Program.Info()
		rxInfo, _ := a.RX.Program.Info()
		txID, _ := txInfo.ID()
		rxID, _ := rxInfo.ID()
		if got := attachedIDs(t, tap.Index, ebpf.AttachTCXEgress); len(got) != 1 || got[0] != txID {
			t.Fatalf("TAP egress runs %v, want the TX program %d", got, txID)
		}
		g := RXGuest{MAC: guestMAC, TAP: uint32(tap.Index), MTU: 1500}
		for range 2 {
			if err := a.PutChild(ch.Index, g); err != nil {
				t.Fatal(err)
			}
		}
		if got := attachedIDs(t, ch.Index, ebpf.AttachTCXIngress); len(got) != 1 || got[0] != rxID {
			t.Fatalf("child ingress runs %v, want the RX program %d once", got, rxID)
		}
		var v rxGuest
		if err := a.RX.Guests.Lookup(uint32(ch.Index), &v); err != nil || v.TAP != uint32(tap.Index) {
			t.Fatalf("RX guest of the child: %+v, %v", v, err)
		}
		if err := a.DeleteChild(ch.Index); err != nil {
			t.Fatal(err)
		}
		if got := attachedIDs(t, ch.Index, ebpf.AttachTCXIngress); len(got) != 0 {
			t.Fatalf("child ingress still runs %v after DeleteChild", got)
		}
		for _, err := range []error{a.DeleteChild(ch.Index), a.DeleteGuest(guestMAC), a.DeleteREMAC(remac), a.DeleteSender(1, netip.MustParseAddr("10.0.0.1"))} {
			if err != nil {
				t.Errorf("delete of an absent entry: %v", err)
			}
		}
		if err := a.PutChild(ch.Index, g); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if got := append(attachedIDs(t, tap.Index, ebpf.AttachTCXEgress), attachedIDs(t, ch.Index, ebpf.AttachTCXIngress)...); len(got) != 0 {
			t.Fatalf("after Close still attached: %v", got)
		}
	})
}
