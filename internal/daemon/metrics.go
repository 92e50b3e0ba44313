package daemon

// The metrics server: the shim's counters and the per-VIF families at
// /metrics, Go's profiles at /debug/pprof/ with --pprof.

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/eipoib/eipoibd/internal/metrics"
	"github.com/eipoib/eipoibd/internal/shim"
)

// serveMetrics serves the metrics at addr until the returned stop.
func serveMetrics(addr string, withPProf bool, sh *shim.Shim, log *slog.Logger) (stop func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(sh, shim.Families(), metrics.VIFs(sh.VIFs)))
	if withPProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	log.Info("serving metrics", "addr", ln.Addr().String())
	return srv.Close, nil
}
