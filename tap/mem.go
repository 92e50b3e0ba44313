package tap

import (
	"net"
	"sync"
	"sync/atomic"
)

// Mem is an in-memory Device for tests: Inject plays a guest sending a
// frame into the TAP, Sent yields the frames the shim wrote (what guests
// receive).
type Mem struct {
	in      chan []byte
	out     chan []byte
	done    chan struct{}
	once    sync.Once
	carrier atomic.Bool
}

var _ Device = (*Mem)(nil)

// NewMem returns an in-memory device with queues of n frames.
func NewMem(n int) *Mem {
	return &Mem{in: make(chan []byte, n), out: make(chan []byte, n), done: make(chan struct{})}
}

// Inject queues a frame for the shim to read.
func (m *Mem) Inject(frame []byte) { m.in <- append([]byte(nil), frame...) }

// Sent returns the channel of frames the shim wrote.
func (m *Mem) Sent() <-chan []byte { return m.out }

// Carrier reports the last SetCarrier.
func (m *Mem) Carrier() bool { return m.carrier.Load() }

// BatchSize is the largest batch per call.
func (m *Mem) BatchSize() int { return 16 }

// Read returns queued frames, blocking for the first.
func (m *Mem) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	var f []byte
	select {
	case f = <-m.in:
	case <-m.done:
		return 0, net.ErrClosed
	}
	n := 0
	for {
		sizes[n] = copy(bufs[n][offset:], f)
		n++
		if n == len(bufs) {
			return n, nil
		}
		select {
		case f = <-m.in:
		default:
			return n, nil
		}
	}
}

// Write queues copies of the frames on Sent; a full queue drops them.
func (m *Mem) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-m.done:
		return 0, net.ErrClosed
	default:
	}
	for _, b := range bufs {
		select {
		case m.out <- append([]byte(nil), b[offset:]...):
		default:
		}
	}
	return len(bufs), nil
}

// SetCarrier records the carrier state.
func (m *Mem) SetCarrier(up bool) error { m.carrier.Store(up); return nil }

// Close stops the device.
func (m *Mem) Close() error {
	m.once.Do(func() { close(m.done) })
	return nil
}
