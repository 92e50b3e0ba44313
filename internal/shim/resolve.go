package shim

// Frames to an unknown REMAC: eth_ipoib dropped them. Here up to
// pendingPerDst frames per destination wait, as the kernel's neighbour
// queue does. Meanwhile the shim resolves the packet's destination IP on
// the guest's behalf: an ARP request or neighbour solicitation from the
// guest's own VIF. REMACs are derived from (GID, QPN), so once the
// endpoint answers, its REMAC is the one the guest used and the queue is
// sent. Unresolved after resolveTries, the frames are dropped and counted.

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

const (
	pendingPerDst   = 3
	maxPendingDsts  = 256
	resolveTries    = 3
	resolveInterval = time.Second
)

type pendingKey struct {
	pkey ipoib.PKey
	mac  ether.MAC
}

type pendingEntry struct {
	p      *partition
	vif    *mactrans.VIF
	source netip.Addr // the guest's address, sender of the resolution
	target netip.Addr // the address to resolve
	frames heldFrames // each with its sender: guests share a destination
	tries  int
	next   time.Time
}

// pendingQueue is touched only off the fast path (unknown destinations).
type pendingQueue struct {
	mu      sync.Mutex
	m       map[pendingKey]*pendingEntry
	nframes int          // frames held, under mu
	count   atomic.Int32 // len(m), read lock-free by the RX workers
	frames  atomic.Int32 // nframes, for the counters
}

func (q *pendingQueue) init() { q.m = make(map[pendingKey]*pendingEntry) }

// publish updates the lock-free copies of the sizes; call with mu held.
func (q *pendingQueue) publish() {
	q.count.Store(int32(len(q.m)))
	q.frames.Store(int32(q.nframes))
}

// forget deletes an entry whose frames are sent or dropped; call with mu
// held.
func (q *pendingQueue) forget(k pendingKey, e *pendingEntry) {
	q.nframes -= len(e.frames)
	delete(q.m, k)
}

// dropAll empties the queue, counting every frame.
func (q *pendingQueue) dropAll(c *counters) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, e := range q.m {
		c.c[DropUnresolved].Add(uint64(len(e.frames)))
		q.forget(k, e)
	}
	q.publish()
}

// resolver owns the frames waiting for an unknown REMAC (pending) and
// the ARP requests and neighbour solicitations that resolve them, sent
// from the guests' VIFs. Any sender may enqueue; tick and flush run
// within a sender's epoch (control.go). It makes no port control call.
type resolver struct {
	shared
	pending pendingQueue
	neigh   *mactrans.NeighTable
	groups  *groups // the solicited-node groups solicitations go to
	scope   uint8   // Config.Scope
}

// init readies r.
func (r *resolver) init(sh shared, neigh *mactrans.NeighTable, g *groups, scope uint8) {
	r.shared, r.neigh, r.groups, r.scope = sh, neigh, g, scope
	r.pending.init()
}

// enqueue holds the IPoIB packet pkt (ipoib.Headroom bytes before the
// header) for the unknown REMAC dst, starting a resolution when the
// destination is new, and reports whether pkt was queued (the caller
// counts a frame that was not). With pkt nil it only starts the
// resolution.
func (r *resolver) enqueue(p *partition, vif *mactrans.VIF, dst ether.MAC, pkt []byte, m ipoib.TxMeta, source, target netip.Addr, now time.Time) bool {
	q := &r.pending
	q.mu.Lock()
	k := pendingKey{p.pkey, dst}
	e, ok := q.m[k]
	if !ok {
		if len(q.m) >= maxPendingDsts || !target.IsValid() || target.IsUnspecified() {
			q.mu.Unlock()
			return false
		}
		e = &pendingEntry{p: p, vif: vif, source: source, target: target, next: now}
		q.m[k] = e
	}
	queued := false
	if pkt != nil && len(e.frames) < pendingPerDst {
		e.frames.hold(pkt, portTailRoom, heldFrame{meta: m, vif: vif})
		q.nframes++
		queued = true
	}
	q.publish()
	q.mu.Unlock()
	if queued {
		r.ctr.inc(TxQueued)
	}
	if !ok {
		r.tick(now)
	}
	return queued
}

// tick sends due resolutions and expires the hopeless. Call within
// a sender's epoch (control.go).
func (r *resolver) tick(now time.Time) {
	q := &r.pending
	if q.count.Load() == 0 {
		return
	}
	type req struct {
		p              *partition
		vif            *mactrans.VIF
		source, target netip.Addr
	}
	var due []req
	q.mu.Lock()
	for k, e := range q.m {
		if now.Before(e.next) {
			continue
		}
		switch {
		case !r.vifLive(e.vif):
			r.ctr.c[DropVIFGone].Add(uint64(len(e.frames)))
			q.forget(k, e)
		case e.tries == resolveTries:
			r.ctr.c[DropUnresolved].Add(uint64(len(e.frames)))
			q.forget(k, e)
		default:
			e.tries++
			e.next = now.Add(resolveInterval)
			due = append(due, req{e.p, e.vif, e.source, e.target})
		}
	}
	q.publish()
	q.mu.Unlock()
	for _, d := range due {
		r.send(d.p, d.vif, d.source, d.target)
	}
}

