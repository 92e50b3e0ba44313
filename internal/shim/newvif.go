package shim

// Frames that wait for the control plane. One mechanism, heldFrames, holds
// copies of them wherever they wait: for a destination being resolved
// (resolve.go), for a group being joined (groups.go), and here, for a new
// guest whose VIF is pending.
//
// A new guest's frames (learn auto) are held as read from the TAP,
// untranslated, since the translation needs the VIF's QP. Up to
// vifHoldPerGuest per guest and vifHoldTotal in all are held
// (tx_queued_new_vif; beyond, drop_vif_pending_full), while one intent
// asks the control goroutine for the VIF. With the VIF table full they
// are refused at once (drop_vif_limit, vifs_overflow). When no guest is
// pending that takes no intent and no lock, so a MAC flood's frames do
// not serialise the TX workers.
//
// Once its QP is allocated, the control goroutine publishes the VIF (the
// ARP/NDP rewrite and the resolutions of the held frames look it up).
// Then it translates the held frames in order, sends them in one write
// and only then marks the VIF ready (mactrans.VIF.Ready), under
// newGuests.mu. A TX worker that finds no ready VIF re-checks under that
// lock, so no newer frame of the guest overtakes a held one.
//
// A guest whose QP is refused is refused for vifRefusedFor: its held and
// new frames are dropped (drop_vif_refused, or drop_vif_limit when the
// VIF table is full). So a flood of frames does not ask the port once
// per frame. The refusals are a copy-on-write map the workers read
// without a lock.

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

const (
	vifHoldPerGuest = 16
	vifHoldTotal    = 256
	maxNewGuests    = 256  // guests pending at once
	maxRefused      = 4096 // refused guests remembered for their back-off
	vifRefusedFor   = 5 * time.Second
	// txTailRoom is room after a held TAP frame for the growth of its
	// ARP/NDP/DHCP rewrite, as devBufSize leaves after a read one.
	txTailRoom = 256
	// portTailRoom is room after a held IPoIB packet for what a port
	// writes after it (the pad and ICRC of the simulated fabric,
	// simfabric.TailRoom), as every buffer the shim writes from leaves.
	portTailRoom = 64
)

// heldFrame is a copy of a frame waiting for the control plane.
type heldFrame struct {
	buf  []byte
	n    int           // a TAP frame's length, at devHeadroom in buf
	sup  tap.Super     // a TAP frame's super-frame description
	meta ipoib.TxMeta  // an IPoIB packet's
	vif  *mactrans.VIF // an IPoIB packet's sender
	own  bool          // the shim's own packet (a resolution), no TAP frame
	segs int           // a UDP super-packet's datagrams, for tx_super_segments
}

// heldFrames is the frames one destination, group or guest holds.
type heldFrames []heldFrame

// hold appends a copy of data, with room bytes to spare after it, as f.
func (h *heldFrames) hold(data []byte, room int, f heldFrame) {
	f.buf = make([]byte, len(data), len(data)+room)
	copy(f.buf, data)
	*h = append(*h, f)
}

// newGuest is a guest whose VIF is pending, with its held frames.
type newGuest struct {
	frames heldFrames
}

// refusal is a guest refused until until; its frames count as drop.
type refusal struct {
	until time.Time
	drop  Counter
}

// newGuests is the guests whose VIF is pending or refused.
type newGuests struct {
	mu      sync.Mutex
	m       map[mactrans.VIFKey]*newGuest // pending guests, under mu
	frames  int                           // held, under mu
	pending atomic.Int32                  // len(m), read without mu
	// refused is the refused guests (copy on write): read by the
	// workers without a lock, written by the control plane only.
	refused atomic.Pointer[map[mactrans.VIFKey]refusal]
}

func (q *newGuests) init() {
	q.m = make(map[mactrans.VIFKey]*newGuest)
	q.refused.Store(&map[mactrans.VIFKey]refusal{})
}

// forget deletes pending guest k; call with mu held.
func (q *newGuests) forget(k mactrans.VIFKey, g *newGuest) {
	q.frames -= len(g.frames)
	delete(q.m, k)
	q.pending.Store(int32(len(q.m)))
}

// refusedAt returns how guest k's frames are dropped when it is in its
// refusal back-off at now. It takes no lock.
func (q *newGuests) refusedAt(k mactrans.VIFKey, now time.Time) (Counter, bool) {
	r, ok := (*q.refused.Load())[k]
	return r.drop, ok && now.Before(r.until)
}

