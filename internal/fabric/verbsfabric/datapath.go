package verbsfabric

import (
	"fmt"
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
		p.drops.AddN(ipoib.DropPortDown, uint64(len(bufs)))
		return 0, nil
	}
	p.takeEvicted()
	p.reap()
	accepted := 0
	for i := range bufs {
		pkt := bufs[i][offset:]
		m := &meta[i]
		q := p.valid(m, len(pkt))
		if q == nil {
			continue
		}
		key := ahKey{m.Dst.GID(), q.wire}
		ah, ok := p.ah(key)
		if !ok {
			var held bool
			if ah, ok, held = p.hold(pkt, m, key); !ok {
				if held {
					accepted++
				}
				continue
			}
		}
		if p.queue(pkt, q, m.SrcQPN, m.Dst.QPN(), ah) {
			accepted++
		}
		if len(p.descs) == batchSize {
			p.post()
		}
	}
	p.post()
	return accepted, nil
}

// valid checks one packet's metadata (ipoib.CheckTx; the port takes no
// super-packets) and size, counting a refusal, and returns the sending
// QP (nil when refused).
func (p *Port) valid(m *ipoib.TxMeta, n int) *qpState {
	e, d := ipoib.CheckTx(m, n, p.qps, false)
	if d == ipoib.DropNone && n < ipoib.HeaderLen {
		d = ipoib.DropBadMeta
	}
	if d != ipoib.DropNone {
		p.drops.Add(d)
		return nil
	}
	q := e.Data.(*qpState)
	if n > int(q.part.mtu.Load()) {
		// The partition's MTU (its broadcast group's on IB). rxe
		// completes a UD send larger than the MTU without sending it:
		// refuse it here, where it can be counted.
		p.drops.Add(ipoib.DropOversize)
		return nil
	}
	return q
}

// queue copies pkt into a send slot and adds its descriptor to the
// batch, with the partition's Q_Key as the remote Q_Key (IPoIB's
// tx_wr.remote_qkey = priv->qkey, from the broadcast group).
func (p *Port) queue(pkt []byte, q *qpState, src, rqpn uint32, ah handle) bool {
	slot, ok := p.slot()
	if !ok {
		p.drops.Add(ipoib.DropRingFull)
		return false
	}
	copy(p.dev.sendBuf(slot), pkt)
	p.slots[slot] = slotInfo{qpn: src, seq: q.posted}
	q.posted++
	p.descs = append(p.descs, sendDesc{qpn: src, ah: ah, rqpn: rqpn, qkey: q.part.qkey.Load(), slot: slot, len: len(pkt), wrID: q.posted - 1,
		signal: q.posted%signalEvery == 0})
	p.used++
	p.queued++
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
	for i := len(p.descs) - 1; i >= 0; i-- {
		// FreeQP takes a QP out of the table between batches only:
		// every QP of the batch is here.
		if q := p.qp(p.descs[i].qpn); q != nil && q.lastBatch != p.batchNo {
			q.lastBatch = p.batchNo
			p.descs[i].signal = true
		}
	}
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
		for i := len(p.descs) - 1; i >= n; i-- {
			d := &p.descs[i]
			if q := p.qp(d.qpn); q != nil {
				q.posted = d.wrID
			}
			p.txBytes.Add(^uint64(d.len - 1))
			p.used--
			p.queued--
			p.head = (p.head - 1 + len(p.slots)) % len(p.slots)
		}
		p.drops.AddN(ipoib.DropSendError, uint64(len(p.descs)-n))
		p.warnLimited(err)
	}
	p.descs = p.descs[:0]
}

// slot returns the next free send slot. Slots are used as a ring and
// freed in order: the oldest is free once its QP has completed its send
// or the QP is destroyed.
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

