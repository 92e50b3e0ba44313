package metrics

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/shim"
)

var update = flag.Bool("update", false, "rewrite the changelog's list of renamed metrics")

// The changelog's list of renamed metrics lies between these lines.
const (
	renameBegin = "<!-- metrics-rename:begin (go test ./internal/metrics -run TestChangelog -update) -->\n"
	renameEnd   = "<!-- metrics-rename:end -->\n"
)

// renames is the list of every metric's name before Prometheus naming
// (eipoibd_ and the snapshot name) and after: the shim's from its
// table, the per-VIF families, and the names a port or the TAP reports
// as the rule their families and kinds make.
func renames(t *testing.T) string {
	var b strings.Builder
	b.WriteString("| Before | After | What it counts |\n|---|---|---|\n")
	row := func(before, after, help string) {
		if before == after {
			fmt.Fprintf(&b, "| `%s` | unchanged | %s |\n", before, help)
			return
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", before, after, help)
	}
	fams := shim.Families()
	st := newShim(t).Stats()
	slices.SortFunc(st, func(a, b stat.Value) int { return strings.Compare(a.Name, b.Name) })
	fixedPort := []string{"port_tx_packets", "port_tx_bytes", "port_rx_packets", "port_rx_bytes"}
	for _, v := range st {
		if strings.HasPrefix(v.Name, "port_") && !slices.Contains(fixedPort, v.Name) {
			continue // the test port's own: the rules below
		}
		row(Prefix+v.Name, SeriesOf(fams, v).String(), v.Help)
	}
	for _, c := range vifColumns {
		row(Prefix+strings.TrimSuffix(c.Name, "_total")+"{…}", Prefix+c.Name+"{…}", c.Help)
	}
	for _, f := range fams {
		if strings.HasPrefix(f.Prefix, "port_") || strings.HasPrefix(f.Prefix, "tap_") {
			row(Prefix+f.Prefix+"<reason>", SeriesOf(fams, stat.Value{Name: f.Prefix + "<reason>"}).String(), f.Help)
		}
	}
	row(Prefix+"port_<counter>", SeriesOf(fams, stat.Value{Name: "port_<counter>"}).String(), "A total the fabric port counts (see its backend's section)")
	row(Prefix+"port_<level>", SeriesOf(fams, stat.Value{Name: "port_<level>", Kind: stat.Level}).String(), "A level the fabric port reports (see its backend's section)")
	row(Prefix+"tap_<counter>", SeriesOf(fams, stat.Value{Name: "tap_<counter>"}).String(), "The TAP's offload counters")
	return b.String()
}

// TestChangelog: the changelog's list of renamed metrics is the one the
// table makes, complete and exact (-update rewrites it).
func TestChangelog(t *testing.T) {
	const readme = "../../CHANGELOG.md"
	text, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(text), renameBegin)
	_, after, ok2 := strings.Cut(rest, renameEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s has no %q … %q", readme, renameBegin, renameEnd)
	}
	want := renames(t)
	if *update {
		if err := os.WriteFile(readme, []byte(before+renameBegin+want+renameEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got, _, _ := strings.Cut(rest, renameEnd); got != want {
		t.Errorf("the changelog's renamed metrics are not the table's; run go test ./internal/metrics -run TestChangelog -update. Want:\n%s", want)
	}
}
