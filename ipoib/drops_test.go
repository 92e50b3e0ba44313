package ipoib

import (
	"sync"
	"testing"
)

// TestDropNames: every reason has its own non-empty name, and the names
// the backends counted under before the shared enum are kept.
func TestDropNames(t *testing.T) {
	seen := map[string]Drop{}
	for d := range NumDrops {
		n := d.String()
		if n == "" || n == "unknown" {
			t.Fatalf("reason %d has no name", d)
		}
		if o, dup := seen[n]; dup {
			t.Fatalf("reasons %d and %d share the name %q", o, d, n)
		}
		seen[n] = d
	}
	for d, want := range map[Drop]string{
		DropBadMeta: "bad_meta", DropPKey: "pkey_mismatch", DropUnknownQPN: "unknown_qpn",
		DropNotJoined: "not_joined", DropNoCarrier: "child_no_carrier", DropAHPending: "ah_pending_full",
		DropBadICRC: "bad_icrc", DropRxOverflow: "rx_queue_overflow", DropBadDestQPN: "bad_dest_qpn",
	} {
		if d.String() != want {
			t.Errorf("%d is %q, want %q", d, d.String(), want)
		}
	}
	if NumDrops.String() != "unknown" {
		t.Fatalf("out of range: %q", NumDrops.String())
	}
}

// TestDropCounters: concurrent adds are all counted, the snapshot holds
// the non-zero reasons by name only, and DropNone is never counted.
func TestDropCounters(t *testing.T) {
	var c DropCounters
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Add(DropBadMeta)
				c.Add(DropNone)
			}
		})
	}
	wg.Wait()
	c.AddN(DropOversize, 5)
	c.AddN(NumDrops, 5)
	s := c.Snapshot()
	if len(s) != 2 || s["bad_meta"] != 8000 || s["oversize"] != 5 || c.Load(DropBadMeta) != 8000 || c.Load(DropNone) != 0 {
		t.Fatalf("snapshot %v", s)
	}
}

// BenchmarkDropCountersAdd: counting a drop allocates nothing.
func BenchmarkDropCountersAdd(b *testing.B) {
	var c DropCounters
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Add(DropPKey)
		}
	})
}
