package kernelfabric_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestChildQueuesBeforeFix: a parent with several receive queues (mlx5's
// enhanced IPoIB) on a kernel without commit dbc94a0fb817 is refused at
// start with a message naming the commit. That holds whether the kernel
// makes the child with one queue (before Linux 6.2) or refuses it
// (EINVAL: mlx5i_pkey_dev_init's check). No child is left behind. With
// the fix the child gets the parent's queues and the port starts. A
// parent with one queue (the other IPoIB drivers) starts on either
// kernel.
func TestChildQueuesBeforeFix(t *testing.T) {
	for _, c := range []struct {
		name              string
		parentQueues      int
		noFix, refuse, ok bool
	}{
		{"one queue a child", 8, true, false, false},
		{"refused by mlx5", 8, true, true, false},
		{"with the fix", 8, false, true, true},
		{"one-queue parent", 1, true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
			k.SetRxQueues(c.parentQueues)
			k.NoQueueFix, k.RefuseFewerQueues = c.noFix, c.refuse
			p, err := kf.New(kf.Config{Kernel: k, Parent: "ib0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), "dbc94a0fb817") {
				t.Errorf("error %q does not name the kernel fix", err)
			}
			if !c.refuse && !errors.Is(err, kf.ErrChildQueues) {
				t.Errorf("error %q, want ErrChildQueues", err)
			}
			if ch := children(k); len(ch) != 0 {
				t.Errorf("children left: %v", ch)
			}
		})
	}
}

// TestLinkRxQueues: Link.RxQueues is IFLA_NUM_RX_QUEUES as the real
// kernel reports it (a veth made with 4; rtnl_fill_ifinfo), and the
// fake's children get their parent's (ipoib_get_max_num_queues, with
// commit dbc94a0fb817).
func TestLinkRxQueues(t *testing.T) {
	t.Run("kernel", func(t *testing.T) {
		nstest.Require(t)
		ns := fmt.Sprintf("kfrxq%d", os.Getpid())
		nstest.Add(t, ns)
		var l kf.Link
		nstest.Do(t, ns, func() {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rq0", NumRxQueues: 4}, PeerName: "rq1"}); err != nil {
				t.Fatal(err)
			}
			var err error
			if l, err = (kf.System{}).LinkByName("rq0"); err != nil {
				t.Fatal(err)
			}
		})
		if l.RxQueues != 4 {
			t.Fatalf("RxQueues %d, want 4", l.RxQueues)
		}
	})
	t.Run("fake", func(t *testing.T) {
		k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
		k.SetRxQueues(6)
		if err := k.AddChild(kf.ChildSpec{Name: "ib0.e1", Parent: 1, PKey: 0xffff}); err != nil {
			t.Fatal(err)
		}
		if l, _ := k.LinkByName("ib0.e1"); l.RxQueues != 6 {
			t.Fatalf("child RxQueues %d, want 6", l.RxQueues)
		}
	})
}

// TestParentDown: the parent set administratively down is the port going
// down. (Its children receive through its receive queues on mlx5, and
// ipoib_stop takes them down with it.) Events says so, and a VIF's
// packets are dropped as child_no_carrier. Up again, ipoib_open brings
// the children up and they join again: the port is up and the VIF sends.
func TestParentDown(t *testing.T) {
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	a, b := open(t, ka), open(t, kb)
	ch := a.Events()
	eventtest.Expect(t, ch, eventtest.Link(true), eventtest.MTU(0xffff, 2048))
	qa, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	qb, err := b.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	dst := ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b"))
	ka.SetParentUp(false)
	eventtest.Expect(t, ch, eventtest.Link(false))
	testutil.WaitFor(t, "the port down", func() bool { return a.IsDown() })
	if n := unicast(a, qa, 0xffff, dst, 100); n != 0 || a.Counters().Drops[ipoib.DropNoCarrier.String()] != 1 {
		t.Fatalf("parent down: sent %d, drops %v", n, a.Counters().Drops)
	}
	ka.SetParentUp(true)
	eventtest.Expect(t, ch, eventtest.Link(true))
	testutil.WaitFor(t, "a packet sent with the parent up", func() bool { return unicast(a, qa, 0xffff, dst, 100) == 1 })
	if n := readOne(t, b); n != 104 {
		t.Fatalf("received %d bytes, want 104", n)
	}
}

// TestSendDropReasons: a packet the kernel refuses because the child is
// down (ENETDOWN, which TestConformance's "device down" case shows
// packet_snd returning on this kernel and the fake) is dropped as
// child_no_carrier, as when the carrier check saw it first; any other
// refusal is send_error. TestParentDown met the first case when the
// parent went down between the carrier check and the send.
func TestSendDropReasons(t *testing.T) {
	for _, c := range []struct {
		err  error
		want ipoib.Drop
	}{
		{unix.ENETDOWN, ipoib.DropNoCarrier},
		{fmt.Errorf("sendmmsg: %w", unix.ENETDOWN), ipoib.DropNoCarrier},
		{unix.ENXIO, ipoib.DropSendError},
		{unix.EMSGSIZE, ipoib.DropSendError},
		{nil, ipoib.DropSendError}, // the kernel took none and said nothing
	} {
		if got := kf.SendDrop(c.err); got != c.want {
			t.Errorf("a send refused with %v: dropped as %v, want %v", c.err, got, c.want)
		}
	}
}
