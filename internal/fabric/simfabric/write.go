package simfabric

// The send path: Write → chunks of up to batch packets (super-packets cut
// into segments on the way) → writeChunk: checks, BTH+DETH written into
// the headroom, pad and ICRC appended → trains (trains.go) → sendmmsg;
// n counts the packets of the batch accepted whole.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// TailRoom is what Write needs after each payload: pad and ICRC.
const TailRoom = 3 + ICRCLen

func (p *Port) udpAddr(g ipoib.GID) *peer {
	a, ok := p.addrs[g]
	if !ok {
		if len(p.addrs) > 65536 {
			clear(p.addrs) // bound the cache; it refills on demand
		}
		a = newPeer(g, p.ifi.Index)
		p.addrs[g] = a
	}
	return a
}

// Write sends a batch of any length, up to BatchSize packets per system
// call. bufs[i][offset:] is the IPoIB header and payload; HeaderLen bytes
// before offset and TailRoom bytes of capacity after the payload are
// used; a packet with less tail room is copied into the port's own
// buffers first. A TCP or UDP super-packet (meta[i].GSO) is cut into segments
// here, in the port's own buffers. n counts the packets the port
// accepted (a super-packet when all its segments were): handed to the
// kernel. A packet refused locally (oversize, metadata that
// ipoib.CheckTx refuses, a super-packet that does not parse, port down)
// or refused by the kernel is counted under its drop reason and not in
// n; the port's packet counters count segments.
func (p *Port) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if offset < HeaderLen {
		return 0, fmt.Errorf("simfabric: write offset %d below header length %d", offset, HeaderLen)
	}
	if len(meta) < len(bufs) {
		return 0, fmt.Errorf("simfabric: write of %d packets with %d metadata", len(bufs), len(meta))
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	c := &p.chunk
	c.reset()
	for i, b := range bufs {
		m := &meta[i]
		if m.GSO.Type == ipoib.GSONone {
			c.add(b, m, i)
			if c.full() {
				if err := p.flush(offset); err != nil {
					return c.n, err
				}
			}
			continue
		}
		if _, d := ipoib.CheckTxOffloads(m, len(b)-offset, p.qps, p.Offloads()); d != ipoib.DropNone {
			p.drops.Add(d)
			continue
		}
		// The cut is done here, into the port's buffers, not left to the
		// kernel's UDP GSO. Each segment is an IB packet of its own,
		// with BTH and DETH in front and an ICRC behind, and the
		// super-packet has no room for them between its segments. A send
		// from iovecs would spare the copy, which is 1.7 % of a TCP
		// stream's samples in the data path's profiles.
		if p.cutter.StartIPoIB(m.GSO, b[offset:], p.mtu) != nil { // UDP: one of the port's trains when its datagrams are of one size
			p.drops.Add(ipoib.DropBadGSO)
			continue
		}
		sm := *m
		sm.GSO = ipoib.GSO{}
		for !p.cutter.Done() {
			buf := p.segment(len(c.bufs), offset)
			k := p.cutter.Cut(buf[offset:])
			c.add(buf[:offset+k], &sm, i)
			if c.full() {
				if err := p.flush(offset); err != nil {
					return c.n, err
				}
			}
		}
	}
	if err := p.flush(offset); err != nil {
		return c.n, err
	}
	c.finish()
	return c.n, nil
}

// segment returns the storage of chunk entry k's segment (or copy, for a
// packet given without tail room), with offset bytes of headroom.
func (p *Port) segment(k, offset int) []byte {
	if p.segBuf == nil || p.segOff != offset {
		p.segBuf, p.segOff = make([][]byte, batch), offset
		for i := range p.segBuf {
			p.segBuf[i] = make([]byte, offset+p.mtu+TailRoom)
		}
	}
	return p.segBuf[k]
}

// flush sends the chunk's packets; call with wmu held.
func (p *Port) flush(offset int) error {
	c := &p.chunk
	if len(c.bufs) == 0 {
		return nil
	}
	var ok [batch]bool
	err := p.writeChunk(c.bufs, c.meta, offset, &ok)
	c.tally(ok[:len(c.bufs)])
	c.bufs, c.meta, c.orig = c.bufs[:0], c.meta[:0], c.orig[:0]
	return err
}

// chunk gathers up to batch packets for one writeChunk, each with the
// index in Write's batch of the packet it is (or is a segment of), and
// counts the packets of the batch accepted whole.
type chunk struct {
	bufs [][]byte
	meta []ipoib.TxMeta
	orig []int
	n    int  // packets of the batch accepted
	cur  int  // the packet whose entries are being tallied, -1 for none
	ok   bool // all of cur's entries so far were accepted
}