// editRefused replaces the refusals with an edited copy. Control plane
// only.
func (q *newGuests) editRefused(fn func(m map[mactrans.VIFKey]refusal)) {
	m := maps.Clone(*q.refused.Load())
	fn(m)
	q.refused.Store(&m)
}

// add adds pending guest k; call with mu held.
func (q *newGuests) add(k mactrans.VIFKey) *newGuest {
	g := &newGuest{}
	q.m[k] = g
	q.pending.Store(int32(len(q.m)))
	return g
}

// drop drops guest k's held frames, counted as why.
func (q *newGuests) drop(k mactrans.VIFKey, why Counter, c *counters) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if g, ok := q.m[k]; ok {
		c.add(why, uint64(len(g.frames)))
		q.forget(k, g)
	}
}

// dropAll drops every held frame, counted.
func (q *newGuests) dropAll(c *counters) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, g := range q.m {
		c.add(DropVIFRefused, uint64(len(g.frames)))
		q.forget(k, g)
	}
}

// expire forgets the refusals whose back-off is over. Control plane
// only.
func (q *newGuests) expire(now time.Time) {
	for _, r := range *q.refused.Load() {
		if !now.Before(r.until) { // copied only when one is over (no allocation per round)
			q.editRefused(func(m map[mactrans.VIFKey]refusal) {
				maps.DeleteFunc(m, func(_ mactrans.VIFKey, r refusal) bool { return !now.Before(r.until) })
			})
			return
		}
	}
}

