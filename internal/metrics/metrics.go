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

// Column is one metric family of a Table, eipoibd_<Name>.
type Column struct {
	Name, Help string
	Type       prometheus.ValueType
}

// Row is one labeled item of a Table: its label values, and its value in
// each of the table's columns, in order.
type Row struct {
	Labels []string
	Values []float64
}

// Table is a collector of labeled metric families (its columns) that
// share their labels and are read from one snapshot per scrape: e.g. the
// per-VIF counters, all from one listing of the VIFs.
type Table struct {
	descs []*prometheus.Desc
	types []prometheus.ValueType
	rows  func() []Row
}

// NewTable describes the columns with the labels; rows is called once a
// scrape and must give len(cols) values a row.
func NewTable(labels []string, cols []Column, rows func() []Row) Table {
	t := Table{rows: rows}
	for _, c := range cols {
		t.descs = append(t.descs, prometheus.NewDesc("eipoibd_"+c.Name, c.Help, labels, nil))
		t.types = append(t.types, c.Type)
	}
	return t
}

// Describe sends the columns' descriptions.
func (t Table) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range t.descs {
		ch <- d
	}
}

// Collect takes one snapshot and sends every row's value of each column.
func (t Table) Collect(ch chan<- prometheus.Metric) {
	for _, r := range t.rows() {
		for i, d := range t.descs {
			ch <- prometheus.MustNewConstMetric(d, t.types[i], r.Values[i], r.Labels...)
		}
	}
}
