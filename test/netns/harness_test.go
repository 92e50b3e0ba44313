// Package netns holds eipoibd's end-to-end tests: real daemons, Linux
// bridges, guests in network namespaces and real tools (ping, arping,
// iperf3, tshark). They need root; with EIPOIB_REQUIRE_NETNS=1 (as CI
// sets) a missing prerequisite fails the tests instead of skipping them.
package netns

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/metrics"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/shim"
)

var (
	daemonBin string // built once by TestMain
	buildErr  error
	nsSeq     atomic.Int32
)

// ovsTools are what a topology with Open vSwitch needs besides ip. They
// are the daemons startOVS starts, and the clients the tests (ovs-vsctl,
// ovs-appctl) and eipoibd (ovs-vsctl, ovsdb-client: vswitch) run.
// ethtool turns off the checksum offload the userspace datapath cannot
// fill in.
var ovsTools = []string{"ovs-vsctl", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-appctl", "ovsdb-client", "ethtool"}

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "eipoibd-netns")
		if err == nil {
			daemonBin = filepath.Join(dir, "eipoibd")
			out, err := exec.Command("go", "build", "-o", daemonBin, "github.com/eipoib/eipoibd/cmd/eipoibd").CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("build eipoibd: %v\n%s", err, out)
			}
		} else {
			buildErr = err
		}
	}
	code := m.Run()
	if daemonBin != "" {
		os.RemoveAll(filepath.Dir(daemonBin)) // before os.Exit, which runs no deferred call
	}
	os.Exit(code)
}

