package ipoib

import (
	"log/slog"
	"sync"
)

// EventKind says what an Event reports.
type EventKind uint8

// The kinds of port events.
const (
	// EventLink: the port's link state; Up says whether it is up (IB
	// PORT_ACTIVE, the parent interface's carrier, the simulated port's
	// down fault cleared).
	EventLink EventKind = iota + 1
	// EventPartitionMTU: partition PKey's IB MTU is now MTU (on
	// InfiniBand its broadcast group's, from the join:
	// ipoib_mcast_join_finish), as PartitionMTU reports it from now on.
	EventPartitionMTU
)

// String names the kind.
func (k EventKind) String() string {
	switch k {
	case EventLink:
		return "link"
	case EventPartitionMTU:
		return "partition_mtu"
	}
	return "unknown"
}

// LogValue logs the kind by its name in every log format (a JSON log
// would otherwise show the number).
func (k EventKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// Event is a change of a port's state, as Port.Events delivers it. Each
// event carries the state now, not a transition: an event may repeat a
// state the reader already has, and a reader acts on the state.
type Event struct {
	Kind EventKind
	// Up is the link state (EventLink).
	Up bool
	// PKey (full-membership bit set) and MTU, the partition's IB MTU
	// (2048 or 4096), for EventPartitionMTU.
	PKey PKey
	MTU  int
}

// eventKey names the state an Event reports: a later event of the same
// key supersedes an earlier one.
type eventKey struct {
	kind EventKind
	pkey PKey
}

func (e Event) key() eventKey {
	k := eventKey{kind: e.Kind}
	if e.Kind == EventPartitionMTU {
		k.pkey = e.PKey
	}
	return k
}

// EventBuffer is the capacity of the channel an EventQueue delivers on.
const EventBuffer = 16

// EventQueue is the Events channel of a backend, after wireguard-go's
// tun.Device.Events (tun/tun.go Event). In tun_linux.go, NativeTun's
// routineHackListener sends the state it finds at start,
// routineNetlinkListener sends EventUp, EventDown and EventMTUUpdate as
// RTM_NEWLINK reports them, and Close closes the channel.
//
// Unlike wireguard-go's, an event here carries the state, and a
// backend's calls never block. (wireguard-go's routines block on a
// reader that does not keep up, with plain sends on a channel of 5, and
// its EventMTUUpdate leaves the reader to ask MTU.) Events go into a
// buffered channel (EventBuffer). Once it is full they go into a queue
// that holds at most one event per state (the link; each partition's
// MTU), which a goroutine feeds to the channel as the reader frees room.
//
// A new event for a state whose event is still in that queue replaces it
// in place. So a reader that fell behind misses an intermediate state (a
// link that went down and up again before it read) but never the current
// one, and each state's events stay in order. A reader that keeps up
// with the buffer gets every event in the order sent. An event equal to
// the last one queued for its state is not queued again.
//
// NewEventQueue queues the current link state first; Close ends the
// delivery and closes the channel, dropping what was not read.
type EventQueue struct {
	out  chan Event
	wake chan struct{}
	done chan struct{}
	// start starts the delivery goroutine on the first Events call (a
	// port nobody reads has none), or closes out on Close before any.
	start sync.Once
	// ended is closed once out is.
	ended chan struct{}

	mu      sync.Mutex
	pending []Event            // waiting for room in out, oldest first, one per key
	busy    bool               // deliver holds an event taken from pending
	last    map[eventKey]Event // the last event queued per key
	closed  bool
}

// NewEventQueue returns a queue whose first event is the link state up.
// The first Events call starts the goroutine that delivers the events;
// Close ends it.
func NewEventQueue(up bool) *EventQueue {
	q := &EventQueue{
		out: make(chan Event, EventBuffer), wake: make(chan struct{}, 1),
		done: make(chan struct{}), ended: make(chan struct{}),
		last: make(map[eventKey]Event),
	}
	q.Send(Event{Kind: EventLink, Up: up})
	return q
}

// Events is the channel a backend's Port.Events returns.
func (q *EventQueue) Events() <-chan Event {
	q.start.Do(func() { go q.deliver() })
	return q.out
}

// Link queues the link state up.
func (q *EventQueue) Link(up bool) { q.Send(Event{Kind: EventLink, Up: up}) }

// PartitionMTU queues partition pkey's IB MTU.
func (q *EventQueue) PartitionMTU(pkey PKey, mtu int) {
	q.Send(Event{Kind: EventPartitionMTU, PKey: pkey.Full(), MTU: mtu})
}

// Send queues ev without blocking, replacing a queued event of the same
// state; it does nothing when ev repeats the last event queued for its
// state, or after Close.
func (q *EventQueue) Send(ev Event) {
	k := ev.key()
	q.mu.Lock()
	defer q.mu.Unlock()
	if last, ok := q.last[k]; q.closed || ok && last == ev {
		return
	}
	q.last[k] = ev
	if !q.busy && len(q.pending) == 0 {
		select {
		case q.out <- ev: // room in the buffer, nothing ahead of ev
			return
		default:
		}
	}
	for i := range q.pending {
		if q.pending[i].key() == k {
			q.pending[i] = ev
			return
		}
	}
	q.pending = append(q.pending, ev)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// deliver hands the queued events to out, oldest first, until Close.
func (q *EventQueue) deliver() {
	defer close(q.ended)
	defer close(q.out)
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-q.done:
				return
			}
		}
		ev := q.pending[0]
		q.pending = append(q.pending[:0], q.pending[1:]...)
		q.busy = true
		q.mu.Unlock()
		select {
		case q.out <- ev:
		case <-q.done:
			return
		}
		q.mu.Lock()
		q.busy = false
		q.mu.Unlock()
	}
}

// Close stops the queue: the channel is closed by the time Close returns
// (a reader still gets what its buffer holds, then the close), events
// queued past the buffer are dropped and later events ignored. Calling it
// again does nothing.
func (q *EventQueue) Close() {
	q.mu.Lock()
	again := q.closed
	q.closed = true
	q.mu.Unlock()
	if !again {
		close(q.done)
	}
	q.start.Do(func() { // never read: no goroutine to end
		close(q.out)
		close(q.ended)
	})
	<-q.ended
}
