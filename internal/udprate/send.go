package udprate

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// SendConfig is what Send sends.
type SendConfig struct {
	To    netip.AddrPort
	Rate  float64 // datagrams per second over all flows; 0: as fast as possible
	Size  int     // UDP payload bytes, HeaderLen to MaxSize
	Flows int     // sockets, each with its own source port and goroutine
	// Duration and Count end the run, whichever comes first; 0 is no
	// limit (one of them must be set). Count is over all flows.
	Duration time.Duration
	Count    uint64
	Batch    int // most datagrams a sendmmsg call
	// GSO, when above 1, has the kernel cut each sent buffer into up to
	// GSO datagrams (UDP_SEGMENT). That makes fewer trips down the stack
	// for the same datagrams on the wire. It holds as long as the
	// sending interface segments in software (ethtool -K IF
	// tx-udp-segmentation off), or the receiver sees them whole up to
	// its socket. At most MaxGSO, and GSO × Size at most MaxSize.
	GSO     int
	SockBuf int // socket send buffer, bytes
}

// MaxGSO is the most datagrams a GSO buffer holds (the kernel's
// UDP_MAX_SEGMENTS was 64 before Linux 6.9).
const MaxGSO = 64

// SendResult is what Send sent.
type SendResult struct {
	Requested float64 `json:"requested_pps"` // 0: as fast as possible
	Sent      uint64  `json:"sent"`
	Bytes     uint64  `json:"bytes"`
	Seconds   float64 `json:"seconds"` // from the start to the last data datagram sent
	PPS       float64 `json:"pps"`     // achieved: Sent / Seconds
	// SenderLimited is set when PPS fell short of the requested rate by
	// more than 5 %: the sender (or its CPU) was the limit, not the
	// path.
	SenderLimited bool `json:"sender_limited"`
	// Errors counts sendmmsg calls refused with ECONNREFUSED (an ICMP
	// port unreachable came back), ENOBUFS or EAGAIN and tried again.
	Errors uint64 `json:"errors"`
	Flows  int    `json:"flows"`
	Size   int    `json:"size"`
}

// Pacing: a flow sends when it has tokens for a whole batch, and sleeps
// for the tokens it lacks otherwise. Its batch holds batchTime of its
// rate (at most SendConfig.Batch), and the bucket holds at most
// bucketTime of it. A sender held off the CPU longer than that does not
// make up for it in one burst; its rate falls short instead.
const (
	batchTime  = 100 * time.Microsecond
	bucketTime = 5 * time.Millisecond
	// endGap is the pause before a flow's end datagrams, and between
	// them; endCount is how many it sends.
	endGap   = 10 * time.Millisecond
	endCount = 3
	// limitedBelow is the share of the requested rate under which a run
	// counts as sender-limited.
	limitedBelow = 0.95
)

// flow is one sender socket with its batch and counters.
type flow struct {
	fd      int
	id      uint16
	flows   uint16  // of the sender
	rate    float64 // datagrams/s, 0: unpaced
	count   uint64  // 0: no limit
	batch   *batch
	k       int // datagrams per batch
	segs    int // datagrams per message (GSO)
	size    int // bytes per datagram
	sent    uint64
	errors  uint64
	last    time.Duration // when the last data batch went, since the start
	sendErr error
}

