package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// kitTools are what test/hw/run.sh runs on the simulated fabric.
var kitTools = []string{"bash", "nsenter", "bridge", "ping", "arping", "iperf", "ndisc6", "awk", "sed"}

// kitHosts makes two "host" namespaces joined by a veth underlay (ul,
// MTU 9000) and returns the kit's options that make them host A and
// host B, and their names. The kit reaches them with nsenter --net, not
// ip netns exec: the guest namespaces it adds inside must be visible to
// the next command, and ip netns exec gives each command a mount
// namespace of its own. With ovs, each host also gets an Open vSwitch of
// its own, which the kit and eipoibd find through OVS_RUNDIR. The
// hosts' ports run no DAD (nstest.Add).
func kitHosts(t *testing.T, ovs bool) ([]string, []string) {
	t.Helper()
	pfx := fmt.Sprintf("k%d%d", os.Getpid()%1000, nsSeq.Add(1))
	hosts := []string{pfx + "A", pfx + "B"}
	var exec []string
	for _, ns := range hosts {
		nstest.Add(t, ns)
		prefix := "nsenter --net=/run/netns/" + ns
		if ovs {
			dir := startOVS(t, ns)
			t.Cleanup(func() { stopOVS(dir) })
			prefix = "env OVS_RUNDIR=" + dir + " " + prefix
		}
		exec = append(exec, prefix)
	}
	sh(t, "ip", "link", "add", "ul", "netns", hosts[0], "type", "veth", "peer", "name", "ul", "netns", hosts[1])
	for _, ns := range hosts {
		underlayUp(t, ns, "ul") // nstest.Add turned DAD off for the kit's macvlans on ul too
	}
	return []string{"--fabric", "sim", "--dev", "ul", "--local-exec", exec[0], "--peer-exec", exec[1], "--ns-prefix", kitGuestNS(hosts)}, hosts
}

// kitGuestNS is the prefix of the guest namespaces of the kit run on
// hosts (kitHosts): namespace names are global to the machine, so two
// kits running at once (two test suites) must not share them.
func kitGuestNS(hosts []string) string { return strings.TrimSuffix(hosts[0], "A") + "g" }

// runKit runs test/hw/run.sh with args and returns its output and exit
// code. Past the timeout the kit gets SIGTERM, on which it removes what
// it made, and 20 s to do so.
func runKit(t *testing.T, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join("..", "hw", "run.sh")}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		return string(out), ee.ExitCode()
	default:
		t.Fatalf("run.sh %v: %v\n%s", args, err, out)
		return "", -1
	}
}

// kitRow is one row of the kit's summary table.
type kitRow struct{ check, backend, partition, result, figure string }

var (
	kitSummary = regexp.MustCompile(`(?m)^summary: (\d+) passed, (\d+) failed, (\d+) not run$`)
	kitRowRE   = regexp.MustCompile(`^(.{18}) (\S+) +(\S+) +(PASS|FAIL|SKIP|not run) +(.*)$`)
)

// kitTable returns the rows of the summary table: the lines between its
// header and the summary line.
func kitTable(t *testing.T, out string) []kitRow {
	t.Helper()
	lines := strings.Split(out, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "check ") && strings.Contains(l, " figure") {
			start = i + 1
		}
	}
	if start < 0 {
		t.Fatalf("no summary table in the kit's output:\n%s", out)
	}
	var rows []kitRow
	for _, l := range lines[start:] {
		if strings.HasPrefix(l, "summary:") {
			return rows
		}
		m := kitRowRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("summary row %q does not parse\n%s", l, out)
		}
		rows = append(rows, kitRow{strings.TrimSpace(m[1]), m[2], m[3], m[4], m[5]})
	}
	t.Fatalf("summary table without a summary line:\n%s", out)
	return nil
}

// kitLegs are the legs the kit runs per backend and partition.
var kitLegs = []string{"ping4", "ping6", "arp", "nd", "tcp A1>B1", "tcp B1>A1", "mcast4", "mcast6"}

// routedLegs are the routed leg's rows, once per backend in partition
// 0xffff: guest A1 and an address X that host B routes for.
var routedLegs = []string{"routed ping4 A1>X|sim|0xffff", "routed ping6 A1>X|sim|0xffff", "routed tcp A1>X|sim|0xffff", "routed tcp X>A1|sim|0xffff"}

