package netns

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// The Prometheus files of deploy/, from this package's directory.
const (
	rulesDir  = "../../deploy/prometheus"
	dashboard = "../../deploy/grafana/eipoibd.json"
)

// TestPrometheusRules: deploy/prometheus/rules.yml passes "promtool
// check rules", and "promtool test rules rules_test.yml" (each alert
// fires on the series that should fire it, when it should, and on no
// other).
func TestPrometheusRules(t *testing.T) {
	require(t, "promtool")
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		cmd := exec.Command("promtool", args...)
		cmd.Dir = rulesDir
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// promSeries is one series of an instant query's result.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// promServer is a Prometheus started by startPrometheus, answering on
// 127.0.0.1:9090 of its namespace.
type promServer struct {
	ns     string
	client *http.Client
}

// startPrometheus starts Debian's prometheus in namespace ns with a
// private data directory, scraping targets under the job "eipoibd" every
// second and evaluating rules.yml every second; it is stopped at
// cleanup.
func startPrometheus(t *testing.T, ns string, targets []string) *promServer {
	t.Helper()
	nstestRequire(t, "prometheus")
	rules, err := filepath.Abs(filepath.Join(rulesDir, "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = fmt.Sprintf("%q", tg)
	}
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: eipoibd
    static_configs:
      - targets: [%s]
`, rules, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "prometheus", "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:9090")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", abridge(string(b), 20, 40))
		}
	})
	// The test's requests are dialled from inside the namespace.
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := nstest.DoErr(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &promServer{ns: ns, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial}}}
}

// query runs an instant query through the HTTP API (/api/v1/query) and
// returns its series; an expression Prometheus cannot parse or run is
// an error.
func (p *promServer) query(expr string) ([]promSeries, error) {
	resp, err := p.client.Get("http://127.0.0.1:9090/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSeries `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", expr, resp.Status, err)
	}
	if r.Status != "success" || r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: status %s, result type %q: %s", expr, r.Status, r.Data.ResultType, r.Error)
	}
	return r.Data.Result, nil
}

