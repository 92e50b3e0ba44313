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
		if p.startCut(b[offset:], m.GSO) != nil {
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

// startCut prepares the cutter for super-packet pkt described by g: TCP
// into segments, UDP into its datagrams (whose IP packets must fit the
// IPoIB MTU), which leave as one of the port's UDP GSO trains when they
// are of one size.
func (p *Port) startCut(pkt []byte, g ipoib.GSO) error {
	if g.Type.UDP() {
		return p.cutter.StartUDP(pkt, ipoib.HeaderLen, int(g.L4), g.Type.V6(), int(g.Size), p.mtu-ipoib.HeaderLen)
	}
	return p.cutter.Start(pkt, ipoib.HeaderLen, int(g.L4), g.Type.V6(), int(g.Size), p.mtu-ipoib.HeaderLen)
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

// writeChunk sends at most batch packets and sets ok[i] for each one
// accepted; call with wmu held.
func (p *Port) writeChunk(bufs [][]byte, meta []ipoib.TxMeta, offset int, ok *[batch]bool) error {
	if p.down.Load() {
		p.drops.AddN(ipoib.DropPortDown, uint64(len(bufs)))
		return nil
	}
	var size [batch]int // payload length of each accepted packet, 0 if refused
	src := [16]byte(p.gid)
	msgs := p.wmsgs[:0]
	p.worig = p.worig[:0]
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
		pkt := Packet{PKey: uint16(m.PKey), DestQPN: m.Dst.QPN(), PSN: p.psn.Add(1) & 0xffffff, QKey: ipoib.QKey, SrcQPN: m.SrcQPN}
		out := p.wcodec.Encode(b, offset, &pkt, &src, &dst, UDPPort, UDPPort)
		if p.hook != nil {
			p.hook(out[HeaderLen:], dstGID.IsMulticast())
		}
		msgs = p.add(msgs, out, p.udpAddr(dstGID), i)
		size[i] = payload
	}
	var out []ipv6.Message
	var spans []span
	if p.gso && p.hook == nil {
		out, spans = p.trains(msgs)
	} else {
		out, spans = msgs, p.singles(len(msgs))
	}
	if err := p.send(out, spans, msgs, &size); err != nil {
		return err
	}
	for i, l := range size[:len(bufs)] {
		if l > 0 {
			ok[i] = true
			p.txPackets.Add(1)
			p.txBytes.Add(uint64(l))
		}
	}
	return nil
}

// send sends out (each message standing for the messages of its span in
// orig) and clears size for the packets lost. A refused train's packets
// go again one by one; when the refusal is the kernel's word on GSO
// itself, trains are off for the port from then on.
func (p *Port) send(out []ipv6.Message, spans []span, orig []ipv6.Message, size *[batch]int) error {
	// lost counts a packet the kernel refused: a send error (no route,
	// no buffer) loses it, as a full HCA send queue would.
	lost := func(k int) {
		p.drops.Add(ipoib.DropSendError)
		size[p.worig[k]] = 0
	}
	for off := 0; off < len(out); off++ {
		sent, err := p.snd.send(out[off:])
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
			lost(s.from)
			continue
		}
		// The kernel refuses GSO itself (no UDP GSO, or not with this
		// socket or device): trains off for good. Other errors (no
		// buffer, link down) are passing: the train's packets go one
		// by one this time only.
		if p.gso && (errors.Is(err, unix.EIO) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
			p.gso = false
			p.gsoFallback.Add(1)
		}
		for k := s.from; k < s.to; k++ {
			if _, err := p.snd.send(orig[k : k+1]); err != nil {
				if p.closed.Load() {
					return net.ErrClosed
				}
				lost(k)
			}
		}
	}
	return nil
}

// add appends a message for b, sent on behalf of bufs[orig] of the
// current chunk.
func (p *Port) add(msgs []ipv6.Message, b []byte, to *peer, orig int) []ipv6.Message {
	i := len(msgs)
	p.wbufs[i][0] = b
	p.worig = append(p.worig, orig)
	return append(msgs, ipv6.Message{Buffers: p.wbufs[i][:], Addr: to})
}