// Send sends datagrams to cfg.To until cfg.Duration has passed or
// cfg.Count were sent, then ends each flow with its end datagrams.
func Send(cfg SendConfig) (SendResult, error) {
	flows := make([]*flow, cfg.Flows)
	defer func() {
		for _, f := range flows {
			if f != nil {
				unix.Close(f.fd)
			}
		}
	}()
	for i := range flows {
		fd, err := socket(cfg.To, cfg.SockBuf)
		if err != nil {
			return SendResult{}, err
		}
		f := &flow{fd: fd, id: uint16(i), flows: uint16(cfg.Flows), rate: cfg.Rate / float64(cfg.Flows),
			k: cfg.Batch, segs: max(1, cfg.GSO), size: cfg.Size}
		flows[i] = f
		if err := unix.Connect(fd, sockaddr(cfg.To)); err != nil {
			return SendResult{}, err
		}
		if f.segs > 1 {
			if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT, cfg.Size); err != nil {
				return SendResult{}, fmt.Errorf("UDP GSO (UDP_SEGMENT): %w", err)
			}
		}
		if cfg.Count > 0 {
			f.count = cfg.Count / uint64(cfg.Flows)
			if uint64(i) < cfg.Count%uint64(cfg.Flows) {
				f.count++
			}
		}
		if f.rate > 0 {
			f.k = min(cfg.Batch, max(1, int(f.rate*batchTime.Seconds()+0.5)))
		}
		f.batch = newBatch((f.k+f.segs-1)/f.segs, f.segs*cfg.Size)
		for _, b := range f.batch.bufs {
			for at := 0; at < len(b); at += cfg.Size {
				Put(b[at:], Header{Kind: Data, Flow: f.id, Flows: f.flows})
			}
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for _, f := range flows {
		wg.Go(func() { f.run(start, cfg.Duration) })
	}
	wg.Wait()
	res := SendResult{Requested: cfg.Rate, Flows: cfg.Flows, Size: cfg.Size}
	var last time.Duration
	for _, f := range flows {
		if f.sendErr != nil {
			return res, f.sendErr
		}
		res.Sent += f.sent
		res.Errors += f.errors
		last = max(last, f.last)
	}
	res.Bytes = res.Sent * uint64(cfg.Size)
	res.Seconds = last.Seconds()
	if res.Seconds > 0 {
		res.PPS = float64(res.Sent) / res.Seconds
	}
	res.SenderLimited = cfg.Rate > 0 && res.PPS < limitedBelow*cfg.Rate
	return res, nil
}

// run sends the flow's datagrams, then its end datagrams.
func (f *flow) run(start time.Time, d time.Duration) {
	var dropped float64 // tokens the full bucket did not take
	depth := max(float64(2*f.k), f.rate*bucketTime.Seconds())
	for {
		now := time.Since(start)
		if d > 0 && now >= d {
			break
		}
		k := f.k
		if f.count > 0 {
			k = int(min(uint64(k), f.count-f.sent))
			if k == 0 {
				break
			}
		}
		if f.rate > 0 {
			tokens := now.Seconds()*f.rate - dropped - float64(f.sent)
			if tokens > depth {
				dropped += tokens - depth
				tokens = depth
			}
			if tokens < float64(k) {
				wait := time.Duration((float64(k) - tokens) / f.rate * 1e9)
				if d > 0 {
					wait = min(wait, d-now)
				}
				sleep(wait)
				continue
			}
		}
		msgs := f.fill(k)
		n, err := f.batch.mmsg(unix.SYS_SENDMMSG, f.fd, msgs, 0)
		switch {
		case err == nil:
			if n == msgs {
				f.sent += uint64(k)
			} else { // the messages before the last are full
				f.sent += uint64(n * f.segs)
			}
			f.last = time.Since(start)
		case errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN):
			f.errors++
		case errors.Is(err, unix.EINTR):
		default:
			f.sendErr = err
			return
		}
	}
	end := make([]byte, f.size)
	Put(end, Header{Kind: End, Flow: f.id, Flows: f.flows, Seq: f.sent})
	for range endCount {
		sleep(endGap)
		unix.Write(f.fd, end) // best effort: a receiver without it waits for its --idle
	}
}

// fill numbers the flow's next k datagrams in the batch's messages, sets
// the messages' lengths and returns how many messages hold them.
func (f *flow) fill(k int) int {
	msgs := (k + f.segs - 1) / f.segs
	for m, b := range f.batch.bufs[:msgs] {
		n := min(f.segs, k-m*f.segs)
		for j := range n {
			putSeq(b[j*f.size:], f.sent+uint64(m*f.segs+j))
		}
		f.batch.iovs[m].SetLen(n * f.size)
	}
	return msgs
}

// sleep sleeps d with the kernel's timer precision (nanosleep), finer
// than the Go runtime's timers at these tens of microseconds.
func sleep(d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