// waitFor polls the query until ok accepts its series, failing the test
// after a minute with the last answer.
func (p *promServer) waitFor(t *testing.T, expr string, ok func([]promSeries) bool) []promSeries {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := p.query(expr)
		if err == nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v, %v: not the state waited for", expr, s, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// byInstance returns each series' value by its instance label.
func byInstance(s []promSeries) map[string]string {
	m := map[string]string{}
	for _, x := range s {
		v, _ := x.Value[1].(string)
		m[x.Metric["instance"]] = v
	}
	return m
}

// sendRaw writes frames out of device dev of namespace ns through a raw
// packet socket: on a TAP, eipoibd reads them as frames from the host.
func sendRaw(t *testing.T, ns, dev string, frames ...[]byte) {
	t.Helper()
	nsDo(t, ns, func() {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		for _, b := range frames {
			if err := unix.Sendto(fd, b, 0, sa); err != nil {
				t.Fatalf("send %d-byte frame on %s: %v", len(b), dev, err)
			}
		}
	})
}

// grafanaDashboard is the part of a Grafana dashboard the test reads.
type grafanaDashboard struct {
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
			AllValue   string `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

var labelValues = regexp.MustCompile(`^label_values\((.+), instance\)$`)

// TestPrometheus: Debian's Prometheus, loading deploy/prometheus's
// rules, scrapes two running daemons (over addresses on the simulated
// fabric's underlay) that carried a ping and dropped frames:
//   - both targets are up: up returns exactly 2 series, both 1.
//   - the drops are there as counted. 5 frames of an ethertype IPoIB
//     does not carry into h1's TAP are
//     eipoibd_drops_total{reason="ethertype"} 5 on h1 and 0 on h2. A
//     1-byte datagram to h2's fabric port is one port drop of the reason
//     the fabric's decoder gives.
//   - every query of deploy/grafana/eipoibd.json parses and returns
//     series, its variables given the values of "All" and a range. It
//     returns each instance's, exactly one per daemon where the query has
//     one series per daemon. The drops panel has h1's ethertype series,
//     the port drops panel h2's reason only. The instance variable's
//     query returns exactly the 2 daemons.
//   - the recording rules give a series per daemon;
//   - after h2 restarts, the restarts panel's query says 1 for h2 and 0
//     for h1.
func TestPrometheus(t *testing.T) {
	require(t, "prometheus")
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	tp := newTopo(t, 2, true, "--metrics", ":9474")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	ul := tp.pfx + "ul"
	sh(t, in(ul, "ip", "addr", "add", "192.0.2.254/24", "dev", "ubr")...)
	var targets []string
	inst := map[*hypervisor]string{}
	for i, h := range tp.hvs {
		sh(t, in(h.ns, "ip", "addr", "add", fmt.Sprintf("192.0.2.%d/24", i+1), "dev", h.underlay)...)
		inst[h] = fmt.Sprintf("192.0.2.%d:9474", i+1)
		targets = append(targets, inst[h])
	}
	prom := startPrometheus(t, ul, targets)

	// Traffic, and drops of a known reason on each daemon.
	ping(t, h1.guests[0], h2.guests[0].ip4)
	frame := make([]byte, 100)
	copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0xee, 0, 0, 0, 1, 0x88, 0xb5}) // local experimental ethertype
	sendRaw(t, h1.ns, "eib0", frame, frame, frame, frame, frame)
	var portDrop string
	src, dst := h1.gid(t), h2.gid(t)
	nsDo(t, h1.ns, func() {
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: dst.AsSlice(), Port: simfabric.UDPPort, Zone: h1.underlay})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		garbage := []byte{0}
		s16, d16 := src.As16(), dst.As16()
		var p simfabric.Packet
		err = new(simfabric.Codec).Decode(garbage, &s16, &d16, uint16(c.LocalAddr().(*net.UDPAddr).Port), simfabric.UDPPort, &p)
		de, ok := err.(simfabric.DecodeError)
		if !ok {
			t.Fatalf("a 1-byte datagram decodes with %v", err)
		}
		portDrop = de.Drop().String()
		if _, err := c.Write(garbage); err != nil {
			t.Fatal(err)
		}
	})

	both := func(s []promSeries) bool {
		v := byInstance(s)
		return len(s) == 2 && v[inst[h1]] == "1" && v[inst[h2]] == "1"
	}
	prom.waitFor(t, `up{job="eipoibd"}`, both)
	prom.waitFor(t, `eipoibd_drops_total{job="eipoibd", reason="ethertype"}`, func(s []promSeries) bool {
		v := byInstance(s)
		return len(s) == 2 && v[inst[h1]] == "5" && v[inst[h2]] == "0"
	})
	prom.waitFor(t, fmt.Sprintf(`eipoibd_port_drops_total{job="eipoibd", reason=%q}`, portDrop), func(s []promSeries) bool {
		return len(s) == 1 && byInstance(s)[inst[h2]] == "1"
	})
	// Rate windows need two scrapes after the events: wait for the
	// recording rule of a rate to have both daemons.
	prom.waitFor(t, `instance:eipoibd_drops:rate5m`, func(s []promSeries) bool { return len(s) == 2 })

	// The dashboard's variables, as Grafana substitutes them for "All"
	// and a time range.
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$instance", ".*")
	queries := 0
	for _, v := range dash.Templating.List {
		if v.Name != "instance" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil || v.AllValue != ".*" {
			t.Fatalf("variable instance: definition %q, allValue %q: want label_values(SELECTOR, instance) and .*", v.Definition, v.AllValue)
		}
		s, err := prom.query(m[1])
		if err != nil || !both(s) {
			t.Errorf("variable instance: %s: %v, %v: want the 2 daemons", m[1], s, err)
		}
		queries++
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			expr := vars.Replace(tg.Expr)
			what := fmt.Sprintf("panel %q, query %s: %s", p.Title, tg.RefID, expr)
			s, err := prom.query(expr)
			if err != nil {
				t.Errorf("%s: %v", what, err)
				continue
			}
			var got []string
			for _, x := range s {
				got = append(got, x.Metric["instance"])
			}
			got = slices.Compact(slices.Sorted(slices.Values(got)))
			switch {
			case p.Title == "Port drops by reason":
				// Only h2's port dropped anything; a port counts a
				// reason from its first drop on.
				if len(s) != 1 || s[0].Metric["instance"] != inst[h2] || s[0].Metric["reason"] != portDrop {
					t.Errorf("%s: %v, want h2's %s only", what, s, portDrop)
				}
			case !strings.Contains(expr, "by (instance, ") && !strings.HasPrefix(expr, "topk("):
				// One series per daemon.
				if len(s) != 2 || !slices.Equal(got, targets) {
					t.Errorf("%s: %d series of %v, want exactly one per daemon, %v", what, len(s), got, targets)
				}
			default:
				// Series per daemon and label: every daemon has some.
				if !slices.Equal(got, targets) {
					t.Errorf("%s: series of %v, want some of each of %v", what, got, targets)
				}
			}
			if p.Title == "Drops by reason" && !slices.ContainsFunc(s, func(x promSeries) bool {
				return x.Metric["instance"] == inst[h1] && x.Metric["reason"] == "ethertype"
			}) {
				t.Errorf("%s: no series of h1's ethertype drops: %v", what, s)
			}
		}
	}
	if queries < 25 {
		t.Errorf("%d queries in the dashboard: the test read too few", queries)
	}

	// A restart of h2 shows in the restarts panel, and only for h2.
	restarts := ""
	for _, p := range dash.Panels {
		if p.Title == "Restarts" && len(p.Targets) == 1 {
			restarts = vars.Replace(p.Targets[0].Expr)
		}
	}
	if restarts == "" {
		t.Fatal("no Restarts panel with one query")
	}
	start := byInstance(prom.waitFor(t, `process_start_time_seconds{job="eipoibd"}`, func(s []promSeries) bool { return len(s) == 2 }))[inst[h2]]
	h2.stop(t, true)
	h2.start(t)
	prom.waitFor(t, fmt.Sprintf(`process_start_time_seconds{instance=%q}`, inst[h2]), func(s []promSeries) bool {
		return len(s) == 1 && byInstance(s)[inst[h2]] != start
	})
	s, err := prom.query(restarts)
	if v := byInstance(s); err != nil || len(s) != 2 || v[inst[h1]] != "0" || v[inst[h2]] != "1" {
		t.Errorf("%s after h2 restarted: %v, %v: want 0 for h1, 1 for h2", restarts, s, err)
	}
}
