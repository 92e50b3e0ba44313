package shim

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// txFrame runs one frame through the TX path of a still shim, as the TX
// loop does, into batch b (flushed by the caller).
func txFrame(s *Shim, b *txBatch, frame []byte) {
	buf := make([]byte, devBufSize)
	copy(buf[devHeadroom:], frame)
	s.ctr.inc(TxFrames)
	s.tx(b, buf, len(frame), tap.Super{}, s.clk.Now())
	s.runIntents(nil) // the control goroutine's part: a new guest's VIF, joins
}

// rxPacket runs one IPoIB packet through the RX path of a still shim and
// returns the frame for the TAP, or nil.
func rxPacket(s *Shim, pkt []byte, m ipoib.RxMeta) []byte {
	buf := make([]byte, rxOffset+len(pkt)+64)
	copy(buf[rxOffset:], pkt)
	s.ctr.inc(RxPackets)
	return s.rx(buf, len(pkt), &m, s.clk.Now())
}

// readAll reads n packets from port p, failing after two seconds.
func readAll(t *testing.T, p *memfabric.Port, n int) []ipoib.RxMeta {
	t.Helper()
	done := make(chan []ipoib.RxMeta, 1)
	go func() {
		var got []ipoib.RxMeta
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 4200)
		}
		sizes, meta := make([]int, 64), make([]ipoib.RxMeta, 64)
		for len(got) < n {
			k, err := p.Read(bufs, sizes, meta, 64)
			if err != nil {
				break
			}
			got = append(got, meta[:k]...)
		}
		done <- got
	}()
	select {
	case got := <-done:
		if len(got) != n {
			t.Fatalf("read %d packets, want %d", len(got), n)
		}
		return got
	case <-time.After(testutil.Settle):
		t.Fatalf("fewer than %d packets arrived (port counters %+v)", n, p.Counters())
	}
	return nil
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