func (c *chunk) reset() {
	if c.bufs == nil {
		c.bufs, c.meta, c.orig = make([][]byte, 0, batch), make([]ipoib.TxMeta, 0, batch), make([]int, 0, batch)
	}
	c.bufs, c.meta, c.orig = c.bufs[:0], c.meta[:0], c.orig[:0]
	c.n, c.cur = 0, -1
}

func (c *chunk) add(b []byte, m *ipoib.TxMeta, orig int) {
	c.bufs = append(c.bufs, b)
	c.meta = append(c.meta, *m)
	c.orig = append(c.orig, orig)
}

func (c *chunk) full() bool { return len(c.bufs) == batch }

// tally counts the entries sent (ok[k] for entry k) by the packet they
// belong to; a packet's entries are consecutive, and may span chunks.
func (c *chunk) tally(ok []bool) {
	for k, o := range c.orig[:len(ok)] {
		if o != c.cur {
			c.finish()
			c.cur, c.ok = o, true
		}
		c.ok = c.ok && ok[k]
	}
}

// finish counts the packet being tallied.
func (c *chunk) finish() {
	if c.cur >= 0 && c.ok {
		c.n++
	}
	c.cur = -1
}

// writeChunk sends the chunk's packets (bufs and meta are p.chunk's) and
// sets ok[i] for each one accepted; call with wmu held.
func (p *Port) writeChunk(bufs [][]byte, meta []ipoib.TxMeta, offset int, ok *[batch]bool) error {
	if p.down.Load() {
		p.drops.AddN(ipoib.DropPortDown, uint64(len(bufs)))
		return nil
	}
	var size [batch]int // payload length of each accepted packet, 0 if refused
	src := [16]byte(p.gid)
	msgs := p.wmsgs[:0]
	p.worig, p.wlane = p.worig[:0], p.wlane[:0]
	lane, laneFor := 0, -1 // lane is that of batch entry laneFor
	for i, b := range bufs {
		m := &meta[i]
		payload := len(b) - offset
		if payload > p.mtu {
			p.drops.Add(ipoib.DropOversize)
			continue
		}
		if _, d := ipoib.CheckTx(m, payload, p.qps, true); d != ipoib.DropNone {
			p.drops.Add(d)
			continue
		}
		if cap(b)-len(b) < TailRoom {
			// No room for pad and ICRC (ipoib.Port asks none of the
			// caller): the packet leaves from the port's own copy.
			s := p.segment(i, offset)
			b = s[:offset+copy(s[offset:], b[offset:])]
		}
		dstGID := m.Dst.GID()
		dst := [16]byte(dstGID)
		// The segments of one super-packet (one entry of Write's batch:
		// chunk.orig) are one flow: hashed once.
		if o := p.chunk.orig[i]; o != laneFor {
			lane, laneFor = p.laneOf(b[offset:], m), o
		}
		pkt := Packet{PKey: uint16(m.PKey), DestQPN: m.Dst.QPN(), PSN: p.psn.Add(1) & 0xffffff, QKey: ipoib.QKey, SrcQPN: m.SrcQPN}
		out := p.wcodec.Encode(b, offset, &pkt, &src, &dst, p.sports[lane], UDPPort) // the ICRC covers the source port
		p.wlane = append(p.wlane, uint8(lane))
		if p.hook != nil {
			p.hook(out[HeaderLen:], dstGID.IsMulticast())
		}
		msgs = p.add(msgs, out, p.udpAddr(dstGID), i)
		size[i] = payload
	}
	if err := p.sendLanes(msgs, &size); err != nil {
		return err
	}
	var pkts, mcast, nbytes uint64 // added once a chunk
	for i, l := range size[:len(bufs)] {
		if l > 0 {
			ok[i] = true
			pkts++
			if meta[i].Dst.GID().IsMulticast() {
				mcast++
			}
			nbytes += uint64(l)
		}
	}
	p.txPackets.Add(pkts)
	p.txMulticast.Add(mcast)
	p.txBytes.Add(nbytes)
	return nil
}

