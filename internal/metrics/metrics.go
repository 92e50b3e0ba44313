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

// Handler returns an HTTP handler serving the snapshot's metrics, the
// extra collectors' and the Go runtime's; isGauge tells the levels from
// the totals.
func Handler(snapshot func() map[string]uint64, isGauge func(name string) bool, extra ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{snapshot, isGauge}, collectors.NewGoCollector())
	reg.MustRegister(extra...)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// Labeled is one metric of a labeled family: its label values and value.
type Labeled struct {
	Labels []string
	Value  float64
}

// Family is a collector of one labeled metric family, read at each
// scrape (e.g. per-VIF counters).
type Family struct {
	Desc  *prometheus.Desc
	Type  prometheus.ValueType
	Items func() []Labeled
}

// NewFamily describes eipoibd_<name> with the labels.
func NewFamily(name, help string, typ prometheus.ValueType, labels []string, items func() []Labeled) Family {
	return Family{Desc: prometheus.NewDesc("eipoibd_"+name, help, labels, nil), Type: typ, Items: items}
}

// Describe sends the family's description.
func (f Family) Describe(ch chan<- *prometheus.Desc) { ch <- f.Desc }

// Collect sends the family's current metrics.
func (f Family) Collect(ch chan<- prometheus.Metric) {
	for _, it := range f.Items() {
		ch <- prometheus.MustNewConstMetric(f.Desc, f.Type, it.Value, it.Labels...)
	}
}
