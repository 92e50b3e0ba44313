package simfabric

// The receive path, in order:
//   - recvmmsg;
//   - inspect: addresses, flags, control messages, once per datagram;
//   - split: one packet per buffer, a merged train cut into its packets;
//   - check, in the receive buffer: decode, Q_Key, size, QP or group,
//     P_Key;
//   - the payload copied to the caller's buffer at offset.

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// rxLane is one receive socket's state: its receiver and what the last
// receive brought, its codec and counters. A port has one per socket
// (Config.Sockets), each read by one caller at a time.
type rxLane struct {
	p     *Port
	mu    sync.Mutex
	codec Codec
	rcv   *receiver // datagrams of the last receive, got of them (a merged train can be 64 KB)
	info  []rxInfo
	cur   int // the datagram Read hands out packets from
	got   int
	// ovfl is the kernel's count of this socket's receive-queue drops
	// last reported (SO_RXQ_OVFL); the port's drop counter is raised
	// by each rise of it.
	ovfl                  uint32
	packets, bytes        atomic.Uint64
	multicast             atomic.Uint64 // of packets: those to a group
	groMerged, groPackets atomic.Uint64 // received merged datagrams (UDP GRO)
}

func newRxLane(p *Port, conn *net.UDPConn, busyPoll time.Duration) (*rxLane, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("simfabric: %w", err)
	}
	l := &rxLane{p: p, info: make([]rxInfo, rxBatch)}
	if l.rcv, err = newReceiver(rc, rxBatch, maxTrainBytes+ICRCLen+HeaderLen+4, unix.CmsgSpace(unix.SizeofInet6Pktinfo)+2*unix.CmsgSpace(4)); err != nil {
		return nil, fmt.Errorf("simfabric: %w", err)
	}
	l.rcv.io.SetBusyPoll(busyPoll)
	return l, nil
}

// Read is the first receive socket's Read (rxLane.Read). With several
// sockets it reads that one alone. A caller that uses Read, not
// RxQueues, gets the packets the kernel puts on the first socket: its
// share of the unicast flows, and all multicast. The others stay queued
// until they overflow (counted as rx_queue_overflow).
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	return p.rx[0].Read(bufs, sizes, meta, offset)
}

// RxQueues returns the port's receive sockets, one ipoib.RxQueue each,
// for as many callers to read in parallel (Config.Sockets).
func (p *Port) RxQueues() []ipoib.RxQueue {
	qs := make([]ipoib.RxQueue, len(p.rx))
	for i, l := range p.rx {
		qs[i] = l
	}
	return qs
}

// Read receives datagrams on the lane's socket into its buffers, where
// UDP GRO may have merged a train of them into one. It checks each
// packet there and hands out one per buffer: its IPoIB payload copied to
// bufs[i][offset:], the bytes before offset not touched. Packets of a
// merged datagram that do not fit this call's bufs wait for the next.
// Packets that fail a check, or do not fit their buffer, are counted and
// skipped.
func (l *rxLane) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	if offset < 0 {
		return 0, fmt.Errorf("simfabric: read offset %d is negative", offset)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		n := 0
		for ; l.cur < l.got && n < len(bufs); l.cur++ {
			data, _, _, _ := l.rcv.datagram(l.cur)
			n += l.split(data, &l.info[l.cur], bufs[n:], sizes[n:], meta[n:], offset)
			if l.info[l.cur].off < len(data) {
				break // bufs are full: the rest of this datagram next time
			}
		}
		if n > 0 {
			return n, nil
		}
		got, err := l.rcv.recv()
		if err != nil {
			if l.p.closed.Load() || errors.Is(err, net.ErrClosed) {
				return 0, net.ErrClosed
			}
			return 0, fmt.Errorf("simfabric: receive: %w", err)
		}
		l.cur, l.got = 0, got
		for i := 0; i < got; i++ {
			l.info[i] = l.inspect(l.rcv.datagram(i))
		}
	}
}

// rxInfo is what inspect learned of a received datagram, and how far
// split has got through it.
type rxInfo struct {
	oobInfo
	src   [16]byte
	sport uint16
	good  bool // addresses and framing fine: its packets go to check
	off   int  // next byte split hands out
}

