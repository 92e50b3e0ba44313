package shim

// The control plane. One goroutine, the control goroutine (controlLoop),
// started by Run before anything else and ended after the TX and RX workers,
// makes every control call on the port: AllocQP and FreeQP, Join,
// JoinSendOnly and Leave, PartitionMTU, partition additions. On real
// hardware each takes milliseconds to seconds. A kernel IPoIB child is a
// netlink request, sysctls and a broadcast join; a verbs join is an SA
// round trip. A data path that waited on one would freeze every guest
// for it.
//
// The types enforce it. The data path (the TX and RX workers,
// housekeeping) uses Shim.port, the port's data half (ipoib.DataPort),
// which has no control call: one there does not compile. The control
// half (ipoib.ControlPort) is ctl.port, which control actions alone use.
// The shim's parts (groups, resolver, mobility) hold none: the methods of
// groups that join or leave take it, or ctl, as an argument.
//
// Who owns what:
//   - TX workers, the RX workers and housekeeping only read the tables
//     (lock-free). They hand the control goroutine intents through a
//     bounded queue (controlQueue). A full queue drops the intent and
//     counts the frame that needed it (drop_control_full); a worker never
//     waits. Leaves, and the callers that wait for a result (DeclareVIF,
//     RemoveVIF, AddPartition, RestoreGuests, Run's start-up joins and
//     shutdown), are never dropped: leaves are bounded by the groups
//     joined, waiting callers by themselves. The queue is first in, first
//     out, so a leave never overtakes a later join.
//   - A new guest's VIF is pending (its frames held in newVIFs, newvif.go),
//     then ready (published in the VIF table: the data path sees it), then
//     draining (unpublished, its QP not yet freed); or refused, with a
//     reason, for vifRefusedFor.
//   - A group the port has not joined yet: a guest's frames to it wait in
//     groupWaits (groups.go) while the send-only join runs.
//   - Aging of VIFs, expiry of send-only groups and the partitions' MTU
//     run on the control goroutine's own ticker (the housekeeping
//     period), not in housekeeping.
//
// Epochs (RCU-style quiescent states): a QP is freed only once no sender
// can still use it. Every sender that can hold a VIF across a send marks
// in its own slot the epoch it entered at the start of a batch, and
// clears it at the end. Those senders are each TX worker, each RX worker,
// and housekeeping's resolution and announcement sends. Removing a VIF
// unpublishes it first, then advances the epoch to e. A sender that
// entered at e or later can no longer find the VIF. So once every slot
// is idle or at e or later, the QP is freed. Aging re-checks on the
// ticker (draining); RemoveVIF and
// shutdown wait on the control goroutine, never in a worker. The control
// goroutine itself needs no slot: its own sends (a new guest's held
// frames, resolutions it starts) end before it frees anything.

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/internal/metrics/stat"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
)

// controlQueue bounds the intents the data path may have waiting.
const controlQueue = 1024

// intentKind is what an intent asks of the control goroutine.
type intentKind uint8

// The intents.
const (
	intentNewVIF   intentKind = iota // make the VIF of a guest whose frames are held
	intentJoin                       // join a snooped group (full member)
	intentLeave                      // release a snooped group
	intentSendOnly                   // join a group a guest sends to (send-only)
	intentCall                       // run fn for a caller waiting on reply
)

// intent is one request to the control goroutine.
type intent struct {
	kind  intentKind
	vif   mactrans.VIFKey // intentNewVIF
	group snoop.Key       // intentJoin, intentLeave
	gen   uint64          // intentJoin: the snooping table's entry (snoop.Table.Forget)
	mgid  ipoib.GID       // intentSendOnly
	fn    func() error    // intentCall
	reply chan error      // intentCall
}

// control is the control goroutine's queue and state.
type control struct {
	// port is the port's control half, for control actions only.
	port ipoib.ControlPort

	mu      sync.Mutex
	q       []intent
	running bool // the control goroutine takes intents; under mu
	wake    chan struct{}

	// own is held while a control action runs, by the control goroutine
	// or, before Run starts it and after it ends, by the caller running
	// the action itself: so actions never run concurrently.
	own      sync.Mutex
	batch    *txBatch  // for sending held frames; under own
	draining []drained // unpublished VIFs whose QPs wait for quiescence; under own
	fastOff  string    // why the fast path carried nothing at the last sync, "" when it carried; under own

	refMu    sync.Mutex
	refusals map[string]uint64 // vifs_refused_<reason>, groups_refused_<reason>
}

// drained is a VIF unpublished at epoch, its QP not freed yet.
type drained struct {
	vif   *mactrans.VIF
	epoch uint64
}

func (c *control) init(bs int) {
	c.wake = make(chan struct{}, 1)
	c.batch = newTxBatch(bs)
	c.refusals = make(map[string]uint64)
}

