package metrics

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/internal/shim"
)

// fakeSource is a Source with fixed values.
type fakeSource []stat.Value

func (f fakeSource) Stats() []stat.Value { return f }

var testFamilies = []stat.Family{
	{Prefix: "drop_", Name: "drops", Labels: []string{"reason"}, Help: "Dropped, by reason"},
	{Prefix: "tx_rewrite_", Name: "rewrite_refused", Labels: []string{"direction", "reason"}, Fixed: []string{"tx"}, Help: "Refused, by direction and reason"},
	{Prefix: "rx_rewrite_", Name: "rewrite_refused", Labels: []string{"direction", "reason"}, Fixed: []string{"rx"}, Help: "Refused, by direction and reason"},
	{Prefix: "port_", Name: "port_other", Labels: []string{"name"}, Help: "Never the family of port_drop_*"},
	{Prefix: "port_drop_", Name: "port_drops", Labels: []string{"reason"}, Help: "Port drops, by reason"},
}

var testSource = fakeSource{
	{Name: "tx_frames", Value: 7, Help: "Frames read"},
	{Name: "tx_bytes", Value: 700, Help: "Bytes read"},
	{Name: "vifs", Value: 2, Kind: stat.Level, Help: "VIFs"},
	{Name: "drop_runt", Value: 1, Help: "Runts"},
	{Name: "drop_rx_bad_header", Value: 3, Help: "Bad headers"},
	{Name: "tx_rewrite_truncated", Value: 4, Help: "TX truncated"},
	{Name: "rx_rewrite_truncated", Value: 5, Help: "RX truncated"},
	{Name: "port_drop_bad_icrc", Value: 6, Help: "Bad ICRC"},
}

// scrape serves one scrape of testSource's metrics and the collectors'.
func scrape(t *testing.T, c ...prometheus.Collector) []byte {
	t.Helper()
	return scrapeHandler(t, Handler(testSource, testFamilies, c...))
}

// scrapeHandler serves one scrape of h and returns the exposition.
func scrapeHandler(t *testing.T, h http.Handler) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	body, _ := io.ReadAll(rec.Body)
	return body
}

// TestHandler: totals are counters named _total (bytes _bytes_total),
// and levels gauges without it. The names of a family are one metric
// with the name's rest as its last label. The longest prefix wins:
// port_drop_bad_icrc is a port drop, not one of port_. Help is the
// family's, or the value's own.
func TestHandler(t *testing.T) {
	body := string(scrape(t))
	for _, want := range []string{
		"# HELP eipoibd_tx_frames_total Frames read", "# TYPE eipoibd_tx_frames_total counter", "eipoibd_tx_frames_total 7",
		"# TYPE eipoibd_tx_bytes_total counter", "eipoibd_tx_bytes_total 700",
		"# HELP eipoibd_vifs VIFs", "# TYPE eipoibd_vifs gauge", "eipoibd_vifs 2",
		"# HELP eipoibd_drops_total Dropped, by reason", "# TYPE eipoibd_drops_total counter",
		`eipoibd_drops_total{reason="runt"} 1`, `eipoibd_drops_total{reason="rx_bad_header"} 3`,
		"# HELP eipoibd_rewrite_refused_total Refused, by direction and reason",
		`eipoibd_rewrite_refused_total{direction="tx",reason="truncated"} 4`,
		`eipoibd_rewrite_refused_total{direction="rx",reason="truncated"} 5`,
		`eipoibd_port_drops_total{reason="bad_icrc"} 6`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	for _, gone := range []string{"eipoibd_drop_runt", "eipoibd_tx_frames ", "eipoibd_vifs_total", "eipoibd_port_other"} {
		if strings.Contains(body, gone) {
			t.Errorf("metrics have %q:\n%s", gone, body)
		}
	}
}

// TestProcessMetrics: the process's start time is served, so that a
// restart shows (the dashboard's restarts panel counts its changes).
func TestProcessMetrics(t *testing.T) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(scrape(t)))
	if err != nil {
		t.Fatal(err)
	}
	f := families["process_start_time_seconds"]
	if f == nil || len(f.Metric) != 1 || f.Metric[0].GetGauge().GetValue() < float64(time.Now().Add(-time.Hour).Unix()) {
		t.Fatalf("process_start_time_seconds: %v, want one gauge, this process's start", f)
	}
}

