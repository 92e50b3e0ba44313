package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// TestToggleDown: SIGUSR1's toggle reaches the simulated port through
// the faultport that --fault puts in front of it (down, then up again,
// each logged once), and a port without a toggle (one on a real link)
// ignores it.
func TestToggleDown(t *testing.T) {
	nstest.Require(t)
	ns := underlayNS(t)
	c := Config{Fabric: FabricSim, Underlay: "ula", IBMTU: 2048, Queues: 1, Faults: faultport.Faults{Loss: 0.1}}
	var fab fabric
	if err := nstest.DoErr(ns, func() (err error) { fab, err = openFabric(&c, nil); return err }); err != nil {
		t.Fatal(err)
	}
	defer fab.port.Close()
	fp, ok := fab.port.(*faultport.Port)
	if !ok {
		t.Fatalf("--fault: the port is a %T, want a *faultport.Port", fab.port)
	}
	sp := fp.Unwrap().(*simfabric.Port)
	if fab.device != "ula" {
		t.Errorf("device %q, want the underlay ula", fab.device)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, want := range []string{"down=true", "down=false"} {
		toggleDown(fab, log)
		if sp.IsDown() != (want == "down=true") || strings.Count(logs.String(), `msg="simulated port state toggled" `+want+"\n") != 1 {
			t.Fatalf("after a toggle the port is down=%t; the log:\n%s", sp.IsDown(), logs.String())
		}
	}
	toggleDown(fabric{port: fab.port, device: "ib0"}, log)
	if sp.IsDown() || strings.Count(logs.String(), `msg="SIGUSR1 ignored: only the simulated port can be toggled"`) != 1 {
		t.Errorf("a port without a toggle: down=%t; the log:\n%s", sp.IsDown(), logs.String())
	}
}

// TestBackends: the registry holds the three backends in the order the
// version lists them, and only verbs needs a build tag.
func TestBackends(t *testing.T) {
	var got []string
	for _, b := range Backends() {
		got = append(got, b.Name+"/"+b.Tag)
	}
	if want := "sim/ kernel/ verbs/verbs"; strings.Join(got, " ") != want {
		t.Errorf("Backends: %q, want %q", got, want)
	}
}

// TestUseFastPath: off never probes; auto uses the fast path when the
// probe passes and otherwise runs without it, saying why once in the
// log; on refuses to start with the probe's reason in one line.
func TestUseFastPath(t *testing.T) {
	missing := errors.New("the kernel has no tcx (Linux 6.6)")
	for _, c := range []struct {
		mode     fastpath.Mode
		probeErr error
		use      bool
		wantErr  string
		wantLogs int
	}{
		{fastpath.Off, missing, false, "", 0},
		{fastpath.Auto, nil, true, "", 0},
		{fastpath.Auto, missing, false, "", 1},
		{fastpath.On, nil, true, "", 0},
		{fastpath.On, missing, false, "--fast-path on: this kernel cannot run it: the kernel has no tcx (Linux 6.6)", 0},
	} {
		var logs syncBuffer
		probes := 0
		use, err := useFastPath(c.mode, func() error { probes++; return c.probeErr }, slog.New(slog.NewTextHandler(&logs, nil)))
		if use != c.use || (err == nil) != (c.wantErr == "") || err != nil && err.Error() != c.wantErr {
			t.Errorf("%v, probe %v: use %v, error %v; want %v, %q", c.mode, c.probeErr, use, err, c.use, c.wantErr)
		}
		if wantProbes := map[bool]int{true: 0, false: 1}[c.mode == fastpath.Off]; probes != wantProbes {
			t.Errorf("%v: %d probes, want %d", c.mode, probes, wantProbes)
		}
		line := `msg="fast path off: this kernel cannot run it; frames cross user space" fast_path=auto reason="the kernel has no tcx (Linux 6.6)"`
		if n := strings.Count(logs.String(), line); n != c.wantLogs || strings.Count(logs.String(), "\n") != c.wantLogs {
			t.Errorf("%v, probe %v: the log holds the reason %d times, want %d:\n%s", c.mode, c.probeErr, n, c.wantLogs, logs.String())
		}
	}
}

// TestStartFastPath: a kernel port not running the fast path (off, or
// a probe that failed under auto) gets nothing attached and no TAP is
// looked up; one running it whose programs cannot attach (here: no such
// TAP) runs without it under auto, saying why once, and refuses to start
// under on.
func TestStartFastPath(t *testing.T) {
	kp, err := kernelfabric.New(kernelfabric.Config{Kernel: fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044), Parent: "ib0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Close()
	for _, c := range []struct {
		fast     bool
		mode     fastpath.Mode
		wantErr  string
		wantLogs int
	}{
		{false, fastpath.Off, "", 0},
		{false, fastpath.Auto, "", 0},
		{true, fastpath.Auto, "", 1},
		{true, fastpath.On, "--fast-path on: TAP fpnosuchtap: route ip+net: no such network interface", 0},
	} {
		var logs syncBuffer
		fp, closeFP, err := startFastPath(fabric{port: kp, device: "ib0", fastPath: c.fast}, &Config{FastPath: c.mode, Name: "fpnosuchtap"}, slog.New(slog.NewTextHandler(&logs, nil)))
		if fp != nil || (err == nil) != (c.wantErr == "") || err != nil && err.Error() != c.wantErr {
			t.Errorf("fast %v %v: %v, %v; want no fast path and error %q", c.fast, c.mode, fp, err, c.wantErr)
		}
		if err == nil {
			closeFP()
		}
		if n := strings.Count(logs.String(), `msg="fast path off: its programs did not attach; frames cross user space"`); n != c.wantLogs || strings.Count(logs.String(), "\n") != c.wantLogs {
			t.Errorf("fast %v %v: the log holds the reason %d times, want %d:\n%s", c.fast, c.mode, n, c.wantLogs, logs.String())
		}
	}
}

// TestStartFastPathPersist: under --persist the fast path is pinned in
// --bpf-dir/NAME and its closing leaves it there, the TX program still
// attached to the TAP; the next start under --persist takes it over (one
// program at the TAP's egress, not two); a start without --persist
// removes the pins, and its closing leaves the bpffs as it was mounted
// and nothing at the TAP's egress. (A private bpffs, a real TAP, the
// fake kernel's port: --fast-path needs IPoIB for the rest.)
func TestStartFastPathPersist(t *testing.T) {
	nstest.Require(t, "ip")
	kp, err := kernelfabric.New(kernelfabric.Config{Kernel: fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044), Parent: "ib0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Close()
	fs := nstest.BPFFS(t)
	fresh := nstest.Names(t, fs)
	ns := fmt.Sprintf("dfpp%d", os.Getpid())
	nstest.Add(t, ns)
	nstest.Must(t, nstest.In(ns, "ip", "tuntap", "add", "dev", "dfpptap", "mode", "tap")...)
	c := Config{FastPath: fastpath.On, Name: "dfpptap", Persist: true, BPFDir: fs}
	nstest.Do(t, ns, func() {
		tap, err := net.InterfaceByName("dfpptap")
		if err != nil {
			t.Fatal(err)
		}
		egress := func() int {
			t.Helper()
			r, err := link.QueryPrograms(link.QueryOptions{Target: tap.Index, Attach: ebpf.AttachTCXEgress})
			if err != nil {
				t.Fatal(err)
			}
			return len(r.Programs)
		}
		start := func(want string) {
			t.Helper()
			var logs syncBuffer
			fp, closeFP, err := startFastPath(fabric{port: kp, device: "ib0", fastPath: true}, &c, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil || fp == nil {
				t.Fatalf("persist %v: %v, %v", c.Persist, fp, err)
			}
			if !strings.Contains(logs.String(), want) {
				t.Fatalf("persist %v: log\n%s\nwant %q", c.Persist, logs.String(), want)
			}
			if n := egress(); n != 1 {
				t.Fatalf("persist %v: %d programs at the TAP's egress, want 1", c.Persist, n)
			}
			closeFP()
		}
		pinned := "pinned=" + filepath.Join(fs, "dfpptap")
		for range 2 {
			start(pinned)
			if got, want := nstest.Names(t, fs), slices.Sorted(slices.Values(append(slices.Clone(fresh), "dfpptap"))); !slices.Equal(got, want) {
				t.Fatalf("bpffs holds %v, want %v", got, want)
			}
			if n := egress(); n != 1 {
				t.Fatalf("after the persist closing: %d programs at the TAP's egress, want 1", n)
			}
		}
		c.Persist = false
		start("removed what a --persist run pinned")
		if got := nstest.Names(t, fs); !slices.Equal(got, fresh) {
			t.Fatalf("bpffs holds %v, want %v as mounted", got, fresh)
		}
		if n := egress(); n != 0 {
			t.Fatalf("after the closing without persist: %d programs at the TAP's egress, want 0", n)
		}
	})
}

// TestRunPersistFailedStart: a --persist start of the kernel backend
// that fails after the adoption (here its metrics address cannot be
// listened on) leaves the IPoIB children it adopted in place for the
// next start: the group child keeps its ifindex. The VIF child no saved
// guest claimed was deleted when the adoption ended, before the
// failure.
func TestRunPersistFailedStart(t *testing.T) {
	nstest.Require(t, "ip")
	ns := fmt.Sprintf("dpfs%d", os.Getpid()%100000)
	nstest.Add(t, ns)
	k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	for _, name := range []string{"ib0.mffff", "ib0.e1"} {
		if err := k.AddChild(kernelfabric.ChildSpec{Name: name, Parent: 1, PKey: 0xffff}); err != nil {
			t.Fatal(err)
		}
	}
	before := k.ChildIndexes()
	old := newKernel
	newKernel = func(*slog.Logger) (kernelfabric.Kernel, error) { return k, nil }
	defer func() { newKernel = old }()
	cfg := testConfig("")
	cfg.Fabric, cfg.IBDev, cfg.IBMTU, cfg.Persist, cfg.StateDir = FabricKernel, "ib0", DefaultIBMTU, true, t.TempDir()
	cfg.Metrics = "127.0.0.1:99999" // no such port: the listen fails
	err := nstest.DoErr(ns, func() error { return Run(context.Background(), cfg) })
	if err == nil || !strings.Contains(err.Error(), "99999") {
		t.Fatalf("Run: %v, want the metrics listen's failure", err)
	}
	if got := k.ChildIndexes(); len(got) != 1 || got["ib0.mffff"] != before["ib0.mffff"] {
		t.Fatalf("children after the failed start %v, want ib0.mffff alone, as before (%v)", got, before)
	}
}
