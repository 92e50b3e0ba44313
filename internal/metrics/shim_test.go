package metrics

import (
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// levelPort is a port that reports a level and a stat beside its own
// counters, as the verbs and simulated ports do.
type levelPort struct{ ipoib.Port }

func (p levelPort) Counters() ipoib.PortCounters {
	c := p.Port.Counters()
	c.Levels = map[string]uint64{"address_handles": 7}
	c.Stats = map[string]uint64{"tx_trains": 3}
	return c
}

// newShim is a shim on an in-memory fabric, not running.
func newShim(t *testing.T) *shim.Shim {
	t.Helper()
	f, err := memfabric.New(2048)
	if err != nil {
		t.Fatal(err)
	}
	port, err := f.NewPort(testutil.GID("fe80::a"))
	if err != nil {
		t.Fatal(err)
	}
	sh, err := shim.New(shim.Config{Device: tap.NewMem(16), Port: levelPort{port}})
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

// labelValues returns the values of a family's label, sorted, one per
// metric.
func labelValues(mf *dto.MetricFamily, label string) []string {
	var out []string
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out = append(out, l.GetValue())
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestShimScrape scrapes a real shim's metrics:
//   - promlint finds no problem;
//   - every counter ends in _total and no gauge does;
//   - the drop reasons are one family, eipoibd_drops_total, whose reason
//     values are exactly the shim's drop_* counters;
//   - the rewrite refusals are one family by direction and reason;
//   - the levels are gauges;
//   - every family has real help;
//   - the scrape holds the snapshot, every name once.
func TestShimScrape(t *testing.T) {
	sh := newShim(t)
	rec := Handler(sh, shim.Families(), VIFs(sh.VIFs))
	body := scrapeHandler(t, rec)
	if probs := lint(t, collector{sh, shim.Families()}, body); len(probs) != 0 {
		t.Errorf("lint problems: %v", probs)
	}
	fams := families(t, body)
	for name, mf := range fams {
		if !strings.HasPrefix(name, Prefix) {
			continue
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case dto.MetricType_GAUGE:
			if strings.HasSuffix(name, "_total") {
				t.Errorf("gauge %s ends in _total", name)
			}
		default:
			t.Errorf("%s is a %v", name, mf.GetType())
		}
		if h := mf.GetHelp(); h == "" || strings.HasPrefix(h, "eipoibd ") {
			t.Errorf("%s has no real help: %q", name, h)
		}
		if slices.ContainsFunc([]string{"drop_", "port_drop_", "tx_rewrite_", "rx_rewrite_"}, func(p string) bool { return strings.HasPrefix(name, Prefix+p) }) {
			t.Errorf("%s is a drop or rewrite reason outside its family", name)
		}
	}

	snap := sh.Counters()
	var drops, rewrite []string
	for name := range snap {
		if r, ok := strings.CutPrefix(name, "drop_"); ok {
			drops = append(drops, r)
		}
		if r, ok := strings.CutPrefix(name, "tx_rewrite_"); ok {
			rewrite = append(rewrite, r)
		}
	}
	sort.Strings(drops)
	sort.Strings(rewrite)
	d := fams["eipoibd_drops_total"]
	if d == nil || d.GetType() != dto.MetricType_COUNTER {
		t.Fatalf("no counter eipoibd_drops_total: %v", d)
	}
	if got := labelValues(d, "reason"); !slices.Equal(got, drops) {
		t.Errorf("eipoibd_drops_total reasons %v, want the shim's drop counters %v", got, drops)
	}
	for _, r := range []string{"runt", "rx_bad_header", "tx_rewrite", "announce"} {
		if !slices.Contains(drops, r) {
			t.Errorf("no drop reason %q", r)
		}
	}
	rw := fams["eipoibd_rewrite_refused_total"]
	if rw == nil || len(rewrite) == 0 {
		t.Fatalf("no eipoibd_rewrite_refused_total, or no rewrite reasons in %v", rewrite)
	}
	for _, dir := range []string{"tx", "rx"} {
		var got []string
		for _, m := range rw.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["direction"] == dir {
				got = append(got, l["reason"])
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, rewrite) || !slices.Contains(got, "bad_checksum") {
			t.Errorf("rewrite refusals %s: reasons %v, want %v", dir, got, rewrite)
		}
	}
	for _, g := range []string{"vifs", "vifs_pending", "neighbours", "groups", "groups_send_only", "snooped_groups", "pending", "pending_frames", "port_address_handles"} {
		if mf := fams[Prefix+g]; mf == nil || mf.GetType() != dto.MetricType_GAUGE {
			t.Errorf("level %s is not the gauge %s: %v", g, Prefix+g, mf)
		}
	}
	for _, c := range []string{"tx_frames_total", "tx_bytes_total", "rx_bytes_total", "port_tx_bytes_total", "port_tx_trains_total", "groups_send_only_evicted_total"} {
		if mf := fams[Prefix+c]; mf == nil || mf.GetType() != dto.MetricType_COUNTER {
			t.Errorf("no counter %s: %v", Prefix+c, mf)
		}
	}

	seen := map[string]bool{}
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			sn, ok := SnapshotName(shim.Families(), name, l)
			if !ok {
				continue
			}
			if _, in := snap[sn]; !in || seen[sn] {
				t.Errorf("series %s%v is %s, which is not in the snapshot or seen twice", name, l, sn)
			}
			seen[sn] = true
		}
	}
	if len(seen) != len(snap) {
		t.Errorf("the scrape has %d of the snapshot's %d names", len(seen), len(snap))
	}
}

// TestFastPathFamily: the kernel backend's fast-path verdicts, which its
// port reports as fast_path_tx_<reason> and fast_path_rx_<reason>, are
// one counter family labelled by direction and reason, and read back to
// their snapshot names.
func TestFastPathFamily(t *testing.T) {
	fams := shim.Families()
	for _, c := range []struct{ name, series string }{
		{"port_" + kernelfabric.StatFastPathTX + fastpath.Redirected.String(), `eipoibd_fast_path_total{direction="tx",reason="redirected"}`},
		{"port_" + kernelfabric.StatFastPathRX + fastpath.RXFallbackUnknownSender.String(), `eipoibd_fast_path_total{direction="rx",reason="unknown_sender"}`},
	} {
		s := SeriesOf(fams, stat.Value{Name: c.name})
		if s.String() != c.series {
			t.Errorf("%s is exported as %s, want %s", c.name, s, c.series)
		}
		if back, ok := SnapshotName(fams, s.Name, map[string]string{s.Labels[0]: s.Values[0], s.Labels[1]: s.Values[1]}); !ok || back != c.name {
			t.Errorf("%s reads back as %q (%v), want %s", s, back, ok, c.name)
		}
	}
}