// checkKit asserts what the kit's run printed:
//   - exit 0;
//   - a summary of 0 failed, with as many passed as the table has PASS
//     rows;
//   - every leg in the table as PASS for backend sim on each of the
//     partitions, and the extra rows (check|backend|partition);
//   - exactly the notRun rows (→ the start of the reason) as "not run",
//     never as passed;
//   - no other row;
//   - nothing left on the hosts;
//   - each host's eipoibd counters, VIFs, neighbours and groups saved in
//     its logs under work;
//   - the throughput and RTT block (checkPerf).
func checkKit(t *testing.T, out string, code int, work string, hosts, partitions, extra []string, notRun map[string]string) map[string]kitRow {
	t.Helper()
	if code != 0 {
		t.Errorf("run.sh exited %d, want 0", code)
	}
	m := kitSummary.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line:\n%s", out)
	}
	rows := kitTable(t, out)
	pass := 0
	got := map[string]kitRow{}
	for _, r := range rows {
		got[r.check+"|"+r.backend+"|"+r.partition] = r
		if r.result == "PASS" {
			pass++
		}
	}
	if m[2] != "0" || m[1] != strconv.Itoa(pass) || m[1] == "0" {
		t.Errorf("summary %q, want 0 failed and %d passed (the table's PASS rows)", m[0], pass)
	}
	for _, pk := range partitions {
		for _, c := range kitLegs {
			if r, ok := got[c+"|sim|"+pk]; !ok || r.result != "PASS" {
				t.Errorf("leg %s (sim, %s): %+v, want PASS", c, pk, r)
			}
		}
	}
	for _, key := range extra {
		if r, ok := got[key]; !ok || r.result != "PASS" {
			t.Errorf("leg %s: %+v, want PASS", key, r)
		}
	}
	for key, reason := range notRun {
		if r, ok := got[key]; !ok || r.result != "not run" || !strings.HasPrefix(r.figure, reason) {
			t.Errorf("leg %s: %+v, want not run %s…", key, r, reason)
		}
	}
	if want := len(kitLegs)*len(partitions) + len(extra) + len(notRun); len(rows) != want {
		t.Errorf("%d rows, want %d", len(rows), want)
	}
	for _, ns := range hosts {
		if l := sh(t, in(ns, "ip", "-o", "link")...); strings.Contains(l, "eht") {
			t.Errorf("%s: the kit left interfaces behind:\n%s", ns, l)
		}
	}
	if l := sh(t, "ip", "netns", "list"); strings.Contains(l, kitGuestNS(hosts)) {
		t.Errorf("the kit left guest namespaces behind:\n%s", l)
	}
	for _, h := range []string{"A", "B"} {
		b, err := os.ReadFile(filepath.Join(work, h+".prev", "show-sim.txt"))
		for _, want := range []string{"== eipoibd show stats", "tx_frames", "== eipoibd show vifs", "== eipoibd show neigh", "== eipoibd show groups"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("host %s: the saved eipoibd state lacks %q (%v)\n%s", h, want, err, b)
			}
		}
	}
	checkPerf(t, out, got, partitions)
	t.Logf("run.sh output:\n%s", out)
	return got
}

// The kit's throughput and RTT block, above the table: its header, then
// a line per leg, partition, backend and fast path setting.
var (
	kitPerfHead = "throughput and RTT per leg (tcp: iperf 2's server; ping: the mean RTT of the pairs):"
	kitPerfRE   = regexp.MustCompile(`^  (checks|routed) +(\S+) +(\S+) +(fast path: n/a \(sim\)|fast path.*?)  +(.*)$`)
	// What the sim backend's legs measure, in order; each number is the
	// one of its row in the table (kitPerfRows).
	kitPerfFigures = map[string]*regexp.Regexp{
		"checks": regexp.MustCompile(`^ping4 (\d+\.\d{3}) ms, ping6 (\d+\.\d{3}) ms, tcp A1>B1 (\d+\.\d{2}) Gbit/s, tcp B1>A1 (\d+\.\d{2}) Gbit/s$`),
		"routed": regexp.MustCompile(`^ping4 A1>X (\d+\.\d{3}) ms, ping6 A1>X (\d+\.\d{3}) ms, tcp A1>X (\d+\.\d{2}) Gbit/s, tcp X>A1 (\d+\.\d{2}) Gbit/s$`),
	}
	kitPerfRows = map[string][]string{
		"checks": {"ping4", "ping6", "tcp A1>B1", "tcp B1>A1"},
		"routed": {"routed ping4 A1>X", "routed ping6 A1>X", "routed tcp A1>X", "routed tcp X>A1"},
	}
	kitRowFigure = regexp.MustCompile(`(?:rtt avg (\d+\.\d{3}) ms|, (\d+\.\d{2}) Gbit/s)`)
)

