package fdio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The data path's system calls on its non-blocking descriptors (a TAP
// queue's read and write, a fabric socket's sendmmsg and recvmmsg) are
// made raw, without telling the runtime (unix.RawSyscall and
// RawSyscall6). A call through unix.Syscall enters the runtime's syscall
// state. reentersyscall (runtime/proc.go, Go 1.26) then wakes the sysmon
// thread whenever it sleeps idle (entersyscallWakeSysmon), which it does
// after every pause in the traffic. So each packet after a pause woke a
// second thread of each daemon, which then polled every 20 µs until idle
// again.
//
// On the two-hypervisor topology (2 cores), a ping at 10 ms intervals
// cost 14 wake-ups and 22 context switches across the machine with
// runtime calls, and 6.7 and 9.6 with raw ones (perf stat,
// sched:sched_wakeup and sched:sched_switch). The floor is 5 wake-ups:
// ping, and each daemon's two readers. The RTT median fell by about 47
// µs (295 → 248 µs, 4 interleaved pairs of 500 pings).
//
// A raw call is only for a descriptor that never sleeps in the kernel:
// O_NONBLOCK or MSG_DONTWAIT, which answers EAGAIN instead. It keeps its
// P for the whole call, as a loop of Go code would. So a long call holds
// up the goroutines queued on that P, and a garbage collector's
// stop-the-world, for as long. A TAP write, for one, runs the bridge's
// and the guest's receive path in the caller's softirq: tens of µs for a
// super-frame. A wait for room or data stays a runtime call (Write's
// ppoll, the netpoller).

// RawRead is read(2) of b on fd, raw (see above): the byte count, or
// the errno (EAGAIN when there is nothing to read).
func RawRead(fd uintptr, b []byte) (int, error) { return rawRW(unix.SYS_READ, fd, b) }

// RawWrite is write(2) of b on fd, raw (see above): the byte count, or
// the errno (EAGAIN when there is no room).
func RawWrite(fd uintptr, b []byte) (int, error) { return rawRW(unix.SYS_WRITE, fd, b) }

func rawRW(trap, fd uintptr, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := unix.RawSyscall(trap, fd, uintptr(p), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// RawMmsg is sendmmsg(2) or recvmmsg(2) (trap) of hdrs on fd with
// flags, raw (see above): how many messages moved, or the errno (EAGAIN:
// none yet). hdrs must not be empty.
func RawMmsg(trap, fd uintptr, hdrs []unix.Mmsghdr, flags int) (int, error) {
	r, _, e := unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
