package iobuf

import "testing"

// TestBuffersApart: each buffer has the length and capacity asked for,
// starts zeroed, and writing one to its capacity leaves its neighbours
// untouched; Free unmaps once and is harmless again.
func TestBuffersApart(t *testing.T) {
	b, err := New(3, 5000)
	if err != nil {
		t.Fatal(err)
	}
	for i, buf := range b.Bufs {
		if len(buf) != 5000 || cap(buf) != 5000 {
			t.Fatalf("buffer %d: len %d cap %d, want 5000", i, len(buf), cap(buf))
		}
		for _, c := range buf {
			if c != 0 {
				t.Fatalf("buffer %d not zeroed", i)
			}
		}
	}
	for i := range b.Bufs[1] {
		b.Bufs[1][i] = 0xAA
	}
	if b.Bufs[0][4999] != 0 || b.Bufs[2][0] != 0 {
		t.Error("writing buffer 1 reached its neighbours")
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil || b.Bufs != nil {
		t.Errorf("second Free: %v, buffers %v", err, b.Bufs)
	}
}

// TestBadSize: no mapping for a count or size that is not positive.
func TestBadSize(t *testing.T) {
	for _, c := range [][2]int{{0, 10}, {10, 0}, {-1, 10}} {
		if _, err := New(c[0], c[1]); err == nil {
			t.Errorf("New(%d, %d) mapped", c[0], c[1])
		}
	}
}
