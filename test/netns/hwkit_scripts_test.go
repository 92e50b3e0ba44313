package netns

// The hardware kit's parts that need no hosts (test/hw): fastpath-check.sh,
// the fast path verdict run.sh makes from eipoibd's counters on InfiniBand
// hosts, and perf.sh, its throughput and RTT block with the fast path's
// on/off ratios, which only those hosts fill; and that the kit's scripts
// are shellcheck clean. None needs root. (TestHWKit runs the kit itself on
// the simulated fabric.)

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kitDir is the kit's directory, where its scripts run.
const kitDir = "../hw"

// fpGuestMAC is the guest whose VIF the scrapes list, with another's
// around it.
const fpGuestMAC = "02:00:00:00:0a:0b"

// fpScrape is what run.sh saves of one eipoibd: `show stats`, "== vifs",
// `show vifs`. vif is the guest's TX and RX bytes, or nil for no row.
func fpScrape(stats map[string]uint64, vif []uint64) string {
	var b strings.Builder
	b.WriteString("rx_bytes            1000\ntx_bytes            2000\n")
	for k, v := range stats {
		fmt.Fprintf(&b, "%-30s  %d\n", k, v)
	}
	b.WriteString("== vifs\nMAC                VLAN  PKEY    QPN       ADDRESS                                               ORIGIN   IDLE  TX PKTS  TX BYTES  RX PKTS  RX BYTES\n")
	b.WriteString("02:00:00:00:0c:0d  0     0xffff  0x000049  00:00:00:49:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02  learned  0s    99       999999999 99       999999999\n")
	if vif != nil {
		fmt.Fprintf(&b, "02:00:00:00:0A:0B  0     0xffff  0x000048  00:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01  learned  3s    7        %d       8        %d\n", vif[0], vif[1])
	}
	return b.String()
}

// fpCheck runs fastpath-check.sh on two scrapes and returns its line and
// exit code.
func fpCheck(t *testing.T, setting, dir string, bytes int, before, after string) (string, int) {
	t.Helper()
	d := t.TempDir()
	b, a := filepath.Join(d, "before"), filepath.Join(d, "after")
	for f, s := range map[string]string{b: before, a: after} {
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return runFPCheck(t, setting, dir, fpGuestMAC, fmt.Sprint(bytes), b, a)
}

// runFPCheck runs fastpath-check.sh with args and returns its output and
// exit code.
func runFPCheck(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"fastpath-check.sh"}, args...)...)
	cmd.Dir = kitDir
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("fastpath-check.sh: %v", err)
	return "", -1
}

