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

// TestFamily: a labeled family is served with its labels and type.
func TestFamily(t *testing.T) {
	f := NewFamily("vif_tx_packets", "frames from the guest", prometheus.CounterValue, []string{"mac", "vlan"},
		func() []Labeled { return []Labeled{{Labels: []string{"02:00:00:00:00:01", "10"}, Value: 5}} })
	h := Handler(func() map[string]uint64 { return nil }, func(string) bool { return false }, f)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{"# TYPE eipoibd_vif_tx_packets counter", `eipoibd_vif_tx_packets{mac="02:00:00:00:00:01",vlan="10"} 5`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}
