package daemon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/snoop"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a log sink the daemon's goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testConfig is a valid configuration on the simulated fabric over
// underlay, its Settings as the command line would have them.
func testConfig(underlay string) Config {
	c := Config{
		Name: "eibt0", Fabric: FabricSim, Underlay: underlay, IBMTU: 2048, TAPMTU: 9000, Queues: 1, Offload: true,
		Learn: shim.LearnAuto, MaxVIFs: 1024, MaxNeighbours: 65536, VIFIdle: 5 * time.Minute, Partitions: map[uint16]ipoib.PKey{},
		Multicast: snoop.Timers{QueryInterval: 125 * time.Second, QueryResponseInterval: 10 * time.Second, LastMemberQueryInterval: time.Second, Robustness: 2},
		DHCP:      shim.DHCPBroadcast, DHCPClientID: arpndp.ClientIDMAC,
	}
	c.Settings = map[string]string{"vif-idle": c.VIFIdle.String(), "vlan-pkey": "", "ib-mtu": "2048"}
	return c
}

// underlayNS makes a namespace with a veth pair, ula and ulb, up with
// MTU 9000: ula is the simulated fabric's underlay.
func underlayNS(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("dmn%d", os.Getpid()%100000)
	nstest.Add(t, ns)
	nstest.Must(t, "ip", "link", "add", "ula", "netns", ns, "type", "veth", "peer", "name", "ulb", "netns", ns)
	for _, l := range []string{"ula", "ulb"} {
		nstest.Must(t, nstest.In(ns, "ip", "link", "set", l, "mtu", "9000", "up")...)
	}
	return ns
}

// stopped ends a Run or RunHost by cancel and asserts it returns nil
// within 10 s.
func stopped(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return 10 s after its context ended")
	}
}

// TestRunInProcess starts the daemon with Run on the simulated fabric
// over a veth in a namespace, with a real TAP there. It drives it
// through its control socket with the typed client. The daemon answers
// show port with the configuration, declares and removes a VIF, and
// refuses a bad MAC with the daemon's message.
//
// A SIGHUP (on Config.Signals) applies a reload that adds a VLAN (show
// port lists its partition) and changes vif-idle (logged). A reload that
// does not validate changes nothing: not the VLANs, vif-idle or the log
// level it also changes. A reload of the running settings then finds no
// change.
//
// Ending the context stops it: Run returns nil, the TAP and the socket
// are gone, and no goroutine is left (goleak).
//
// Run is called on a thread in the namespace, so the TAP, the fabric's
// sockets and the metrics listener are made there. The daemon's later
// goroutines run on other threads of the test process, which are not in
// it. What they look up by interface name afterwards is not what the
// binary sees, and is not checked here: that is the TAP's operational
// state, which only times the queries after a carrier change.
func TestRunInProcess(t *testing.T) {
	nstest.Require(t, "sysctl")
	defer goleak.VerifyNone(t)
	ns := underlayNS(t)
	// The TAP comes without IPv6, so the host's own router and MLD
	// messages make no VIF: the test's is the only one.
	nstest.Must(t, nstest.In(ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")...)

	var logs syncBuffer
	cfg := testConfig("ula")
	cfg.CtlDir = t.TempDir()
	cfg.Level = new(slog.LevelVar)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: cfg.Level}))
	reloads := make(chan Config, 2)
	cfg.Reload = func() (Config, error) { return <-reloads, nil }
	sig := make(chan os.Signal, 1)
	cfg.Signals = sig

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- nstest.DoErr(ns, func() error { return Run(ctx, cfg) }) }()

	c := ctl.Client{Path: ctl.Path(cfg.CtlDir, cfg.Name)}
	var port ctl.Port
	testutil.WaitFor(t, "control socket", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run ended at start: %v\n%s", err, logs.String())
		default:
		}
		var err error
		port, err = c.ShowPort()
		return err == nil
	})
	if port.Name != "eibt0" || port.Backend != "sim" || port.Device != "ula" || port.IBMTU != 2048 || port.IPoIBMTU != 2044 ||
		len(port.Partitions) != 1 || port.Partitions[0] != (ctl.Partition{VLAN: 0, PKey: "0xffff"}) || !strings.HasPrefix(port.GID, "fe80::") {
		t.Errorf("show port: %+v", port)
	}
	if out := nstest.Must(t, nstest.In(ns, "ip", "-o", "link", "show", "eibt0")...); !strings.Contains(out, "mtu 9000") {
		t.Errorf("TAP: %s", out)
	}

	const mac = "02:00:00:00:cc:01"
	if err := c.AddVIF(ctl.VIFRequest{MAC: mac, VLAN: 0}); err != nil {
		t.Fatal(err)
	}
	vifs, err := c.ShowVIFs()
	if err != nil || len(vifs) != 1 || vifs[0].MAC != mac || vifs[0].Origin != "declared" || vifs[0].PKey != "0xffff" || vifs[0].TxPackets != 0 {
		t.Fatalf("show vifs after vif-add: %+v, %v", vifs, err)
	}
	if err := c.DelVIF(ctl.VIFRequest{MAC: mac}); err != nil {
		t.Fatal(err)
	}
	if vifs, err := c.ShowVIFs(); err != nil || len(vifs) != 0 {
		t.Fatalf("show vifs after vif-del: %+v, %v", vifs, err)
	}
	if err := c.AddVIF(ctl.VIFRequest{MAC: "zz"}); err == nil || !strings.HasPrefix(err.Error(), `MAC "zz"`) {
		t.Errorf("vif-add zz: %v", err)
	}
	if st, err := c.ShowStats(); err != nil || st["vifs_created"] != 1 || st["vifs_removed"] != 1 {
		t.Errorf("show stats: vifs_created %d, vifs_removed %d, %v", st["vifs_created"], st["vifs_removed"], err)
	}

	// A reload: VLAN 10 added live, vif-idle changed, ib-mtu logged as
	// needing a restart.
	next := testConfig("ula")
	next.VIFIdle, next.IBMTU, next.Partitions = 2*time.Second, 4096, map[uint16]ipoib.PKey{10: 0x800a}
	next.Settings = maps.Clone(next.Settings)
	next.Settings["vif-idle"], next.Settings["vlan-pkey"], next.Settings["ib-mtu"] = "2s", "10=0x800a", "4096"
	reloads <- next
	sig <- syscall.SIGHUP
	testutil.WaitFor(t, "partition of VLAN 10", func() bool {
		p, err := c.ShowPort()
		return err == nil && len(p.Partitions) == 2 && p.Partitions[1] == ctl.Partition{VLAN: 10, PKey: "0x800a"}
	})
	for _, l := range []string{`msg="config reloaded" key=vif-idle old=5m0s new=2s`, `msg="config reloaded" key=vlan-pkey old="" new="10=0x800a"`,
		`msg="config change needs a restart" key=ib-mtu running=2048 new=4096`} {
		testutil.WaitFor(t, l, func() bool { return strings.Contains(logs.String(), l) })
	}
	// One that does not validate changes nothing, though it changes
	// live keys too: a VLAN added, vif-idle and the log level.
	bad := next
	bad.IBMTU, bad.VIFIdle, bad.Partitions = 1000, 7*time.Second, map[uint16]ipoib.PKey{10: 0x800a, 20: 0x8014}
	bad.Level = new(slog.LevelVar)
	bad.Level.Set(slog.LevelError)
	bad.Settings = maps.Clone(next.Settings)
	bad.Settings["ib-mtu"], bad.Settings["vif-idle"], bad.Settings["vlan-pkey"], bad.Settings["log-level"] = "1000", "7s", "10=0x800a,20=0x8014", "error"
	reloads <- bad
	sig <- syscall.SIGHUP
	testutil.WaitFor(t, "refused reload", func() bool {
		return strings.Contains(logs.String(), `msg="config reload failed; running on unchanged" err="--ib-mtu 1000: want 2048 or 4096"`)
	})
	if p, err := c.ShowPort(); err != nil || len(p.Partitions) != 2 || p.Partitions[1] != (ctl.Partition{VLAN: 10, PKey: "0x800a"}) {
		t.Errorf("show port after the refused reload: %+v, %v", p, err)
	}
	if l := cfg.Level.Level(); l != slog.LevelInfo {
		t.Errorf("log level %v after the refused reload, want INFO", l)
	}
	// The running settings are still next's (but its ib-mtu, which
	// needs a restart): reloading them changes nothing, where a key the
	// refused reload had taken would be reloaded back, and logged.
	running := next
	running.IBMTU = 2048
	running.Settings = maps.Clone(next.Settings)
	running.Settings["ib-mtu"] = "2048"
	reloads <- running
	sig <- syscall.SIGHUP
	testutil.WaitFor(t, "the reload of the running settings", func() bool {
		return strings.Contains(logs.String(), `msg="config reloaded: no changes"`)
	})
	if n := strings.Count(logs.String(), `msg="config reloaded" `); n != 2 {
		t.Errorf("%d keys reloaded in all, want 2 (vif-idle and vlan-pkey, once):\n%s", n, logs.String())
	}

	stopped(t, cancel, done)
	if out, err := nstest.Run(nstest.In(ns, "ip", "link", "show", "eibt0")...); err == nil {
		t.Errorf("the TAP outlived Run: %s", out)
	}
	if _, err := os.Stat(filepath.Join(cfg.CtlDir, "eibt0.sock")); !os.IsNotExist(err) {
		t.Errorf("control socket after Run: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, `msg=stopped tap_removed=eibt0`) {
		t.Errorf("no stop in the log:\n%s", l)
	}
}

