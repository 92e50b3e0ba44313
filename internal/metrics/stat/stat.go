// Package stat describes the numbers of a counters snapshot (the map of
// name → value that `eipoibd stats` prints) for export. Each number has
// a kind, a running total or a level, and one line of help. The names
// that end in a label value (drop_<reason>) are declared as families. It
// has no dependencies, so that the packages that count (shim) declare
// their names without knowing Prometheus. internal/metrics turns
// described values into Prometheus metrics.
package stat

// Kind tells a running total from a level.
type Kind uint8

// The kinds.
const (
	// Total is a running total that only goes up: a Prometheus counter.
	Total Kind = iota
	// Level goes up and down (a table size, a queue depth): a gauge.
	Level
)

// String returns "total" or "level".
func (k Kind) String() string {
	if k == Level {
		return "level"
	}
	return "total"
}

// Value is one number of a snapshot with its description.
type Value struct {
	// Name is its snapshot name, e.g. "drop_runt".
	Name  string
	Value uint64
	Kind  Kind
	// Help is one line saying what is counted.
	Help string
	// End is the flow of frames this value is an outcome of, if any.
	End End
}

// End marks a value as one of the outcomes that together account for a
// flow of frames: each frame of the flow ends in exactly one of them.
type End uint8

// The flows.
const (
	// NoEnd: the value is no outcome of a flow.
	NoEnd End = iota
	// TxEnd: an outcome of a frame read from the TAP (tx_frames).
	TxEnd
	// RxEnd: an outcome of a packet read from the port (rx_packets).
	RxEnd
)

// Family declares the snapshot names Prefix+<value> as one metric,
// Name, whose last label takes <value>: drop_runt is drops{reason="runt"}
// when Prefix is "drop_", Name "drops" and Labels {"reason"}. Every
// value of a family has the same kind.
type Family struct {
	Prefix string
	// Name is the metric's name without the daemon's prefix and
	// without the _total a family of totals gets.
	Name string
	// Labels are the label names: every one but the last has its value
	// in Fixed, the last takes the rest of the snapshot name.
	Labels []string
	Fixed  []string
	// Help is the family's one line (the values' own lines document
	// the label values).
	Help string
}

// Match reports whether name is of f, and its last label's value.
func (f Family) Match(name string) (string, bool) {
	if len(name) <= len(f.Prefix) || name[:len(f.Prefix)] != f.Prefix {
		return "", false
	}
	return name[len(f.Prefix):], true
}

// Find returns the family of fams that name belongs to, the one with
// the longest prefix (port_drop_ before port_), and its label value.
func Find(fams []Family, name string) (Family, string, bool) {
	var best Family
	var rest string
	found := false
	for _, f := range fams {
		if r, ok := f.Match(name); ok && (!found || len(f.Prefix) > len(best.Prefix)) {
			best, rest, found = f, r, true
		}
	}
	return best, rest, found
}
