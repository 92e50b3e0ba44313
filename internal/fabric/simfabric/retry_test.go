package simfabric

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// script is a fake send: it answers with errs in turn (nil: sent, 1
// message), then with last; pauses records the pauses asked for. Its
// clock starts at an arbitrary time and moves only in a pause, by the
// pause asked for and over more (a sleep that wakes late).
type script struct {
	errs   []error
	last   error
	calls  int
	pauses []time.Duration
	clock  time.Time
	over   time.Duration
}

func (s *script) sys(uintptr) (int, error) {
	s.calls++
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		if err == nil {
			return 1, nil
		}
		return 0, err
	}
	if s.last == nil {
		return 1, nil
	}
	return 0, s.last
}

func (s *script) pause(_ uintptr, _ refusal, d time.Duration) {
	s.pauses = append(s.pauses, d)
	s.clock = s.clock.Add(d + s.over)
}

func (s *script) now() time.Time { return s.clock }

func (s *script) retrier() *retrier {
	s.clock = time.Unix(1_000_000, 0)
	return &retrier{sys: s.sys, pause: s.pause, now: s.now, budget: &budget{}}
}

// A refusal that may pass (EAGAIN, ENOBUFS) is tried again after pauses
// of 100 µs, then twice the last; the send that then goes is counted as
// passed, every refusal under its errno.
func TestRetryPassingRefusal(t *testing.T) {
	s := &script{errs: []error{unix.EAGAIN, unix.ENOBUFS, unix.EAGAIN}}
	r := s.retrier()
	r.allow(sendPatience)
	if n, err := r.retry(0); n != 1 || err != nil {
		t.Fatalf("retry: %d, %v; want 1 sent", n, err)
	}
	if want := []time.Duration{100 * time.Microsecond, 200 * time.Microsecond, 400 * time.Microsecond}; !slices.Equal(s.pauses, want) || s.calls != 4 {
		t.Fatalf("pauses %v in %d calls, want %v in 4", s.pauses, s.calls, want)
	}
	if a, nb, p := r.refused[refusedAgain].Load(), r.refused[refusedNoBufs].Load(), r.passed.Load(); a != 2 || nb != 1 || p != 1 {
		t.Fatalf("refused eagain %d enobufs %d, passed %d; want 2, 1, 1", a, nb, p)
	}
}

// A refusal that lasts pauses until sendPatience has passed on the clock
// since its first refusal, each pause the next backoff cut to the time
// left. Then it returns its error. The sends after it until the next
// allow do not pause. With pauses that take what they ask, they sum to
// the patience. With pauses that wake 300 µs late, the time left shrinks
// by what each took, not by what it asked: 100+300, 200+300, 400+300 µs
// leave 400 µs for the fourth, and none after it.
func TestRetryBound(t *testing.T) {
	µs := time.Microsecond
	for _, c := range []struct {
		over time.Duration
		want []time.Duration
	}{
		{0, []time.Duration{100 * µs, 200 * µs, 400 * µs, 800 * µs, 500 * µs}},
		{300 * µs, []time.Duration{100 * µs, 200 * µs, 400 * µs, 400 * µs}},
	} {
		s := &script{last: unix.ENOBUFS, over: c.over}
		r := s.retrier()
		r.allow(sendPatience)
		start := s.clock
		if _, err := r.retry(0); !errors.Is(err, unix.ENOBUFS) {
			t.Fatalf("over %v: retry: %v, want ENOBUFS once the patience is spent", c.over, err)
		}
		if !slices.Equal(s.pauses, c.want) || s.calls != len(c.want)+1 {
			t.Fatalf("over %v: pauses %v in %d calls, want %v in %d", c.over, s.pauses, s.calls, c.want, len(c.want)+1)
		}
		if spent, last := s.clock.Sub(start), s.pauses[len(s.pauses)-1]+c.over; spent < sendPatience || spent-last >= sendPatience {
			t.Fatalf("over %v: paused %v, want the patience %v reached by the last pause", c.over, spent, sendPatience)
		}
		s.pauses, s.calls = nil, 0
		if _, err := r.retry(0); !errors.Is(err, unix.ENOBUFS) || len(s.pauses) != 0 || s.calls != 1 {
			t.Fatalf("over %v: next send: %v after %d calls and pauses %v; want ENOBUFS at once", c.over, err, s.calls, s.pauses)
		}
		if got, want := r.refused[refusedNoBufs].Load(), uint64(len(c.want)+2); got != want || r.passed.Load() != 0 {
			t.Fatalf("over %v: refused enobufs %d, passed %d; want %d and 0", c.over, got, r.passed.Load(), want)
		}
		// The next allow's deadline counts from its own first refusal.
		r.allow(sendPatience)
		s.errs, s.last = []error{unix.EAGAIN}, nil
		if n, err := r.retry(0); n != 1 || err != nil || !slices.Equal(s.pauses, []time.Duration{100 * µs}) {
			t.Fatalf("over %v: after allow: %d, %v, pauses %v; want sent after one pause of 100µs", c.over, n, err, s.pauses)
		}
	}
}

