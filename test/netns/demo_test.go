package netns

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemo runs make demo's script. Every check passes: guests on two
// hypervisors and the native host talk. It leaves nothing behind: no
// namespace of its own, no process whose command line names it (the
// daemons' do), nothing in its temporary directory (TMPDIR is the
// test's) and no /run/eipoibd/PREFIX-* directory. The prefix of its
// namespaces is this run's own (EIPOIB_DEMO_PREFIX), so that another test
// suite's TestDemo on the machine does not meet it. The demo ignores
// EIPOIB_NETNS_OFFLOAD: make test runs it once.
func TestDemo(t *testing.T) {
	require(t, "ping", "iperf3")
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../../scripts/demo.sh")
	prefix := fmt.Sprintf("ed%d", os.Getpid())
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "EIPOIB_DEMO_PREFIX="+prefix)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("== summary: 10 checks passed, 0 failed")) {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	if ns := sh(t, "ip", "netns", "list"); strings.Contains(ns, prefix+"-") {
		t.Errorf("namespaces left:\n%s", ns)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(prefix+"-")) {
			t.Errorf("process left: %s: %s", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
	if left, _ := filepath.Glob("/run/eipoibd/" + prefix + "-*"); len(left) != 0 {
		t.Errorf("left in /run/eipoibd: %v", left)
	}
}