// holdNew holds a frame (buf, n, sup as tx got them) of guest k, which has
// no VIF, asking the control goroutine for one on its first frame. It
// returns the VIF when it became ready meanwhile (the caller translates
// the frame), else nil and the frame's verdict (held or a drop). A guest
// in its refusal back-off, and a new one while the VIF table is full and
// no guest is pending, are dropped without taking newGuests.mu.
func (s *Shim) holdNew(k mactrans.VIFKey, buf []byte, n int, sup tap.Super, now time.Time) (*mactrans.VIF, verdict) {
	q := &s.newVIFs
	v, published := s.vifs.Lookup(k)
	if published && v.Ready() { // made meanwhile (declared, say)
		return v, pass
	}
	if drop, ok := q.refusedAt(k, now); ok {
		return nil, verdict(drop)
	}
	if !published && q.pending.Load() == 0 && s.vifs.Full() { // so not pending itself
		return nil, s.refuseFull(k, now)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if v, published = s.vifs.Lookup(k); published && v.Ready() { // again, under the lock readyVIF holds
		return v, pass
	}
	g := q.m[k]
	switch {
	case g != nil:
	case published:
		// Being made ready (its held frames are being sent): its
		// readyVIF, which holds mu next, sends this one after them.
		g = q.add(k)
	default:
		if s.vifs.Full() { // refused here, per frame, as a MAC flood's are
			return nil, s.refuseFull(k, now)
		}
		if len(q.m) >= maxNewGuests {
			return nil, verdict(DropVIFPendingFull)
		}
		if !s.ctl.post(intent{kind: intentNewVIF, vif: k}, false) {
			return nil, verdict(DropControlFull)
		}
		g = q.add(k)
	}
	if len(g.frames) >= vifHoldPerGuest || q.frames >= vifHoldTotal {
		return nil, verdict(DropVIFPendingFull)
	}
	g.frames.hold(buf[:devHeadroom+n], txTailRoom, heldFrame{n: n, sup: sup})
	q.frames++
	s.ctr.inc(TxQueuedNewVIF)
	return nil, held
}

// refuseFull drops a new guest's frame for a full VIF table and warns
// (rate-limited).
func (s *Shim) refuseFull(k mactrans.VIFKey, now time.Time) verdict {
	if s.vifWarn.Allow(now) {
		s.log.Warn("new guest MAC refused", "mac", k.MAC, "vlan", k.VLAN, "reason", "vif_limit", "suppressed", s.vifWarn.Suppressed())
	}
	return verdict(DropVIFLimit)
}

// readyVIF sends the frames held for the guest of v, published, translated
// in order and written at once, then marks v ready, under newGuests.mu
// (see the top of this file). Control plane only.
func (s *Shim) readyVIF(p *partition, v *mactrans.VIF, now time.Time) {
	q := &s.newVIFs
	q.mu.Lock()
	defer q.mu.Unlock()
	if g, ok := q.m[v.Key]; ok {
		b := s.ctl.batch // room for vifHoldPerGuest frames (control.init)
		for _, f := range g.frames {
			_, pay, vd := s.txCheck(f.buf, f.n) // as it was when held
			if vd == pass {
				vd = s.translate(b, p, v, f.buf, f.n, pay, f.sup, now)
			}
			s.txEnd(b, vd)
		}
		s.flushTx(b)
		q.forget(v.Key, g)
	}
	v.SetReady()
}

// refuseVIF records that guest k got no VIF for err: its held frames are
// dropped and its new ones too for vifRefusedFor, counted, and the
// refusal is counted by reason and logged (rate-limited).
func (s *Shim) refuseVIF(k mactrans.VIFKey, err error, now time.Time) {
	reason := s.ctl.refused("vifs", err)
	drop := DropVIFRefused
	if reason == "vif_limit" {
		drop = DropVIFLimit
	}
	q := &s.newVIFs
	if len(*q.refused.Load()) < maxRefused {
		q.editRefused(func(m map[mactrans.VIFKey]refusal) { m[k] = refusal{until: now.Add(vifRefusedFor), drop: drop} })
	}
	q.drop(k, drop, &s.ctr)
	if s.vifWarn.Allow(now) {
		s.log.Warn("new guest MAC refused", "mac", k.MAC, "vlan", k.VLAN, "reason", reason, "err", err, "retry_after", vifRefusedFor, "suppressed", s.vifWarn.Suppressed())
	}
}

// makeVIF returns the VIF of a guest MAC in p, making it when new. It
// reserves a place in the table and allocates the QP, under no lock a
// worker takes, wishing for the QPN saved (a guest restored, RestoreGuests;
// taken over with AdoptQP on a port that can) or else the MAC's QPN hint. Then it reads the MTU again, sends the
// guest's held frames and publishes the VIF. A new guest's addresses are
// announced for AnnounceWindow; a restored guest that got its saved QPN
// back did not move, and peers hold its address: it has no window, so
// that the fast path carries it at once (a kernel backend that adopted
// its child keeps the fast path's entries). A refusal is counted and
// logged (refuseVIF). Control plane only (ctl.own held).
func (s *Shim) makeVIF(p *partition, mac ether.MAC, origin mactrans.Origin, now time.Time, saved uint32) (*mactrans.VIF, error) {
	k := mactrans.VIFKey{MAC: mac, VLAN: p.vlan}
	if v, ok := s.vifs.Lookup(k); ok {
		return v, nil
	}
	err := s.vifs.Reserve(k)
	var qpn uint32
	if err == nil {
		hint := saved
		if hint == 0 {
			hint = mactrans.QPNHint(k)
		}
		if qpn, err = s.allocQP(p.pkey, hint, saved != 0); err != nil {
			s.vifs.Unreserve(k)
			err = fmt.Errorf("shim: allocate a QP for %s on VLAN %d: %w", mac, p.vlan, err)
		}
	}
	if err != nil {
		s.refuseVIF(k, err, now)
		return nil, err
	}
	v := s.vifs.NewVIF(k, p.pkey, qpn, origin, now)
	s.refreshMTU(p)
	if saved == 0 || qpn != saved {
		v.AnnounceUntil(now.Add(s.cfg.AnnounceWindow))
	}
	s.vifs.Publish(v)
	s.ctr.inc(VIFsCreated) // before its held frames go out
	s.log.Info("VIF created", "mac", mac, "vlan", p.vlan, "pkey", p.pkey, "qpn", fmt.Sprintf("%#06x", v.QPN), "limac", v.LIMAC, "origin", origin)
	s.readyVIF(p, v, now)
	s.syncFastPath(now)
	if s.cfg.AnnounceWindow > 0 {
		s.mobility.seekMoved(p, v, now)
	}
	return v, nil
}

// allocQP allocates a QP in partition pkey wishing for QPN hint; for a
// restored guest (saved) on a port that can take over the QP it had
// (ipoib.QPAdopter), it does so with AdoptQP.
func (s *Shim) allocQP(pkey ipoib.PKey, hint uint32, saved bool) (uint32, error) {
	if a, ok := s.ctl.port.(ipoib.QPAdopter); ok && saved {
		return a.AdoptQP(pkey, hint)
	}
	return s.ctl.port.AllocQP(pkey, hint)
}

// vif returns (making when new) the VIF of a guest MAC in p, with the
// QPN its MAC hints at. Control plane only (ctl.own held), or a test of a
// shim that is not running.
func (s *Shim) vif(p *partition, mac ether.MAC, origin mactrans.Origin, now time.Time) (*mactrans.VIF, error) {
	return s.makeVIF(p, mac, origin, now, 0)
}