// TestRunHostInProcess runs "eipoibd host" with RunHost in a namespace:
// its TUN device appears with the IPoIB MTU, SIGUSR1 and SIGUSR2 (on
// HostConfig.Signals) log the neighbour table and the counters, and
// ending the context removes the device and leaves no goroutine.
func TestRunHostInProcess(t *testing.T) {
	nstest.Require(t)
	defer goleak.VerifyNone(t)
	ns := underlayNS(t)
	var logs syncBuffer
	sig := make(chan os.Signal, 1)
	cfg := HostConfig{Name: "ibt0", Underlay: "ula", IBMTU: 2048, PKey: 0xffff, MaxNeighbours: 16,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Signals: sig}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- nstest.DoErr(ns, func() error { return RunHost(ctx, cfg) }) }()
	testutil.WaitFor(t, "started", func() bool { return strings.Contains(logs.String(), "msg=started tun=ibt0") })
	if out := nstest.Must(t, nstest.In(ns, "ip", "-o", "link", "show", "ibt0")...); !strings.Contains(out, "mtu 2044") {
		t.Errorf("TUN: %s", out)
	}
	sig <- syscall.SIGUSR1
	testutil.WaitFor(t, "neighbour table", func() bool { return strings.Contains(logs.String(), `msg="neighbours\n`) })
	sig <- syscall.SIGUSR2
	testutil.WaitFor(t, "counters", func() bool { return strings.Contains(logs.String(), "msg=counters") })
	stopped(t, cancel, done)
	if out, err := nstest.Run(nstest.In(ns, "ip", "link", "show", "ibt0")...); err == nil {
		t.Errorf("the TUN outlived RunHost: %s", out)
	}
	if l := logs.String(); !strings.Contains(l, "msg=stopped tun_removed=ibt0") {
		t.Errorf("no stop in the log:\n%s", l)
	}
}