// TestFastPathCheck: the verdict on crafted scrapes of a transfer of
// 8 MiB (bound: 128 redirects; half: 4194304 bytes). Each case gives the
// exact line and exit code:
//   - carried: enough redirects, the VIF carried almost nothing, each
//     way (tx reads the VIF's TX BYTES, rx its RX BYTES);
//   - the bound exactly, and one short of it;
//   - not carried: the redirects grew but eipoibd's VIF carried the
//     bulk, or the redirects did not grow at all;
//   - a VIF made again (its count went down): its new count is what it
//     carried; a VIF absent from both scrapes carried 0;
//   - on, but the port reports no fast path counters;
//   - off with the counters absent or 0: PASS; off with any redirect,
//     before or after, either direction: FAIL.
func TestFastPathCheck(t *testing.T) {
	const n = 8 << 20
	tx := func(v uint64) map[string]uint64 {
		return map[string]uint64{"port_fast_path_tx_redirected": v, "port_fast_path_tx_unknown_guest": 3, "port_fast_path_rx_redirected": 5}
	}
	rx := func(v uint64) map[string]uint64 {
		return map[string]uint64{"port_fast_path_rx_redirected": v, "port_fast_path_tx_redirected": 1}
	}
	zero := map[string]uint64{"port_fast_path_rx_redirected": 0, "port_fast_path_tx_redirected": 0}
	for _, c := range []struct {
		name, setting, dir string
		before, after      string
		want               string
		code               int
	}{
		{"carried tx", "on", "tx", fpScrape(tx(10), []uint64{500, 9}), fpScrape(tx(4010), []uint64{1700, 9000000}),
			"PASS tx redirected +4000 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +1200 (half 4194304)\n", 0},
		{"carried rx", "on", "rx", fpScrape(rx(0), []uint64{9000000, 100}), fpScrape(rx(130), []uint64{99000000, 4194303}),
			"PASS rx redirected +130 (bound 128), VIF 02:00:00:00:0a:0b rx bytes +4194203 (half 4194304)\n", 0},
		{"bound exactly", "on", "tx", fpScrape(tx(0), []uint64{0, 0}), fpScrape(tx(128), []uint64{0, 0}),
			"PASS tx redirected +128 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +0 (half 4194304)\n", 0},
		{"one below the bound", "on", "tx", fpScrape(tx(0), []uint64{0, 0}), fpScrape(tx(127), []uint64{0, 0}),
			"FAIL redirected below the bound: tx redirected +127 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +0 (half 4194304)\n", 1},
		{"eipoibd carried the bulk", "on", "tx", fpScrape(tx(0), []uint64{100, 0}), fpScrape(tx(5000), []uint64{100 + n/2, 0}),
			"FAIL eipoibd carried the bulk: tx redirected +5000 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +4194304 (half 4194304)\n", 1},
		{"not redirected", "on", "rx", fpScrape(rx(7), []uint64{0, 0}), fpScrape(rx(7), []uint64{0, 9000000}),
			"FAIL redirected below the bound: rx redirected +0 (bound 128), VIF 02:00:00:00:0a:0b rx bytes +9000000 (half 4194304)\n", 1},
		{"VIF made again", "on", "tx", fpScrape(tx(0), []uint64{8000000, 0}), fpScrape(tx(200), []uint64{4194304, 0}),
			"FAIL eipoibd carried the bulk: tx redirected +200 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +4194304 (half 4194304)\n", 1},
		{"no VIF row", "on", "tx", fpScrape(tx(0), nil), fpScrape(tx(200), nil),
			"PASS tx redirected +200 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +0 (half 4194304)\n", 0},
		{"no fast path counters", "on", "rx", fpScrape(nil, []uint64{0, 0}), fpScrape(nil, []uint64{0, 0}),
			"FAIL no port_fast_path_rx_redirected after: eipoibd ran no fast path\n", 1},
		{"off, absent", "off", "tx", fpScrape(nil, []uint64{0, 0}), fpScrape(nil, []uint64{n, 0}),
			"PASS redirected tx 0, rx 0 (fast path off)\n", 0},
		{"off, zero", "off", "rx", fpScrape(zero, []uint64{0, 0}), fpScrape(zero, []uint64{0, n}),
			"PASS redirected tx 0, rx 0 (fast path off)\n", 0},
		{"off, redirected after", "off", "tx", fpScrape(nil, nil), fpScrape(map[string]uint64{"port_fast_path_rx_redirected": 0, "port_fast_path_tx_redirected": 2}, nil),
			"FAIL fast path off, yet port_fast_path_tx_redirected 2 (after)\n", 1},
		{"off, redirected before", "off", "tx", fpScrape(map[string]uint64{"port_fast_path_rx_redirected": 1}, nil), fpScrape(map[string]uint64{"port_fast_path_rx_redirected": 1}, nil),
			"FAIL fast path off, yet port_fast_path_rx_redirected 1 (before) port_fast_path_rx_redirected 1 (after)\n", 1},
		{"empty before", "on", "tx", "", fpScrape(tx(300), nil),
			"PASS tx redirected +300 (bound 128), VIF 02:00:00:00:0a:0b tx bytes +0 (half 4194304)\n", 0},
	} {
		got, code := fpCheck(t, c.setting, c.dir, n, c.before, c.after)
		if got != c.want || code != c.code {
			t.Errorf("%s: %q, exit %d; want %q, exit %d", c.name, got, code, c.want, c.code)
		}
	}
}