// A refusal that cannot pass in a TX worker's wait (EINVAL: no
// neighbour entry; anything else) is returned at once, counted under
// its errno.
func TestRetryNotPassing(t *testing.T) {
	for _, c := range []struct {
		err error
		r   refusal
	}{{unix.EINVAL, refusedInval}, {unix.ENETUNREACH, refusedOther}, {errors.New("no errno"), refusedOther}} {
		s := &script{last: c.err}
		r := s.retrier()
		r.allow(sendPatience)
		if _, err := r.retry(0); err != c.err || s.calls != 1 || len(s.pauses) != 0 {
			t.Fatalf("%v: got %v after %d calls, pauses %v; want it at once", c.err, err, s.calls, s.pauses)
		}
		if r.refused[c.r].Load() != 1 {
			t.Fatalf("%v: counted %d under %s, want 1", c.err, r.refused[c.r].Load(), refusals[c.r].name)
		}
	}
}

// The real wait allocates nothing. A send to a datagram socketpair whose
// peer's queue is full is refused with EAGAIN, and the sender's wait
// (ppoll for POLLOUT, which never comes) runs until the deadline.
// ENOBUFS sleeps (nanosleep); a fake send gives it, as no socket can be
// made to. Each retry tries more than once, so the wait ran.
func TestRetryAllocs(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	msg := make([]byte, 64)
	for {
		if _, err := unix.Write(fds[0], msg); errors.Is(err, unix.EAGAIN) {
			break // the peer's receive queue is full (unix_dgram_sendmsg)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	s := &sender{}
	s.retrier.pause, s.retrier.now, s.retrier.budget = s.wait, time.Now, &budget{}
	errno := unix.EAGAIN
	s.retrier.sys = func(fd uintptr) (int, error) {
		if errno != unix.EAGAIN {
			return 0, errno
		}
		return unix.Write(int(fd), msg)
	}
	const runs = 5
	for _, c := range []struct {
		errno unix.Errno
		r     refusal
	}{{unix.EAGAIN, refusedAgain}, {unix.ENOBUFS, refusedNoBufs}} {
		errno = c.errno
		var last error
		if a := testing.AllocsPerRun(runs, func() { s.allow(sendPatience); _, last = s.retry(uintptr(fds[0])) }); a != 0 {
			t.Fatalf("%v: %v allocations per refused send, want 0", c.errno, a)
		}
		if !errors.Is(last, c.errno) {
			t.Fatalf("%v: retry returned %v", c.errno, last)
		}
		if got := s.refused[c.r].Load(); got < 2*(runs+1) { // AllocsPerRun runs once more to warm up
			t.Fatalf("%v: %d tries in %d retries, want more than one each", c.errno, got, runs+1)
		}
	}
}

// Through a port: packets the kernel refuses for good are dropped under
// their errno's reason. One that a pause lets through arrives, counted
// as refused and passed. Trains refused with EINVAL whose packets are
// refused alike (a full neighbour table) leave trains on. With four
// sockets, each socket's sender is scripted alike: the packets leave
// from one of them (their lane) and are retried there. A chunk spread
// over several lanes and refused for good pauses sendPatience in all,
// not once per lane.
func TestWriteRefused(t *testing.T) {
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("sockets=%d", n), func(t *testing.T) { writeRefused(t, n) })
	}
}