// reap takes send completions and frees the slots they cover: a slot is
// free once its QP completed the send or is destroyed. A freed QP not
// destroyed yet (dying) keeps its slots: its sends may still be reading
// them. reap then destroys the dead address handles no send can still
// use. It runs in the middle of a batch too (slot, when the ring is
// full), so it takes no evicted handle (see takeEvicted).
func (p *Port) reap() {
	n := p.dev.pollSend(p.dones)
	for _, d := range p.dones[:n] {
		if !d.ok {
			p.drops.Add(ipoib.DropSendError)
		}
		if q := p.txQP(d.qpn); q != nil && d.wrID+1 > q.done {
			q.done = d.wrID + 1
		}
	}
	for p.used > 0 {
		tail := (p.head - p.used + len(p.slots)) % len(p.slots)
		s := p.slots[tail]
		if q := p.txQP(s.qpn); q != nil && s.seq >= q.done {
			break
		}
		p.used--
		p.freed++
	}
	if len(p.dead) > 0 {
		p.buryAHs()
	}
}

// txQP is QP qpn's state, freed but not destroyed yet included (nil: no
// such QP, or destroyed). Called with txMu held.
func (p *Port) txQP(qpn uint32) *qpState {
	if q := p.qp(qpn); q != nil {
		return q
	}
	return p.dying[qpn]
}

// takeEvicted moves the address handles evictAH dropped to the dead
// list, to be destroyed once every send queued so far is done. It runs
// only where no handle looked up from the cache is held (a batch's
// start, txMu held): a handle evicted after a lookup, before its send
// is queued, then gets a mark past that send. Taken in the middle of a
// batch, the mark could come before the send and the handle be
// destroyed under it.
func (p *Port) takeEvicted() {
	if p.nEvicted.Load() == 0 {
		return
	}
	p.ahMu.Lock()
	for _, h := range p.evicted {
		p.dead = append(p.dead, deadAH{h: h, mark: p.queued})
	}
	p.evicted = p.evicted[:0]
	p.nEvicted.Store(0)
	p.ahMu.Unlock()
}

// buryAHs destroys the flushed address handles no queued send can still
// use: those whose every earlier slot is free. Called with txMu held.
func (p *Port) buryAHs() {
	keep := p.dead[:0]
	for _, d := range p.dead {
		if d.mark <= p.freed {
			p.dev.destroyAH(d.h)
		} else {
			keep = append(keep, d)
		}
	}
	clear(p.dead[len(keep):])
	p.dead = keep
}

// flushAHs drops the cached address handles whose key match selects, as
// IPoIB's flushes drop paths and groups' handles; the next packet makes
// new ones (a resolution under way is made again: its generation is
// stale). The handles are destroyed once the sends queued on them are
// done.
func (p *Port) flushAHs(match func(ahKey) bool) {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	p.dropAHs(match)
}

// dropAHs is flushAHs with txMu held (between batches).
func (p *Port) dropAHs(match func(ahKey) bool) {
	p.ahMu.Lock()
	defer p.ahMu.Unlock()
	p.ahs.gen++
	p.ahs.deleteIf(func(k ahKey, e *ahEntry) bool {
		if !match(k) || e.resolving() {
			return false
		}
		if e.ready {
			p.dead = append(p.dead, deadAH{h: e.h, mark: p.queued})
		}
		return true
	})
	p.buryAHs()
}

// ah returns the address handle of key, asking the resolver for one
// when there is none. It takes no lock.
func (p *Port) ah(key ahKey) (handle, bool) {
	if h, ok := p.ahs.lookup(key); ok {
		return h, true
	}
	p.wantAH(key)
	return 0, false
}

// settled reports e as needing no resolution now: ready, under way, or
// failed moments ago.
func settled(e *ahEntry) bool {
	return e != nil && (e.ready || e.failedAt.IsZero() || time.Since(e.failedAt) < ahRetry)
}

// wantAH asks the resolver for key's address handle unless it has one,
// is making one, or failed to moments ago. That answer takes no lock (the
// receive path asks for every packet's sender); ahMu is taken only to
// add the entry.
func (p *Port) wantAH(key ahKey) {
	if settled(p.ahs.get(key)) {
		return
	}
	p.ahMu.Lock()
	if settled(p.ahs.get(key)) {
		p.ahMu.Unlock()
		return
	}
	if p.ahs.get(key) == nil && int(p.ahs.n.Load()) >= ahMax {
		p.evictAH()
	}
	e := &ahEntry{}
	p.ahs.set(key, e)
	p.ahMu.Unlock()
	select {
	case p.resolve <- key:
	default:
		// Every resolver busy and the queue full: the destination is
		// asked for again by its next packet.
		p.resolveFull.Add(1)
		p.ahMu.Lock()
		if p.ahs.get(key) == e {
			p.ahs.del(key)
		}
		p.ahMu.Unlock()
	}
}

