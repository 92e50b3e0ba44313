package verbsfabric

import (
	"net"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// Write sends the batch; see the package's flow comment. It returns how
// many packets were posted or queued for an address handle.
func (p *Port) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	p.txMu.Lock()
	defer p.txMu.Unlock()
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if p.down.Load() {
		p.drops[DropPortDown].Add(uint64(len(bufs)))
		return 0, nil
	}
	p.reap()
	accepted := 0
	for i := range bufs {
		pkt := bufs[i][offset:]
		m := &meta[i]
		if !p.valid(m, len(pkt)) {
			continue
		}
		ah, ok := p.ah(m.Dst.GID())
		if !ok {
			if p.hold(pkt, m) {
				accepted++
			}
			continue
		}
		if p.queue(pkt, m.SrcQPN, m.Dst.QPN(), ah) {
			accepted++
		}
		if len(p.descs) == batchSize {
			p.post()
		}
	}
	p.post()
	return accepted, nil
}

// valid checks one packet's metadata and size, counting a refusal.
func (p *Port) valid(m *ipoib.TxMeta, n int) bool {
	p.qpMu.RLock()
	q, ok := p.qps[m.SrcQPN]
	p.qpMu.RUnlock()
	mc := m.Dst.QPN() == ipoib.MulticastQPN
	switch {
	case !ok || q.pkey != m.PKey || mc != m.Dst.GID().IsMulticast() || m.GSO.Type != ipoib.GSONone || n < ipoib.HeaderLen:
		p.drops[DropBadMeta].Add(1)
		return false
	case n > p.a.mtu:
		// rxe completes a UD send larger than the MTU without sending it:
		// refuse it here, where it can be counted.
		p.drops[DropOversize].Add(1)
		return false
	}
	return true
}

// queue copies pkt into a send slot and adds its descriptor to the batch.
func (p *Port) queue(pkt []byte, src, rqpn uint32, ah handle) bool {
	slot, ok := p.slot()
	if !ok {
		p.drops[DropRingFull].Add(1)
		return false
	}
	p.qpMu.RLock()
	q := p.qps[src]
	p.qpMu.RUnlock()
	copy(p.dev.sendBuf(slot), pkt)
	p.slots[slot] = slotInfo{qpn: src, seq: q.posted}
	q.posted++
	p.descs = append(p.descs, sendDesc{qpn: src, ah: ah, rqpn: rqpn, slot: slot, len: len(pkt), wrID: q.posted - 1,
		signal: q.posted%signalEvery == 0})
	p.used++
	p.txBytes.Add(uint64(len(pkt)))
	return true
}

// post posts the batch, asking for a completion of the last packet of
// each QP in it so that every slot is freed in time.
func (p *Port) post() {
	if len(p.descs) == 0 {
		return
	}
	p.batchNo++
	p.qpMu.RLock()
	for i := len(p.descs) - 1; i >= 0; i-- {
		q := p.qps[p.descs[i].qpn]
		if q.lastBatch != p.batchNo {
			q.lastBatch = p.batchNo
			p.descs[i].signal = true
		}
	}
	p.qpMu.RUnlock()
	for i := range p.descs {
		if p.descs[i].signal {
			p.signalled.Add(1)
		}
	}
	n, err := p.dev.postSend(p.descs)
	p.txPackets.Add(uint64(n))
	if err != nil {
		// The rest were not posted: they never complete, so give their
		// slots back (they are the newest) and rewind their QPs.
		p.qpMu.RLock()
		for i := len(p.descs) - 1; i >= n; i-- {
			d := &p.descs[i]
			if q := p.qps[d.qpn]; q != nil {
				q.posted = d.wrID
			}
			p.txBytes.Add(^uint64(d.len - 1))
			p.used--
			p.head = (p.head - 1 + len(p.slots)) % len(p.slots)
		}
		p.qpMu.RUnlock()
		p.drops[DropSendError].Add(uint64(len(p.descs) - n))
		p.warnOnce(err)
	}
	p.descs = p.descs[:0]
}

// slot returns the next free send slot. Slots are used as a ring and
// freed in order: the oldest is free once its QP has completed its send
// or the QP is gone.
func (p *Port) slot() (int, bool) {
	if p.used == len(p.slots) {
		p.reap()
		if p.used == len(p.slots) && len(p.descs) > 0 {
			p.post()
		}
		for wait := time.Microsecond; p.used == len(p.slots) && wait < 4*time.Millisecond; wait *= 2 {
			time.Sleep(wait)
			p.reap()
		}
		if p.used == len(p.slots) {
			return 0, false
		}
	}
	s := p.head
	p.head = (p.head + 1) % len(p.slots)
	return s, true
}