func writeRefused(t *testing.T, sockets int) {
	a, b, _, _ := pairN(t, 9000, sockets, sockets)
	got := reader(b)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff}
	s := &script{}
	for _, snd := range a.snds {
		snd.pause, snd.now = s.pause, s.now
	}
	fake := func(errs []error, last error) {
		s.errs, s.last, s.calls, s.pauses = errs, last, 0, nil
		for _, snd := range a.snds {
			snd.sys = func(fd uintptr) (int, error) {
				if _, err := s.sys(fd); err != nil {
					return 0, err
				}
				return snd.sendmmsg(fd)
			}
		}
	}
	write := func(what string, n int) {
		t.Helper()
		bufs, meta := batchOf(n, m)
		for i := range bufs {
			bufs[i] = append(bufs[i][:64], make([]byte, 1000)...)
		}
		if _, err := a.Write(bufs, meta, 64); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	fake([]error{unix.ENOBUFS}, nil)
	write("ENOBUFS once", 1)
	expect(t, got, "the packet sent again after ENOBUFS")
	if st, d := a.Counters().Stats, a.Counters().Drops; st["tx_refused_enobufs"] != 1 || st["tx_refused_passed"] != 1 || len(d) != 0 || len(s.pauses) != 1 {
		t.Fatalf("stats %v, drops %v, pauses %v; want one refusal passed after one pause, no drop", st, d, s.pauses)
	}

	fake(nil, unix.EAGAIN)
	write("EAGAIN for good", 1)
	none(t, got, "a packet refused past the patience")
	if d := a.Counters().Drops; d["send_eagain"] != 1 || len(d) != 1 {
		t.Fatalf("drops %v, want send_eagain 1", d)
	}

	fake(nil, unix.EINVAL)
	write("EINVAL for good", 5) // one train of 5, then 5 singles
	none(t, got, "packets refused with EINVAL")
	if d, st := a.Counters().Drops, a.Counters().Stats; d["send_einval"] != 5 || !a.gso || st["tx_gso_fallbacks"] != 0 || st["tx_refused_einval"] != 6 || len(s.pauses) != 0 {
		t.Fatalf("drops %v, stats %v, trains on %v, pauses %v; want 5 send_einval, 6 refusals, trains on, no pause", d, st, a.gso, s.pauses)
	}
	if sockets == 1 {
		return
	}

	// With several lanes, a chunk whose packets leave from several
	// sockets, all refused with ENOBUFS for good, pauses sendPatience
	// in all (one budget for the chunk), not once per lane.
	fake(nil, unix.ENOBUFS)
	const flows = 16
	bufs, meta := make([][]byte, flows), make([]ipoib.TxMeta, flows)
	lanes := make(map[uint8]bool)
	for f := range bufs {
		bufs[f], meta[f] = udpPacket(f, 0), m
	}
	if _, err := a.Write(bufs, meta, 64); err != nil {
		t.Fatalf("ENOBUFS on several lanes: %v", err)
	}
	for _, l := range a.wlane {
		lanes[l] = true
	}
	none(t, got, "packets refused on several lanes")
	var paused time.Duration
	for _, d := range s.pauses {
		paused += d
	}
	if d := a.Counters().Drops; len(lanes) < 2 || d["send_enobufs"] != flows || paused != sendPatience {
		t.Fatalf("%d lanes, drops %v, paused %v in all (%v); want several lanes, %d send_enobufs, %v of pauses", len(lanes), d, paused, s.pauses, flows, sendPatience)
	}
}

// BenchmarkWriteRefused is a packet that the kernel refuses once with
// EAGAIN and takes after a pause (of no time here: the fake's), through
// a port's Write and read back: the retry path allocates nothing.
func BenchmarkWriteRefused(b *testing.B) {
	a, p, _, _ := pair(b, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := p.AllocQP(0xffff, 0)
	bufs, meta := batchOf(1, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, p.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	bufs[0] = append(bufs[0][:64], make([]byte, 1000)...)
	refuse := false
	a.snds[0].sys = func(fd uintptr) (int, error) {
		if refuse = !refuse; refuse {
			return 0, unix.EAGAIN
		}
		return a.snds[0].sendmmsg(fd)
	}
	a.snds[0].pause = func(uintptr, refusal, time.Duration) {}
	benchRoundTrip(b, a, p, bufs, meta, 1, 1000)
}
