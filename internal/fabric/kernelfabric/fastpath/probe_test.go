package fastpath

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestProbe: this kernel (6.18, tcx and every helper the programs call)
// passes the probe, as root.
func TestProbe(t *testing.T) {
	nstest.RequireRoot(t)
	if err := Probe(); err != nil {
		t.Fatalf("Probe on this kernel: %v", err)
	}
}

// TestMode: each mode parses back from its name, and nothing else parses.
func TestMode(t *testing.T) {
	for _, m := range []Mode{Off, Auto, On} {
		got, ok := ParseMode(m.String())
		if !ok || got != m || !m.Valid() {
			t.Errorf("ParseMode(%q) = %v, %v; Valid %v", m.String(), got, ok, m.Valid())
		}
	}
	for _, s := range []string{"", "ON", "true", "mode(3)"} {
		if m, ok := ParseMode(s); ok {
			t.Errorf("ParseMode(%q) = %v, want refused", s, m)
		}
	}
	if m := Mode(3); m.Valid() || m.String() != "Mode(3)" {
		t.Errorf("Mode(3): Valid %v, String %q", m.Valid(), m.String())
	}
}
