package netns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib/emukernel"
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
	hosts, exec := kitNS(t, ovs)
	sh(t, "ip", "link", "add", "ul", "netns", hosts[0], "type", "veth", "peer", "name", "ul", "netns", hosts[1])
	for _, ns := range hosts {
		underlayUp(t, ns, "ul") // nstest.Add turned DAD off for the kit's macvlans on ul too
	}
	return []string{"--fabric", "sim", "--dev", "ul", "--local-exec", exec[0], "--peer-exec", exec[1], "--ns-prefix", kitGuestNS(hosts)}, hosts
}

// kitNS makes the two host namespaces of kitHosts and returns their
// names and the prefixes that run a command in each.
func kitNS(t *testing.T, ovs bool) (hosts, exec []string) {
	t.Helper()
	pfx := fmt.Sprintf("k%d%d", os.Getpid()%1000, nsSeq.Add(1))
	hosts = []string{pfx + "A", pfx + "B"}
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
	return hosts, exec
}

// kitEmuHosts makes the two host namespaces of kitNS on package emuib's
// EMULATED IPoIB wire, as newEmuTopo's hypervisors: the wire pinned in a
// bpffs (emuWire), a fabric namespace, and in each host the emulated
// parent ib0 (emuParent). It returns the kit's options that run the
// kernel backend's round there (--fabric emuib, --dev ib0, eipoibd
// built with the emuib tag) and the hosts' names. Each host's commands
// run with $EIPOIB_EMUIB, its emukernel.Config (host 0 or 1, GID
// fe80::ee:1 or :2), which the daemon the kit starts inherits: JSON has
// no blank, and the kit splits the prefixes at blanks only.
func kitEmuHosts(t *testing.T) ([]string, []string) {
	t.Helper()
	bin := emuibDaemon(t)
	hosts, exec := kitNS(t, false)
	_, pins := emuWire(t)
	fabric := strings.TrimSuffix(hosts[0], "A") + "f"
	nstest.Add(t, fabric)
	for i, ns := range hosts {
		emuParent(t, ns, fabric, fmt.Sprintf("p%d", i+1))
		cfg, err := json.Marshal(emukernel.Config{Fabric: fabric, Pins: pins, Host: i, GID: netip.MustParseAddr(fmt.Sprintf("fe80::ee:%d", i+1)), Parent: "ib0"})
		if err != nil || strings.ContainsAny(string(cfg), " \t\n") {
			t.Fatalf("$EIPOIB_EMUIB %s (%v): the kit needs it without blanks", cfg, err)
		}
		exec[i] = "env EIPOIB_EMUIB=" + string(cfg) + " " + exec[i]
	}
	return []string{"--fabric", "emuib", "--dev", "ib0", "--eipoibd", bin, "--local-exec", exec[0], "--peer-exec", exec[1], "--ns-prefix", kitGuestNS(hosts)}, hosts
}

// kitGuestNS is the prefix of the guest namespaces of the kit run on
// hosts (kitHosts): namespace names are global to the machine, so two
// kits running at once (two test suites) must not share them.
func kitGuestNS(hosts []string) string { return strings.TrimSuffix(hosts[0], "A") + "g" }

// kitHang is how long runKit lets the kit run before it takes it for
// hung. It bounds no speed: on this 2-core machine a run took 60-90 s in
// .ci/run, and in make test-load, with other work beside it, 91 s (past
// the old bound of 90 s) and 124 s. It only has to end a hung kit, with
// its clean-up, before go test's own -timeout ends the suite.
const kitHang = 10 * time.Minute

// runKit runs test/hw/run.sh with args and returns its output and exit
// code. Past kitHang the kit gets SIGTERM, on which it removes what it
// made, and 20 s to do so.
func runKit(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kitHang)
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

// kitRound says which rounds a kit run had: the backend, and its fast
// path settings in the order run ("n/a" alone: a backend without one,
// its rows' backend column the backend; else BACKEND/SETTING); and the
// legs of its throughput and RTT block ("checks|PARTITION",
// "routed|0xffff").
type kitRound struct {
	backend  string
	settings []string
	perf     []string
}