// TestSnapshotName: SnapshotName gives back the snapshot name of every
// series SeriesOf makes, and refuses what is not the daemon's.
func TestSnapshotName(t *testing.T) {
	for _, v := range testSource {
		s := SeriesOf(testFamilies, v)
		labels := map[string]string{}
		for i, l := range s.Labels {
			labels[l] = s.Values[i]
		}
		if got, ok := SnapshotName(testFamilies, s.Name, labels); !ok || got != v.Name {
			t.Errorf("SnapshotName(%s) = %q, %v, want %q", s, got, ok, v.Name)
		}
	}
	for _, bad := range []struct {
		name   string
		labels map[string]string
	}{
		{"go_goroutines", nil},
		{"eipoibd_drops_total", map[string]string{"why": "runt"}},
		{"eipoibd_rewrite_refused_total", map[string]string{"direction": "up", "reason": "truncated"}},
		{"eipoibd_unknown_total", map[string]string{"reason": "x"}},
	} {
		if got, ok := SnapshotName(testFamilies, bad.name, bad.labels); ok {
			t.Errorf("SnapshotName(%s, %v) = %q, want none", bad.name, bad.labels, got)
		}
	}
}

// TestTable: each column is served as a family with the rows' labels
// and its type, all from one snapshot per scrape.
func TestTable(t *testing.T) {
	calls := 0
	tb := NewTable([]string{"mac", "vlan"}, []Column{
		{Name: "vif_tx_packets_total", Help: "frames from the guest", Type: prometheus.CounterValue},
		{Name: "vif_idle_seconds", Help: "idle time", Type: prometheus.GaugeValue},
	}, func() []Row {
		calls++
		return []Row{
			{Labels: []string{"02:00:00:00:00:01", "10"}, Values: []float64{5, 1.5}},
			{Labels: []string{"02:00:00:00:00:02", "0"}, Values: []float64{9, 0}},
		}
	})
	body := string(scrape(t, tb))
	for _, want := range []string{
		"# TYPE eipoibd_vif_tx_packets_total counter", `eipoibd_vif_tx_packets_total{mac="02:00:00:00:00:01",vlan="10"} 5`,
		`eipoibd_vif_tx_packets_total{mac="02:00:00:00:00:02",vlan="0"} 9`,
		"# TYPE eipoibd_vif_idle_seconds gauge", `eipoibd_vif_idle_seconds{mac="02:00:00:00:00:01",vlan="10"} 1.5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if calls != 1 {
		t.Errorf("a scrape took %d snapshots of the rows, want 1", calls)
	}
}

// families parses an exposition.
func families(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, body)
	}
	return fams
}

// lint returns promlint's problems with a collector's metrics and with
// a whole scrape (the Go runtime's and the extra collectors' included).
func lint(t *testing.T, c prometheus.Collector, body []byte) []promlint.Problem {
	t.Helper()
	probs, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	more, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	return append(probs, more...)
}

// TestLint: the names the scheme makes pass promlint, the checks
// `promtool check metrics` makes; and a name that breaks the naming
// rules is caught (the lint can fail).
func TestLint(t *testing.T) {
	vifs := VIFs(func() []shim.VIFInfo { return []shim.VIFInfo{{VLAN: 10, Idle: time.Second}} })
	if probs := lint(t, collector{testSource, testFamilies}, scrape(t, vifs)); len(probs) != 0 {
		t.Errorf("lint problems: %v", probs)
	}
	bad := fakeSource{{Name: "queue_depth_total", Kind: stat.Level, Help: "a level named as a total"}}
	if probs, err := testutil.CollectAndLint(collector{bad, nil}); err != nil || len(probs) == 0 {
		t.Errorf("a gauge named _total: problems %v, err %v; want one", probs, err)
	}
}
