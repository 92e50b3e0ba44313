package simfabric

// The receive path: recvmmsg → inspect (addresses, flags, control
// messages, once per datagram) → split (one packet per buffer, a merged
// train cut into its packets) → check (decode, Q_Key, size, QP or group,
// P_Key) in the receive buffer → payload copied to the caller's buffer
// at offset.

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// Read receives datagrams into the port's buffers, where UDP GRO may
// have merged a train of them into one, checks each packet there and
// hands out one per buffer: its IPoIB payload copied to bufs[i][offset:]
// (the bytes before offset are not touched). Packets of a merged
// datagram that do not fit this call's bufs wait for the next. Packets
// that fail a check, or do not fit their buffer, are counted and
// skipped.
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	if offset < 0 {
		return 0, fmt.Errorf("simfabric: read offset %d is negative", offset)
	}
	p.rmu.Lock()
	defer p.rmu.Unlock()
	for {
		n := 0
		for ; p.rcur < p.rgot && n < len(bufs); p.rcur++ {
			data, _, _, _ := p.rcv.datagram(p.rcur)
			n += p.split(data, &p.rinfo[p.rcur], bufs[n:], sizes[n:], meta[n:], offset)
			if p.rinfo[p.rcur].off < len(data) {
				break // bufs are full: the rest of this datagram next time
			}
		}
		if n > 0 {
			return n, nil
		}
		got, err := p.rcv.recv()
		if err != nil {
			if p.closed.Load() || errors.Is(err, net.ErrClosed) {
				return 0, net.ErrClosed
			}
			return 0, fmt.Errorf("simfabric: receive: %w", err)
		}
		p.rcur, p.rgot = 0, got
		for i := 0; i < got; i++ {
			p.rinfo[i] = p.inspect(p.rcv.datagram(i))
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
func (p *Port) inspect(data, oob []byte, flags int, sa *unix.RawSockaddrInet6) rxInfo {
	n := len(data)
	r := rxInfo{oobInfo: parseOOB(oob)}
	if r.hasOvfl {
		p.drops[ipoib.DropRxOverflow].Store(uint64(r.ovfl))
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
		p.groMerged.Add(1)
		p.groPackets.Add(uint64((n + r.seg - 1) / r.seg))
	}
	return r
}

// split checks the packets of a datagram, from r.off on, copies the
// payload of each good one into bufs at offset, and returns how many it
// filled; it stops when bufs are full.
func (p *Port) split(data []byte, r *rxInfo, bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) int {
	n := 0
	for r.off < len(data) && n < len(bufs) {
		pkt := data[r.off:min(r.off+r.seg, len(data))]
		r.off += len(pkt)
		if payload, ok := p.check(pkt, &r.src, &r.dst, r.sport, &meta[n], len(bufs[n])-offset); ok {
			sizes[n] = copy(bufs[n][offset:], payload)
			n++
		}
	}
	return n
}

// check verifies the UDP payload b (starting with the BTH) of a datagram
// from src, UDP port sport, to dst: decode, Q_Key, size (at most the
// MTU and room bytes), then the shared receive checks (ipoib.CheckRx:
// destination QP or group, P_Key). It counts a failure, or fills rm and
// returns the payload, a view of b.
func (p *Port) check(b []byte, src, dst *[16]byte, sport uint16, rm *ipoib.RxMeta, room int) ([]byte, bool) {
	var pkt Packet
	if err := p.rcodec.Decode(b, src, dst, sport, UDPPort, &pkt); err != nil {
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
	if ipoib.GID(*dst).IsMulticast() {
		rm.MGID = *dst
	}
	if d := ipoib.CheckRx(rm, p.qps, p.groups); d != ipoib.DropNone {
		p.drops.Add(d)
		return nil, false
	}
	p.rxPackets.Add(1)
	p.rxBytes.Add(uint64(len(pkt.Payload)))
	return pkt.Payload, true
}
