// Package metrics exports a described counters snapshot as Prometheus
// metrics, named as https://prometheus.io/docs/practices/naming/ says. A
// running total is a counter named eipoibd_<name>_total (bytes end in
// _bytes_total). A level is a gauge named eipoibd_<name>. The names a
// family declares (drop_<reason>) are one metric with labels:
// eipoibd_drops_total{reason="runt"}. The help of a name is the line its
// owner declares. The snapshot names themselves, which `eipoibd stats`
// and the control socket show, are not changed by this package.
package metrics

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/eipoib/eipoibd/internal/metrics/stat"
)

// Prefix begins every metric name of the daemon.
const Prefix = "eipoibd_"

// Source is what the daemon exports: its snapshot, each value
// described.
type Source interface {
	Stats() []stat.Value
}

// Series is how one snapshot name appears in the exposition.
type Series struct {
	// Name is the metric's full name, e.g. eipoibd_drops_total.
	Name string
	// Help is the metric's help: the family's, or the value's own.
	Help string
	// Labels and Values are the label names and the name's values.
	Labels, Values []string
}

// String writes the series as the exposition does,
// eipoibd_drops_total{reason="runt"}.
func (s Series) String() string {
	var b strings.Builder
	b.WriteString(s.Name)
	for i, l := range s.Labels {
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(l + `="` + s.Values[i] + `"`)
	}
	if len(s.Labels) > 0 {
		b.WriteByte('}')
	}
	return b.String()
}

// SeriesOf names v for Prometheus: Prefix, its family's name and labels
// if it is of one of fams, else its own name, and _total if it is a
// total.
func SeriesOf(fams []stat.Family, v stat.Value) Series {
	s := Series{Name: v.Name, Help: v.Help}
	if f, rest, ok := stat.Find(fams, v.Name); ok {
		s = Series{Name: f.Name, Help: f.Help, Labels: f.Labels, Values: append(slices.Clone(f.Fixed), rest)}
	}
	s.Name = Prefix + s.Name
	if v.Kind == stat.Total {
		s.Name += "_total"
	}
	return s
}

// SnapshotName is SeriesOf's inverse: the snapshot name of the series
// with the given metric name and labels, or false if the name is not the
// daemon's. A reader of a scrape (the netns tests) uses it for the names
// `eipoibd stats` shows.
func SnapshotName(fams []stat.Family, name string, labels map[string]string) (string, bool) {
	base, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return "", false
	}
	base = strings.TrimSuffix(base, "_total")
	if len(labels) == 0 {
		return base, true
	}
	for _, f := range fams {
		if f.Name != base || len(labels) != len(f.Labels) {
			continue
		}
		fixed := true
		for i, v := range f.Fixed {
			fixed = fixed && labels[f.Labels[i]] == v
		}
		if last, ok := labels[f.Labels[len(f.Labels)-1]]; fixed && ok {
			return f.Prefix + last, true
		}
	}
	return "", false
}

// collector exports a Source whose names fall in fams. It is unchecked
// (it describes nothing): the names a port reports are known only once
// it reports them.
type collector struct {
	src  Source
	fams []stat.Family
}

func (collector) Describe(chan<- *prometheus.Desc) {}

// Collect takes one snapshot and sends each value under its series.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.src.Stats() {
		s := SeriesOf(c.fams, v)
		typ := prometheus.CounterValue
		if v.Kind == stat.Level {
			typ = prometheus.GaugeValue
		}
		d := prometheus.NewDesc(s.Name, s.Help, s.Labels, nil)
		ch <- prometheus.MustNewConstMetric(d, typ, float64(v.Value), s.Values...)
	}
}

// Handler returns an HTTP handler serving src's metrics, its names in
// the families fams, the extra collectors', the Go runtime's and the
// process's (process_start_time_seconds: a dashboard counts restarts
// by its changes).
func Handler(src Source, fams []stat.Family, extra ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{src, fams}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
		t.descs = append(t.descs, prometheus.NewDesc(Prefix+c.Name, c.Help, labels, nil))
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
