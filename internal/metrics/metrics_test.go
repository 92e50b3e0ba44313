package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
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