// reap takes send completions and frees the slots they cover.
func (p *Port) reap() {
	n := p.dev.pollSend(p.dones)
	p.qpMu.RLock()
	defer p.qpMu.RUnlock()
	for _, d := range p.dones[:n] {
		if !d.ok {
			p.drops[DropSendError].Add(1)
		}
		if q := p.qps[d.qpn]; q != nil && d.wrID+1 > q.done {
			q.done = d.wrID + 1
		}
	}
	for p.used > 0 {
		tail := (p.head - p.used + len(p.slots)) % len(p.slots)
		s := p.slots[tail]
		if q := p.qps[s.qpn]; q != nil && s.seq >= q.done {
			break
		}
		p.used--
	}
}

// ah returns the address handle of gid, asking the resolver for one when
// there is none.
func (p *Port) ah(gid ipoib.GID) (handle, bool) {
	p.ahMu.Lock()
	e := p.ahs[gid]
	if e != nil && e.ready {
		e.lastUsed = time.Now()
		p.ahMu.Unlock()
		return e.h, true
	}
	p.ahMu.Unlock()
	p.wantAH(gid)
	return 0, false
}

// wantAH asks the resolver for gid's address handle unless it has one,
// is making one, or failed to moments ago.
func (p *Port) wantAH(gid ipoib.GID) {
	p.ahMu.Lock()
	e := p.ahs[gid]
	if e != nil && (e.ready || e.failedAt.IsZero() || time.Since(e.failedAt) < ahRetry) {
		p.ahMu.Unlock()
		return
	}
	if e == nil {
		if len(p.ahs) >= ahMax {
			p.evictAH()
		}
		e = &ahEntry{}
		p.ahs[gid] = e
	}
	e.failedAt = time.Time{}
	p.ahMu.Unlock()
	select {
	case p.resolve <- gid:
	default:
		p.ahMu.Lock()
		if p.ahs[gid] == e {
			delete(p.ahs, gid)
		}
		p.ahMu.Unlock()
	}
}

// evictAH destroys the least recently used unicast address handle. Called
// with ahMu held, off the hot path (only when a new destination appears
// and the cache is full).
func (p *Port) evictAH() {
	var old ipoib.GID
	var oldest *ahEntry
	for g, e := range p.ahs {
		if e.ready && !g.IsMulticast() && e.pending == 0 && (oldest == nil || e.lastUsed.Before(oldest.lastUsed)) {
			old, oldest = g, e
		}
	}
	if oldest != nil {
		delete(p.ahs, old)
		p.dev.destroyAH(oldest.h)
	}
}

// hold copies a packet into the pending pool until its destination's
// address handle exists.
func (p *Port) hold(pkt []byte, m *ipoib.TxMeta) bool {
	gid := m.Dst.GID()
	p.ahMu.Lock()
	e := p.ahs[gid]
	if e == nil || !e.failedAt.IsZero() {
		p.ahMu.Unlock()
		p.drops[DropNoAH].Add(1)
		return false
	}
	if len(p.pendFree) == 0 || e.pending >= pendingPerGID {
		p.ahMu.Unlock()
		p.drops[DropPendingFull].Add(1)
		return false
	}
	e.pending++
	p.ahMu.Unlock()
	b := p.pendFree[len(p.pendFree)-1]
	p.pendFree = p.pendFree[:len(p.pendFree)-1]
	p.pending = append(p.pending, pendingPkt{buf: b, n: copy(p.pendBufs[b], pkt), src: m.SrcQPN, dst: m.Dst, pkey: m.PKey})
	return true
}

// resolver makes address handles off the hot path, then sends what
// waited for them.
func (p *Port) resolver() {
	defer p.wg.Done()
	for {
		var gid ipoib.GID
		select {
		case <-p.done:
			return
		case gid = <-p.resolve:
		}
		h, err := p.makeAH(gid)
		p.ahMu.Lock()
		e := p.ahs[gid]
		switch {
		case e == nil:
			if err == nil {
				p.dev.destroyAH(h)
			}
		case err != nil:
			e.failedAt = time.Now()
			p.ahFailed.Add(1)
		default:
			e.h, e.ready, e.lastUsed = h, true, time.Now()
			p.ahCreated.Add(1)
		}
		p.ahMu.Unlock()
		if err != nil {
			p.warnOnce(err)
		}
		p.flushPending(gid, err == nil)
	}
}