// checkPerf asserts the throughput and RTT block of a run on the
// simulated fabric, which has no fast path:
//   - its header once, before the table;
//   - exactly one line per partition's checks and one for the routed
//     leg (0xffff), each "fast path: n/a (sim)";
//   - each listing ping4 and ping6 RTTs and both TCP rates, well formed,
//     each equal to the figure of its row in the table;
//   - no on/off comparison and no line of another setting.
func checkPerf(t *testing.T, out string, rows map[string]kitRow, partitions []string) {
	t.Helper()
	if n := strings.Count(out, "\n"+kitPerfHead+"\n"); n != 1 {
		t.Errorf("the throughput and RTT header %d times, want 1", n)
	}
	want := map[string]bool{"routed|0xffff": true}
	for _, pk := range partitions {
		want["checks|"+pk] = true
	}
	seen := map[string]bool{}
	inBlock := false
	for _, l := range strings.Split(out, "\n") {
		if l == kitPerfHead {
			inBlock = true
			continue
		}
		if !inBlock || !strings.HasPrefix(l, "  ") {
			inBlock = false
			continue
		}
		m := kitPerfRE.FindStringSubmatch(l)
		if m == nil || m[3] != "sim" || m[4] != "fast path: n/a (sim)" {
			t.Errorf("throughput line %q, want leg, partition, sim and fast path: n/a (sim)", l)
			continue
		}
		key := m[1] + "|" + m[2]
		if !want[key] || seen[key] {
			t.Errorf("throughput line %q: unexpected or repeated", l)
			continue
		}
		seen[key] = true
		f := kitPerfFigures[m[1]].FindStringSubmatch(m[5])
		if f == nil {
			t.Errorf("throughput line %q: figures do not match %v", l, kitPerfFigures[m[1]])
			continue
		}
		for i, check := range kitPerfRows[m[1]] {
			r := kitRowFigure.FindStringSubmatch(rows[check+"|sim|"+m[2]].figure)
			if r == nil || r[1]+r[2] != f[i+1] {
				t.Errorf("throughput line %q: %s %s, but its row says %q", l, check, f[i+1], rows[check+"|sim|"+m[2]].figure)
			}
		}
	}
	for key := range want {
		if !seen[key] {
			t.Errorf("no throughput line for %s", key)
		}
	}
	if strings.Contains(out, "on/off") || regexp.MustCompile(`fast path: (on|off|auto)`).MatchString(out) {
		t.Errorf("a fast path setting or comparison on the simulated fabric:\n%s", out)
	}
	if strings.Index(out, kitPerfHead) > strings.LastIndex(out, "\ncheck ") {
		t.Errorf("the throughput block is not above the table")
	}
}

// kitArgs are the self-tests' measurement options: fewer requests and
// bytes than on hardware, so a run stays well under 90 s.
var kitArgs = []string{"--count", "3", "--bytes", "8388608", "--mcast-settle", "1"}

// smRecovery is the SM leg's figure: seconds until the first reply.
var smRecovery = regexp.MustCompile(`^ping A1>B1 back after (\d+\.\d) s, then 3/3 \(--sm-restart\)$`)