// inspect checks what a received datagram's addresses, flags and control
// messages say, once for all the packets UDP GRO may have merged into it.
// A datagram refused here is counted once per packet in it.
func (l *rxLane) inspect(data, oob []byte, flags int, sa *unix.RawSockaddrInet6) rxInfo {
	p := l.p
	n := len(data)
	r := rxInfo{oobInfo: parseOOB(oob)}
	if r.hasOvfl && r.ovfl != l.ovfl {
		p.drops.AddN(ipoib.DropRxOverflow, uint64(r.ovfl-l.ovfl)) // a u32 in the kernel (sk_drops): the difference survives its wrap
		l.ovfl = r.ovfl
	}
	if r.seg <= 0 || r.seg > n {
		r.seg = n
	}
	reason := ipoib.DropNone
	switch {
	case p.down.Load():
		reason = ipoib.DropPortDown
	case flags&unix.MSG_TRUNC != 0:
		reason = ipoib.DropOversize
	case sa.Family != unix.AF_INET6 || !net.IP(sa.Addr[:]).IsLinkLocalUnicast():
		reason = ipoib.DropBadSource
	case !r.ok:
		reason = ipoib.DropNoPktinfo
	case n == 0:
		reason = ipoib.DropTruncated
	}
	if reason != ipoib.DropNone {
		p.drops.AddN(reason, uint64(max((n+r.seg-1)/max(r.seg, 1), 1)))
		r.off = n
		return r
	}
	port := (*[2]byte)(unsafe.Pointer(&sa.Port))
	r.src, r.sport, r.good = sa.Addr, uint16(port[0])<<8|uint16(port[1]), true
	if r.seg < n {
		l.groMerged.Add(1)
		l.groPackets.Add(uint64((n + r.seg - 1) / r.seg))
	}
	return r
}

// split checks the packets of a datagram, from r.off on, copies the
// payload of each good one into bufs at offset, and returns how many it
// filled. It stops when bufs are full. The copy is needed because a
// receive buffer holds a whole datagram, up to a 64 KB GRO train of
// packets. The caller's buffers take one packet each, with room in front
// for the Ethernet header the shim puts there.
func (l *rxLane) split(data []byte, r *rxInfo, bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) int {
	n := 0
	for r.off < len(data) && n < len(bufs) {
		pkt := data[r.off:min(r.off+r.seg, len(data))]
		r.off += len(pkt)
		if payload, ok := l.check(pkt, &r.src, &r.dst, r.sport, &meta[n], len(bufs[n])-offset); ok {
			sizes[n] = copy(bufs[n][offset:], payload)
			n++
		}
	}
	return n
}

// check verifies the UDP payload b (starting with the BTH) of a datagram
// from src, UDP port sport, to dst. It checks decode, Q_Key and size (at
// most the MTU and room bytes), then the shared receive checks
// (ipoib.CheckRx: destination QP or group, P_Key). It counts a failure,
// or fills rm and returns the payload, a view of b.
func (l *rxLane) check(b []byte, src, dst *[16]byte, sport uint16, rm *ipoib.RxMeta, room int) ([]byte, bool) {
	p := l.p
	var pkt Packet
	if err := l.codec.Decode(b, src, dst, sport, UDPPort, &pkt); err != nil {
		p.drops.Add(err.(DecodeError).Drop())
		return nil, false
	}
	if pkt.QKey != ipoib.QKey {
		p.drops.Add(ipoib.DropQKey)
		return nil, false
	}
	if len(pkt.Payload) > min(p.mtu, room) {
		p.drops.Add(ipoib.DropOversize)
		return nil, false
	}
	*rm = ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, pkt.SrcQPN, ipoib.GID(*src)), DstQPN: pkt.DestQPN, PKey: ipoib.PKey(pkt.PKey)}
	// The group is the IPv6 destination whenever that is multicast, so
	// that CheckRx sees a unicast QPN to an MGID (IBA 9.8.1) as well as
	// the multicast QPN to a unicast GID.
	mc := ipoib.GID(*dst).IsMulticast()
	if mc {
		rm.MGID = *dst
	}
	if d := ipoib.CheckRx(rm, p.qps, p.groups); d != ipoib.DropNone {
		p.drops.Add(d)
		return nil, false
	}
	if mc {
		l.multicast.Add(1)
	}
	l.packets.Add(1)
	l.bytes.Add(uint64(len(pkt.Payload)))
	return pkt.Payload, true
}
