package loops

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
)

func TestSet(t *testing.T) {
	s := New("eng", 3)
	var wg sync.WaitGroup
	boom := errors.New("boom")
	s.Go("rx", &wg, func() error { return fmt.Errorf("read: %w", net.ErrClosed) })
	s.Go("tx", &wg, func() error { return boom })
	s.Go("idle", &wg, func() error { return nil })
	wg.Wait()
	var errs []error
	for range 3 {
		if err := <-s.Done(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) != 1 || !errors.Is(errs[0], boom) || errs[0].Error() != "eng: tx: boom" {
		t.Fatalf("errors %v, want only eng: tx: boom (net.ErrClosed is a clean end)", errs)
	}
}