// TestHWKit runs the operators' kit (test/hw/run.sh) here, so that it
// cannot rot. It uses two host namespaces on a veth underlay, the
// simulated fabric, Linux bridges and one partition (this kernel's
// bridge has no VLAN filtering).
//
// There is no SM. The SM leg's trigger (--sm-restart) is a stand-in that
// takes host A's simulated port down for 2 s (SIGUSR1 twice), which
// drops every packet each way. The TAP's carrier follows the port. A
// bridge port that goes down loses its learned multicast router state
// (net/bridge/br_multicast.c). The bridge then keeps guests' multicast
// to groups without local members from the TAP until it hears a query
// (br_multicast_ipv4_rcv: mrouters_only). The "mcast4 after SM" leg
// checks that eipoibd queries as soon as the carrier is back. So a port
// reset on hardware does not cut guests' multicast for the query
// interval.
//
// checkKit asserts the run:
//   - every leg this machine can run PASS: ping, ping -6, ARP, ND, TCP
//     both ways, IPv4 and IPv6 multicast;
//   - the routed leg PASS: ping, ping -6 and TCP both ways between guest
//     A1 and an address host B routes for;
//   - the SM leg and the multicast after it PASS;
//   - the second partition, the kernel and verbs backends and the kernel
//     backend legs (long-name, child-mem) "not run", with their reason;
//   - 0 failed, and nothing left behind;
//   - the throughput and RTT of each leg, "fast path: n/a (sim)", and no
//     fast path comparison: the sim backend has no fast path, so the kit
//     runs each leg once (the kernel backend's twice, off and on, which
//     only InfiniBand hosts run; hwkit_scripts_test.go tests the verdict
//     those runs make from eipoibd's counters).
//
// The SM leg's recovery is at least the 2 s the port was down: the leg
// measured the outage, from the trigger on.
func TestHWKit(t *testing.T) {
	require(t, kitTools...)
	args, hosts := kitHosts(t, false)
	work := t.TempDir()
	pid := "$(cat " + filepath.Join(work, "A", "run.pid") + ")"
	args = append(append(args, kitArgs...), "--eipoibd", daemonBin, "--partitions", "1", "--work", work,
		"--sm-restart", "kill -USR1 "+pid+" && (sleep 2; kill -USR1 "+pid+") >/dev/null 2>&1 &")
	out, code := runKit(t, 90*time.Second, args...)
	got := checkKit(t, out, code, work, hosts, []string{"0xffff"}, append([]string{"sm-reregister|sim|0xffff", "mcast4 after SM|sim|0xffff"}, routedLegs...),
		map[string]string{
			"all checks|all|0x8001":   "(--partitions 1)",
			"all checks|kernel|all":   "(--fabric sim",
			"all checks|verbs|all":    "(--fabric sim",
			"long-name|kernel|0xffff": "(--fabric sim",
			"child-mem|kernel|0xffff": "(--fabric sim",
		})
	m := smRecovery.FindStringSubmatch(got["sm-reregister|sim|0xffff"].figure)
	if m == nil {
		t.Fatalf("SM leg figure %q, want %v", got["sm-reregister|sim|0xffff"].figure, smRecovery)
	}
	if rec, _ := strconv.ParseFloat(m[1], 64); rec < 1.9 {
		t.Errorf("SM leg: first reply %.1f s after the trigger, though the port was down for 2 s", rec)
	}
}

// TestHWKitOVS runs the kit with both partitions. The second one's
// guests are on VLAN 100 of an Open vSwitch bridge (userspace datapath,
// an OVS per host). eipoibd maps it to P_Key 0x8001, and each host's
// second native address is on an eipoibd host of that P_Key. checkKit
// asserts every leg PASS on both partitions, and the SM re-register and
// the kernel and verbs backends "not run". eipoibd runs with
// --offload=false. The userspace datapath reads the TAP without its vnet
// header, so TCP super-frames eipoibd wrote to it with offloads on would
// reach the guests' 1500-byte veths whole, and TCP would crawl through
// retransmissions.
func TestHWKitOVS(t *testing.T) {
	require(t, append(kitTools, ovsTools...)...)
	args, hosts := kitHosts(t, true)
	work := t.TempDir()
	// Two requests per pair: the second partition doubles the run.
	args = append(append(args, kitArgs...), "--no-sm", "--count", "2", "--eipoibd", daemonBin, "--switch", "ovs", "--ovs-datapath", "netdev",
		"--eipoibd-args", "--offload=false",
		"--pkey2", "0x8001", "--vlan2", "100", "--work", work)
	out, code := runKit(t, 90*time.Second, args...)
	checkKit(t, out, code, work, hosts, []string{"0xffff", "0x8001"}, routedLegs, map[string]string{
		"sm-reregister|sim|0xffff": "(--no-sm)",
		"all checks|kernel|all":    "(--fabric sim",
		"all checks|verbs|all":     "(--fabric sim",
		"long-name|kernel|0xffff":  "(--fabric sim",
		"child-mem|kernel|0xffff":  "(--fabric sim",
	})
}

