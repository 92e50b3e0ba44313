package shim

import (
	"errors"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/tap"
)

// partialDev is an in-memory TAP whose Write takes the first two frames
// of a batch and then fails, as tap.Queue.Write does when its queue is
// closed in the middle of a batch: it returns the two with the error.
type partialDev struct{ *tap.Mem }

func (d partialDev) Write(bufs [][]byte, offset int) (int, error) {
	n, _ := d.Mem.Write(bufs[:min(2, len(bufs))], offset)
	return n, errors.New("partialDev: write failed after two frames")
}

func (d partialDev) Queues() []tap.Device { return []tap.Device{d} }

// TestTAPWritePartial: four received frames are written to a TAP that
// takes two and then fails. The two written count as rx_frames (and
// their bytes as rx_bytes), only the other two as drop_tap_write. Of
// four of the shim's own frames, two count as drop_local_tap_write.
func TestTAPWritePartial(t *testing.T) {
	f, err := memfabric.New(2048)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := stillShim(t, f, "fe80::a", func(c *Config) { c.Device = partialDev{tap.NewMem(16)} })
	const frameLen = 60
	frames := make([][]byte, 4)
	for i := range frames {
		frames[i] = make([]byte, tap.Headroom+frameLen)
	}
	s.writeQueues([][][]byte{frames})
	if rx, b, d := s.Get(RxFrames), s.Get(RxBytes), s.Get(DropTAPWrite); rx != 2 || b != 2*frameLen || d != 2 {
		t.Fatalf("rx_frames %d (%d bytes), drop_tap_write %d; want 2 (%d bytes), 2", rx, b, d, 2*frameLen)
	}
	s.writeLocal(frames)
	if d := s.Get(DropLocalTAPWrite); d != 2 {
		t.Fatalf("drop_local_tap_write %d, want 2", d)
	}
}