// evictAH drops a unicast address handle not used lately from the cache
// (CLOCK). Sends queued on it may not have run yet (rxe looks the
// handle up when the send executes), so it is destroyed only once they
// are done: reap takes it to the dead list. Called with ahMu held, off
// the hot path (only when a new destination appears and the cache is
// full).
func (p *Port) evictAH() {
	if h, ok := p.ahs.evict(); ok {
		p.evicted = append(p.evicted, h)
		p.nEvicted.Store(int32(len(p.evicted)))
	}
}

// hold copies a packet into the pending pool until its destination's
// address handle exists, and reports it held; or returns the handle
// (ok) when it was made meanwhile. Called with txMu held.
func (p *Port) hold(pkt []byte, m *ipoib.TxMeta, key ahKey) (h handle, ok, held bool) {
	e := p.ahs.get(key)
	switch {
	case e != nil && e.ready:
		return e.h, true, false
	case e == nil || !e.resolving():
		p.drops.Add(ipoib.DropNoAH)
		return 0, false, false
	case len(p.pendFree) == 0 || e.pending >= pendingPerGID:
		p.drops.Add(ipoib.DropAHPending)
		return 0, false, false
	}
	e.pending++
	b := p.pendFree[len(p.pendFree)-1]
	p.pendFree = p.pendFree[:len(p.pendFree)-1]
	p.pending = append(p.pending, pendingPkt{buf: b, n: copy(p.pendBufs[b], pkt), src: m.SrcQPN, dst: m.Dst, pkey: m.PKey, key: key, e: e})
	return 0, false, true
}

// rejoiner retries the failed rejoins every ahRetry (IB only).
func (p *Port) rejoiner() {
	defer p.wg.Done()
	tick := time.NewTicker(ahRetry)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tick.C:
			p.retryRejoins()
		}
	}
}

// resolver makes address handles off the hot path, then sends what
// waited for them. resolvers of them run at once, each taking the next
// destination. On IB each resolution asks the SA: a path record waits up
// to 2 × 2 s, a send-only join 4 s. One destination whose answer is slow
// must not hold up every new one. Joins still take ctlMu one at a time,
// as the SA work of the port does; path records do not.
func (p *Port) resolver() {
	defer p.wg.Done()
	for {
		var key ahKey
		select {
		case <-p.done:
			return
		case key = <-p.resolve:
		}
		p.resolving.Add(1)
		p.resolveOne(key)
		p.resolving.Add(-1)
	}
}

// resolveOne makes key's address handle and sends what waited for it.
func (p *Port) resolveOne(key ahKey) {
	p.ahMu.Lock()
	gen := p.ahs.gen
	p.ahMu.Unlock()
	h, err := p.makeAH(key)
	p.ahMu.Lock()
	e := p.ahs.get(key)
	switch {
	case e == nil || !e.resolving():
		// Flushed or replaced meanwhile.
		if err == nil {
			p.dev.destroyAH(h)
		}
	case p.ahs.gen != gen:
		// A flush came while this path was resolved: it may be stale.
		if err == nil {
			p.dev.destroyAH(h)
		}
		select {
		case p.resolve <- key:
		default:
			p.ahs.set(key, &ahEntry{failedAt: time.Now()})
		}
	case err != nil:
		p.ahs.set(key, &ahEntry{failedAt: time.Now()})
		p.ahFailed.Add(1)
	default:
		p.ahs.set(key, &ahEntry{h: h, ready: true})
		p.ahCreated.Add(1)
	}
	p.ahMu.Unlock()
	if err != nil {
		p.warnLimited(err)
	}
	p.flushPending(key)
}