// TestFastPathCheckUsage: wrong arguments exit 3 with the usage, an
// unreadable scrape exits 3 naming it; neither prints a verdict.
func TestFastPathCheckUsage(t *testing.T) {
	f := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(f, []byte(fpScrape(nil, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"auto", "tx", fpGuestMAC, "1", f, f},
		{"on", "up", fpGuestMAC, "1", f, f},
		{"on", "tx", fpGuestMAC, "0", f, f},
		{"on", "tx", fpGuestMAC, "x", f, f},
		{"on", "tx", fpGuestMAC, "1", f},
	} {
		if got, code := runFPCheck(t, args...); code != 3 || !strings.HasPrefix(got, "usage: fastpath-check.sh") {
			t.Errorf("%v: %q, exit %d; want the usage, exit 3", args, got, code)
		}
	}
	if got, code := runFPCheck(t, "on", "tx", fpGuestMAC, "1", f, "/nonexistent"); code != 3 || got != "fastpath-check.sh: cannot read /nonexistent\n" {
		t.Errorf("unreadable scrape: %q, exit %d; want exit 3 naming it", got, code)
	}
}

// kitPerfRounds feeds perf.sh what a kit run on InfiniBand would measure:
// the kernel backend's checks and routed legs with the fast path off, on
// and auto (the routed leg's X>A1 transfer failing under on, its ping4
// measuring 0 under off), then the verbs backend's checks.
const kitPerfRounds = `
source perf.sh
CUR_B=kernel CUR_FP=off
perf_leg checks 0xffff
perf checks 0xffff ping4 0.080 ms
perf checks 0xffff "tcp A1>B1" 20.00 Gbit/s
perf_leg routed 0xffff
perf routed 0xffff "ping4 A1>X" 0.000 ms
perf routed 0xffff "tcp X>A1" 10.00 Gbit/s
CUR_FP=on
perf_leg checks 0xffff
perf checks 0xffff ping4 0.040 ms
perf checks 0xffff "tcp A1>B1" 35.00 Gbit/s
perf_leg routed 0xffff
perf routed 0xffff "ping4 A1>X" 0.050 ms
CUR_FP=auto
perf_leg checks 0xffff
CUR_B=verbs CUR_FP=n/a
perf_leg checks 0xffff
perf checks 0xffff ping4 0.030 ms
perf_block
`

// TestPerfBlock: the throughput and RTT block run.sh prints, exactly:
// a line per leg and setting in the order they ran, with what it
// measured ("nothing measured" for none), "fast path: n/a (verbs)" for
// a backend without one; then per leg and setting other than off the
// ratios to off of the figures both measured ("-" where off measured
// 0, "nothing to compare" where none), and none for verbs.
func TestPerfBlock(t *testing.T) {
	out, err := kitBash(kitPerfRounds)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	const want = `throughput and RTT per leg (tcp: iperf 2's server; ping: the mean RTT of the pairs):
  checks  0xffff  kernel  fast path: off          ping4 0.080 ms, tcp A1>B1 20.00 Gbit/s
  routed  0xffff  kernel  fast path: off          ping4 A1>X 0.000 ms, tcp X>A1 10.00 Gbit/s
  checks  0xffff  kernel  fast path: on           ping4 0.040 ms, tcp A1>B1 35.00 Gbit/s
  routed  0xffff  kernel  fast path: on           ping4 A1>X 0.050 ms
  checks  0xffff  kernel  fast path: auto         nothing measured
  checks  0xffff  verbs   fast path: n/a (verbs)  ping4 0.030 ms
  checks  0xffff  kernel  fast path on/off        ping4 0.50x, tcp A1>B1 1.75x
  routed  0xffff  kernel  fast path on/off        ping4 A1>X -
  checks  0xffff  kernel  fast path auto/off      nothing to compare
`
	if string(out) != want {
		t.Errorf("perf_block:\n%s\nwant:\n%s", out, want)
	}
}

// kitBash runs script with bash in the kit's directory.
func kitBash(script string) ([]byte, error) {
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = kitDir
	return cmd.CombinedOutput()
}

// TestPerfBlockEmpty: with no leg run, no block at all.
func TestPerfBlockEmpty(t *testing.T) {
	out, err := kitBash("source perf.sh; perf_block")
	if err != nil || len(out) != 0 {
		t.Errorf("perf_block with nothing measured: %q, %v; want nothing", out, err)
	}
}

// TestKitShellcheck: the kit's scripts are shellcheck clean, following
// what run.sh sources. Without shellcheck (scripts/deps.sh installs it)
// the test skips, or fails under EIPOIB_REQUIRE_NETNS=1 as the tools of
// the netns tests do.
func TestKitShellcheck(t *testing.T) {
	if _, err := exec.LookPath("shellcheck"); err != nil {
		if os.Getenv("EIPOIB_REQUIRE_NETNS") == "1" {
			t.Fatal("needs shellcheck (scripts/deps.sh installs it)")
		}
		t.Skip("needs shellcheck (scripts/deps.sh installs it)")
	}
	cmd := exec.Command("shellcheck", "-x", "run.sh", "perf.sh", "fastpath-check.sh")
	cmd.Dir = kitDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}
