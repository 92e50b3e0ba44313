// Package parked lets a test wait until a goroutine is blocked on a
// mutex in a given function, without sleeping for a guessed time. From
// that point, a lock it waits for may be released, knowing the goroutine
// got there first.
package parked

import (
	"bytes"
	"runtime"
)

// OnMutex reports whether some goroutine is blocked in sync.Mutex.Lock
// (its status in a goroutine dump) with fn, a function name as a dump
// spells it (e.g. "kernelfabric.(*Port).waitBatch"), on its stack.
func OnMutex(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		if bytes.Contains(header, []byte("[sync.Mutex.Lock")) && bytes.Contains(g, []byte(fn+"(")) {
			return true
		}
	}
	return false
}