// makeAH makes gid's address handle. Every packet carries a GRH (on IB
// too, so that receivers learn the source GID); on IB the DLID and SL
// come from a path record, or for a group from its SA membership (a
// send-only one is made here when the port is not a member).
func (p *Port) makeAH(gid ipoib.GID) (handle, error) {
	pa := path{gid: gid, global: true}
	if p.a.ib {
		var l lidSL
		var err error
		if gid.IsMulticast() {
			var ok bool
			if l, ok = p.mlid(gid); !ok {
				l.lid, l.sl, err = p.dev.saJoin(gid, ipoib.MGIDPKey(gid), true)
				if err == nil {
					p.setMLID(gid, l)
				}
			}
		} else {
			l.lid, l.sl, err = p.dev.pathRecord(gid, p.a.pkeys[0])
		}
		if err != nil {
			return 0, err
		}
		pa.dlid, pa.sl = l.lid, l.sl
	}
	return p.dev.createAH(pa)
}

// flushPending sends (or, when its address handle failed, drops) what
// waited for gid.
func (p *Port) flushPending(gid ipoib.GID, ok bool) {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	if p.closed.Load() {
		return
	}
	keep := p.pending[:0]
	for _, w := range p.pending {
		if w.dst.GID() != gid {
			keep = append(keep, w)
			continue
		}
		sent := false
		if ok {
			m := ipoib.TxMeta{Dst: w.dst, SrcQPN: w.src, PKey: w.pkey}
			if h, ready := p.ah(gid); ready && p.valid(&m, w.n) {
				sent = p.queue(p.pendBufs[w.buf][:w.n], w.src, w.dst.QPN(), h)
			}
		}
		if !sent && !ok {
			p.drops[DropNoAH].Add(1)
		}
		p.pendFree = append(p.pendFree, w.buf)
	}
	clear(p.pending[len(keep):])
	p.pending = keep
	p.ahMu.Lock()
	if e := p.ahs[gid]; e != nil {
		e.pending = 0
	}
	p.ahMu.Unlock()
	p.post()
}

// Read returns received packets; see the package's flow comment. One
// goroutine reads at a time.
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	p.rxMu.Lock()
	defer p.rxMu.Unlock()
	for {
		if p.closed.Load() {
			return 0, net.ErrClosed
		}
		n := p.dev.pollRecv(p.rdone[:min(len(bufs), len(p.rdone))])
		if n == 0 {
			if _, err := p.dev.waitRecv(); err != nil && !p.closed.Load() {
				return 0, err
			}
			continue
		}
		k := 0
		for _, d := range p.rdone[:n] {
			p.repost = append(p.repost, uint32(d.buf))
			if p.take(d, bufs[k][offset:], &sizes[k], &meta[k]) {
				k++
			}
		}
		err := p.dev.postRecv(p.repost)
		p.repost = p.repost[:0]
		if err != nil {
			return k, err
		}
		if k > 0 {
			return k, nil
		}
	}
}

// take checks one receive completion and copies its packet to dst.
func (p *Port) take(d recvDone, dst []byte, size *int, m *ipoib.RxMeta) bool {
	switch {
	case !d.ok:
		p.drops[DropRecvError].Add(1)
		return false
	case !d.grh && !p.a.ib:
		p.drops[DropNoGRH].Add(1)
		return false
	case d.len < grhLen+ipoib.HeaderLen:
		p.drops[DropTruncated].Add(1)
		return false
	}
	// The buffer always starts with the GRH's 40 bytes; without a GRH
	// (IB unicast from a sender that sends none, as kernel IPoIB does)
	// they are undefined and the source is unknown.
	b := p.dev.recvBuf(d.buf)[:d.len]
	var src, dgid ipoib.GID
	if d.grh {
		var err error
		if src, dgid, err = parseGRH(b); err != nil {
			p.drops[DropBadGRH].Add(1)
			return false
		}
	}
	p.qpMu.RLock()
	q, ok := p.qps[d.qpn]
	_, own := p.qps[d.srcQPN]
	p.qpMu.RUnlock()
	own = own && src == p.a.gid // a QPN of ours, from our GID: sent by this port
	pkt := b[grhLen:]
	switch {
	case !ok:
		p.drops[DropUnknownQPN].Add(1)
		return false
	case own:
		// Multicast the port sent, looped back to its group QP.
		p.drops[DropOwn].Add(1)
		return false
	case dgid.IsMulticast() && !p.groups.Full(dgid):
		p.drops[DropNotJoined].Add(1)
		return false
	case len(pkt) > len(dst):
		p.drops[DropBufferSmall].Add(1)
		return false
	}
	*size = copy(dst, pkt)
	*m = ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, d.srcQPN, src), DstQPN: d.qpn, PKey: q.pkey}
	if !d.grh {
		m.Src, m.SrcUnknown = ipoib.HwAddr{}, true
	} else if !own {
		p.wantAH(src) // the reply will need it: make it now, off the TX path
	}
	if dgid.IsMulticast() {
		m.DstQPN, m.MGID = ipoib.MulticastQPN, dgid
	}
	p.rxPackets.Add(1)
	p.rxBytes.Add(uint64(len(pkt)))
	return true
}