// post queues it for the control goroutine and reports whether it was
// queued: never when the queue is full, unless must. It never waits.
func (c *control) post(it intent, must bool) bool {
	c.mu.Lock()
	if !must && len(c.q) >= controlQueue {
		c.mu.Unlock()
		return false
	}
	c.q = append(c.q, it)
	c.mu.Unlock()
	c.wakeUp()
	return true
}

// wakeUp tells the control goroutine intents are queued (never blocks:
// one pending wake-up covers every intent queued before it is taken).
func (c *control) wakeUp() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// take moves the queued intents to into (emptied first).
func (c *control) take(into []intent) []intent {
	c.mu.Lock()
	into = append(into[:0], c.q...)
	clear(c.q)
	c.q = c.q[:0]
	c.mu.Unlock()
	return into
}

// errStopping refuses a control action asked for after Run began to
// stop: its QPs would never be freed nor its groups left.
var errStopping = errors.New("shim: stopping: the daemon is shutting down, ask again once it runs")

// call runs fn as a control action and returns its error: on the control
// goroutine when it runs (waiting for it), else here. Once stopPort has
// run (stopping, set under ctl.own) it runs nothing and returns
// errStopping. Not for workers.
func (s *Shim) call(do func() error) error {
	fn := func() error {
		if s.stopping.Load() {
			return errStopping
		}
		return do()
	}
	c := &s.ctl
	c.mu.Lock()
	if c.running {
		reply := make(chan error, 1)
		c.q = append(c.q, intent{kind: intentCall, fn: fn, reply: reply})
		c.mu.Unlock()
		c.wakeUp()
		return <-reply
	}
	c.mu.Unlock()
	c.own.Lock()
	defer c.own.Unlock()
	return fn()
}

// startControl starts the control goroutine; the function returned stops
// it (after the intents queued by then are carried out) and waits for it.
func (s *Shim) startControl() (stop func()) {
	s.ctl.mu.Lock()
	s.ctl.running = true
	s.ctl.mu.Unlock()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		s.controlLoop(quit)
	}()
	return func() {
		close(quit)
		<-done
	}
}

// controlLoop is the control goroutine: it carries out intents as they
// come and, every housekeeping period, ages VIFs, expires send-only
// groups, reads the partitions' MTU and frees drained QPs.
func (s *Shim) controlLoop(quit <-chan struct{}) {
	t := time.NewTicker(s.cfg.Housekeeping)
	defer t.Stop()
	var todo []intent
	for {
		select {
		case <-quit:
			s.ctl.mu.Lock()
			s.ctl.running = false // calls from now on run in their caller
			s.ctl.mu.Unlock()
			s.runIntents(todo)
			return
		case <-s.ctl.wake:
		case <-t.C:
			s.controlTick(s.clk.Now())
		}
		todo = s.runIntents(todo)
	}
}

// runIntents carries out the queued intents in order; buf is scratch.
// Tests of a shim that is not running call it to play the control
// goroutine.
func (s *Shim) runIntents(buf []intent) []intent {
	buf = s.ctl.take(buf)
	for _, it := range buf {
		s.ctl.own.Lock()
		s.handle(it)
		s.ctl.own.Unlock()
	}
	clear(buf)
	return buf[:0]
}

// handle carries out one intent; call with ctl.own held.
func (s *Shim) handle(it intent) {
	now := s.clk.Now()
	stopping := s.stopping.Load() // QPs freed and groups left: make no new ones
	switch it.kind {
	case intentNewVIF:
		if stopping {
			s.newVIFs.drop(it.vif, DropVIFRefused, &s.ctr)
			return
		}
		if p := s.byVLAN[it.vif.VLAN].Load(); p != nil {
			_, _ = s.makeVIF(p, it.vif.MAC, mactrans.OriginLearned, now, 0) // a refusal is counted and logged there
		}
	case intentJoin:
		if !stopping {
			s.groups.join(&s.ctl, it.group, it.gen)
		}
	case intentLeave:
		if !stopping {
			s.groups.leave(s.ctl.port, it.group)
		}
	case intentSendOnly:
		if stopping {
			s.groups.failed(it.mgid)
			return
		}
		s.groups.joinSendOnly(&s.ctl, it.mgid, now)
	case intentCall:
		it.reply <- it.fn()
	}
}

// controlTick is the control goroutine's periodic round.
func (s *Shim) controlTick(now time.Time) {
	s.ctl.own.Lock()
	defer s.ctl.own.Unlock()
	if s.stopping.Load() {
		return
	}
	if n, err := s.groups.set.expireSendOnly(s.ctl.port, now, s.groups.snoop.Timers().MembershipInterval()); err != nil {
		s.log.Warn("leave idle send-only groups", "left", n, "err", err)
	} else if n > 0 {
		s.log.Debug("left idle send-only groups", "left", n)
	}
	s.ageVIFs(now)
	s.syncFastPath(now) // before freeDrained frees the QPs of VIFs it carried
	s.freeDrained()
	s.newVIFs.expire(now)
}

