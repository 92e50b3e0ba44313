// Package fdio drives the hot descriptors of the data path (a TAP queue,
// the simulated fabric's UDP socket), non-blocking, from the calling
// thread: the caller's function tries the system call; when the
// descriptor has nothing for it (EAGAIN), a reader with busy polling on
// spins on it for a while and then blocks in ppoll(2) on the descriptor
// and a wake-up eventfd on its own thread; without busy polling it waits
// in Go's netpoller (see Read for why). A writer that meets a full
// descriptor waits in ppoll(2) on its own thread, for a bounded time.
// The goroutine continues on the thread the system call returned on, so
// a frame read there is translated and written there.
//
// Close is safe against the reuse of the descriptor's number: it wakes
// every thread blocked here through the eventfd, and the owner's close
// (os.File.Close, net.UDPConn.Close) waits until every raw call on the
// descriptor has returned, because the calls run inside
// syscall.RawConn.Control, which holds a reference on the descriptor
// (internal/poll FD.Close waits for the last reference of a non-blocking
// descriptor before close(2)).
package fdio

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrTimeout is Write's error when the descriptor stayed unwritable for
// the whole write timeout.
var ErrTimeout = errors.New("fdio: not writable before the timeout")

// FD is a non-blocking descriptor driven from the calling thread. One
// goroutine may Read and another Write at the same time; each of Read and
// Write is for one goroutine at a time.
type FD struct {
	rc     syscall.RawConn
	wake   int // eventfd, readable once Close has begun
	closed atomic.Bool
	spin   atomic.Int64 // busy-poll time, ns

	read, write func(fd uintptr) bool
	// Read and Write state, pre-bound so that a call allocates nothing.
	rctl, wctl func(fd uintptr)
	rerr, werr error
	rfds, wfds [2]unix.PollFd
	wtimeout   unix.Timespec
	wleft      unix.Timespec // of wtimeout, during a Write
}

// New drives rc's descriptor, which must be non-blocking, with read and
// write (either may be nil when unused), functions of the kind
// syscall.RawConn's Read and Write take: they do the system calls and
// return false when the descriptor had nothing for them (EAGAIN), true
// when done. A Write waits at most writeTimeout for the descriptor to
// become writable.
func New(rc syscall.RawConn, read, write func(fd uintptr) bool, writeTimeout time.Duration) (*FD, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("fdio: eventfd: %w", err)
	}
	f := &FD{rc: rc, wake: efd, read: read, write: write, wtimeout: unix.NsecToTimespec(int64(max(writeTimeout, time.Millisecond)))}
	f.rctl, f.wctl = f.readCtl, f.writeCtl
	return f, nil
}

// SetBusyPoll makes Read (and Write) retry the system call for up to d
// after it found nothing, before blocking in poll(2); 0 turns it off.
func (f *FD) SetBusyPoll(d time.Duration) { f.spin.Store(int64(max(d, 0))) }

// Read calls the read function until it returns true. Without busy
// polling it waits for readability in Go's netpoller (syscall.RawConn's
// Read); with it, the calling thread spins, then waits in poll(2)
// itself. It returns net.ErrClosed once Close has begun.
//
// Why not poll(2) on the thread always: a Go thread blocked in a system
// call keeps its P in the syscall state, so the runtime's sysmon thread
// stays awake to watch it (every 20 µs at first, backing off only to
// 10 ms, and woken again by each exitsyscall), and retakes the P after
// a tick when no other P is idle. Measured on the two-hypervisor
// topology (2 cores), that cost more than the netpoller's wake-up
// chain: sysmon's usleep was half of the daemon's context switches and
// the ping RTT median rose by 50-90 µs. A reader that busy-polls burns
// its core anyway and gains from never leaving its thread.
func (f *FD) Read() error {
	if f.closed.Load() {
		return net.ErrClosed
	}
	if f.spin.Load() == 0 {
		return f.closedErr(f.rc.Read(f.read))
	}
	if err := f.rc.Control(f.rctl); err != nil {
		return f.closedErr(err)
	}
	return f.rerr
}

// Write calls the write function until it returns true, waiting in
// poll(2) for writability in between, for at most the write timeout in
// all: then it returns ErrTimeout. It returns net.ErrClosed once Close
// has begun.
func (f *FD) Write() error {
	if f.closed.Load() {
		return net.ErrClosed
	}
	if err := f.rc.Control(f.wctl); err != nil {
		return f.closedErr(err)
	}
	return f.werr
}

func (f *FD) readCtl(fd uintptr) { f.rerr = f.loop(fd, f.read, unix.POLLIN, nil, &f.rfds) }

func (f *FD) writeCtl(fd uintptr) {
	f.wleft = f.wtimeout // ppoll leaves the time not slept in it
	f.werr = f.loop(fd, f.write, unix.POLLOUT, &f.wleft, &f.wfds)
}

// loop runs fn until it is done: on EAGAIN it spins (SetBusyPoll), then
// blocks in ppoll(2) on fd for events and on the eventfd, for at most
// what is left of timeout in all (nil: no limit). What poll reports for fd besides events (POLLERR,
// POLLHUP: tun_chr_poll's EPOLLERR for a detached queue, a socket
// error) is left for fn's next system call to return.
func (f *FD) loop(fd uintptr, fn func(uintptr) bool, events int16, timeout *unix.Timespec, fds *[2]unix.PollFd) error {
	var spinUntil time.Time
	for {
		if fn(fd) {
			return nil
		}
		if f.closed.Load() {
			return net.ErrClosed
		}
		if spin := time.Duration(f.spin.Load()); spin > 0 {
			now := time.Now()
			if spinUntil.IsZero() {
				spinUntil = now.Add(spin)
			}
			if now.Before(spinUntil) {
				continue
			}
		}
		fds[0] = unix.PollFd{Fd: int32(fd), Events: events}
		fds[1] = unix.PollFd{Fd: int32(f.wake), Events: unix.POLLIN}
		// ppoll on Linux writes the time left back into timeout
		// (do_sys_poll, fs/select.c), so retries share one budget.
		n, err := unix.Ppoll(fds[:], timeout, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("fdio: poll: %w", err)
		case fds[1].Revents != 0:
			return net.ErrClosed
		case n == 0:
			return ErrTimeout
		}
		spinUntil = time.Time{} // woken: spin afresh next time
	}
}

// Close wakes every thread blocked in Read or Write, then calls
// closeFD, the owner's close of the descriptor, which returns once no
// raw call uses the descriptor any more, and then closes the eventfd.
// Read and Write return net.ErrClosed from then on.
func (f *FD) Close(closeFD func() error) error {
	if f.closed.Swap(true) {
		return closeFD() // the owner's own "already closed" answer
	}
	one := [8]byte{1}
	// eventfd_write: the counter stays non-zero, so the eventfd stays
	// readable for every poll until it is closed.
	if _, err := unix.Write(f.wake, one[:]); err != nil {
		err = fmt.Errorf("fdio: wake: %w", err)
		return errors.Join(err, closeFD())
	}
	err := closeFD()
	unix.Close(f.wake)
	return err
}

// closedErr is net.ErrClosed for an error of a descriptor being closed
// (os.File's raw calls return internal/poll's "use of closed file",
// which is neither fs.ErrClosed nor net.ErrClosed), else err.
func (f *FD) closedErr(err error) error {
	if err != nil && (f.closed.Load() || errors.Is(err, fs.ErrClosed) || errors.Is(err, net.ErrClosed)) {
		return net.ErrClosed
	}
	return err
}
