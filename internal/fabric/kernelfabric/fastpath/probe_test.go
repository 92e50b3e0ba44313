package fastpath

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestProbe: this kernel (6.18, tcx and every helper the programs call)
// passes the probe, as root.
func TestProbe(t *testing.T) {
	nstest.RequireRoot(t)
	if err := Probe(); err != nil {
		var ve *ebpf.VerifierError // the whole log, not its last line
		if errors.As(err, &ve) {
			t.Fatalf("Probe on this kernel: %v\n%+v", err, ve)
		}
		t.Fatalf("Probe on this kernel: %v", err)
	}
}

// unitCaps returns the capabilities the systemd unit bounds eipoibd to
// (CapabilityBoundingSet).
func unitCaps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../../../dist/systemd/eipoibd@.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapabilityBoundingSet="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatal("the unit has no CapabilityBoundingSet")
	return nil
}

// TestProbeUnitCapabilities: the systemd unit's capabilities are enough
// for the fast path. This test binary, run again as root bounded to them
// (setpriv from util-linux), passes TestProbe: both programs and their
// maps load, and tcx is tried. Bounded to them without CAP_BPF, the probe
// fails to load the programs, so the bound is real and CAP_BPF is what
// the unit grants for it. It runs here (6.18) and in the QEMU guest's
// 6.1 (TestFastPathVM), whose verifier also needs the unit's CAP_PERFMON.
func TestProbeUnitCapabilities(t *testing.T) {
	nstest.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux): %v", err)
	}
	caps := unitCaps(t)
	if !slices.Contains(caps, "CAP_BPF") {
		t.Fatalf("the unit's CapabilityBoundingSet %v has no CAP_BPF", caps)
	}
	probe := func(caps []string) (string, error) {
		set := "-all"
		for _, c := range caps {
			set += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
		}
		out, err := exec.Command(setpriv, "--bounding-set", set, "--",
			os.Args[0], "-test.run", "^TestProbe$", "-test.count", "1", "-test.v").CombinedOutput()
		return string(out), err
	}
	if out, err := probe(caps); err != nil || !strings.Contains(out, "--- PASS: TestProbe") {
		t.Fatalf("the probe bounded to the unit's %v: %v\n%s", caps, err, out)
	}
	without := slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == "CAP_BPF" })
	if out, err := probe(without); err == nil || !strings.Contains(out, "does not load") {
		t.Fatalf("the probe bounded to %v (no CAP_BPF): %v, want the programs refused\n%s", without, err, out)
	}
}

// TestMode: each mode parses back from its name, and nothing else parses.
func TestMode(t *testing.T) {
	for _, m := range []Mode{Off, Auto, On} {
		got, ok := ParseMode(m.String())
		if !ok || got != m || !m.Valid() {
			t.Errorf("ParseMode(%q) = %v, %v; Valid %v", m.String(), got, ok, m.Valid())
		}
	}
	for _, s := range []string{"", "ON", "true", "mode(3)"} {
		if m, ok := ParseMode(s); ok {
			t.Errorf("ParseMode(%q) = %v, want refused", s, m)
		}
	}
	if m := Mode(3); m.Valid() || m.String() != "Mode(3)" {
		t.Errorf("Mode(3): Valid %v, String %q", m.Valid(), m.String())
	}
}
