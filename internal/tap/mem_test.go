package tap

import "testing"

// TestMemWriteFull: a write to an in-memory device whose Sent queue has
// room for two of three frames queues the first two and returns 2, so
// the caller counts the third as refused.
func TestMemWriteFull(t *testing.T) {
	m := NewMem(2)
	defer m.Close()
	frames := [][]byte{{0, 1}, {0, 2}, {0, 3}}
	if n, err := m.Write(frames, 1); n != 2 || err != nil {
		t.Fatalf("Write of 3 frames to room for 2: %d, %v; want 2, nil", n, err)
	}
	for i := range 2 {
		if got := <-m.Sent(); len(got) != 1 || got[0] != byte(i+1) {
			t.Fatalf("frame %d sent as %v, want [%d]", i, got, i+1)
		}
	}
	if len(m.Sent()) != 0 {
		t.Fatalf("%d frames left on Sent, want 0", len(m.Sent()))
	}
}
