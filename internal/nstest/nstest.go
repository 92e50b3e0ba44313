// Package nstest holds the helpers of eipoibd's tests that need network
// namespaces: the root/tool check that skips locally and fails in CI
// (EIPOIB_REQUIRE_NETNS=1), namespace creation, running Go code or
// commands inside a namespace, a byte-exact TCP transfer between two,
// and a bpffs of a test's own.
package nstest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/nsenter"
)

func init() {
	// Debian keeps ip and arping in the sbin directories, which a
	// non-login PATH may lack.
	os.Setenv("PATH", os.Getenv("PATH")+":/usr/sbin:/sbin")
}

// Require skips the test (locally) or fails it (EIPOIB_REQUIRE_NETNS=1)
// without root or one of the tools.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		need(t, missing)
	}
}

// RequireRoot skips the test (locally) or fails it
// (EIPOIB_REQUIRE_NETNS=1) when not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		need(t, []string{"root"})
	}
}

// need skips or fails the test for what is missing.
func need(t testing.TB, missing []string) {
	t.Helper()
	msg := "needs " + strings.Join(missing, ", ") + " (make test installs the tools; run as root)"
	if os.Getenv("EIPOIB_REQUIRE_NETNS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Run runs a command and returns its combined output.
func Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	return string(out), err
}

// Must runs a command and fails the test on error.
func Must(t testing.TB, args ...string) string {
	t.Helper()
	out, err := Run(args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// In prefixes a command to run in namespace ns.
func In(ns string, args ...string) []string {
	return append([]string{"ip", "netns", "exec", ns}, args...)
}

// Add creates namespace ns with loopback up and deletes it at cleanup.
// Links made in it (or moved into it) later run no IPv6 duplicate
// address detection. Their link-local address is usable at once, as a
// real IB port's GID is, instead of 1-2 s later; the simulated fabric
// waits for it to stop being tentative. A kernel booted with
// ipv6.disable=1 has no /proc/sys/net/ipv6, nor DAD to turn off.
func Add(t testing.TB, ns string) {
	t.Helper()
	Must(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { Run("ip", "netns", "delete", ns) })
	Must(t, In(ns, "ip", "link", "set", "lo", "up")...)
	Do(t, ns, func() { // /proc/sys/net is the calling thread's namespace's
		if _, err := os.Stat("/proc/sys/net/ipv6"); errors.Is(err, os.ErrNotExist) {
			return
		}
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/dad_transmits", []byte("0"), 0); err != nil {
			t.Fatalf("DAD off in %s: %v", ns, err)
		}
	})
}

// Do runs fn with the calling thread in namespace ns, for sockets and
// netlink calls made by the test itself.
func Do(t testing.TB, ns string, fn func()) {
	t.Helper()
	if err := DoErr(ns, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// DoErr is Do for a goroutine other than the test's, which must not call
// t.Fatal: it runs fn on a thread in namespace ns and returns fn's error,
// or why it could not enter ns.
func DoErr(ns string, fn func() error) error { return nsenter.Do(ns, fn) }
