package warnlimit

import (
	"sync"
	"testing"
	"time"
)

// TestLimit: the first warning passes, the next within Interval are held
// back and counted, and the first after Interval passes and reports them.
func TestLimit(t *testing.T) {
	var w Limit
	t0 := time.Unix(1e6, 0)
	if !w.Allow(t0) {
		t.Fatal("first warning held back")
	}
	for i := range 3 {
		if w.Allow(t0.Add(time.Duration(i+1) * time.Second)) {
			t.Fatalf("warning %d within the interval let through", i+2)
		}
	}
	if w.Allow(t0.Add(Interval - time.Nanosecond)) {
		t.Fatal("warning just before the interval let through")
	}
	if !w.Allow(t0.Add(Interval)) {
		t.Fatal("warning after the interval held back")
	}
	if n := w.Suppressed(); n != 4 {
		t.Fatalf("suppressed %d, want 4", n)
	}
	if n := w.Suppressed(); n != 0 {
		t.Fatalf("suppressed %d after taking them, want 0", n)
	}
}

// TestLimitConcurrent: of many workers warning at once, exactly one is let
// through and the others are counted.
func TestLimitConcurrent(t *testing.T) {
	var w Limit
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	now := time.Unix(1e6, 0)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.Allow(now) {
				mu.Lock()
				passed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if passed != 1 || w.Suppressed() != 63 {
		t.Fatalf("%d let through, want 1 (and 63 held back)", passed)
	}
}