// TestHWKitPrerequisites: with an eipoibd that does not exist and
// without --no-sm on the simulated fabric, the kit names both missing
// prerequisites, with what to do. It sets nothing up (no interface on
// either host, no namespace), exits 2, and runs no check.
func TestHWKitPrerequisites(t *testing.T) {
	nstestRequire(t, kitTools...)
	args, hosts := kitHosts(t, false)
	work := t.TempDir()
	args = append(args, "--eipoibd", "/nonexistent/eipoibd", "--partitions", "1", "--work", work)
	// What the kit would set up: interfaces on the hosts, its guest
	// namespaces (kitGuestNS…). (It does make its work directories.)
	state := func() string {
		var s string
		for _, l := range strings.Split(sh(t, "ip", "netns", "list"), "\n") {
			if strings.HasPrefix(l, kitGuestNS(hosts)) {
				s += "netns " + l + "\n"
			}
		}
		for _, ns := range hosts {
			s += ns + ": " + strings.Join(strings.Fields(sh(t, in(ns, "ls", "/sys/class/net")...)), " ") + "\n"
		}
		return s
	}
	before := state()
	out, code := runKit(t, 30*time.Second, args...)
	if after := state(); after != before {
		t.Errorf("the kit set something up:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if code != 2 {
		t.Errorf("run.sh exited %d, want 2", code)
	}
	for _, want := range []string{
		"MISSING  A: eipoibd (/nonexistent/eipoibd): install it on host A, or give --eipoibd PATH",
		"MISSING  B: eipoibd (/nonexistent/eipoibd): install it on host B, or give --eipoibd PATH",
		"MISSING  the simulated fabric has no subnet manager: pass --no-sm, or --sm-restart CMD with a stand-in",
		"prerequisites: 3 missing",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "summary:") || strings.Contains(out, "PASS") {
		t.Errorf("checks ran although prerequisites were missing")
	}
	if t.Failed() {
		t.Logf("run.sh output:\n%s", out)
	}
}

// TestHWKitKernelLegOptions: the kernel backend legs' options are
// checked before anything runs. A --long-name the kernel would refuse
// (16 bytes: dev_valid_name's 15 at most, or a '/'), or equal to --dev,
// exits 3 with the reason. So does a --children that is no positive
// number, a --fast-path setting eipoibd does not take, given twice, or
// none, and a --ns-prefix that is no plain name.
func TestHWKitKernelLegOptions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--long-name", "ibp129s0f0np0xyz"}, "--long-name is 1 to 15"},
		{[]string{"--long-name", "ib/0"}, "--long-name is 1 to 15"},
		{[]string{"--long-name", "ib0"}, "--long-name must differ from --dev"},
		{[]string{"--children", "0"}, "'0' is not a positive number"},
		{[]string{"--children", "x"}, "'x' is not a positive number"},
		{[]string{"--fast-path", "off,fast"}, "--fast-path takes off, on, auto or both, not fast"},
		{[]string{"--fast-path", "on,auto,on"}, "--fast-path: on twice"},
		{[]string{"--fast-path", ","}, "--fast-path needs a setting"},
		{[]string{"--ns-prefix", "1k"}, "--ns-prefix is a letter, then"},
		{[]string{"--ns-prefix", "k-1"}, "--ns-prefix is a letter, then"},
	} {
		out, code := runKit(t, 30*time.Second, append([]string{"--peer-exec", "true", "--work", t.TempDir()}, c.args...)...)
		if code != 3 || !strings.Contains(out, c.want) {
			t.Errorf("run.sh %v: exit %d, want 3 and %q:\n%s", c.args, code, c.want, out)
		}
	}
}