// makeAH makes key's address handle. Every packet carries a GRH, on IB
// too, so that receivers learn the source GID. On IB the DLID and SL
// come from a path record in the sending QP's partition. For a group
// they come from its SA membership; a send-only one is made here when
// the port is not a member.
func (p *Port) makeAH(key ahKey) (handle, error) {
	pa := path{gid: key.gid, global: true}
	if p.sa != nil {
		if key.gid.IsMulticast() {
			p.ctlMu.Lock()
			m, err := p.saJoin(key.gid, true)
			if err == nil {
				pa.dlid, pa.sl = m.mlid, m.sl
			}
			p.ctlMu.Unlock()
			if err != nil {
				return 0, err
			}
		} else {
			// AF_IB ids take RDMA_PS_IB, not RDMA_PS_IPOIB
			// (cma_select_ib_ps); service ID 0: a plain path record.
			epoch := p.lids.now() // a flush during the query voids what it teaches
			r, err := p.sa.pathRecord(pathQuery{sgid: p.a.gid, dgid: key.gid, pkey: key.pkey, ps: psIB})
			if err != nil {
				return 0, fmt.Errorf("verbsfabric: path record to %s in partition %s: %w", key.gid, key.pkey, err)
			}
			pa.dlid, pa.sl = r.dlid, r.sl
			p.lids.learnAt(epoch, r.dlid, key.gid, p.a.gid)
		}
	}
	return p.dev.createAH(pa)
}

// flushPending sends what waited for key on the handle the cache holds
// for it now, under txMu. It does not use the one the resolver made: a
// flush (flushAHs) or an eviction may have dropped that since the
// resolver let ahMu go. A flush buries a handle at once when no send is
// outstanding, and a send queued after the flush's mark would run on a
// destroyed handle (rxe looks the handle up when the send executes).
// Under txMu no flush runs. A handle evicted from here on reaches the
// dead list only at the next batch's start (takeEvicted), past these
// sends. Packets whose key is being resolved again stay held. With no
// handle (the resolution failed, or the entry was flushed or evicted)
// they are dropped and counted.
func (p *Port) flushPending(key ahKey) {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	if p.closed.Load() {
		return
	}
	e := p.ahs.get(key)
	keep := p.pending[:0]
	for _, w := range p.pending {
		switch {
		case w.key != key:
			keep = append(keep, w)
			continue
		case e != nil && e.resolving():
			if w.e != e { // held for an entry flushed since: count it in the new one
				w.e = e
				e.pending++
			}
			keep = append(keep, w)
			continue
		case e == nil || !e.ready:
			p.drops.Add(ipoib.DropNoAH)
		default:
			m := ipoib.TxMeta{Dst: w.dst, SrcQPN: w.src, PKey: w.pkey}
			if q := p.valid(&m, w.n); q != nil {
				p.queue(p.pendBufs[w.buf][:w.n], q, w.src, w.dst.QPN(), e.h)
			}
		}
		p.pendFree = append(p.pendFree, w.buf)
	}
	clear(p.pending[len(keep):])
	p.pending = keep
	p.post()
}

// receiver keeps the shared receive queue full whatever the reader does.
// UD has no RNR: a packet that finds no buffer posted is lost in the
// HCA, uncounted here. So buffers are reposted as soon as their
// completions are taken, not when Read has copied them out. Each
// completion takes a spare buffer, which replaces it on the SRQ, and
// waits in the ready queue for Read. The reader may fall so far behind
// that no spare is left (the ready queue holds depth packets). Then the
// new packet's own buffer goes straight back to the SRQ, and the packet
// is dropped and counted (rx_queue_full), as a NIC's ring drops at its
// tail. A failure of the device ends receiver; Read then returns the
// error once the ready queue is empty.
func (p *Port) receiver() {
	defer p.wg.Done()
	for {
		n := p.dev.pollRecv(p.polled)
		if n == 0 {
			ok, err := p.dev.waitRecv()
			if err != nil && !p.closed.Load() {
				p.rxFail(err)
				return
			}
			if !ok {
				return // woken: closing
			}
			continue
		}
		p.rqMu.Lock()
		for _, d := range p.polled[:n] {
			if len(p.spare) == 0 {
				p.repost = append(p.repost, uint32(d.buf))
				p.drops.Add(ipoib.DropQueueFull)
				continue
			}
			p.repost = append(p.repost, p.spare[len(p.spare)-1])
			p.spare = p.spare[:len(p.spare)-1]
			p.ready[(p.readyAt+p.readyN)%len(p.ready)] = d
			p.readyN++
		}
		p.rqMu.Unlock()
		err := p.dev.postRecv(p.repost)
		p.repost = p.repost[:0]
		select {
		case p.rxReady <- struct{}{}:
		default:
		}
		if err != nil {
			p.rxFail(err)
			return
		}
	}
}