// send sends out from snd's socket (each message standing for the
// messages of its span in orig, whose indices in the batch are worig)
// and clears size for the packets lost. A refused train's packets
// go again one by one; when the refusal is the kernel's word on GSO
// itself, trains are off for the port from then on. Refusals that may
// pass wait within the chunk's patience (the port's budget, which
// sendLanes gives once for all the lanes' sends).
func (p *Port) send(snd *sender, out []ipv6.Message, spans []span, orig []ipv6.Message, worig []int, size *[batch]int) error {
	// lost counts a packet the kernel refused, under its errno's
	// reason: a send error (no buffer, no neighbour) loses it, as a
	// full HCA send queue would.
	lost := func(k int, err error) {
		p.drops.Add(refusals[refusalOf(err)].drop)
		size[worig[k]] = 0
	}
	for off := 0; off < len(out); off++ {
		sent, err := snd.send(out[off:])
		if err == nil && sent <= 0 {
			err = io.ErrNoProgress
		}
		for _, s := range spans[off : off+max(sent, 0)] {
			if s.to-s.from > 1 {
				p.trainsSent.Add(1)
				p.trainPackets.Add(uint64(s.to - s.from))
			}
		}
		if off += max(sent, 0); err == nil {
			off-- // sent up to here
			continue
		}
		if p.closed.Load() {
			return net.ErrClosed
		}
		s := spans[off]
		if s.to-s.from == 1 {
			lost(s.from, err)
			continue
		}
		// The kernel may refuse GSO itself (no UDP GSO, or not with this
		// socket or device: EIO, EINVAL, EOPNOTSUPP). Trains then go off
		// for good, but only once the train's packets went one by one:
		// EINVAL is also ip6_finish_output2's word for a neighbour it
		// could not make, which refuses them alike. Other errors (no
		// buffer, link down) are passing: the train's packets go one by
		// one this time only.
		gsoRefused := p.gso && (errors.Is(err, unix.EIO) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP))
		went := false
		for k := s.from; k < s.to; k++ {
			if _, err := snd.send(orig[k : k+1]); err != nil {
				if p.closed.Load() {
					return net.ErrClosed
				}
				lost(k, err)
			} else {
				went = true
			}
		}
		if gsoRefused && went {
			p.gso = false
			p.gsoFallback.Add(1)
		}
	}
	return nil
}

// Refused sends. The kernel refuses a sendmmsg with an errno: every
// message, or the first after those it took (__sys_sendmmsg returns the
// count when it is not 0, the error otherwise). What each errno means on
// this socket, a non-blocking UDP socket without IPV6_RECVERR, from the
// kernel source:
//   - EAGAIN: the send buffer is full (sock_alloc_send_pskb with no
//     timeout). Passing: room comes back as sent datagrams are freed,
//     and the socket says so (POLLOUT).
//   - ENOBUFS: no memory for the skb (alloc_skb_with_frags). A queue
//     below the socket that is full (the qdisc, veth_xmit's peer
//     backlog: NET_XMIT_DROP, net_xmit_errno's ENOBUFS) does NOT come
//     back: udp_v6_send_skb turns ENOBUFS into success unless
//     IPV6_RECVERR is set, and counts it as Udp6SndbufErrors. Passing.
//   - EINVAL: ip6_finish_output2 could not make the next hop's
//     neighbour entry (__neigh_create: neigh_alloc finds the table at
//     gc_thresh3, and neigh_forced_gc frees no entry younger than 5 s).
//     On a host with many namespaces this is the host's one ND table,
//     shared by them all (docs/scale.md). Not passing within any wait
//     a TX worker may take.
//   - any other (ENETUNREACH with the underlay down, EMSGSIZE): not
//     passing.
// A neighbour entry whose queue (unres_qlen_bytes) overflows while it
// resolves drops the oldest packet silently (__neigh_event_send): no
// errno either.

// sendPatience bounds the time one send (a chunk of at most batch
// packets) may spend pausing for refusals that may pass: a deadline
// sendPatience after its first refusal. What can refuse for a while is a
// full send buffer (EAGAIN: 8 MB, which drains in well under a
// millisecond once its datagrams leave) or the kernel short of memory
// for the skb (ENOBUFS). A full qdisc or device backlog refuses nothing
// here (see Refused sends above). 2 ms covers a consumer kept off the
// CPU for a scheduler slice on a busy host. It is short beside what a
// loss costs a guest (TCP's 200 ms minimum RTO, ping's 1 s). So a TX
// worker, and the TAP frames behind it, is never held longer than a
// retransmission would take.
const sendPatience = 2 * time.Millisecond

// firstPause is the first pause after a refusal; each next one doubles.
const firstPause = 100 * time.Microsecond

// refusal is a class of the kernel's refusals of a send, by errno.
type refusal uint8

const (
	refusedAgain  refusal = iota // EAGAIN
	refusedNoBufs                // ENOBUFS
	refusedInval                 // EINVAL
	refusedOther                 // any other error
	numRefusals
)

// refusals are, by class: the errno, the name the port's counters use,
// the drop reason of a packet it loses, and whether it may pass.
var refusals = [numRefusals]struct {
	errno   unix.Errno
	name    string
	drop    ipoib.Drop
	passing bool
}{
	refusedAgain:  {unix.EAGAIN, "eagain", ipoib.DropSendAgain, true},
	refusedNoBufs: {unix.ENOBUFS, "enobufs", ipoib.DropSendNoBufs, true},
	refusedInval:  {unix.EINVAL, "einval", ipoib.DropSendInval, false},
	refusedOther:  {0, "other", ipoib.DropSendError, false},
}

