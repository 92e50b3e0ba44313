package kernelfabric_test

// The backend on a kernel booted with ipv6.disable=1: net/ipv6/af_inet6.c
// inet6_init returns before ipv6_sysctl_register and addrconf_init, so no
// /proc/sys/net/ipv6/conf/DEV exists for the children's IPv6 settings.
// The fake models it (fakekernel.Kernel.NoIPv6); test/netns's
// TestKernelBackendNoIPv6VM boots the QEMU guest with ipv6.disable=1 and
// runs this test there against the real /proc.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// noIPv6Env, set to 1, says the kernel under the test was booted with
// ipv6.disable=1: TestStartWithoutIPv6's "kernel" case then runs (and
// fails if the kernel has IPv6 after all); unset, it is skipped.
const noIPv6Env = "EIPOIB_NO_IPV6"

// procKernel is a fake host whose sysctls are the running kernel's
// /proc/sys, in network namespace ns. Each child the fake creates gets a
// real link of the same name there: a veth, whose
// /proc/sys/net/*/conf/DEV directories are what a child's would be. So
// the backend's settings meet the real /proc. The kernel has no IPoIB
// without an HCA.
type procKernel struct {
	*fakekernel.Kernel
	ns  string
	seq int
}

func (k *procKernel) in(fn func() error) error { return nstest.DoErr(k.ns, fn) }

func (k *procKernel) HasIPv6() (ok bool, err error) {
	err = k.in(func() (err error) { ok, err = kf.System{}.HasIPv6(); return err })
	return ok, err
}

func (k *procKernel) WriteSysctl(path, value string) error {
	return k.in(func() error { return kf.System{}.WriteSysctl(path, value) })
}

func (k *procKernel) AddChild(c kf.ChildSpec) error {
	if err := k.Kernel.AddChild(c); err != nil {
		return err
	}
	k.seq++
	peer := fmt.Sprintf("pk%d", k.seq)
	return k.in(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: c.Name}, PeerName: peer})
	})
}

func (k *procKernel) DelLink(index int) error {
	var name string
	if links, err := k.Kernel.Links(); err == nil {
		for _, l := range links {
			if l.Index == index {
				name = l.Name
			}
		}
	}
	if err := k.Kernel.DelLink(index); err != nil {
		return err
	}
	return k.in(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
}

// TestStartWithoutIPv6: on a kernel without IPv6 the backend starts (the
// default partition's group child is made in New), and a VIF child is
// made. Both get the IPv4 host-off settings and no IPv6 one, each
// counted as StatIPv6Absent. IPv4 crosses from the VIF to another host's
// and back with its exact size.
func TestStartWithoutIPv6(t *testing.T) {
	t.Run("fake", func(t *testing.T) {
		f := fakekernel.NewFabric()
		ka := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044)
		ka.NoIPv6 = true
		startWithoutIPv6(t, ka, f.NewHost(testutil.GID("fe80::b"), "ib0", 2044), ka.Sysctl)
	})
	t.Run("kernel", func(t *testing.T) {
		if os.Getenv(noIPv6Env) != "1" {
			t.Skipf("%s=1 not set: the kernel was not booted with ipv6.disable=1 (test/netns TestKernelBackendNoIPv6VM runs this case)", noIPv6Env)
		}
		nstest.Require(t)
		if _, err := os.Stat("/proc/sys/net/ipv6"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s=1, but /proc/sys/net/ipv6: %v, want no such directory", noIPv6Env, err)
		}
		ns := fmt.Sprintf("kfnov6%d", os.Getpid())
		nstest.Add(t, ns)
		f := fakekernel.NewFabric()
		ka := &procKernel{Kernel: f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), ns: ns}
		startWithoutIPv6(t, ka, f.NewHost(testutil.GID("fe80::b"), "ib0", 2044), func(path string) string {
			var b []byte
			nstest.Do(t, ns, func() {
				var err error
				if b, err = os.ReadFile("/proc/sys/" + path); err != nil {
					t.Fatal(err)
				}
			})
			return strings.TrimSpace(string(b))
		})
	})
}

// startWithoutIPv6 is TestStartWithoutIPv6 on host ka (a kernel without
// IPv6, whose /proc/sys sysctl reads) and host kb.
func startWithoutIPv6(t *testing.T, ka kf.Kernel, kb *fakekernel.Kernel, sysctl func(path string) string) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := kf.New(kf.Config{Kernel: ka, Parent: "ib0", Logger: log})
	if err != nil {
		t.Fatalf("New on a kernel without IPv6: %v", err)
	}
	defer a.Close()
	b := open(t, kb)
	qa, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatalf("AllocQP on a kernel without IPv6: %v", err)
	}
	qb, err := b.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := a.Counters().Stats[kf.StatIPv6Absent]; n != 2 {
		t.Errorf("%s = %d, want 2 (the group child and the VIF child)", kf.StatIPv6Absent, n)
	}
	var names []string
	links, _ := ka.Links()
	for _, l := range links {
		if l.ParentIndex != 0 {
			names = append(names, l.Name)
		}
	}
	if len(names) != 2 {
		t.Fatalf("children %q, want 2", names)
	}
	for _, name := range names {
		for _, kv := range kf.HostOffSysctls(name, false) {
			if got := sysctl(kv[0]); got != kv[1] {
				t.Errorf("%s = %q, want %q", kv[0], got, kv[1])
			}
		}
	}
	if n := unicast(a, qa, 0xffff, ipoib.MakeHwAddr(0, qb, testutil.GID("fe80::b")), 100); n != 1 {
		t.Fatalf("IPv4 from the VIF: %d sent (%v)", n, a.Counters().Drops)
	}
	if n := readOne(t, b); n != 104 {
		t.Fatalf("IPv4 received: %d bytes, want 104", n)
	}
	if n := unicast(b, qb, 0xffff, ipoib.MakeHwAddr(0, qa, testutil.GID("fe80::a")), 200); n != 1 {
		t.Fatalf("IPv4 to the VIF: %d sent (%v)", n, b.Counters().Drops)
	}
	if n := readOne(t, a); n != 204 {
		t.Fatalf("IPv4 received by the VIF: %d bytes, want 204", n)
	}
}
