package udprate

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RecvConfig is what Listen listens on and how long Run runs.
type RecvConfig struct {
	Listen netip.AddrPort
	// Duration is the most Run runs; Idle ends it sooner once datagrams
	// came and none has for that long (0: only Duration ends it).
	Duration time.Duration
	Idle     time.Duration
	Batch    int // most datagrams a recvmmsg call
	SockBuf  int // socket receive buffer, bytes
}

// RecvResult is what Run counted.
type RecvResult struct {
	Stats
	LossPercent float64 `json:"loss_percent"` // Lost / Sent
	Seconds     float64 `json:"seconds"`      // from the first data datagram to the last
	PPS         float64 `json:"pps"`          // Received / Seconds
	// SocketDrops counts the datagrams that reached the socket but found
	// its buffer full: lost for want of a faster receiver, not on the
	// path (part of Lost, with anything else's for this socket).
	SocketDrops uint64 `json:"socket_drops"`
}

// Receiver is a bound socket that counts datagrams.
type Receiver struct {
	fd    int
	cfg   RecvConfig
	batch *batch
}

// poll is how often Run looks at the clock when no datagram comes.
const poll = 50 * time.Millisecond

// endLinger is how long Run goes on receiving after every flow's end
// datagram came: an end datagram may overtake the flow's last data.
const endLinger = 100 * time.Millisecond

// Listen binds the receiver's socket.
func Listen(cfg RecvConfig) (*Receiver, error) {
	fd, err := socket(cfg.Listen, cfg.SockBuf)
	if err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval(poll.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, sockaddr(cfg.Listen)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// A datagram's whole length, whatever the sender's size.
	return &Receiver{fd: fd, cfg: cfg, batch: newBatch(cfg.Batch, MaxSize+1)}, nil
}

// Addr is the bound address (with the port the kernel chose for port 0).
func (r *Receiver) Addr() (netip.AddrPort, error) {
	sa, err := unix.Getsockname(r.fd)
	if err != nil {
		return netip.AddrPort{}, err
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)), nil
	}
	return netip.AddrPort{}, errors.New("udprate: socket of an unknown family")
}

// Close closes the socket.
func (r *Receiver) Close() error { return unix.Close(r.fd) }

// Run counts datagrams until Duration has passed, Idle has passed without
// one, or every flow's end datagram came (and endLinger more).
func (r *Receiver) Run() (RecvResult, error) {
	var (
		t             Tracker
		first, latest time.Time // data datagrams
		done          time.Time // when the last flow ended
	)
	start := time.Now()
	for {
		n, err := r.batch.mmsg(unix.SYS_RECVMMSG, r.fd, len(r.batch.hdrs), unix.MSG_WAITFORONE)
		now := time.Now()
		switch {
		case err == nil:
			received := t.Received()
			for i := range n {
				t.Add(r.batch.bufs[i][:r.batch.hdrs[i].Len])
			}
			if t.Received() != received {
				if first.IsZero() {
					first = now
				}
				latest = now
			}
			if done.IsZero() && t.Done() {
				done = now
			}
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
		default:
			return RecvResult{}, err
		}
		if now.Sub(start) >= r.cfg.Duration ||
			r.cfg.Idle > 0 && !latest.IsZero() && now.Sub(latest) >= r.cfg.Idle ||
			!done.IsZero() && now.Sub(done) >= endLinger {
			break
		}
	}
	res := RecvResult{Stats: t.Stats(), Seconds: latest.Sub(first).Seconds()}
	if res.Sent > 0 {
		res.LossPercent = float64(res.Lost) / float64(res.Sent) * 100
	}
	if res.Seconds > 0 {
		res.PPS = float64(res.Received) / res.Seconds
	}
	drops, err := socketDrops(r.fd)
	res.SocketDrops = drops
	return res, err
}

// soMeminfo is SO_MEMINFO (socket(7)), which x/sys does not name.
const soMeminfo = 55

// socketDrops is the socket's drop counter (SK_MEMINFO_DROPS).
func socketDrops(fd int) (uint64, error) {
	var info [unix.SK_MEMINFO_VARS]uint32
	n := uint32(unsafe.Sizeof(info))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, soMeminfo,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, fmt.Errorf("SO_MEMINFO: %w", e)
	}
	return uint64(info[unix.SK_MEMINFO_DROPS]), nil
}
