package netns

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFastPathVM runs the fast path's own tests
// (internal/fabric/kernelfabric/fastpath, every one of them, root ones
// required) on Debian's kernel in the QEMU guest, 6.1: older than tcx
// (6.6), with an older verifier than this machine's 6.18. There:
//   - both programs load and TestProbe passes, above the floor of 5.8
//     (docs/kernel-backend.md);
//   - the probe passes bounded to the systemd unit's capabilities and
//     fails without CAP_BPF (TestProbeUnitCapabilities), and a restart's
//     takeover under them logs nothing (TestTakeoverUnitCapabilities);
//   - AttachWith, not told to, falls back to clsact filters, the pins
//     included (TestAttach, TestAttachPinned, TestRemovePins), and the
//     TX and RX programs carry live traffic as clsact filters
//     (TestTXLive, TestRXLive, which attach them directly).
//     EIPOIB_EXPECT_NO_TCX=1 fails those tests should tcx attach, so
//     the run cannot test tcx instead.
func TestFastPathVM(t *testing.T) {
	require(t, "bridge")
	_, ns := vmNamespace(t)
	v := startVM(t, ns, "ubr")
	v.buildTest(t, "fastpath.test", "github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath")
	// TestProbeUnitCapabilities reads the unit at
	// ../../../../dist/systemd/ from where the test runs.
	unit, err := os.ReadFile("../../dist/systemd/eipoibd@.service")
	if err != nil {
		t.Fatal(err)
	}
	dir := v.file("dist/systemd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "eipoibd@.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := v.run(t, "uname -r && modprobe -d /run/kernel -a sch_ingress cls_bpf vxlan && mkdir -p p/k/f/x && cd p/k/f/x && "+
		"EIPOIB_REQUIRE_NETNS=1 EIPOIB_EXPECT_NO_TCX=1 ../../../../fastpath.test -test.count=1 -test.v", 10*time.Minute)
	if err != nil || !strings.Contains(out, "\nPASS\n") {
		t.Fatalf("the fast path's tests in the VM did not pass (%v):\n%s", err, out)
	}
	if !strings.HasPrefix(out, "6.1.") {
		t.Errorf("the VM runs kernel %q, want Debian's 6.1 (older than tcx)", strings.SplitN(out, "\n", 2)[0])
	}
	for _, name := range []string{"TestProbe", "TestProbeUnitCapabilities", "TestTakeoverUnitCapabilities", "TestAttach/clsact",
		"TestAttachPinned/clsact", "TestAttachPinnedReplaced", "TestAttachWithFailsClean", "TestRemovePins",
		"TestTXLive/clsact", "TestRXLive/clsact", "TestTXVerdicts", "TestRXVerdicts"} {
		if !strings.Contains(out, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass in the VM", name)
		}
	}
	if strings.Contains(out, "--- SKIP") || regexp.MustCompile(`/tcx[ /]`).MatchString(out) {
		t.Errorf("the VM's run skipped a test or ran a tcx one:\n%s", out)
	}
	t.Logf("in the VM: %s", strings.SplitN(out, "\n", 2)[0])
}
