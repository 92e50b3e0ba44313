package netns

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// vmInitramfsRoot is where the VM's initramfs mounts the host's root
// (test/vm/init). The agent and its scripts run chrooted there, but the
// kernel's own helpers see the initramfs. (kernel/umh.c
// call_usermodehelper_exec_async: kernel threads share init's fs;
// init/main.c rest_init starts pid 1, which never chroots, with
// CLONE_FS.) So a path handed to the kernel, such as kernel.modprobe for
// request_module, gets this prefix.
const vmInitramfsRoot = "/newroot"

// modprobeRefuse is the guest kernel's modprobe (kernel.modprobe) while
// the link kind "ipoib" must stay unknown: it records what the kernel
// asked for and loads nothing.
const modprobeRefuse = `#!/bin/sh
echo "$*" >>` + vmInitramfsRoot + vmWork + `/modprobe.log
exit 1
`

// invalidLengthWarning is validate_nla's warning (lib/nlattr.c) about
// IFLA_IPOIB_PKEY (type 1) of another length than 2, from the test binary
// (its comm: the first 15 bytes of its name).
var invalidLengthWarning = regexp.MustCompile(`(?m)netlink: 'kernelfabric\.te': attribute type 1 has an invalid length\.$`)

// TestIPoIBNetlinkVM: the kernel backend's IPoIB child request meets
// ib_ipoib's real netlink parser in the QEMU guest (Debian's 6.1
// kernel). The guest runs internal/fabric/kernelfabric's
// TestChildRequestKernelAnswers. That test sends the request through the
// backend's own builder (newChildRequest, AddChild), and variants cut
// from its bytes, with a veth as the parent; the guest has no InfiniBand
// device, as rxe is RoCE. It checks each answer against rtnetlink.c,
// nlattr.c and ipoib_netlink.c. It runs twice, in one boot:
//   - without ib_ipoib, the kernel's modprobe a script that loads
//     nothing. Every request is answered EOPNOTSUPP "Unknown device
//     type", and the kernel did try to load "rtnl-link-ipoib" first.
//   - with ib_ipoib loaded. The request as sent gets ENODEV: the policy
//     and the kind accepted its attributes, and ipoib_new_child_link
//     refused the Ethernet parent. No IFLA_LINK gets EINVAL. A 1-byte
//     P_Key gets ERANGE "Attribute failed policy validation". A 4-byte
//     P_Key and an unknown IFLA_IPOIB_* type get ENODEV (liberal
//     parsing). The kernel warns in its log about each wrong-length
//     P_Key (two), and asks modprobe for nothing more.
func TestIPoIBNetlinkVM(t *testing.T) {
	require(t)
	_, ns := vmNamespace(t)
	v := startVM(t, ns, "ubr")
	v.buildTest(t, "kernelfabric.test", "github.com/eipoib/eipoibd/internal/fabric/kernelfabric")
	if err := os.WriteFile(v.file("modprobe-refuse"), []byte(modprobeRefuse), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(kind string) string {
		t.Helper()
		out, err := v.run(t, "EIPOIB_IPOIB_KIND="+kind+" ./kernelfabric.test -test.run '^TestChildRequestKernelAnswers$' -test.count=1 -test.v", time.Minute)
		if err != nil || !strings.Contains(out, "--- PASS: TestChildRequestKernelAnswers") {
			t.Fatalf("ib_ipoib %s: TestChildRequestKernelAnswers in the VM did not pass (%v):\n%s", kind, err, out)
		}
		t.Logf("ib_ipoib %s:\n%s", kind, out)
		return out
	}
	// What the kernel asked its modprobe for, one line a request.
	modprobeLog := func() []string {
		b, err := os.ReadFile(v.file("modprobe.log"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return strings.FieldsFunc(string(b), func(r rune) bool { return r == '\n' })
	}

	// Without ib_ipoib, and none to be had.
	v.must(t, "echo "+vmInitramfsRoot+vmWork+"/modprobe-refuse >/proc/sys/kernel/modprobe")
	run("absent")
	asked := modprobeLog()
	ok := len(asked) > 0
	for _, a := range asked {
		ok = ok && a == "-q -- rtnl-link-ipoib" // call_modprobe's arguments
	}
	if !ok {
		t.Errorf("the kernel's modprobe was asked for %q, want rtnl-link-ipoib (request_module in __rtnl_newlink), at least once", asked)
	}
	if out := v.must(t, "test -e /sys/module/ib_ipoib && echo loaded || echo absent"); strings.TrimSpace(out) != "absent" {
		t.Errorf("ib_ipoib after the first run: %s, want absent", out)
	}

	// With ib_ipoib.
	v.must(t, "modprobe -d /run/kernel ib_ipoib")
	run("present")
	if again := modprobeLog(); len(again) != len(asked) {
		t.Errorf("with ib_ipoib loaded the kernel's modprobe was asked for more: %q, want nothing after %q", again, asked)
	}
	if n := len(invalidLengthWarning.FindAllString(v.must(t, "dmesg"), -1)); n != 2 {
		t.Errorf("the kernel logged %d warnings about IFLA_IPOIB_PKEY's length, want 2 (the 1-byte and the 4-byte P_Key)", n)
	}
}

// TestKernelBackendNoIPv6VM: the kernel backend starts on a host booted
// with ipv6.disable=1, where no /proc/sys/net/ipv6/conf/DEV exists for a
// child's IPv6 settings (net/ipv6/af_inet6.c inet6_init returns before
// addrconf_init). The QEMU guest boots with that argument and runs
// internal/fabric/kernelfabric's TestStartWithoutIPv6 against its real /proc: New
// and AllocQP succeed, the children's IPv4 settings read back from /proc,
// no IPv6 one is tried (counted), and IPv4 crosses both ways. The guest
// has no IPoIB (no HCA): the children's links are veths of the same names,
// so that their /proc/sys/net/ipv4/conf directories are real.
func TestKernelBackendNoIPv6VM(t *testing.T) {
	require(t)
	_, ns := vmNamespace(t)
	v := startVMWith(t, ns, "ubr", "ipv6.disable=1")
	v.buildTest(t, "kernelfabric.test", "github.com/eipoib/eipoibd/internal/fabric/kernelfabric")
	if out := v.must(t, "cat /proc/cmdline; test -e /proc/sys/net/ipv6 && echo ipv6 present || echo ipv6 absent"); !strings.Contains(out, "ipv6 absent") {
		t.Fatalf("the guest booted with ipv6.disable=1 has /proc/sys/net/ipv6:\n%s", out)
	}
	out, err := v.run(t, "EIPOIB_NO_IPV6=1 ./kernelfabric.test -test.run '^TestStartWithoutIPv6$' -test.count=1 -test.v", time.Minute)
	if err != nil || !strings.Contains(out, "--- PASS: TestStartWithoutIPv6/kernel") {
		t.Fatalf("TestStartWithoutIPv6 in the VM without IPv6 did not pass its kernel case (%v):\n%s", err, out)
	}
	t.Logf("in the VM:\n%s", out)
}