// label is the backend column of setting s's rows.
func (r kitRound) label(s string) string {
	if s == "n/a" {
		return r.backend
	}
	return r.backend + "/" + s
}

// simRound is the round of a run on the simulated fabric, with the
// checks of partitions and the routed leg.
func simRound(partitions []string) kitRound {
	r := kitRound{backend: "sim", settings: []string{"n/a"}, perf: []string{"routed|0xffff"}}
	for _, pk := range partitions {
		r.perf = append(r.perf, "checks|"+pk)
	}
	return r
}

// checkKit asserts what the kit's run printed:
//   - exit 0;
//   - a summary of 0 failed, with as many passed as the table has PASS
//     rows;
//   - every leg in the table as PASS for each of round's settings on
//     each of the partitions, and the extra rows
//     (check|backend|partition);
//   - exactly the notRun rows (→ the start of the reason) as "not run",
//     never as passed;
//   - no other row;
//   - nothing left on the hosts;
//   - each host's eipoibd counters, VIFs, neighbours and groups of each
//     setting saved in its logs under work;
//   - the throughput and RTT block (checkPerf).
func checkKit(t *testing.T, out string, code int, work string, hosts []string, round kitRound, partitions, extra []string, notRun map[string]string) map[string]kitRow {
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
	for _, s := range round.settings {
		for _, pk := range partitions {
			for _, c := range kitLegs {
				if r, ok := got[c+"|"+round.label(s)+"|"+pk]; !ok || r.result != "PASS" {
					t.Errorf("leg %s (%s, %s): %+v, want PASS", c, round.label(s), pk, r)
				}
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
	if want := len(kitLegs)*len(partitions)*len(round.settings) + len(extra) + len(notRun); len(rows) != want {
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
		for _, s := range round.settings {
			name := "show-" + strings.ReplaceAll(round.label(s), "/", "-") + ".txt"
			b, err := os.ReadFile(filepath.Join(work, h+".prev", name))
			for _, want := range []string{"== eipoibd show stats", "tx_frames", "== eipoibd show vifs", "== eipoibd show neigh", "== eipoibd show groups"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("host %s: the saved eipoibd state %s lacks %q (%v)\n%s", h, name, want, err, b)
				}
			}
		}
	}
	checkPerf(t, out, got, round)
	t.Logf("run.sh output:\n%s", out)
	return got
}

// The kit's throughput and RTT block, above the table: its header, then
// a line per leg, partition, backend and fast path setting, then one per
// leg comparing each setting but off with off.
var (
	kitPerfHead = "throughput and RTT per leg (tcp: iperf 2's server; ping: the mean RTT of the pairs):"
	kitPerfRE   = regexp.MustCompile(`^  (checks|routed) +(\S+) +(\S+) +(fast path: n/a \(\S+\)|fast path: \S+|fast path \S+/off)  +(.*)$`)
	// What the legs measure, in order; each number is the one of its
	// row in the table (kitPerfRows).
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

// checkPerf asserts the throughput and RTT block:
//   - its header once, before the table;
//   - exactly one line per leg of round.perf and setting, "fast path:
//     n/a (BACKEND)" for a backend without one, else "fast path:
//     SETTING";
//   - each listing ping4 and ping6 RTTs and both TCP rates, well formed,
//     each equal to the figure of its row in the table;
//   - with off among the settings, exactly one line per leg and other
//     setting S, "fast path S/off", whose ratios are each figure of S
//     divided by off's, as perf.sh prints them ("%.2fx");
//   - no other line in the block, and without a fast path no setting
//     or comparison anywhere in the output.
func checkPerf(t *testing.T, out string, rows map[string]kitRow, round kitRound) {
	t.Helper()
	if n := strings.Count(out, "\n"+kitPerfHead+"\n"); n != 1 {
		t.Errorf("the throughput and RTT header %d times, want 1", n)
	}
	column := map[string]string{} // the setting column → the key's setting
	hasOff := slices.Contains(round.settings, "off")
	for _, s := range round.settings {
		if s == "n/a" {
			column["fast path: n/a ("+round.backend+")"] = s
			continue
		}
		column["fast path: "+s] = s
		if s != "off" && hasOff {
			column["fast path "+s+"/off"] = s + "/off"
		}
	}
	want := map[string]bool{}
	for _, leg := range round.perf {
		for _, s := range column {
			want[leg+"|"+s] = true
		}
	}
	seen := map[string]bool{}
	figures := map[string][]string{} // leg|partition|setting → its numbers
	ratios := map[string]string{}    // leg|partition|setting/off → the comparison
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
		var s string
		ok := m != nil
		if ok {
			s, ok = column[m[4]]
		}
		if !ok || m[3] != round.backend {
			t.Errorf("throughput line %q, want leg, partition, %s and one of %v", l, round.backend, slices.Collect(maps.Keys(column)))
			continue
		}
		key := m[1] + "|" + m[2] + "|" + s
		if !want[key] || seen[key] {
			t.Errorf("throughput line %q: unexpected or repeated", l)
			continue
		}
		seen[key] = true
		if strings.HasSuffix(s, "/off") {
			ratios[key] = m[5]
			continue
		}
		f := kitPerfFigures[m[1]].FindStringSubmatch(m[5])
		if f == nil {
			t.Errorf("throughput line %q: figures do not match %v", l, kitPerfFigures[m[1]])
			continue
		}
		figures[key] = f[1:]
		for i, check := range kitPerfRows[m[1]] {
			row := rows[check+"|"+round.label(s)+"|"+m[2]]
			r := kitRowFigure.FindStringSubmatch(row.figure)
			if r == nil || r[1]+r[2] != f[i+1] {
				t.Errorf("throughput line %q: %s %s, but its row says %q", l, check, f[i+1], row.figure)
			}
		}
	}
	for key := range want {
		if !seen[key] {
			t.Errorf("no throughput line for %s", key)
		}
	}
	for key, got := range ratios {
		leg, _, _ := strings.Cut(key, "|")
		base := strings.TrimSuffix(key, "/off")
		off := base[:strings.LastIndex(base, "|")+1] + "off"
		var w []string
		for i, check := range kitPerfRows[leg] {
			a, b := kitFloat(figures[base], i), kitFloat(figures[off], i)
			r := "-"
			if b > 0 {
				r = fmt.Sprintf("%.2fx", a/b)
			}
			w = append(w, strings.TrimPrefix(check, "routed ")+" "+r)
		}
		if wantR := strings.Join(w, ", "); got != wantR {
			t.Errorf("comparison %s: %q, want %q (from the figures %v and %v)", key, got, wantR, figures[base], figures[off])
		}
	}
	if !hasOff && (strings.Contains(out, "on/off") || regexp.MustCompile(`fast path: (on|off|auto)`).MatchString(out)) {
		t.Errorf("a fast path setting or comparison without a fast path:\n%s", out)
	}
	if strings.Index(out, kitPerfHead) > strings.LastIndex(out, "\ncheck ") {
		t.Errorf("the throughput block is not above the table")
	}
}

// kitFloat is figure i of a perf line's numbers (-1 if absent).
func kitFloat(f []string, i int) float64 {
	if i >= len(f) {
		return -1
	}
	v, err := strconv.ParseFloat(f[i], 64)
	if err != nil {
		return -1
	}
	return v
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
//     runs each leg once (the kernel backend's twice, off and on:
//     TestHWKitEmulated runs that round on the emulated IPoIB wire).
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
	out, code := runKit(t, args...)
	got := checkKit(t, out, code, work, hosts, simRound([]string{"0xffff"}), []string{"0xffff"}, append([]string{"sm-reregister|sim|0xffff", "mcast4 after SM|sim|0xffff"}, routedLegs...),
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
	out, code := runKit(t, args...)
	checkKit(t, out, code, work, hosts, simRound([]string{"0xffff", "0x8001"}), []string{"0xffff", "0x8001"}, routedLegs, map[string]string{
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
	out, code := runKit(t, args...)
	if after := state(); after != before {
		t.Errorf("the kit set something up:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	checkMissing(t, out, code, []string{
		"MISSING  A: eipoibd (/nonexistent/eipoibd): install it on host A, or give --eipoibd PATH",
		"MISSING  B: eipoibd (/nonexistent/eipoibd): install it on host B, or give --eipoibd PATH",
		"MISSING  the simulated fabric has no subnet manager: pass --no-sm, or --sm-restart CMD with a stand-in",
		"prerequisites: 3 missing",
	})
}

// TestHWKitEmulatedPrerequisites: on hosts without the emulation's set-up
// (no $EIPOIB_EMUIB, no ib0) and without --no-sm, --fabric emuib names
// each missing prerequisite, with what to do, exits 2 and runs no check.
func TestHWKitEmulatedPrerequisites(t *testing.T) {
	nstestRequire(t, kitTools...)
	hosts, exec := kitNS(t, false)
	out, code := runKit(t, "--fabric", "emuib", "--dev", "ib0", "--partitions", "1", "--eipoibd", daemonBin,
		"--local-exec", exec[0], "--peer-exec", exec[1], "--ns-prefix", kitGuestNS(hosts), "--work", t.TempDir())
	checkMissing(t, out, code, []string{
		"MISSING  A: $EIPOIB_EMUIB set (the emulated kernel's configuration): run the host's commands with it",
		"MISSING  B: $EIPOIB_EMUIB set (the emulated kernel's configuration): run the host's commands with it",
		"MISSING  A: emulated IPoIB parent ib0 up: ip link set ib0 up",
		"MISSING  B: emulated IPoIB parent ib0 up: ip link set ib0 up",
		"MISSING  the emulated wire has no subnet manager: pass --no-sm",
		"prerequisites: 5 missing",
	})
}

// checkMissing fails t unless the kit exited 2 (code), its output out
// holds every line of want (the MISSING prerequisites and their count)
// and no check ran; it logs out when t failed.
func checkMissing(t *testing.T, out string, code int, want []string) {
	t.Helper()
	if code != 2 {
		t.Errorf("run.sh exited %d, want 2", code)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
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
// none, and a --ns-prefix that is no plain name. So do a --fabric the
// kit does not know, and the emulated wire (--fabric emuib) with a
// backend other than kernel or with two partitions (the default).
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
		{[]string{"--fabric", "rxe"}, "--fabric is ib, sim or emuib, not rxe"},
		{[]string{"--fabric", "emuib", "--partitions", "1", "--backends", "kernel,verbs"}, "--fabric emuib emulates the kernel backend's IPoIB only: --backends kernel (not kernel,verbs)"},
		{[]string{"--fabric", "emuib"}, "--fabric emuib runs one partition (--partitions 1)"},
	} {
		out, code := runKit(t, append([]string{"--peer-exec", "true", "--work", t.TempDir()}, c.args...)...)
		if code != 3 || !strings.Contains(out, c.want) {
			t.Errorf("run.sh %v: exit %d, want 3 and %q:\n%s", c.args, code, c.want, out)
		}
	}
}

// TestHWKitEmulated runs the kit's kernel backend round, with the fast
// path off and then on, over package emuib's EMULATED IPoIB wire
// (--fabric emuib, kitEmuHosts): eipoibd built with the emuib tag runs
// --fabric kernel on each host's emulated parent ib0, and the kit's own
// legs, fast path checks and throughput block run unchanged. The
// emulation has no native IPoIB host, no SM and no P_Key, so the kit
// runs the guests' pairs only, one partition, --no-sm.
//
// checkKit asserts the run, for kernel/off and kernel/on alike:
//   - every leg PASS: ping and ping -6 (the 2 guest pairs, 3/3 each),
//     ARP and ND (1 pair, 3/3), TCP both ways (8 MiB sent = received),
//     IPv4 and IPv6 multicast;
//   - each transfer's fastpath row PASS (fastpath-check.sh's verdict);
//   - "not run", with the kit's reason: the native pairs and the
//     routed leg (no native host), the SM leg (--no-sm), long-name and
//     child-mem (the parent is a veth), verbs (no InfiniBand), the
//     second partition;
//   - 0 failed, nothing left behind, each round's eipoibd state saved;
//   - the throughput block: a line for off and one for on, each figure
//     its row's, and the on/off ratios of those figures.
//
// From the fastpath rows' figures, exactly: with the fast path off,
// both hosts counted 0 redirects each way; with it on, the sending
// host's TX program and the receiving host's RX program each
// redirected at least the 128 skbs of 64 KiB that 8 MiB take at the
// fewest, and the guest's VIF (eipoibd's own path) carried less than
// half the bytes: the fast path carried the transfer, each way.
func TestHWKitEmulated(t *testing.T) {
	require(t, kitTools...)
	args, hosts := kitEmuHosts(t)
	work := t.TempDir()
	args = append(append(args, kitArgs...), "--backends", "kernel", "--fast-path", "off,on", "--partitions", "1", "--no-sm", "--work", work)
	out, code := runKit(t, args...)
	round := kitRound{backend: "kernel", settings: []string{"off", "on"}, perf: []string{"checks|0xffff"}}
	const noNative = "(--fabric emuib: no native IPoIB host on the emulated wire)"
	notRun := map[string]string{
		"long-name|kernel|0xffff": "(--fabric emuib: its parent is a veth, no IPoIB driver)",
		"child-mem|kernel|0xffff": "(--fabric emuib: its parent is a veth, no IPoIB driver)",
		"all checks|verbs|all":    "(--fabric emuib: no InfiniBand here)",
		"all checks|all|0x8001":   "(--partitions 1)",
	}
	var extra []string
	for _, s := range round.settings {
		l := round.label(s)
		extra = append(extra, "fastpath A1>B1|"+l+"|0xffff", "fastpath B1>A1|"+l+"|0xffff")
		notRun["native pairs|"+l+"|0xffff"] = noNative
		notRun["routed|"+l+"|0xffff"] = noNative
		notRun["sm-reregister|"+l+"|0xffff"] = "(--no-sm)"
	}
	got := checkKit(t, out, code, work, hosts, round, []string{"0xffff"}, extra, notRun)
	figures := map[string]*regexp.Regexp{
		"ping4":     regexp.MustCompile(`^2 pairs 6/6, rtt avg \d+\.\d{3} ms$`),
		"ping6":     regexp.MustCompile(`^2 pairs 6/6, rtt avg \d+\.\d{3} ms$`),
		"arp":       regexp.MustCompile(`^1 pairs 3/3 replies$`),
		"nd":        regexp.MustCompile(`^1 pairs 3/3 advertisements \(ndisc6\)$`),
		"tcp A1>B1": regexp.MustCompile(`^8388608 B sent = received, \d+\.\d{2} Gbit/s$`),
		"tcp B1>A1": regexp.MustCompile(`^8388608 B sent = received, \d+\.\d{2} Gbit/s$`),
	}
	for _, s := range round.settings {
		for check, re := range figures {
			if f := got[check+"|"+round.label(s)+"|0xffff"].figure; !re.MatchString(f) {
				t.Errorf("%s (%s): %q, want %v", check, round.label(s), f, re)
			}
		}
	}
	for _, d := range [][2]string{{"A", "B"}, {"B", "A"}} {
		from, to := d[0], d[1]
		name := "fastpath " + from + "1>" + to + "1"
		if f, want := got[name+"|kernel/off|0xffff"].figure, from+" redirected tx 0, rx 0 (fast path off); "+to+" redirected tx 0, rx 0 (fast path off)"; f != want {
			t.Errorf("%s (off): %q, want %q", name, f, want)
		}
		re := regexp.MustCompile(`^` + from + ` tx redirected \+(\d+) \(bound 128\), VIF \S+ tx bytes \+(\d+) \(half 4194304\); ` +
			to + ` rx redirected \+(\d+) \(bound 128\), VIF \S+ rx bytes \+(\d+) \(half 4194304\)$`)
		f := got[name+"|kernel/on|0xffff"].figure
		m := re.FindStringSubmatch(f)
		if m == nil {
			t.Errorf("%s (on): %q, want %v", name, f, re)
			continue
		}
		n := make([]int, 4)
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+1])
		}
		if n[0] < 128 || n[2] < 128 || n[1] >= 4194304 || n[3] >= 4194304 {
			t.Errorf("%s (on): %s tx redirected %d and %s rx %d (want at least 128 each), VIF bytes %d and %d (want fewer than 4194304 each)",
				name, from, n[0], to, n[2], n[1], n[3])
		}
	}
}
