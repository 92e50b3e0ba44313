// Package loops runs the long-lived goroutines of a data-path engine
// (TX, RX, housekeeping). Each runs in a wait group of the caller's
// choice, so they can be stopped in stages. The first error among them
// comes on one channel, with net.ErrClosed, a clean shutdown, reported
// as nil.
package loops

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// Set is a set of loops. Create it with New.
type Set struct {
	prefix string
	errc   chan error
}

// New returns a set for up to n loops; their errors are prefixed with
// prefix, e.g. "shim".
func New(prefix string, n int) *Set { return &Set{prefix: prefix, errc: make(chan error, n)} }

// Go runs f in a goroutine counted in wg. Its error, wrapped as
// "prefix: name: err", or nil when it returned nil or net.ErrClosed, is
// sent on Done.
func (s *Set) Go(name string, wg *sync.WaitGroup, f func() error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := f()
		if errors.Is(err, net.ErrClosed) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("%s: %s: %w", s.prefix, name, err)
		}
		s.errc <- err
	}()
}

// Done yields each loop's result as it returns.
func (s *Set) Done() <-chan error { return s.errc }