// flush sends the queued frames whose destination is now known.
// Call within a sender's epoch (control.go).
func (r *resolver) flush() {
	q := &r.pending
	var bufs [][]byte
	var meta []ipoib.TxMeta
	q.mu.Lock()
	for k, e := range q.m {
		n, ok := r.neigh.LookupREMAC(k.pkey, k.mac)
		if !ok {
			continue
		}
		for _, f := range e.frames {
			if !r.vifLive(f.vif) { // its guest's QP is gone: never send from it
				r.ctr.inc(DropVIFGone)
				continue
			}
			f.meta.Dst = n.RIMAC.WithoutFlags()
			bufs = append(bufs, f.buf)
			meta = append(meta, f.meta)
			r.ctr.inc(TxForwarded)
		}
		q.forget(k, e)
	}
	q.publish()
	q.mu.Unlock()
	if len(bufs) > 0 {
		r.toPort(bufs, meta)
	}
}

// send asks the fabric for target's address from the guest's VIF:
// an IPoIB ARP request to the broadcast group, or a neighbour solicitation
// with an IPoIB source link-layer option to the solicited-node group.
func (r *resolver) send(p *partition, vif *mactrans.VIF, source, target netip.Addr) {
	sent := false
	if target.Is4() {
		sent = r.sendARPRequest(p, vif, source, target)
	} else {
		sent = r.sendNDP(p, vif, ndSolicit, source, solicitedNode(target), target)
	}
	if sent {
		r.ctr.inc(TxResolveSent)
	}
}

// sendARPRequest sends an IPoIB ARP request from vif to the broadcast
// group (a gratuitous one when source is target).
func (r *resolver) sendARPRequest(p *partition, vif *mactrans.VIF, source, target netip.Addr) bool {
	buf := make([]byte, ipoib.Headroom, ipoib.Headroom+ipoib.HeaderLen+128)
	buf = binary.BigEndian.AppendUint16(buf, ether.TypeARP)
	buf = append(buf, 0, 0)
	buf = binary.BigEndian.AppendUint16(buf, arpndp.HwTypeInfiniBand)
	buf = binary.BigEndian.AppendUint16(buf, ether.TypeIPv4)
	buf = append(buf, ipoib.HwAddrLen, 4, 0, arpndp.OpRequest)
	buf = append(buf, vif.LIMAC[:]...)
	s4 := source.As4()
	buf = append(buf, s4[:]...)
	buf = append(buf, make([]byte, ipoib.HwAddrLen)...)
	t4 := target.As4()
	buf = append(buf, t4[:]...)
	m := ipoib.TxMeta{SrcQPN: vif.QPN, PKey: p.pkey, Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, p.bcast)}
	r.toPort([][]byte{buf}, []ipoib.TxMeta{m})
	return true
}

// The NDP messages sendNDP makes.
const (
	ndSolicit = iota // neighbour solicitation with the VIF's address as source option
	ndAdvert         // unsolicited neighbour advertisement (override) with it as target option
)

// sendNDP sends a neighbour solicitation or an unsolicited advertisement
// for target from vif, from source to group, carrying the VIF's 20-byte
// address as the link-layer option.
func (r *resolver) sendNDP(p *partition, vif *mactrans.VIF, kind int, source, group, target netip.Addr) bool {
	if !source.Is6() || source.IsUnspecified() {
		return false
	}
	buf := make([]byte, ipoib.Headroom, ipoib.Headroom+ipoib.HeaderLen+128)
	buf = binary.BigEndian.AppendUint16(buf, ether.TypeIPv6)
	buf = append(buf, 0, 0)
	const plen = 24 + 24 // NS/NA + IPoIB link-layer option
	start := len(buf)
	buf = buf[:start+header.IPv6Len]
	ip := header.EncodeIPv6(buf[start:], header.IPv6Fields{PayloadLen: plen, NextHeader: header.ProtoICMPv6, HopLimit: 255, Src: source, Dst: group})
	t16 := target.As16()
	typ, flags, opt := byte(arpndp.TypeNeighborSolicitation), byte(0), byte(arpndp.OptSLLA)
	if kind == ndAdvert {
		typ, flags, opt = arpndp.TypeNeighborAdvertisement, 0x20, arpndp.OptTLLA // override
	}
	buf = append(buf, typ, 0, 0, 0, flags, 0, 0, 0)
	buf = append(buf, t16[:]...)
	buf = append(buf, opt, 3, 0, 0)
	buf = append(buf, vif.LIMAC[:]...)
	icmp := buf[start+header.IPv6Len:]
	sum := csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoICMPv6, plen), icmp))
	binary.BigEndian.PutUint16(icmp[2:4], sum)
	mgid := ipoib.IPv6MGID(group, p.pkey, r.scope)
	m := ipoib.TxMeta{SrcQPN: vif.QPN, PKey: p.pkey, Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, mgid)}
	switch r.groups.sendTo(mgid, r.clk.Now()) { // a UD QP sends only to groups it joined
	case groupRefused:
		return false
	case groupJoining:
		if r.groups.holdForGroup(mgid, heldFrame{buf: buf, meta: m, vif: vif, own: true}) != pass {
			return true // held, or dropped uncounted as the shim's own frames are
		}
	}
	r.toPort([][]byte{buf}, []ipoib.TxMeta{m})
	return true
}
