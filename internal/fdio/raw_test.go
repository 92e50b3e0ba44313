package fdio

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRawReadWrite: on a non-blocking pipe the raw calls answer as
// read(2) and write(2) do: EAGAIN when empty, the bytes written, EAGAIN
// when full, an empty write of nothing, EBADF on a closed descriptor.
func TestRawReadWrite(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	r, w := os.NewFile(uintptr(fds[0]), "r"), os.NewFile(uintptr(fds[1]), "w")
	defer r.Close()
	defer w.Close()
	buf := make([]byte, 16)
	if n, err := RawRead(r.Fd(), buf); err != unix.EAGAIN || n != 0 {
		t.Fatalf("read of an empty pipe: %d, %v; want 0, EAGAIN", n, err)
	}
	if n, err := RawWrite(w.Fd(), []byte("abc")); err != nil || n != 3 {
		t.Fatalf("write: %d, %v; want 3, nil", n, err)
	}
	if n, err := RawRead(r.Fd(), buf); err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("read: %q, %v; want \"abc\"", buf[:n], err)
	}
	if n, err := RawWrite(w.Fd(), nil); err != nil || n != 0 {
		t.Fatalf("write of nothing: %d, %v; want 0, nil", n, err)
	}
	fill(t, w)
	if n, err := RawWrite(w.Fd(), []byte("x")); err != unix.EAGAIN || n != 0 {
		t.Fatalf("write to a full pipe: %d, %v; want 0, EAGAIN", n, err)
	}
	closed := r.Fd()
	r.Close()
	if _, err := RawRead(closed, buf); err != unix.EBADF {
		t.Fatalf("read of a closed descriptor: %v, want EBADF", err)
	}
}

// TestRawMmsg: sendmmsg and recvmmsg through RawMmsg on a non-blocking
// datagram socket pair move whole messages, report how many, and the
// lengths received; recvmmsg of nothing is EAGAIN.
func TestRawMmsg(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	msgs := [][]byte{[]byte("first"), []byte("second!")}
	var hdrs [2]unix.Mmsghdr
	var iovs [2]unix.Iovec
	set := func(bufs [][]byte) {
		for i, b := range bufs {
			iovs[i] = unix.Iovec{Base: &b[0]}
			iovs[i].SetLen(len(b))
			hdrs[i] = unix.Mmsghdr{Hdr: unix.Msghdr{Iov: &iovs[i]}}
			hdrs[i].Hdr.SetIovlen(1)
		}
	}
	in := [][]byte{make([]byte, 64), make([]byte, 64)}
	set(in)
	if n, err := RawMmsg(unix.SYS_RECVMMSG, uintptr(fds[1]), hdrs[:], 0); err != unix.EAGAIN || n != 0 {
		t.Fatalf("recvmmsg of nothing: %d, %v; want 0, EAGAIN", n, err)
	}
	set(msgs)
	if n, err := RawMmsg(unix.SYS_SENDMMSG, uintptr(fds[0]), hdrs[:], unix.MSG_DONTWAIT); err != nil || n != 2 {
		t.Fatalf("sendmmsg: %d, %v; want 2, nil", n, err)
	}
	set(in)
	if n, err := RawMmsg(unix.SYS_RECVMMSG, uintptr(fds[1]), hdrs[:], 0); err != nil || n != 2 {
		t.Fatalf("recvmmsg: %d, %v; want 2, nil", n, err)
	}
	for i, m := range msgs {
		if got := in[i][:hdrs[i].Len]; string(got) != string(m) {
			t.Fatalf("message %d: %q, want %q", i, got, m)
		}
	}
}
