package tap

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestPersist: a persistent TAP whose queues are kept open (as systemd's
// file descriptor store keeps them) is taken over by the next Create
// with no carrier change. That holds also when the next run wants more
// queues and no offloads. Once every queue closes, it stays (same
// ifindex) and is reopened, without the last run's TSO when offloads are
// off. A second taker while it is held, and a non-persistent Create, are
// refused with a reason. Kept queues handed to a non-persistent Create
// make way for a new TAP; while another holder keeps the old one, they
// are refused with a reason after 2 s.
func TestPersist(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("tapp%d", os.Getpid())
	nstest.Add(t, ns)
	const name = "ptap0"
	carrier := func() (changes int, up bool) {
		t.Helper()
		out := nstest.Must(t, nstest.In(ns, "cat", "/sys/class/net/"+name+"/carrier_changes", "/sys/class/net/"+name+"/carrier")...)
		f := strings.Fields(out)
		n, err := strconv.Atoi(f[0])
		if err != nil || len(f) != 2 {
			t.Fatalf("carrier_changes and carrier: %q", out)
		}
		return n, f[1] == "1"
	}
	// tso reports the TAP's TCP segmentation offload: on, the kernel
	// hands it super-frames (which only a vnet header describes).
	tso := func() bool {
		t.Helper()
		out := nstest.Must(t, nstest.In(ns, "ethtool", "-k", name)...)
		on := strings.Contains(out, "\ntcp-segmentation-offload: on")
		if !on && !strings.Contains(out, "\ntcp-segmentation-offload: off") {
			t.Fatalf("ethtool -k %s: no tcp-segmentation-offload line\n%s", name, out)
		}
		return on
	}
	nstest.Do(t, ns, func() {
		link := func() *netlink.Tuntap {
			t.Helper()
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			return l.(*netlink.Tuntap)
		}
		create := func(cfg Config, want Start) *TAP {
			t.Helper()
			tp, err := Create(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if tp.Start() != want {
				t.Fatalf("Create: %s, want %s", tp.Start(), want)
			}
			return tp
		}
		// keep duplicates the queues' descriptors, as a store keeps them,
		// and closes the TAP.
		keep := func(tp *TAP) []int {
			t.Helper()
			var fds []int
			for _, f := range tp.Files() {
				rc, _ := f.SyscallConn()
				rc.Control(func(fd uintptr) {
					d, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 3)
					if err != nil {
						t.Fatal(err)
					}
					fds = append(fds, d)
				})
			}
			tp.Close()
			return fds
		}
		cfg := Config{Name: name, MTU: 1500, Persist: true, Queues: 2, Offload: true}
		tp := create(cfg, Created)
		idx := link().Index
		if !tso() {
			t.Fatal("offloads asked for, but the new TAP has no TSO")
		}
		changes, up := carrier()
		if !up {
			t.Fatal("no carrier on a new TAP")
		}

		kept := keep(tp)
		c := cfg
		c.FDs = kept
		tp = create(c, Kept)
		if got, up := carrier(); got != changes || !up {
			t.Fatalf("taking kept queues over: carrier changes %d → %d, up %v", changes, got, up)
		}
		if n, err := tp.Write([][]byte{make([]byte, vnetHdrLen+60)}, vnetHdrLen); n != 1 || err != nil {
			t.Fatalf("a frame written on a kept queue: %d taken, %v", n, err)
		}
		// More queues, then fewer; offloads off, which the kernel does
		// not change while a queue is open: the TAP keeps them.
		for _, n := range []int{3, 1} {
			c = cfg
			c.Queues, c.Offload, c.FDs = n, false, keep(tp)
			tp = create(c, Kept)
			l := link()
			if got, up := carrier(); got != changes || !up || l.Index != idx || l.Queues != n || len(tp.Files()) != n || l.Flags&netlink.TUNTAP_VNET_HDR == 0 || !tp.Offload() {
				t.Fatalf("%d queues: carrier changes %d → %d, up %v; ifindex %d → %d; %d queues (%d files), flags %#x, offload %v",
					n, changes, got, up, idx, l.Index, l.Queues, len(tp.Files()), l.Flags, tp.Offload())
			}
		}
		tp.Close()
		if _, up := carrier(); up || link().Index != idx {
			t.Fatalf("with every queue closed: carrier %v, ifindex %d → %d; want the TAP kept without carrier", up, idx, link().Index)
		}

		c = cfg
		c.Offload = false
		tp = create(c, Reopened)
		if l := link(); l.Index != idx || l.Flags&netlink.TUNTAP_VNET_HDR != 0 || tp.Offload() || tso() {
			t.Fatalf("reopened without offloads: ifindex %d → %d, flags %#x, offload %v, TSO %v", idx, l.Index, l.Flags, tp.Offload(), tso())
		}
		if _, err := Create(cfg); err == nil || !strings.Contains(err.Error(), "ptap0 is in use: 2 queues attached by another process") {
			t.Fatalf("a second taker: %v", err)
		}
		tp.Close()
		if _, err := Create(Config{Name: name, MTU: 1500}); err == nil || !strings.Contains(err.Error(), `"ip link del ptap0" removes it`) {
			t.Fatalf("a non-persistent Create over the persistent TAP: %v", err)
		}

		tp = create(Config{Name: name, MTU: 1500, FDs: keep(create(cfg, Reopened))}, Created)
		if link().Index == idx {
			t.Fatal("kept queues handed to a non-persistent Create: the old TAP stayed")
		}
		other := create(Config{Name: "ptap1", MTU: 1500, Persist: true}, Created)
		if _, err := Create(Config{Name: name, MTU: 1500, Persist: true, FDs: keep(other)}); err == nil || !strings.Contains(err.Error(), "is a queue of ptap1, not of ptap0") {
			t.Fatalf("another TAP's queue taken: %v", err)
		}
		tp.Close()
		if _, err := netlink.LinkByName(name); err == nil {
			t.Fatal("the non-persistent TAP outlived its queues")
		}

		// Kept queues let go while another holder keeps the TAP: the
		// non-persistent Create says so after its wait, and the TAP
		// goes with that holder's queues.
		fds := keep(create(cfg, Created))
		holder, err := unix.FcntlInt(uintptr(fds[0]), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Create(Config{Name: name, MTU: 1500, FDs: fds}); err == nil || !strings.Contains(err.Error(), "ptap0 still exists 2s after its kept queues were let go") {
			t.Fatalf("kept queues let go while another holder keeps the TAP: %v", err)
		}
		unix.Close(holder)
		if _, err := netlink.LinkByName(name); err == nil {
			t.Fatal("the TAP outlived its last holder after its kept queues were let go")
		}
	})
}
