// Package metrics exports counters snapshots as Prometheus metrics: each
// name becomes eipoibd_<name>, a counter, except the table sizes, which
// are gauges.
package metrics

import (
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// gauges are the snapshot names that can go down.
var gauges = map[string]bool{"vifs": true, "neighbours": true, "groups": true, "pending": true}

type collector struct {
	snapshot func() map[string]uint64
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
		if gauges[k] {
			typ = prometheus.GaugeValue
		}
		d := prometheus.NewDesc("eipoibd_"+k, "eipoibd "+k, nil, nil)
		ch <- prometheus.MustNewConstMetric(d, typ, float64(snap[k]))
	}
}

// Handler returns an HTTP handler serving the snapshot's metrics, plus the
// Go runtime's.
func Handler(snapshot func() map[string]uint64) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{snapshot}, collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