// rxFail records the receiver's failure for Read.
func (p *Port) rxFail(err error) {
	p.rxErr.Store(&err)
	select {
	case p.rxReady <- struct{}{}:
	default:
	}
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
		p.rqMu.Lock()
		n := min(len(bufs), len(p.rdone), p.readyN)
		for i := range n {
			p.rdone[i] = p.ready[(p.readyAt+i)%len(p.ready)]
		}
		p.readyAt = (p.readyAt + n) % len(p.ready)
		p.readyN -= n
		p.rqMu.Unlock()
		if n == 0 {
			if err := p.rxErr.Load(); err != nil {
				return 0, *err
			}
			select {
			case <-p.rxReady:
			case <-p.done:
			}
			continue
		}
		k := 0
		for _, d := range p.rdone[:n] {
			if p.take(d, bufs[k][offset:], &sizes[k], &meta[k]) {
				k++
			}
		}
		p.rqMu.Lock()
		for _, d := range p.rdone[:n] {
			p.spare = append(p.spare, uint32(d.buf))
		}
		p.rqMu.Unlock()
		if k > 0 {
			return k, nil
		}
	}
}

// take checks one receive completion and copies its packet to dst.
func (p *Port) take(d recvDone, dst []byte, size *int, m *ipoib.RxMeta) bool {
	switch {
	case !d.ok:
		p.drops.Add(ipoib.DropRecvError)
		return false
	case !d.grh && !p.a.ib:
		p.drops.Add(ipoib.DropNoGRH)
		return false
	case d.len < grhLen+ipoib.HeaderLen:
		p.drops.Add(ipoib.DropTruncated)
		return false
	}
	// The buffer always starts with the GRH's 40 bytes. Without a GRH
	// they are undefined (IB unicast from a sender that sends none, as
	// kernel IPoIB does). The source GID is then the one last seen
	// behind the completion's SLID (lids.go).
	b := p.dev.recvBuf(d.buf)[:d.len]
	var src, dgid ipoib.GID
	named := d.grh
	if d.grh {
		var err error
		if src, dgid, err = parseGRH(b); err != nil {
			p.drops.Add(ipoib.DropBadGRH)
			return false
		}
		if p.a.ib {
			p.lids.learn(d.slid, src, p.a.gid)
		}
	} else {
		src, named = p.lids.lookup(d.slid)
	}
	q := p.qp(d.qpn)
	own := src == p.a.gid // from our GID, and (looked up only then) a QPN of ours: sent by this port
	if own {
		_, own = p.qps.Lookup(d.srcQPN)
	}
	pkt := b[grhLen:]
	if q == nil {
		p.drops.Add(ipoib.DropUnknownQPN)
		return false
	}
	*m = ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, d.srcQPN, src), DstQPN: d.qpn, PKey: q.pkey}
	if dgid.IsMulticast() {
		m.DstQPN, m.MGID = ipoib.MulticastQPN, dgid
	}
	drop := ipoib.CheckRx(m, p.qps, p.groups)
	switch {
	case own:
		// Multicast the port sent, looped back to its group QP.
		drop = ipoib.DropOwn
	case drop == ipoib.DropNone && len(pkt) > len(dst):
		drop = ipoib.DropBufferSmall
	}
	if drop != ipoib.DropNone {
		p.drops.Add(drop)
		return false
	}
	*size = copy(dst, pkt)
	switch {
	case !named:
		m.Src, m.SrcUnknown = ipoib.HwAddr{}, true
		p.rxSrcUnknown.Add(1)
	default:
		if !d.grh {
			p.rxByLID.Add(1)
		}
		p.wantAH(ahKey{src, q.wire}) // the reply will need it: make it now, off the TX path
	}
	p.rxPackets.Add(1)
	p.rxBytes.Add(uint64(len(pkt)))
	return true
}
