package simfabric

// The receive path: recvmmsg → inspect (addresses, flags, control
// messages, once per datagram) → split (one packet per buffer, a merged
// train cut into its packets) → check (decode, Q_Key, size, QP or group,
// P_Key) → payload left in place at offset.

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// Read receives datagrams into the port's buffers, where UDP GRO may
// have merged a train of them into one, and hands out one packet per
// buffer: the BTH and DETH land in the headroom (offset must be at least
// HeaderLen) and the IPoIB payload at bufs[i][offset:]. Packets of a
// merged datagram that do not fit this call's bufs wait for the next.
// Packets that fail a check are counted and skipped.
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	if offset < HeaderLen {
		return 0, fmt.Errorf("simfabric: read offset %d below header length %d", offset, HeaderLen)
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
		p.rxOverflow.Store(uint64(r.ovfl))
	}
	if r.seg <= 0 || r.seg > n {
		r.seg = n
	}
	reason := -1
	switch {
	case p.down.Load():
		reason = DropPortDown
	case flags&unix.MSG_TRUNC != 0:
		reason = DropOversize
	case sa.Family != unix.AF_INET6 || !net.IP(sa.Addr[:]).IsLinkLocalUnicast():
		reason = DropBadSource
	case !r.ok:
		reason = DropNoPktinfo
	case n == 0:
		reason = int(ErrTruncated)
	}
	if reason >= 0 {
		p.drops[reason].Add(uint64(max((n+r.seg-1)/max(r.seg, 1), 1)))
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

// split copies the packets of a datagram, from r.off on, into bufs (the
// BTH at offset-HeaderLen), checks each, and returns how many it filled;
// it stops when bufs are full.
func (p *Port) split(data []byte, r *rxInfo, bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) int {
	n := 0
	for r.off < len(data) && n < len(bufs) {
		pkt := data[r.off:min(r.off+r.seg, len(data))]
		r.off += len(pkt)
		b := bufs[n][offset-HeaderLen:]
		if len(pkt) > len(b) {
			p.drop(DropOversize)
			continue
		}
		copy(b, pkt)
		if l, ok := p.check(b[:len(pkt)], &r.src, &r.dst, r.sport, &meta[n]); ok {
			sizes[n] = l
			n++
		}
	}
	return n
}

// check verifies the UDP payload b (starting with the BTH) of a datagram
// from src, UDP port sport, to dst: decode, Q_Key, size, destination QP
// or group, P_Key. It counts a failure, or fills rm and returns the
// payload length.
func (p *Port) check(b []byte, src, dst *[16]byte, sport uint16, rm *ipoib.RxMeta) (int, bool) {
	var pkt Packet
	if err := p.rcodec.Decode(b, src, dst, sport, UDPPort, &pkt); err != nil {
		p.drop(int(err.(DecodeError)))
		return 0, false
	}
	if pkt.QKey != ipoib.QKey {
		p.drop(DropQKey)
		return 0, false
	}
	if len(pkt.Payload) > p.mtu {
		p.drop(DropOversize)
		return 0, false
	}
	pk := ipoib.PKey(pkt.PKey)
	*rm = ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, pkt.SrcQPN, ipoib.GID(*src)), DstQPN: pkt.DestQPN, PKey: pk}
	// IBA 9.8.1: a multicast packet's destination QP is 0xFFFFFF, and
	// 0xFFFFFF is never a unicast one.
	if (pkt.DestQPN == ipoib.MulticastQPN) != ipoib.GID(*dst).IsMulticast() {
		p.drop(DropBadDestQPN)
		return 0, false
	}
	if pkt.DestQPN == ipoib.MulticastQPN {
		mgid := ipoib.GID(*dst)
		if !p.groups.Full(mgid) {
			p.drop(DropNotJoined)
			return 0, false
		}
		if !ipoib.CanTalk(pk, ipoib.MGIDPKey(mgid)) {
			p.drop(DropPKey)
			return 0, false
		}
		rm.MGID = mgid
	} else {
		qpk, ok := p.qps.PKey(pkt.DestQPN)
		if !ok {
			p.drop(DropUnknownQPN)
			return 0, false
		}
		if !ipoib.CanTalk(pk, qpk) {
			p.drop(DropPKey)
			return 0, false
		}
	}
	p.rxPackets.Add(1)
	p.rxBytes.Add(uint64(len(pkt.Payload)))
	return len(pkt.Payload), true
}
