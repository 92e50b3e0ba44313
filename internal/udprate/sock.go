package udprate

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockaddr is ap as a socket address.
func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() || ap.Addr().Is4In6() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// socket opens a blocking UDP socket for ap's family with send and
// receive buffers of bufBytes: forced past the sysctl limits where the
// process may (CAP_NET_ADMIN), else as large as they allow.
func socket(ap netip.AddrPort, bufBytes int) (int, error) {
	family := unix.AF_INET6
	if ap.Addr().Is4() || ap.Addr().Is4In6() {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, err
	}
	if bufBytes > 0 {
		for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
			if unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], bufBytes) != nil {
				unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], bufBytes) // best effort
			}
		}
	}
	return fd, nil
}

// batch is a set of message headers over buffers of one size, built once
// for sendmmsg or recvmmsg on a connected or bound socket.
type batch struct {
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
	bufs [][]byte
}

func newBatch(msgs, size int) *batch {
	b := &batch{hdrs: make([]unix.Mmsghdr, msgs), iovs: make([]unix.Iovec, msgs), bufs: make([][]byte, msgs)}
	mem := make([]byte, msgs*size)
	for i := range b.hdrs {
		b.bufs[i] = mem[i*size : (i+1)*size : (i+1)*size]
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(size)
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
	}
	return b
}

// mmsg makes system call trap (SYS_SENDMMSG or SYS_RECVMMSG) on the first
// k messages with flags, and returns how many moved. It blocks the
// goroutine's thread, as a blocking socket does.
func (b *batch) mmsg(trap uintptr, fd, k, flags int) (int, error) {
	n, _, e := unix.Syscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(k), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
