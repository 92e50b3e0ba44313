package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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

// TestProbeUnitCapabilities: the systemd unit's capabilities are enough
// for the fast path. This test binary, run again as root bounded to them
// (setpriv from util-linux), passes TestProbe: both programs and their
// maps load, and tcx is tried. Bounded to them without CAP_BPF, the probe
// fails to load the programs, so the bound is real and CAP_BPF is what
// the unit grants for it. It runs here (6.18) and in the QEMU guest's
// 6.1 (TestFastPathVM), whose verifier also needs the unit's CAP_PERFMON.
func TestProbeUnitCapabilities(t *testing.T) {
	nstest.RequireRoot(t)
	setpriv, caps := unitBound(t)
	if !slices.Contains(caps, "CAP_BPF") {
		t.Fatalf("the unit's CapabilityBoundingSet %v has no CAP_BPF", caps)
	}
	probe := func(caps []string) (string, error) {
		out, err := exec.Command(setpriv, bounded(caps, os.Args[0], "-test.run", "^TestProbe$", "-test.count", "1", "-test.v")...).CombinedOutput()
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

// unitBound returns setpriv's path (from util-linux; the test fails
// without it) and the capabilities the systemd unit bounds eipoibd to
// (CapabilityBoundingSet), what a test needs to run a child bounded to
// them.
func unitBound(t *testing.T) (setpriv string, caps []string) {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux): %v", err)
	}
	b, err := os.ReadFile("../../../../dist/systemd/eipoibd@.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapabilityBoundingSet="); ok {
			return setpriv, strings.Fields(v)
		}
	}
	t.Fatal("the unit has no CapabilityBoundingSet")
	return "", nil
}

// bounded is setpriv's arguments to run cmd as root with capabilities
// caps (CAP_ names) and no others: bounding set, and no inheritable or
// ambient ones that a runner could leak past it.
func bounded(caps []string, cmd ...string) []string {
	set := "-all"
	for _, c := range caps {
		set += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return append([]string{"--bounding-set", set, "--inh-caps", "-all", "--ambient-caps", "-all", "--"}, cmd...)
}

// TestMain runs the takeover a TestTakeoverUnitCapabilities child is
// started for (takeoverEnv set), and the tests otherwise.
func TestMain(m *testing.M) {
	if spec := os.Getenv(takeoverEnv); spec != "" {
		if err := takeover(spec); err != nil {
			fmt.Fprintln(os.Stderr, "takeover:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// takeoverEnv names "PIN-DIR,TAP-IFINDEX" for a takeover child.
const takeoverEnv = "EIPOIB_FASTPATH_TAKEOVER"

// takeover attaches with pins at the TAP, as a --persist start does,
// taking over what an earlier one pinned, and lets go (Release) as a
// --persist stop does. What AttachWith logs goes to stdout.
func takeover(spec string) error {
	dir, ifindex, ok := strings.Cut(spec, ",")
	tap, err := strconv.Atoi(ifindex)
	if !ok || err != nil {
		return fmt.Errorf("bad %s %q", takeoverEnv, spec)
	}
	a, err := AttachWith(tap, Options{Pin: dir, Log: slog.New(slog.NewTextHandler(os.Stdout, nil))})
	if err != nil {
		return err
	}
	return a.Release()
}

// TestTakeoverUnitCapabilities: a --persist restart under the systemd
// unit's capabilities takes over what the last run pinned without
// calling it foreign. Two children, each the test binary run as root
// bounded to the unit's capabilities in the TAP's namespace, attach
// with pins and let go in turn; the second takes over the first's and
// logs nothing. The tags it compares are read without CAP_SYS_ADMIN,
// which BPF_PROG_GET_FD_BY_ID wants (bpf_prog_get_fd_by_id,
// kernel/bpf/syscall.c): a program ID it cannot open has an unknown
// tag, not another one.
func TestTakeoverUnitCapabilities(t *testing.T) {
	nstest.Require(t)
	setpriv, caps := unitBound(t)
	h := hooks(t)[0]
	dir := filepath.Join(nstest.BPFFS(t), "fputap")
	devices(t, "fpu", h, func(tap, _ int) {
		ns := fmt.Sprintf("fpu%s%d", h, os.Getpid())
		t.Cleanup(func() { RemovePins(dir, tap) })
		for i := range 2 {
			cmd := exec.Command("ip", append([]string{"netns", "exec", ns, setpriv}, bounded(caps, os.Args[0])...)...)
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d", takeoverEnv, dir, tap))
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Fatalf("start %d under the unit's %v (%s): %v; want no error and nothing logged, got:\n%s", i+1, caps, h, err, out)
			}
		}
	})
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
