package simfabric

import (
	"errors"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// script is a fake send: it answers with errs in turn (nil: sent, 1
// message), then with last; pauses records the pauses asked for.
type script struct {
	errs   []error
	last   error
	calls  int
	pauses []time.Duration
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

func (s *script) pause(_ uintptr, _ refusal, d time.Duration) { s.pauses = append(s.pauses, d) }

func (s *script) retrier() *retrier { return &retrier{sys: s.sys, pause: s.pause} }

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

// A refusal that lasts gets pauses summing to the patience exactly (the
// last one cut to what is left), then its error; no pause is left for
// the sends after it until the next allow.
func TestRetryBound(t *testing.T) {
	s := &script{last: unix.ENOBUFS}
	r := s.retrier()
	r.allow(sendPatience)
	if _, err := r.retry(0); !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("retry: %v, want ENOBUFS once the patience is spent", err)
	}
	var sum time.Duration
	for _, d := range s.pauses {
		sum += d
	}
	if want := []time.Duration{100 * time.Microsecond, 200 * time.Microsecond, 400 * time.Microsecond, 800 * time.Microsecond, 500 * time.Microsecond}; !slices.Equal(s.pauses, want) || sum != sendPatience {
		t.Fatalf("pauses %v (sum %v), want %v (sum %v)", s.pauses, sum, want, sendPatience)
	}
	s.pauses, s.calls = nil, 0
	if _, err := r.retry(0); !errors.Is(err, unix.ENOBUFS) || len(s.pauses) != 0 || s.calls != 1 {
		t.Fatalf("next send: %v after %d calls and pauses %v; want ENOBUFS at once", err, s.calls, s.pauses)
	}
	if got := r.refused[refusedNoBufs].Load(); got != 7 || r.passed.Load() != 0 {
		t.Fatalf("refused enobufs %d, passed %d; want 7 and 0", got, r.passed.Load())
	}
	r.allow(sendPatience)
	s.last = nil
	if n, err := r.retry(0); n != 1 || err != nil {
		t.Fatalf("after allow: %d, %v; want sent", n, err)
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

// The wait for a send that may pass allocates nothing.
func TestRetryAllocs(t *testing.T) {
	r := &retrier{}
	fails := 0
	r.sys = func(uintptr) (int, error) {
		if fails++; fails%2 == 1 {
			return 0, unix.EAGAIN
		}
		return 1, nil
	}
	r.pause = func(uintptr, refusal, time.Duration) {}
	if a := testing.AllocsPerRun(100, func() { r.allow(sendPatience); _, _ = r.retry(0) }); a != 0 {
		t.Fatalf("%v allocations per refused send, want 0", a)
	}
}

// Through a port: packets the kernel refuses for good are dropped under
// their errno's reason; one that a pause lets through arrives, counted
// as refused and passed; trains refused with EINVAL whose packets are
// refused alike (a full neighbour table) leave trains on.
func TestWriteRefused(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	got := reader(b)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff}
	s := &script{}
	a.snd.pause = s.pause
	fake := func(errs []error, last error) {
		s.errs, s.last, s.calls, s.pauses = errs, last, 0, nil
		a.snd.sys = func(fd uintptr) (int, error) {
			if _, err := s.sys(fd); err != nil {
				return 0, err
			}
			return a.snd.sendmmsg(fd)
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
	a.snd.sys = func(fd uintptr) (int, error) {
		if refuse = !refuse; refuse {
			return 0, unix.EAGAIN
		}
		return a.snd.sendmmsg(fd)
	}
	a.snd.pause = func(uintptr, refusal, time.Duration) {}
	benchRoundTrip(b, a, p, bufs, meta, 1, 1000)
}
