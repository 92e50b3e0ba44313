package fdio

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pipe is a non-blocking pipe whose ends are driven by FDs: r reads one
// byte at a time into got, w writes out.
type pipe struct {
	rf, wf *os.File
	r, w   *FD
	got    []byte
	out    []byte
	reads  atomic.Int64 // read function calls
	rerr   error
	werr   error
}

func newPipe(t *testing.T, writeTimeout time.Duration) *pipe {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	p := &pipe{rf: os.NewFile(uintptr(fds[0]), "r"), wf: os.NewFile(uintptr(fds[1]), "w")}
	rc, err := p.rf.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if p.r, err = New(rc, p.read, nil, 0); err != nil {
		t.Fatal(err)
	}
	wc, err := p.wf.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if p.w, err = New(wc, nil, p.write, writeTimeout); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.r.Close(p.rf.Close); p.w.Close(p.wf.Close) })
	return p
}

func (p *pipe) read(fd uintptr) bool {
	p.reads.Add(1)
	var b [1]byte
	n, err := RawRead(fd, b[:])
	if err == unix.EAGAIN {
		return false
	}
	p.got, p.rerr = append(p.got, b[:n]...), err
	return true
}

func (p *pipe) write(fd uintptr) bool {
	n, err := RawWrite(fd, p.out)
	if err == unix.EAGAIN {
		return false
	}
	p.out, p.werr = p.out[max(n, 0):], err
	return err != nil || len(p.out) == 0
}

// fill writes into the pipe until the kernel takes no more.
func fill(t *testing.T, f *os.File) {
	t.Helper()
	b := make([]byte, 1<<16)
	for {
		if _, err := unix.Write(int(f.Fd()), b); err == unix.EAGAIN {
			return
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadBlocksUntilData: Read on an empty pipe returns once a byte is
// written, with that byte; without busy polling the read function ran
// exactly twice (empty, then once the netpoller said readable).
func TestReadBlocksUntilData(t *testing.T) {
	p := newPipe(t, time.Second)
	done := make(chan error)
	go func() { done <- p.r.Read() }()
	for p.reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := p.wf.Write([]byte{42}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if string(p.got) != "\x2a" || p.rerr != nil {
		t.Fatalf("read %x, %v; want 2a", p.got, p.rerr)
	}
	if n := p.reads.Load(); n != 2 {
		t.Fatalf("read function called %d times, want 2 (no spinning)", n)
	}
}

// TestBusyPollSpins: with SetBusyPoll the reader retries the read while
// the pipe is empty (the writer waits until it has retried 100 times,
// which a reader waiting in the netpoller never does), then takes the
// byte.
func TestBusyPollSpins(t *testing.T) {
	p := newPipe(t, time.Second)
	p.r.SetBusyPoll(time.Hour)
	done := make(chan error)
	go func() { done <- p.r.Read() }()
	for p.reads.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	if _, err := p.wf.Write([]byte{7}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if string(p.got) != "\x07" {
		t.Fatalf("read %x, want 07", p.got)
	}
}

// TestCloseWakesReader: Close wakes a reader waiting in the netpoller
// (no busy polling, or a spin of 1 ns, over before Close) or spinning (a
// spin of an hour). The reader returns net.ErrClosed, and the pipe's
// descriptor is closed by then. Read after Close returns net.ErrClosed
// at once.
func TestCloseWakesReader(t *testing.T) {
	for _, spin := range []time.Duration{0, time.Nanosecond, time.Hour} {
		p := newPipe(t, time.Second)
		p.r.SetBusyPoll(spin)
		done := make(chan error)
		go func() { done <- p.r.Read() }()
		for p.reads.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond) // most likely waiting by now; either way it must wake
		if err := p.r.Close(p.rf.Close); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("spin %v: blocked Read returned %v, want net.ErrClosed", spin, err)
		}
		if err := p.r.Read(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("spin %v: Read after Close returned %v, want net.ErrClosed", spin, err)
		}
		if _, err := p.rf.Stat(); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("spin %v: the descriptor is still open after Close (%v)", spin, err)
		}
	}
}

// TestWriteTimeout: a Write to a pipe that stays full returns
// ErrTimeout after the write timeout instead of blocking forever.
func TestWriteTimeout(t *testing.T) {
	p := newPipe(t, 20*time.Millisecond)
	fill(t, p.wf)
	p.out = []byte{1}
	if err := p.w.Write(); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Write to a full pipe returned %v, want ErrTimeout", err)
	}
	if len(p.out) != 1 {
		t.Fatalf("%d bytes left, want the 1 not written", len(p.out))
	}
}

// TestWriteWaitsForRoom: a Write to a full pipe completes once the
// reader drains it, within the timeout.
func TestWriteWaitsForRoom(t *testing.T) {
	p := newPipe(t, time.Hour)
	fill(t, p.wf)
	p.out = []byte{1, 2, 3}
	done := make(chan error)
	go func() { done <- p.w.Write() }()
	b := make([]byte, 1<<20)
	if _, err := p.rf.Read(b); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Write after the pipe drained: %v", err)
	}
	if len(p.out) != 0 || p.werr != nil {
		t.Fatalf("%d bytes left, %v", len(p.out), p.werr)
	}
}

// TestCloseWakesWriter: Close wakes a writer waiting for room, which
// returns net.ErrClosed.
func TestCloseWakesWriter(t *testing.T) {
	p := newPipe(t, time.Hour)
	fill(t, p.wf)
	p.out = []byte{1}
	done := make(chan error)
	go func() { done <- p.w.Write() }()
	time.Sleep(10 * time.Millisecond) // most likely in ppoll(2) by now; either way it must wake
	if err := p.w.Close(p.wf.Close); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Write returned %v, want net.ErrClosed", err)
	}
}
