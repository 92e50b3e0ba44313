package tap

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/gso"
)

// Mem is an in-memory Device for tests: Inject plays a guest sending a
// frame into the TAP (InjectSuper a TCP super-frame, as a guest with TSO
// does), Sent yields the frames the shim wrote (what guests receive).
// NewMemQueues makes one with several queues (Queue(i).Inject feeds
// queue i); they share Sent, the carrier and Close.
type Mem struct {
	in     chan memFrame
	seg    gso.Segmenter // a super-frame Read is cutting
	queues []*Mem
	*memShared
}

// memShared is what a Mem's queues share.
type memShared struct {
	out     chan []byte
	done    chan struct{}
	once    sync.Once
	carrier atomic.Bool
}

// memFrame is a frame queued for the shim, with how to cut it when it is
// a super-frame.
type memFrame struct {
	b []byte
	s Super
}

var _ Device = (*Mem)(nil)

// NewMem returns an in-memory device with queues of n frames.
func NewMem(n int) *Mem { return NewMemQueues(n, 1) }

// NewMemQueues returns an in-memory device with q queues of n frames.
func NewMemQueues(n, q int) *Mem {
	sh := &memShared{out: make(chan []byte, n), done: make(chan struct{})}
	m := &Mem{in: make(chan memFrame, n), memShared: sh}
	m.queues = []*Mem{m}
	for i := 1; i < q; i++ {
		m.queues = append(m.queues, &Mem{in: make(chan memFrame, n), memShared: sh})
	}
	return m
}

// Queue returns queue i, itself a Mem (0 is m).
func (m *Mem) Queue(i int) *Mem { return m.queues[i] }

// Queues returns the queues as devices (a queue other than the first
// returns itself alone).
func (m *Mem) Queues() []Device {
	if len(m.queues) == 0 {
		return []Device{m}
	}
	qs := make([]Device, len(m.queues))
	for i, q := range m.queues {
		qs[i] = q
	}
	return qs
}

// Caps reports super-frames: ReadSuper hands InjectSuper's whole.
func (m *Mem) Caps() Caps { return Caps{SuperFrames: true} }

// Counters is nil: the in-memory device keeps none.
func (m *Mem) Counters() map[string]uint64 { return nil }

// Inject queues a frame for the shim to read.
func (m *Mem) Inject(frame []byte) { m.in <- memFrame{b: append([]byte(nil), frame...)} }

// InjectSuper queues a TCP super-frame, its checksum field holding the
// pseudo-header sum as a TSO guest leaves it; Read cuts it as the TAP
// does, ReadSuper hands it over whole.
func (m *Mem) InjectSuper(frame []byte, s Super) {
	m.in <- memFrame{b: append([]byte(nil), frame...), s: s}
}

// Sent returns the channel of frames the shim wrote.
func (m *Mem) Sent() <-chan []byte { return m.out }

// Carrier reports the last SetCarrier.
func (m *Mem) Carrier() bool { return m.carrier.Load() }

// BatchSize is the largest batch per call.
func (m *Mem) BatchSize() int { return 16 }

// Read returns queued frames, blocking for the first; super-frames are
// cut into segments.
func (m *Mem) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return m.read(bufs, sizes, nil, offset)
}

// ReadSuper returns queued frames, super-frames whole.
func (m *Mem) ReadSuper(bufs [][]byte, sizes []int, super []Super, offset int) (int, error) {
	return m.read(bufs, sizes, super, offset)
}

func (m *Mem) read(bufs [][]byte, sizes []int, super []Super, offset int) (int, error) {
	n := 0
	for n < len(bufs) {
		if !m.seg.Done() {
			sizes[n] = m.seg.Cut(bufs[n][offset:])
			if super != nil {
				super[n] = Super{}
			}
			n++
			continue
		}
		var f memFrame
		if n == 0 {
			select {
			case f = <-m.in:
			case <-m.done:
				return 0, net.ErrClosed
			}
		} else {
			select {
			case f = <-m.in:
			default:
				return n, nil
			}
		}
		if f.s.L4 != 0 && super == nil {
			// Size is within the MTU already.
			if err := m.seg.StartL4(f.s.UDP, f.b, ether.Frame(f.b).HeaderLen(), int(f.s.L4), f.s.V6, int(f.s.Size), 1<<16); err != nil {
				panic("tap.Mem: the test injected a bad super-frame: " + err.Error())
			}
			continue
		}
		sizes[n] = copy(bufs[n][offset:], f.b)
		if super != nil {
			super[n] = f.s
		}
		n++
	}
	return n, nil
}

// Write queues copies of the frames on Sent and returns how many it
// queued: when Sent is full it takes no more, and the caller counts the
// rest as refused, as it does the frames a TAP refuses.
func (m *Mem) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-m.done:
		return 0, net.ErrClosed
	default:
	}
	for i, b := range bufs {
		select {
		case m.out <- append([]byte(nil), b[offset:]...):
		default:
			return i, nil
		}
	}
	return len(bufs), nil
}

// SetCarrier records the carrier state.
func (m *Mem) SetCarrier(up bool) error { m.carrier.Store(up); return nil }

// OperUp is the carrier: the in-memory device has no link watch.
func (m *Mem) OperUp() bool { return m.carrier.Load() }

// Close stops the device.
func (m *Mem) Close() error {
	m.once.Do(func() { close(m.done) })
	return nil
}