// ageVIFs unpublishes the VIFs idle for VIFIdle; their QPs are freed once
// no sender can use them (freeDrained). Call with ctl.own held.
func (s *Shim) ageVIFs(now time.Time) {
	gone := s.vifs.Expire(now, time.Duration(s.vifIdle.Load()))
	if len(gone) == 0 {
		return
	}
	e := s.ep.advance()
	for _, v := range gone {
		s.ctl.draining = append(s.ctl.draining, drained{v, e})
	}
}

// freeDrained frees the QPs of the draining (aged) VIFs no sender can use
// any more, and counts them aged. Call with ctl.own held.
func (s *Shim) freeDrained() {
	keep := s.ctl.draining[:0]
	for _, d := range s.ctl.draining {
		if !s.ep.quiet(d.epoch) {
			keep = append(keep, d)
			continue
		}
		v := d.vif
		if err := s.ctl.port.FreeQP(v.QPN); err != nil {
			s.log.Warn("free QP of aged VIF", "mac", v.Key.MAC, "vlan", v.Key.VLAN, "err", err)
		}
		s.ctr.inc(VIFsAged) // counted once its QP is gone
		s.log.Info("VIF aged out", "mac", v.Key.MAC, "vlan", v.Key.VLAN, "qpn", fmt.Sprintf("%#06x", v.QPN))
	}
	clear(s.ctl.draining[len(keep):])
	s.ctl.draining = keep
}

// freeQuiesced waits (on the control goroutine) until no sender can use
// the VIFs vs, which the caller removed from the table, and frees their
// QPs, returning the first error. Call with ctl.own held.
func (s *Shim) freeQuiesced(vs []*mactrans.VIF) error {
	s.syncFastPath(s.clk.Now()) // the fast path lets go of them first
	e := s.ep.advance()
	for !s.ep.quiet(e) {
		time.Sleep(100 * time.Microsecond) // a batch in flight ends within microseconds
	}
	var first error
	for _, v := range vs {
		if err := s.ctl.port.FreeQP(v.QPN); err != nil && first == nil {
			first = fmt.Errorf("shim: free QP %#x of %s vlan %d: %w", v.QPN, v.Key.MAC, v.Key.VLAN, err)
		}
	}
	return first
}

// refusalReason names why the control plane refused a request: the
// port's RefusedError reason, "vif_limit" for a full VIF table, else
// "port_error". Only [a-z0-9_] reach the counter's name.
func refusalReason(err error) string {
	var re *ipoib.RefusedError
	switch {
	case errors.As(err, &re) && re.Reason != "":
		return strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
				return r
			case r >= 'A' && r <= 'Z':
				return r - 'A' + 'a'
			}
			return '_'
		}, re.Reason)
	case errors.Is(err, mactrans.ErrFull):
		return "vif_limit"
	}
	return "port_error"
}

// refused counts a refusal of what (vifs or groups) for err's reason and
// returns the reason.
func (c *control) refused(what string, err error) string {
	r := refusalReason(err)
	c.refMu.Lock()
	c.refusals[what+"_refused_"+r]++
	c.refMu.Unlock()
	return r
}

// refusalStats appends the control plane's refusals by reason
// (vifs_refused_<reason>, groups_refused_<reason>) to out.
func (s *Shim) refusalStats(out []stat.Value) []stat.Value {
	s.ctl.refMu.Lock()
	defer s.ctl.refMu.Unlock()
	for k, v := range s.ctl.refusals {
		out = append(out, stat.Value{Name: k, Value: v, Help: "Control requests the port refused: " + k})
	}
	return out
}

// epochs tracks the senders' quiescent states (see the comment at the
// top of this file).
type epochs struct {
	now   atomic.Uint64
	slots []epochSlot
}

// epochSlot is one sender's: the epoch it entered, 0 when idle. Padded to
// a cache line so that senders do not share one.
type epochSlot struct {
	e atomic.Uint64
	_ [56]byte
}

func (ep *epochs) init(n int) {
	ep.now.Store(1)
	ep.slots = make([]epochSlot, n)
}

// enter marks the start of sender i's batch; exit its end.
func (ep *epochs) enter(i int) { ep.slots[i].e.Store(ep.now.Load()) }
func (ep *epochs) exit(i int)  { ep.slots[i].e.Store(0) }

// advance starts a new epoch and returns it; call after unpublishing.
func (ep *epochs) advance() uint64 { return ep.now.Add(1) }

// quiet reports whether every sender is idle or entered at e or later.
func (ep *epochs) quiet(e uint64) bool {
	for i := range ep.slots {
		if x := ep.slots[i].e.Load(); x != 0 && x < e {
			return false
		}
	}
	return true
}

// The senders' slots: TX worker i has slot i, then the RX workers, then
// housekeeping.
func (s *Shim) rxSlot(i int) int { return len(s.queues) + i }
func (s *Shim) houseSlot() int   { return len(s.queues) + len(s.rxq) }
