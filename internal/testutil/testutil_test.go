package testutil

import (
	"bytes"
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
)

// fatalT records a Fatal instead of ending the test.
type fatalT struct {
	testing.TB
	failed bool
}

func (t *fatalT) Fatal(args ...any) { t.failed = true }

// TestUnhex: every separator is skipped, and a string that is not hex
// fails the test.
func TestUnhex(t *testing.T) {
	got := Unhex(t, "45 00|0a\n\tff")
	if want := []byte{0x45, 0x00, 0x0a, 0xff}; !bytes.Equal(got, want) {
		t.Fatalf("Unhex: %x, want %x", got, want)
	}
	ft := &fatalT{TB: t}
	if Unhex(ft, "4g"); !ft.failed {
		t.Fatal("Unhex of 4g did not fail the test")
	}
}

// TestGID: the GID is the address's 16 bytes in network order.
func TestGID(t *testing.T) {
	want := ipoib.GID{0xfe, 0x80, 14: 0x12, 15: 0x34}
	if got := GID("fe80::1234"); got != want {
		t.Fatalf("GID: %x, want %x", got, want)
	}
}

// TestWaitFor: WaitFor returns once cond holds, having called it until
// then.
func TestWaitFor(t *testing.T) {
	calls := 0
	WaitFor(t, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}
