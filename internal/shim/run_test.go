package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// flakyPort refuses its failAt-th Join and notes when a Read returns.
type flakyPort struct {
	*memfabric.Port
	joins, failAt int
	readEnded     atomic.Bool
}

func (p *flakyPort) Join(m ipoib.GID) error {
	if p.joins++; p.joins == p.failAt {
		return errors.New("join refused")
	}
	return p.Port.Join(m)
}

func (p *flakyPort) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	n, err := p.Port.Read(bufs, sizes, meta, offset)
	if err != nil {
		p.readEnded.Store(true)
	}
	return n, err
}

// TestRunLifetimes: a start-up join failure leaves the groups already
// joined; a normal Run returns only after its RX loop has ended.
func TestRunLifetimes(t *testing.T) {
	f := memFab(t, 2048)
	for _, failAt := range []int{2, 0} {
		mp, _ := f.NewPort(testutil.GID(fmt.Sprintf("fe80::%d", failAt+1)))
		port := &flakyPort{Port: mp, failAt: failAt}
		s, err := New(Config{Device: tap.NewMem(16), Port: port, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		bc := s.byVLAN[0].Load().bcast
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		if failAt == 0 {
			testutil.WaitFor(t, "the broadcast join", func() bool { return mp.Joined(bc) })
			cancel()
		}
		select {
		case err = <-done:
		case <-time.After(testutil.Settle):
			t.Fatal("Run did not return")
		}
		cancel()
		if failAt != 0 && (err == nil || mp.Joined(bc)) {
			t.Fatalf("failed start-up: err %v, broadcast group still joined %v", err, mp.Joined(bc))
		}
		if failAt == 0 && (err != nil || !port.readEnded.Load()) {
			t.Fatalf("Run returned %v before its RX loop ended (%v)", err, port.readEnded.Load())
		}
	}
}
