package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestHandler(t *testing.T) {
	h := Handler(func() map[string]uint64 { return map[string]uint64{"tx_frames": 7, "vifs": 2} }, func(n string) bool { return n == "vifs" })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{"# TYPE eipoibd_tx_frames counter", "eipoibd_tx_frames 7", "# TYPE eipoibd_vifs gauge", "eipoibd_vifs 2"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// TestTable: each column is served as a family with the rows' labels
// and its type, all from one snapshot per scrape.
func TestTable(t *testing.T) {
	calls := 0
	tb := NewTable([]string{"mac", "vlan"}, []Column{
		{Name: "vif_tx_packets", Help: "frames from the guest", Type: prometheus.CounterValue},
		{Name: "vif_idle_seconds", Help: "idle time", Type: prometheus.GaugeValue},
	}, func() []Row {
		calls++
		return []Row{
			{Labels: []string{"02:00:00:00:00:01", "10"}, Values: []float64{5, 1.5}},
			{Labels: []string{"02:00:00:00:00:02", "0"}, Values: []float64{9, 0}},
		}
	})
	h := Handler(func() map[string]uint64 { return nil }, func(string) bool { return false }, tb)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		"# TYPE eipoibd_vif_tx_packets counter", `eipoibd_vif_tx_packets{mac="02:00:00:00:00:01",vlan="10"} 5`,
		`eipoibd_vif_tx_packets{mac="02:00:00:00:00:02",vlan="0"} 9`,
		"# TYPE eipoibd_vif_idle_seconds gauge", `eipoibd_vif_idle_seconds{mac="02:00:00:00:00:01",vlan="10"} 1.5`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if calls != 1 {
		t.Errorf("a scrape took %d snapshots of the rows, want 1", calls)
	}
}
