// Package fdio drives the hot descriptors of the data path (a TAP queue,
// the simulated fabric's UDP socket), non-blocking. The caller's
// function tries the system call. When the descriptor has nothing for it
// (EAGAIN), a reader with busy polling on retries on the calling thread
// for a while. Then, or at once without busy polling, it waits in Go's
// netpoller (see Read for why not in poll(2) on its thread). A writer
// that meets a full descriptor waits in ppoll(2) on its thread for a
// bounded time.
//
// Close is safe against the reuse of the descriptor's number. It wakes a
// writer waiting in ppoll through an eventfd, and a spinning reader
// through a flag; the owner's close wakes the netpoller. The owner's
// close (os.File.Close, net.UDPConn.Close) waits until every raw call on
// the descriptor has returned. That holds because the calls run inside
// syscall.RawConn's Control or Read, which hold a reference on the
// descriptor: internal/poll FD.Close waits for the last reference of a
// non-blocking descriptor before close(2).
//
// RawRead, RawWrite and RawMmsg are the data path's system calls on
// those descriptors, made without the runtime's syscall state (raw.go
// says why).
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
	wake   int // eventfd, readable once Close has begun: wakes a Write
	closed atomic.Bool
	spin   atomic.Int64 // busy-poll time, ns

	read, write func(fd uintptr) bool
	// Read and Write state, pre-bound so that a call allocates nothing.
	rctl, wctl func(fd uintptr)
	rdone      bool
	werr       error
	wfds       [2]unix.PollFd
	wtimeout   unix.Timespec
	wleft      unix.Timespec // of wtimeout, during a Write
}

// New drives rc's descriptor, which must be non-blocking, with read and
// write; either may be nil when unused. They are functions of the kind
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

// SetBusyPoll makes Read retry the read for up to d on the calling
// thread after it found nothing, before it waits in the netpoller; 0
// turns it off.
func (f *FD) SetBusyPoll(d time.Duration) { f.spin.Store(int64(max(d, 0))) }

// Read calls the read function until it returns true. With busy polling
// it first retries on the calling thread for up to the busy-poll time.
// Then, or at once without busy polling, it waits for readability in
// Go's netpoller (syscall.RawConn's Read). It returns net.ErrClosed once
// Close has begun.
//
// Why the wait is the netpoller's, not poll(2) on the thread: a Go
// thread blocked in a system call keeps its P in the syscall state. So
// the runtime's sysmon thread stays awake to watch it and retakes the P;
// it checks every 20 µs at first, backing off to 10 ms, and each
// exitsyscall wakes it again. A goroutine locked to its thread
// (LockOSThread) adds a hand-over whenever another thread readies it.
// This was measured on the two-hypervisor topology (2 cores). Readers
// locked to their threads and waiting in poll(2) made sysmon's usleep
// half of the daemon's context switches, and raised the ping RTT median
// by 50-90 µs over the netpoller. Spinning and then waiting in poll(2)
// cost a third more CPU than spinning and then waiting in the netpoller,
// for the same RTT.
func (f *FD) Read() error {
	if f.closed.Load() {
		return net.ErrClosed
	}
	if f.spin.Load() > 0 {
		if err := f.rc.Control(f.rctl); err != nil {
			return f.closedErr(err)
		}
		if f.rdone {
			return nil
		}
	}
	return f.closedErr(f.rc.Read(f.read))
}

// readCtl retries the read until it is done, the busy-poll time has
// passed or Close has begun; rdone says whether it is done.
func (f *FD) readCtl(fd uintptr) {
	until := time.Now().Add(time.Duration(f.spin.Load()))
	for f.rdone = f.read(fd); !f.rdone && !f.closed.Load() && time.Now().Before(until); {
		f.rdone = f.read(fd)
	}
}

// Write calls the write function until it returns true, waiting in
// ppoll(2) on the calling thread for writability (or Close) in between,
// for at most the write timeout in all: then it returns ErrTimeout.
// What ppoll reports besides POLLOUT (POLLERR, POLLHUP: tun_chr_poll's
// EPOLLERR for a detached queue) is left for the next write to return.
// It returns net.ErrClosed once Close has begun.
func (f *FD) Write() error {
	if f.closed.Load() {
		return net.ErrClosed
	}
	if err := f.rc.Control(f.wctl); err != nil {
		return f.closedErr(err)
	}
	return f.werr
}

func (f *FD) writeCtl(fd uintptr) {
	// ppoll on Linux writes the time left back into its timeout
	// (poll_select_finish, fs/select.c), so retries share one budget.
	f.wleft = f.wtimeout
	for !f.write(fd) {
		if f.closed.Load() {
			f.werr = net.ErrClosed
			return
		}
		f.wfds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
		f.wfds[1] = unix.PollFd{Fd: int32(f.wake), Events: unix.POLLIN}
		n, err := unix.Ppoll(f.wfds[:], &f.wleft, nil)
		switch {
		case err == unix.EINTR:
		case err != nil:
			f.werr = fmt.Errorf("fdio: poll: %w", err)
			return
		case f.wfds[1].Revents != 0:
			f.werr = net.ErrClosed
			return
		case n == 0:
			f.werr = ErrTimeout
			return
		}
	}
	f.werr = nil
}

// Close wakes a Write waiting in ppoll(2) and a Read spinning, then calls
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
