// Package metrics exports counters snapshots as Prometheus metrics: each
// name becomes eipoibd_<name>, a counter, or a gauge for the names the
// snapshot's owner says are levels (table sizes, queue depths).
package metrics

import (
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type collector struct {
	snapshot func() map[string]uint64
	isGauge  func(name string) bool
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.snapshot()
	names := make([]string, 0, len(snap))
	for k := range snap {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		typ := prometheus.CounterValue
		if c.isGauge(k) {
			typ = prometheus.GaugeValue
		}
		d := prometheus.NewDesc("eipoibd_"+k, "eipoibd "+k, nil, nil)
		ch <- prometheus.MustNewConstMetric(d, typ, float64(snap[k]))
	}
}

// Handler returns an HTTP handler serving the snapshot's metrics, plus the
// Go runtime's; isGauge tells the levels from the totals.
func Handler(snapshot func() map[string]uint64, isGauge func(name string) bool) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{snapshot, isGauge}, collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
