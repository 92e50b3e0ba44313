package parked

import (
	"sync"
	"testing"
	"time"
)

// blockOn takes mu and keeps it: a function the test finds on a stack.
func blockOn(mu *sync.Mutex) { mu.Lock() }

// TestOnMutex: a goroutine blocked taking a held mutex is found by its
// function's name; no goroutine is once the mutex is released.
func TestOnMutex(t *testing.T) {
	var mu sync.Mutex
	mu.Lock()
	done := make(chan struct{})
	go func() {
		blockOn(&mu)
		close(done)
	}()
	for !OnMutex("parked.blockOn") {
		time.Sleep(time.Millisecond)
	}
	if OnMutex("parked.nowhere") {
		t.Fatal("found a function no goroutine runs")
	}
	mu.Unlock()
	<-done
	if OnMutex("parked.blockOn") {
		t.Fatal("still found after the mutex was released")
	}
}