// refusalOf is err's class (mmsg returns the bare errno).
func refusalOf(err error) refusal {
	if e, ok := err.(unix.Errno); ok {
		for r := range refusedOther {
			if refusals[r].errno == e {
				return r
			}
		}
	}
	return refusedOther
}

// budget is the time the sends of one chunk may pause in all. There is
// one for the port, shared by the senders of all its lanes: what refuses
// is mostly host-wide (ENOBUFS: the kernel short of memory), and a TX
// worker holds the port's send lock while it waits. A budget per lane
// would let a chunk wait the patience once per lane.
type budget struct {
	patience time.Duration // what allow gave
	deadline time.Time     // patience after the first refusal since allow; zero before it
}

// allow gives the sends from now on d to pause in all, counted from the
// first refusal that pauses (so a send the kernel takes reads no clock).
func (b *budget) allow(d time.Duration) { b.patience, b.deadline = d, time.Time{} }

// retrier tries a refused send again, pausing, while the refusal may
// pass and the patience of its budget (shared with the port's other
// senders) lasts.
type retrier struct {
	// sys makes one send on fd; pause waits up to d for the refusal r
	// to pass; now reads the clock (the sender's sendmmsg, wait and
	// time.Now; tests give fakes).
	sys   func(fd uintptr) (int, error)
	pause func(fd uintptr, r refusal, d time.Duration)
	now   func() time.Time
	*budget
	pfd [1]unix.PollFd
	ts  unix.Timespec
	// refused counts the refusals by class, each try, passed or not;
	// passed counts the sends that went after a pause.
	refused [numRefusals]atomic.Uint64
	passed  atomic.Uint64
}

// retry sends and, while the kernel refuses with a refusal that may
// pass and the deadline is not reached, pauses and sends again: the
// first pause firstPause, each next one twice the last, cut to the time
// left. The time left is read from the clock, not summed from the
// pauses asked for: a pause may take longer than asked. The error is
// the last refusal's.
func (t *retrier) retry(fd uintptr) (int, error) {
	d, paused := firstPause, false
	for {
		n, err := t.sys(fd)
		if err == nil {
			if paused {
				t.passed.Add(1)
			}
			return n, nil
		}
		r := refusalOf(err)
		t.refused[r].Add(1)
		if !refusals[r].passing {
			return 0, err
		}
		now := t.now()
		if t.deadline.IsZero() {
			t.deadline = now.Add(t.patience)
		}
		left := t.deadline.Sub(now)
		if left <= 0 {
			return 0, err
		}
		t.pause(fd, r, min(d, left))
		d, paused = 2*d, true
	}
}

// wait waits up to d for r to pass. For EAGAIN it waits until the socket
// is writable: ppoll for POLLOUT, which sock_def_write_space raises once
// sent datagrams free half the send buffer. For ENOBUFS, which no socket
// event ends, it waits d. Both are system calls with a nanosecond
// timeout (an hrtimer, give or take the thread's timer slack) that
// allocate nothing. time.Sleep is not used: the runtime's timers wake
// here no finer than about a millisecond, as netpoll's epoll_pwait takes
// whole milliseconds. Five pauses of 100–800 µs took some 5 ms with it.
func (t *retrier) wait(fd uintptr, r refusal, d time.Duration) {
	t.ts = unix.NsecToTimespec(d.Nanoseconds())
	if r != refusedAgain {
		// hrtimer_nanosleep writes the time left on EINTR (the
		// runtime's preemption signal): sleep the rest.
		for unix.Nanosleep(&t.ts, &t.ts) == unix.EINTR {
		}
		return
	}
	t.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	_, _ = unix.Ppoll(t.pfd[:], &t.ts, nil) // writable, timed out or EINTR: the caller sends again either way
}

// refusalStats adds the sender's refusals to the port's stats (the
// senders' sums): tx_refused_<errno> for each class, tx_refused_passed
// for the sends that went after a pause.
func (s *sender) refusalStats(m map[string]uint64) {
	for r := range numRefusals {
		m["tx_refused_"+refusals[r].name] += s.refused[r].Load()
	}
	m["tx_refused_passed"] += s.passed.Load()
}

// add appends a message for b, sent on behalf of bufs[orig] of the
// current chunk.
func (p *Port) add(msgs []ipv6.Message, b []byte, to *peer, orig int) []ipv6.Message {
	i := len(msgs)
	p.wbufs[i][0] = b
	p.worig = append(p.worig, orig)
	return append(msgs, ipv6.Message{Buffers: p.wbufs[i][:], Addr: to})
}
