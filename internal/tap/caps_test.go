package tap

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// checkQueues checks that d's queues are n devices, the first d itself
// (or, for a TAP, its first queue), each with d's Caps and Counters and,
// unless it is d, returning itself alone as its queues.
func checkQueues(t *testing.T, d Device, n int) {
	t.Helper()
	qs := d.Queues()
	if len(qs) != n || qs[0] != d && !isFirstQueue(d, qs[0]) {
		t.Fatalf("%d queues %v, want %d, the first the device's own", len(qs), qs, n)
	}
	for i, q := range qs {
		if own := q.Queues(); q != d && (len(own) != 1 || own[0] != q) {
			t.Errorf("queue %d's queues: %v, want itself alone", i, own)
		}
		if q.Caps() != d.Caps() {
			t.Errorf("queue %d: caps %+v, the device's %+v", i, q.Caps(), d.Caps())
		}
		if got, want := slices.Sorted(maps.Keys(q.Counters())), slices.Sorted(maps.Keys(d.Counters())); !slices.Equal(got, want) {
			t.Errorf("queue %d: counters %v, the device's %v", i, got, want)
		}
	}
}

// isFirstQueue reports whether q is a TAP d's first queue, which its
// own Read, ReadSuper and Write use.
func isFirstQueue(d Device, q Device) bool {
	t, ok := d.(*TAP)
	return ok && q == Device(t.queues[0])
}

// TestMemCaps: the in-memory device hands super-frames over whole, keeps
// no counters, and gives its queues, the first itself.
func TestMemCaps(t *testing.T) {
	m := NewMemQueues(4, 3)
	defer m.Close()
	if !m.Caps().SuperFrames || m.Counters() != nil {
		t.Fatalf("caps %+v, counters %v", m.Caps(), m.Counters())
	}
	checkQueues(t, m, 3)
	checkQueues(t, NewMem(4), 1)
}

// TestTAPCaps: a real TAP with offloads hands super-frames over whole,
// one without does not; each gives its queues and its offload counters
// through every queue.
func TestTAPCaps(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("tapc%d", os.Getpid())
	nstest.Add(t, ns)
	nstest.Do(t, ns, func() {
		for _, c := range []struct {
			offload bool
			queues  int
		}{{true, 2}, {false, 1}} {
			tp, err := Create(Config{Name: "ctap0", MTU: 1500, Offload: c.offload, Queues: c.queues})
			if err != nil {
				t.Fatal(err)
			}
			if tp.Caps().SuperFrames != c.offload || len(tp.Counters()) == 0 {
				t.Errorf("offload %v: caps %+v, counters %v", c.offload, tp.Caps(), tp.Counters())
			}
			checkQueues(t, tp, c.queues)
			tp.Close()
		}
	})
}
