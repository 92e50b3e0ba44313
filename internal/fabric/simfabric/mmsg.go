package simfabric

// The socket calls: sendmmsg and recvmmsg straight through x/sys, with
// message headers, iovecs and socket addresses built once and reused, so
// that moving a batch allocates nothing and takes no lock. (x/net's batch
// API allocates a net.UDPAddr per received datagram and looks up the
// address's zone under a global lock per sent one.)

import (
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fdio"
)

// peer is a destination's socket address, built once per GID; it is the
// net.Addr of the messages the send path builds.
type peer struct {
	sa unix.RawSockaddrInet6
}

// Network is "udp6".
func (*peer) Network() string { return "udp6" }

// String is the peer's address.
func (p *peer) String() string { return net.IP(p.sa.Addr[:]).String() }

// newPeer returns the socket address of gid, port 4791, on interface
// ifindex (a link-local or link-scope multicast address needs its scope).
func newPeer(gid [16]byte, ifindex int) *peer {
	p := &peer{sa: unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: gid, Scope_id: uint32(ifindex)}}
	port := (*[2]byte)(unsafe.Pointer(&p.sa.Port))
	port[0], port[1] = UDPPort>>8, UDPPort&0xff // network byte order
	return p
}

// sender calls sendmmsg for the send path; its function values are
// bound once so that a call allocates nothing. A refusal that may pass
// is tried again, within a bound (retrier, write.go).
type sender struct {
	rc   syscall.RawConn
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
	k    int // messages to send
	n    int // sent
	err  error
	fn   func(fd uintptr) bool
	retrier
}

// newSender makes a sender for msgs messages at a time whose pauses
// come out of b.
func newSender(rc syscall.RawConn, msgs int, b *budget) *sender {
	s := &sender{rc: rc, hdrs: make([]unix.Mmsghdr, msgs), iovs: make([]unix.Iovec, msgs)}
	s.fn = s.call
	s.retrier.sys, s.retrier.pause, s.retrier.now, s.retrier.budget = s.sendmmsg, s.wait, time.Now, b
	return s
}

func (s *sender) call(fd uintptr) bool {
	s.n, s.err = s.retry(fd)
	return true // not the poller's wait for writability, which has no bound: retry's
}

// sendmmsg sends hdrs[:k] on fd, once.
func (s *sender) sendmmsg(fd uintptr) (int, error) {
	return fdio.RawMmsg(unix.SYS_SENDMMSG, fd, s.hdrs[:s.k], 0)
}

// send sends msgs (each with a *peer address, and buffers that are not
// empty) and returns how many the kernel took. An error is about the
// first message not taken.
func (s *sender) send(msgs []ipv6.Message) (int, error) {
	iov := s.iovs[:0]
	for _, m := range msgs {
		for _, b := range m.Buffers {
			iov = append(iov, unix.Iovec{Base: &b[0]})
			iov[len(iov)-1].SetLen(len(b))
		}
	}
	if cap(iov) > cap(s.iovs) {
		s.iovs = iov // grown once (a batch with more buffers than before)
	}
	at := 0
	for i, m := range msgs {
		h := &s.hdrs[i].Hdr
		pe := m.Addr.(*peer)
		h.Name, h.Namelen = (*byte)(unsafe.Pointer(&pe.sa)), unix.SizeofSockaddrInet6
		h.Iov = &iov[at]
		h.SetIovlen(len(m.Buffers))
		at += len(m.Buffers)
		if len(m.OOB) > 0 {
			h.Control = &m.OOB[0]
			h.SetControllen(len(m.OOB))
		} else {
			h.Control = nil
			h.SetControllen(0)
		}
	}
	s.k = len(msgs)
	if err := s.rc.Write(s.fn); err != nil {
		return 0, err
	}
	return s.n, s.err
}

// receiver calls recvmmsg for the receive path into buffers set up once,
// through internal/fdio (with Config.BusyPoll, spinning on the calling
// thread before it waits).
type receiver struct {
	io   *fdio.FD
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
	sas  []unix.RawSockaddrInet6
	bufs [][]byte
	oobs [][]byte
	n    int
	err  error
}

func newReceiver(rc syscall.RawConn, msgs, size, oob int) (*receiver, error) {
	r := &receiver{hdrs: make([]unix.Mmsghdr, msgs), iovs: make([]unix.Iovec, msgs),
		sas: make([]unix.RawSockaddrInet6, msgs), bufs: make([][]byte, msgs), oobs: make([][]byte, msgs)}
	for i := range r.hdrs {
		r.bufs[i], r.oobs[i] = make([]byte, size), make([]byte, oob)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(size)
		h := &r.hdrs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&r.sas[i]))
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
		h.Control = &r.oobs[i][0]
	}
	// The socket is readable when its receive queue holds a datagram
	// (udp_poll, net/ipv4/udp.c, over datagram_poll). It is never
	// written through r.io. The sender makes its sendmmsg in
	// RawConn.Write's callback, which never asks the netpoller to wait
	// for writability. It waits for a refusal to pass itself, bounded
	// (retrier, write.go: ppoll or nanosleep).
	io, err := fdio.New(rc, r.call, nil, 0)
	if err != nil {
		return nil, err
	}
	r.io = io
	return r, nil
}

func (r *receiver) call(fd uintptr) bool {
	for i := range r.hdrs { // what the kernel may fill, each time
		h := &r.hdrs[i].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(len(r.oobs[i]))
		h.Flags = 0
	}
	r.n, r.err = fdio.RawMmsg(unix.SYS_RECVMMSG, fd, r.hdrs, 0)
	return r.err != unix.EAGAIN // false: wait until readable
}

// recv receives up to len(hdrs) datagrams and returns how many.
func (r *receiver) recv() (int, error) {
	if err := r.io.Read(); err != nil {
		return 0, err
	}
	return r.n, r.err
}

// datagram describes received datagram i: its bytes, control data,
// flags and source.
func (r *receiver) datagram(i int) (data, oob []byte, flags int, src *unix.RawSockaddrInet6) {
	h := &r.hdrs[i]
	return r.bufs[i][:h.Len], r.oobs[i][:h.Hdr.Controllen], int(h.Hdr.Flags), &r.sas[i]
}