// require checks root, ip and the tools given, and that the daemon was
// built. Each test needs only the tools it runs. The helpers that run a
// tool require it themselves (capture tcpdump, tshark tshark, iperf
// iperf3, …), so a test using one needs its tool without naming it.
// TestToolsRequired checks that every tool the tests name is required on
// the path that runs it. Under EIPOIB_REQUIRE_NETNS=1 (CI) a missing
// tool fails the test instead of skipping it.
func require(t *testing.T, tools ...string) {
	t.Helper()
	nstest.Require(t, tools...)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

var (
	nstestRequire = nstest.Require
	sh            = nstest.Must
	shErr         = nstest.Run
	in            = nstest.In
	nsDo          = nstest.Do
)

// stdout runs a command and returns its standard output only.
func stdout(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

type guest struct {
	ns, ip4, ip6 string
}

type hypervisor struct {
	name, ns, underlay string
	guests             []*guest
	cmd                *exec.Cmd
	logDir, logPath    string
	starts             int
	done               chan error
	extra              []string
	env                []string // more environment for the daemon
	// files are passed to the daemon as systemd passes its file
	// descriptor store back: descriptors 3 on, $LISTEN_FDS,
	// $LISTEN_FDNAMES (fdNames, one per file) and $LISTEN_PID.
	files      []*os.File
	fdNames    []string
	switchArgs []string // --bridge or --ovs-bridge and their arguments
	host       bool     // a native IPoIB host (eipoibd host, TUN ib0) instead
	// bin is the daemon's binary (daemonBin when empty), fabricArgs
	// its fabric's flags (--underlay UNDERLAY when nil).
	bin        string
	fabricArgs []string
}

type topo struct {
	t   *testing.T
	pfx string
	hvs []*hypervisor
}

// topoOpts shape a topology.
type topoOpts struct {
	n          int      // hypervisors
	guests     int      // per hypervisor (default and at least 2)
	viaBridge  bool     // underlay: a Linux bridge even for two hypervisors
	ovs        []bool   // per hypervisor: Open vSwitch instead of a Linux bridge
	tags       [][]int  // per hypervisor, per guest: OVS access VLAN (0: untagged)
	ovsTSO     bool     // OVS: other_config:userspace-tso-enable=true
	ovsTSOLate bool     // the same, set once the bridge and guests' ports run
	extra      []string // more eipoibd flags, for every hypervisor
}

// newTopo builds n hypervisors, each with a Linux bridge and two guests
// (10.77.0.HG/24, fd77::HG/64; newTopoOpts can add more), joined by an
// underlay: a veth pair for two hypervisors unless viaBridge, else a
// Linux bridge in its own namespace.
// The daemons are started before the guests get their addresses, as when
// guests boot on a running hypervisor.
func newTopo(t *testing.T, n int, viaBridge bool, extra ...string) *topo {
	return newTopoOpts(t, topoOpts{n: n, viaBridge: viaBridge, extra: extra})
}

func newTopoOpts(t *testing.T, o topoOpts) *topo {
	t.Helper()
	// Every topology test pings (ping, runPing), not all through a
	// helper with a t of its own; OVS, before any namespace is made.
	require(t, "ping")
	if slices.Contains(o.ovs, true) {
		require(t, ovsTools...)
	}
	tp := &topo{t: t, pfx: fmt.Sprintf("e%d%d", os.Getpid()%1000, nsSeq.Add(1))}
	var all []string
	var ovsDirs []string
	logDir := t.TempDir() // before the cleanup below, which reads the logs
	addNS := func(name string) string {
		ns := tp.pfx + name
		sh(t, "ip", "netns", "add", ns)
		all = append(all, ns)
		sh(t, in(ns, "ip", "link", "set", "lo", "up")...)
		return ns
	}
	t.Cleanup(func() {
		if t.Failed() {
			tp.dump()
		}
		for _, h := range tp.hvs {
			h.stop(t, false)
		}
		for _, dir := range ovsDirs {
			stopOVS(dir)
		}
		for _, ns := range all {
			shErr("ip", "netns", "delete", ns)
		}
	})
	for i := 1; i <= o.n; i++ {
		h := &hypervisor{name: fmt.Sprintf("h%d", i), underlay: fmt.Sprintf("ul%d", i), extra: o.extra, logDir: logDir}
		h.ns = addNS(h.name)
		tp.hvs = append(tp.hvs, h)
	}
	if o.n == 2 && !o.viaBridge {
		sh(t, "ip", "link", "add", "ul1", "netns", tp.hvs[0].ns, "type", "veth", "peer", "name", "ul2", "netns", tp.hvs[1].ns)
	} else {
		u := addNS("ul")
		sh(t, in(u, "ip", "link", "add", "ubr", "mtu", "9000", "type", "bridge")...)
		sh(t, in(u, "ip", "link", "set", "ubr", "up")...)
		for _, h := range tp.hvs {
			sh(t, "ip", "link", "add", h.underlay, "netns", h.ns, "type", "veth", "peer", "name", "p"+h.name, "netns", u)
			sh(t, in(u, "ip", "link", "set", "p"+h.name, "mtu", "9000", "master", "ubr", "up")...)
		}
	}
	for i, h := range tp.hvs {
		underlayUp(t, h.ns, h.underlay)
		useOVS := i < len(o.ovs) && o.ovs[i]
		var vsctl func(args ...string) string
		if useOVS {
			dir := startOVS(t, h.ns)
			ovsDirs = append(ovsDirs, dir)
			db := "unix:" + filepath.Join(dir, "db.sock")
			vsctl = func(args ...string) string {
				return sh(t, append([]string{"ovs-vsctl", "--timeout=10", "--db=" + db}, args...)...)
			}
			if o.ovsTSO {
				// Before any port: OVS reads it once (userspace_tso_init)
				// and gives each port's socket its vnet header then.
				vsctl("set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true")
			}
			vsctl("add-br", "obr", "--", "set", "bridge", "obr", "datapath_type=netdev")
			sh(t, in(h.ns, "ip", "link", "set", "obr", "up")...)
			h.switchArgs = []string{"--ovs-bridge", "obr", "--ovs-db", db}
		} else {
			sh(t, in(h.ns, "ip", "link", "add", "br0", "type", "bridge")...)
			sh(t, in(h.ns, "ip", "link", "set", "br0", "up")...)
			h.switchArgs = []string{"--bridge", "br0"}
		}
		for g := 1; g <= max(o.guests, 2); g++ {
			gs := &guest{ns: addNS(fmt.Sprintf("h%dg%d", i+1, g)), ip4: fmt.Sprintf("10.77.0.%d%d", i+1, g), ip6: fmt.Sprintf("fd77::%d%d", i+1, g)}
			vg := fmt.Sprintf("vg%d", g)
			sh(t, "ip", "link", "add", "eth0", "netns", gs.ns, "type", "veth", "peer", "name", vg, "netns", h.ns)
			if useOVS {
				args := []string{"add-port", "obr", vg}
				if i < len(o.tags) && g <= len(o.tags[i]) && o.tags[i][g-1] != 0 {
					args = append(args, fmt.Sprintf("tag=%d", o.tags[i][g-1]))
				}
				vsctl(args...)
				// The userspace datapath needs checksums filled in.
				sh(t, in(h.ns, "ethtool", "-K", vg, "tx", "off")...)
				sh(t, in(gs.ns, "ethtool", "-K", "eth0", "tx", "off")...)
				sh(t, in(h.ns, "ip", "link", "set", vg, "up")...)
			} else {
				sh(t, in(h.ns, "ip", "link", "set", vg, "master", "br0", "up")...)
			}
			sh(t, in(gs.ns, "ip", "link", "set", "eth0", "up")...)
			h.guests = append(h.guests, gs)
		}
		if useOVS && o.ovsTSOLate {
			vsctl("set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true")
			waitOVSTSO(t, ovsDirs[len(ovsDirs)-1])
		}
	}
	for _, h := range tp.hvs {
		h.start(t)
	}
	for _, h := range tp.hvs {
		for _, g := range h.guests {
			sh(t, in(g.ns, "ip", "addr", "add", g.ip4+"/24", "dev", "eth0")...)
			sh(t, in(g.ns, "ip", "addr", "add", g.ip6+"/64", "dev", "eth0", "nodad")...)
			// No default route: IPv4 multicast needs one of its own.
			sh(t, in(g.ns, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")...)
		}
	}
	return tp
}

// underlayUp brings a hypervisor's underlay up at MTU 9000 without
// duplicate address detection (noDAD).
func underlayUp(t *testing.T, ns, dev string) {
	t.Helper()
	noDAD(t, ns, dev)
	sh(t, in(ns, "ip", "link", "set", dev, "mtu", "9000", "up")...)
}

// noDAD turns duplicate address detection off on device dev of namespace
// ns before it comes up ("default": on the devices made there from now
// on). A simulated port's GID is its underlay's link-local address. The
// daemon waits to see it leave the tentative state (simfabric.Open), and
// no neighbour can also hold it (an IB port runs no DAD on its GID). DAD
// would only delay each daemon's start by 1-2 s (addrconf_dad_kick: a
// random delay up to rtr_solicit_delay, then dad_transmits solicitations
// retrans_time apart).
func noDAD(t *testing.T, ns, dev string) {
	t.Helper()
	var err error
	// /proc/sys/net is the calling thread's namespace's.
	nsDo(t, ns, func() { err = os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/dad_transmits", []byte("0"), 0) })
	if err != nil {
		t.Fatalf("DAD off on %s in %s: %v", dev, ns, err)
	}
}

// abridge keeps the first head and last tail lines of a long log.
func abridge(log string, head, tail int) string {
	lines := strings.Split(log, "\n")
	if len(lines) <= head+tail {
		return log
	}
	return strings.Join(lines[:head], "\n") + fmt.Sprintf("\n[… %d lines …]\n", len(lines)-head-tail) +
		strings.Join(lines[len(lines)-tail:], "\n")
}

// linkMAC returns the MAC address of interface dev in namespace ns.
func linkMAC(t *testing.T, ns, dev string) net.HardwareAddr {
	t.Helper()
	out := strings.TrimSpace(sh(t, in(ns, "cat", "/sys/class/net/"+dev+"/address")...))
	mac, err := net.ParseMAC(out)
	if err != nil {
		t.Fatalf("MAC of %s in %s: %v", dev, ns, err)
	}
	return mac
}

// mac returns the MAC address of the guest's eth0.
func (g *guest) mac(t *testing.T) net.HardwareAddr { return linkMAC(t, g.ns, "eth0") }

var vifCreated = regexp.MustCompile(`msg="VIF created" mac=(\S+) vlan=(\d+) pkey=\S+ qpn=0x([0-9a-f]+)`)

// vifMACs returns how many VIFs the daemon's log says it created for
// each source MAC (any VLAN).
func (h *hypervisor) vifMACs() map[string]int {
	n := map[string]int{}
	for _, m := range vifCreated.FindAllStringSubmatch(h.log(), -1) {
		n[m[1]]++
	}
	return n
}

// vifQPN returns the QPN the daemon's log says the VIF of (mac, vlan)
// got, or 0.
func (h *hypervisor) vifQPN(mac string, vlan int) uint32 {
	var qpn uint64
	for _, m := range vifCreated.FindAllStringSubmatch(h.log(), -1) {
		if m[1] == mac && m[2] == strconv.Itoa(vlan) {
			qpn, _ = strconv.ParseUint(m[3], 16, 32)
		}
	}
	return uint32(qpn)
}

// gid returns the hypervisor's port GID: its underlay's IPv6 link-local
// address.
func (h *hypervisor) gid(t *testing.T) netip.Addr {
	t.Helper()
	out := sh(t, in(h.ns, "ip", "-6", "-o", "addr", "show", "dev", h.underlay, "scope", "link")...)
	f := strings.Fields(out)
	if len(f) < 4 {
		t.Fatalf("no link-local address on %s: %s", h.underlay, out)
	}
	return netip.MustParsePrefix(f[3]).Addr()
}

// sniff returns the packets matching a tcpdump filter seen on a guest's
// eth0 for the duration of fn, one tcpdump line each.
func sniff(t *testing.T, g *guest, filter string, fn func()) []string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tcpdump.log")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stop := tcpdump(t, g.ns, f, "--immediate-mode", "-i", "eth0", "-n", "-l", "-e", filter)
	fn()
	// A window for packets still on their way when fn returns, which
	// the callers that want none to come need; what did come is then
	// all read (stop drains the capture).
	time.Sleep(300 * time.Millisecond)
	stop()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// tcpdump starts tcpdump with args in namespace ns, its standard output
// to w, and waits until it listens, so that nothing sent afterwards is
// missed. A tcpdump that exits first, on a bad filter say, fails the
// test instead of capturing nothing. tcpdump returns a function that
// ends the capture (SIGINT: tcpdump writes out what it holds and exits
// 0). That function fails the test unless tcpdump ran until then. The
// capture also ends at cleanup.
func tcpdump(t *testing.T, ns string, w io.Writer, args ...string) func() {
	t.Helper()
	nstestRequire(t, "tcpdump")
	cmd := exec.Command("ip", in(ns, append([]string{"tcpdump"}, args...)...)[1:]...)
	stderr := &listenWatch{ready: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = w, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-stderr.ready:
	case err := <-done:
		t.Fatalf("tcpdump %v in %s exited before it listened: %v\n%s", args, ns, err, stderr)
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("tcpdump %v in %s did not start listening:\n%s", args, ns, stderr)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			drainCapture(t, cmd.Process, stderr)
			cmd.Process.Signal(syscall.SIGINT)
			if err := <-done; err != nil {
				t.Errorf("tcpdump %v in %s: %v\n%s", args, ns, err, stderr)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

var tcpdumpStats = regexp.MustCompile(`(\d+) packets captured, (\d+) packets received by filter`)

// drainCapture waits until tcpdump has taken every packet the kernel
// passed its filter, so that stopping it loses none still in its
// socket's ring. On SIGUSR1 tcpdump writes its counts to its standard
// error and goes on. The capture is drained once the packets it captured
// are those the filter received. There is one count per packet on a
// veth, where the tests capture; on loopback the kernel counts each
// twice. The packets a test waits for have passed the interface by the
// time it stops the capture. It gives up after 20 s, leaving the test to
// find what is missing.
func drainCapture(t *testing.T, p *os.Process, stderr *listenWatch) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		seen := len(tcpdumpStats.FindAllString(stderr.String(), -1))
		if p.Signal(syscall.SIGUSR1) != nil {
			return
		}
		for len(tcpdumpStats.FindAllString(stderr.String(), -1)) == seen && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		all := tcpdumpStats.FindAllStringSubmatch(stderr.String(), -1)
		if len(all) > seen && all[len(all)-1][1] == all[len(all)-1][2] {
			return
		}
	}
}

// listenWatch keeps what tcpdump writes to its standard error and closes
// ready at its "listening on" line.
type listenWatch struct {
	mu    sync.Mutex
	b     []byte
	ready chan struct{}
}

func (w *listenWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := bytes.Contains(w.b, []byte("listening on"))
	w.b = append(w.b, p...)
	if !had && bytes.Contains(w.b, []byte("listening on")) {
		close(w.ready)
	}
	return len(p), nil
}

func (w *listenWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// tshark runs tshark with args (reading a capture file) and returns its
// standard output.
func tshark(t *testing.T, args ...string) string {
	t.Helper()
	nstestRequire(t, "tshark")
	return stdout(t, append([]string{"tshark"}, args...)...)
}

// startOVS starts a private ovsdb-server and ovs-vswitchd (userspace
// datapath) in namespace ns and returns their run directory.
func startOVS(t *testing.T, ns string) string {
	t.Helper()
	nstestRequire(t, ovsTools...)
	dir, err := os.MkdirTemp("", "eipoib-ovs")
	if err != nil {
		t.Fatal(err)
	}
	p := func(f string) string { return filepath.Join(dir, f) }
	sh(t, "ovsdb-tool", "create", p("conf.db"), "/usr/share/openvswitch/vswitch.ovsschema")
	sh(t, in(ns, "ovsdb-server", p("conf.db"), "--remote=punix:"+p("db.sock"), "--pidfile="+p("ovsdb-server.pid"),
		"--unixctl="+p("ovsdb-server.ctl"), "--log-file="+p("ovsdb-server.log"), "--detach")...)
	sh(t, "ovs-vsctl", "--timeout=10", "--db=unix:"+p("db.sock"), "--no-wait", "init")
	startVswitchd(t, ns, dir)
	return dir
}

// startVswitchd starts the ovs-vswitchd of startOVS's directory dir in
// namespace ns.
func startVswitchd(t *testing.T, ns, dir string) {
	t.Helper()
	nstestRequire(t, ovsTools...)
	p := func(f string) string { return filepath.Join(dir, f) }
	sh(t, in(ns, "env", "OVS_RUNDIR="+dir, "ovs-vswitchd", "unix:"+p("db.sock"), "--pidfile="+p("ovs-vswitchd.pid"),
		"--unixctl="+p("ovs-vswitchd.ctl"), "--log-file="+p("ovs-vswitchd.log"), "--detach")...)
}

// restartVswitchd stops the ovs-vswitchd of startOVS's directory dir
// and starts it again in namespace ns, with the same OVSDB.
func restartVswitchd(t *testing.T, ns, dir string) {
	t.Helper()
	nstestRequire(t, ovsTools...)
	pid, err := os.ReadFile(filepath.Join(dir, "ovs-vswitchd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	sh(t, "ovs-appctl", "-t", filepath.Join(dir, "ovs-vswitchd.ctl"), "exit")
	stat := "/proc/" + strings.TrimSpace(string(pid)) + "/stat"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// Gone, or a zombie its reaper has not waited for yet.
		if b, err := os.ReadFile(stat); err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ovs-vswitchd (pid %s) still runs 30 s after exit", strings.TrimSpace(string(pid)))
		}
	}
	startVswitchd(t, ns, dir)
}

// waitOVSTSO waits until the ovs-vswitchd of startOVS's directory dir
// has taken userspace-tso-enable (userspace_tso_init logs it).
func waitOVSTSO(t *testing.T, dir string) {
	t.Helper()
	const took = "Userspace TCP Segmentation Offloading support enabled"
	log := filepath.Join(dir, "ovs-vswitchd.log")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), took) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ovs-vswitchd never logged %q:\n%s", took, b)
		}
	}
}

// stopOVS stops the daemons of startOVS and removes their directory.
func stopOVS(dir string) {
	for _, d := range []string{"ovs-vswitchd", "ovsdb-server"} {
		shErr("ovs-appctl", "-t", filepath.Join(dir, d+".ctl"), "exit")
	}
	os.RemoveAll(dir)
}

// start runs eipoibd in the hypervisor and waits until it moves traffic.
func (h *hypervisor) start(t *testing.T) {
	t.Helper()
	h.starts++
	h.logPath = filepath.Join(h.logDir, fmt.Sprintf("%s-%d.log", h.name, h.starts))
	logf, err := os.Create(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Each daemon's control socket in a directory of its own: the
	// hypervisors' TAPs all have the same name.
	bin, fabricArgs := h.bin, h.fabricArgs
	if bin == "" {
		bin = daemonBin
	}
	if fabricArgs == nil {
		fabricArgs = []string{"--underlay", h.underlay}
	}
	args := append(append([]string{bin, "run"}, fabricArgs...), "--metrics", "127.0.0.1:9474", "--ctl-dir", h.ctlDir(), "--state-dir", h.ctlDir())
	args = append(args, h.switchArgs...)
	// EIPOIB_NETNS_OFFLOAD=false runs the whole suite with the TAP's
	// offloads off (make test runs it both ways); a test's own flags,
	// after it, win.
	if v := os.Getenv("EIPOIB_NETNS_OFFLOAD"); v != "" {
		args = append(args, "--offload="+v)
	}
	ready := "shim running"
	if h.host {
		args, ready = []string{daemonBin, "host", "--underlay", h.underlay}, "host running"
	}
	args = append(args, h.extra...)
	h.cmd = exec.Command("ip", in(h.ns, args...)[1:]...)
	h.cmd.Env = append(os.Environ(), h.env...)
	if len(h.files) > 0 {
		// The shell's PID is the daemon's: ip netns exec and the shell
		// exec it in place.
		h.cmd = exec.Command("sh", append([]string{"-c", `LISTEN_PID=$$ exec "$@"`, "sh"}, in(h.ns, args...)...)...)
		h.cmd.Env = append(os.Environ(), append(h.env, fmt.Sprintf("LISTEN_FDS=%d", len(h.files)), "LISTEN_FDNAMES="+strings.Join(h.fdNames, ":"))...)
		h.cmd.ExtraFiles = h.files
	}
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.done = make(chan error, 1)
	go func() { h.done <- h.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.log(), ready) {
		select {
		case err := <-h.done:
			t.Fatalf("eipoibd in %s exited: %v\n%s", h.name, err, h.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("eipoibd in %s did not start:\n%s", h.name, h.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ctlDir is the directory of the daemon's control socket.
func (h *hypervisor) ctlDir() string { return filepath.Join(h.logDir, h.name+"-ctl") }

// ctl runs an eipoibd client command against the daemon and returns its
// standard output.
func (h *hypervisor) ctl(t *testing.T, args ...string) string {
	t.Helper()
	return stdout(t, append(append([]string{daemonBin}, args...), "--ctl-dir", h.ctlDir())...)
}

func (h *hypervisor) log() string {
	b, _ := os.ReadFile(h.logPath)
	return string(b)
}

// terminate stops h's running daemon with SIGTERM and returns its exit
// error. One still running 10 s later is killed, and with check that
// fails t.
func (h *hypervisor) terminate(t *testing.T, check bool) error {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-h.done:
	case <-time.After(10 * time.Second):
		h.cmd.Process.Kill()
		err = <-h.done
		if check {
			t.Errorf("eipoibd in %s did not stop on SIGTERM", h.name)
		}
	}
	h.cmd = nil
	return err
}

// stop sends SIGTERM and waits; with check, it asserts a clean exit and
// that the TAP is gone.
func (h *hypervisor) stop(t *testing.T, check bool) {
	t.Helper()
	if h.cmd == nil {
		return
	}
	err := h.terminate(t, check)
	if !check {
		return
	}
	if err != nil {
		t.Errorf("eipoibd in %s exited with %v\n%s", h.name, err, h.log())
	}
	dev := "eib0"
	if h.host {
		dev = "ib0"
	}
	if out, err := shErr(in(h.ns, "ip", "link", "show", dev)...); err == nil {
		t.Errorf("%s still present after shutdown: %s", dev, out)
	}
}

// metrics reads the daemon's Prometheus counters.
func (h *hypervisor) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := h.readMetrics(t)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (h *hypervisor) readMetrics(t testing.TB) (map[string]float64, error) {
	var conn net.Conn
	var err error
	nsDo(t, h.ns, func() { conn, err = net.DialTimeout("tcp", "127.0.0.1:9474", 2*time.Second) })
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", h.name, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(conn, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", h.name, err)
	}
	defer resp.Body.Close()
	m := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && strings.HasPrefix(f[0], metrics.Prefix) {
			v, _ := strconv.ParseFloat(f[1], 64)
			m[snapshotName(f[0])] = v
		}
	}
	return m, nil
}

// snapshotName keys a series of the exposition by the name `eipoibd
// stats` gives it (eipoibd_drops_total{reason="runt"} is drop_runt);
// a series of no snapshot name (the per-VIF families) keeps its
// exposition text without the eipoibd_ prefix.
func snapshotName(series string) string {
	name, ls, _ := strings.Cut(series, "{")
	labels := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(ls, "}"), ",") {
		if k, v, ok := strings.Cut(l, "="); ok {
			labels[k] = strings.Trim(v, `"`)
		}
	}
	if sn, ok := metrics.SnapshotName(shim.Families(), name, labels); ok {
		return sn
	}
	return strings.TrimPrefix(series, metrics.Prefix)
}

// dump logs each running daemon's log and non-zero counters, for a
// failed test.
func (tp *topo) dump() {
	for _, h := range tp.hvs {
		if h.logPath == "" {
			continue
		}
		ctrs := "(daemon stopped)"
		if h.cmd != nil {
			m, err := h.readMetrics(tp.t)
			var nz []string
			for k, v := range m {
				if v != 0 && !strings.HasPrefix(k, "go_") {
					nz = append(nz, fmt.Sprintf("%s=%v", k, v))
				}
			}
			sort.Strings(nz)
			ctrs = fmt.Sprint(strings.Join(nz, " "), " ", err)
		}
		tp.t.Logf("%s: eipoibd log:\n%s\ncounters (non-zero): %s", h.name, abridge(h.log(), 60, 20), ctrs)
	}
}

// pingResult is what one ping run printed: requests sent, replies
// received, and which sequence numbers were answered.
type pingResult struct {
	tx, rx, dups int
	seqs         map[int]bool
	out          string
}

var (
	pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received(?:, \+(\d+) duplicates)?`)
	pingReply   = regexp.MustCompile(`(?m)^\d+ bytes from .*icmp_seq=(\d+) .*time=`)
)

// runPing runs ping from g to dst until n replies arrive or deadline
// passes (ping -c n -w deadline). With a deadline ping sends one more
// request whenever fewer than n replies are back by the next interval, so
// a lost request shows as a missing sequence number and a late reply as
// more requests transmitted than n.
func runPing(g *guest, dst string, n int, deadline time.Duration, extra ...string) (pingResult, error) {
	args := []string{"ping", "-c", strconv.Itoa(n), "-i", "0.2", "-w", strconv.Itoa(int(deadline.Seconds()))}
	out, err := shErr(in(g.ns, append(append(args, extra...), dst)...)...)
	r := pingResult{seqs: map[int]bool{}, out: out}
	if m := pingSummary.FindStringSubmatch(out); m != nil {
		r.tx, _ = strconv.Atoi(m[1])
		r.rx, _ = strconv.Atoi(m[2])
		r.dups, _ = strconv.Atoi(m[3])
	}
	for _, m := range pingReply.FindAllStringSubmatch(out, -1) {
		seq, _ := strconv.Atoi(m[1])
		r.seqs[seq] = true
	}
	return r, err
}

// lossless reports whether n of n replies came back: the first n
// requests each answered once. Replies to requests ping sent beyond n,
// because replies were late on a busy machine, are no loss. ping may
// take them in before it exits, so rx may pass n. Each reply counted is
// one of a distinct request's, none a duplicate.
func (r pingResult) lossless(n int) bool {
	for seq := 1; seq <= n; seq++ {
		if !r.seqs[seq] {
			return false
		}
	}
	return r.rx == len(r.seqs) && r.dups == 0
}

// ping pings dst from guest g 3 times and fails the test unless all 3
// requests, the first one included, got their replies: no loss is
// expected wherever it is used. The first request to a destination the
// shim never resolved waits in its resolution queue and must arrive too.
func ping(t *testing.T, g *guest, dst string, extra ...string) {
	t.Helper()
	pingN(t, g, dst, 3, extra...)
}

// pingN is ping with n requests.
func pingN(t *testing.T, g *guest, dst string, n int, extra ...string) {
	t.Helper()
	nstestRequire(t, "ping")
	r, err := runPing(g, dst, n, time.Duration(n)*200*time.Millisecond+5*time.Second, extra...)
	if err != nil || !r.lossless(n) {
		t.Fatalf("ping %s → %s %v: replies to %v of requests 1–%d (%d transmitted, %d received, %d duplicates), want each answered once (%v)\n%s",
			g.ns, dst, extra, sortedKeys(r.seqs), n, r.tx, r.rx, r.dups, err, r.out)
	}
	if r.tx > n { // late, not lost: logged, as it shows a stalled path
		t.Logf("ping %s → %s: all %d answered, but late enough that ping sent %d\n%s", g.ns, dst, n, r.tx, r.out)
	}
}

var pingRTT = regexp.MustCompile(`(?m)^\d+ bytes from .*icmp_seq=(\d+) .*time=([0-9.]+) ms`)

// pingPrompt is pingN for a path claimed to answer at once: each of the
// n requests answered once, and within, its round trip as ping reports
// it; a later reply fails the test, where pingN only logs it.
func pingPrompt(t *testing.T, g *guest, dst string, n int, within time.Duration) {
	t.Helper()
	nstestRequire(t, "ping")
	r, err := runPing(g, dst, n, time.Duration(n)*200*time.Millisecond+5*time.Second)
	if err != nil || !r.lossless(n) {
		t.Fatalf("ping %s → %s: replies to %v of requests 1–%d (%d transmitted, %d received, %d duplicates), want each answered once (%v)\n%s",
			g.ns, dst, sortedKeys(r.seqs), n, r.tx, r.rx, r.dups, err, r.out)
	}
	for _, m := range pingRTT.FindAllStringSubmatch(r.out, -1) {
		ms, _ := strconv.ParseFloat(m[2], 64)
		if rtt := time.Duration(ms * float64(time.Millisecond)); rtt > within {
			t.Fatalf("ping %s → %s: request %s answered after %v, want within %v\n%s", g.ns, dst, m[1], rtt, within, r.out)
		}
	}
}

// unanswered pings dst from guest g for 2 s and fails the test unless
// requests went out and none was answered.
func unanswered(t *testing.T, g *guest, dst string) {
	t.Helper()
	nstestRequire(t, "ping")
	if r, _ := runPing(g, dst, 2, 2*time.Second); r.tx == 0 || r.rx != 0 {
		t.Fatalf("ping %s → %s: %d replies to %d requests, want requests and no reply\n%s", g.ns, dst, r.rx, r.tx, r.out)
	}
}

var arpingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)

// arping sends n ARP requests from guest g for dst (arping -c n) and
// fails the test unless all n were answered, once each.
func arping(t *testing.T, g *guest, dst string, n int) {
	t.Helper()
	nstestRequire(t, "arping")
	out, err := shErr(in(g.ns, "arping", "-c", strconv.Itoa(n), "-w", strconv.Itoa(n+3), "-I", "eth0", dst)...)
	m := arpingSummary.FindStringSubmatch(out)
	if err != nil || m == nil || m[1] != strconv.Itoa(n) || m[2] != m[1] || !strings.Contains(out, "(0 extra)") {
		t.Fatalf("arping %s → %s: want %d of %d answered (%v)\n%s", g.ns, dst, n, n, err, out)
	}
}

func sortedKeys(m map[int]bool) []int {
	var k []int
	for v := range m {
		k = append(k, v)
	}
	sort.Ints(k)
	return k
}

// dropWatch remembers the counters of some daemons, to assert later
// that their drop counters (drop_*, port_drop_*) rose by exactly what was
// expected: nothing, during healthy traffic.
type dropWatch struct {
	hvs    []*hypervisor
	before []map[string]float64
}

func isDrop(name string) bool {
	return strings.HasPrefix(name, "drop_") || strings.HasPrefix(name, "port_drop_")
}

// watchDrops snapshots the counters of hvs.
func watchDrops(t *testing.T, hvs ...*hypervisor) *dropWatch {
	t.Helper()
	w := &dropWatch{hvs: hvs}
	for _, h := range hvs {
		w.before = append(w.before, h.metrics(t))
	}
	return w
}

// rises are expected counter rises, by hypervisor name and counter.
type rises map[string]map[string]float64

// check fails the test, naming each one, if any drop counter rose since
// watchDrops.
func (w *dropWatch) check(t *testing.T) {
	t.Helper()
	w.expect(t, nil, 0)
}

// expect waits up to within until every counter in want rose by its
// amount, then fails the test unless each did so exactly and no other
// drop counter rose.
func (w *dropWatch) expect(t *testing.T, want rises, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for i, h := range w.hvs {
		var after map[string]float64
		for {
			after = h.metrics(t)
			short := false
			for name, n := range want[h.name] {
				short = short || after[name]-w.before[i][name] < n
			}
			if !short || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for name, v := range after {
			if d, n := v-w.before[i][name], want[h.name][name]; d != n && (isDrop(name) || n != 0) {
				t.Errorf("%s: %s rose by %v (%v → %v), want %v", h.name, name, d, w.before[i][name], v, n)
			}
		}
		for name, n := range want[h.name] {
			if _, ok := after[name]; !ok && n != 0 {
				t.Errorf("%s: no counter %s, want a rise of %v", h.name, name, n)
			}
		}
	}
}
