package daemon

// The metrics server: the shim's counters and the per-VIF families at
// /metrics, Go's profiles at /debug/pprof/ with --pprof.

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eipoib/eipoibd/internal/metrics"
	"github.com/eipoib/eipoibd/shim"
)

// serveMetrics serves the metrics at addr until the returned stop.
func serveMetrics(addr string, withPProf bool, sh *shim.Shim, log *slog.Logger) (stop func() error, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(sh.Counters, sh.IsGauge, vifMetrics(sh)...))
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

// vifMetrics are the per-VIF metric families: packets and bytes each way
// (eipoibd_vif_{tx,rx}_{packets,bytes}) and idle seconds, labeled by MAC,
// VLAN and origin, all from one listing of the VIFs a scrape.
func vifMetrics(sh *shim.Shim) []prometheus.Collector {
	cols := []metrics.Column{
		{Name: "vif_tx_packets", Help: "Frames from the guest", Type: prometheus.CounterValue},
		{Name: "vif_tx_bytes", Help: "Bytes of frames from the guest", Type: prometheus.CounterValue},
		{Name: "vif_rx_packets", Help: "IPoIB packets to the guest", Type: prometheus.CounterValue},
		{Name: "vif_rx_bytes", Help: "Bytes of IPoIB packets to the guest", Type: prometheus.CounterValue},
		{Name: "vif_idle_seconds", Help: "Time since the VIF last carried traffic", Type: prometheus.GaugeValue},
	}
	return []prometheus.Collector{metrics.NewTable([]string{"mac", "vlan", "origin"}, cols, func() []metrics.Row {
		vs := sh.VIFs()
		out := make([]metrics.Row, len(vs))
		for i, v := range vs {
			out[i] = metrics.Row{
				Labels: []string{v.MAC.String(), strconv.Itoa(int(v.VLAN)), v.Origin.String()},
				Values: []float64{float64(v.TxPackets), float64(v.TxBytes), float64(v.RxPackets), float64(v.RxBytes), v.Idle.Seconds()},
			}
		}
		return out
	})}
}
