package verbsfabric

import (
	"errors"
	"sync"

	"github.com/eipoib/eipoibd/ipoib"
)

// fakeHub is an in-memory fabric of fake verbs devices, each with the
// semantics ibv.go relies on:
//   - a shared receive queue per device;
//   - the 40-byte GRH in front of every received packet;
//   - completions only for signalled sends;
//   - multicast to every attached QP, the sender's device included;
//   - unicast lost when the QPN does not exist;
//   - a UD packet whose Q_Key is not the receiving QP's dropped (IBA
//     10.2.4: the Q_Key check of a UD receive).
//
// Devices opened with openerIB have an IB link layer and a fakeSA. Every
// completion reports the sender's LID (its SM's, 0 on RoCE). With noGRH
// set, unicast arrives without a GRH, as from a Linux IPoIB sender
// inside a subnet; multicast always has one. (sa_query.c
// ib_init_ah_attr_from_path makes a GRH only when the path's hop_limit
// is above 0, and OpenSM answers 0 there.)
type fakeHub struct {
	mu    sync.Mutex
	devs  map[ipoib.GID]*fakeDev
	noGRH bool
}

type fakeDev struct {
	hub *fakeHub
	a   devAttr
	lay layout

	mu       sync.Mutex
	nextQPN  uint32
	qps      map[uint32]*fakeQP
	table    []ipoib.PKey // the P_Key table pkeys reads
	fsa      *fakeSA
	qkeyDrop int                             // packets dropped for a Q_Key mismatch
	attached map[ipoib.GID]map[uint32]uint16 // MGID → QPN → the MLID it was attached with
	ahs      map[handle]path
	nextAH   handle
	send     []byte
	recv     []byte
	posted   []uint32 // receive buffers posted, the next at postedAt
	postedAt int
	lost     int // packets that found no receive buffer posted (UD has no RNR)
	rq       []recvDone
	sq       []sendDone
	failAt   int // postSend fails at this descriptor (-1: never)
	// inflight is, per address handle, the last send posted on it per
	// QP; reaped the sends each QP's reaped completions cover. A handle
	// destroyed while a send on it is not reaped is counted in
	// busyDestroys (rxe looks the handle up when the send runs).
	inflight     map[handle]map[uint32]uint64
	reaped       map[uint32]uint64
	busyDestroys int
	notify       chan struct{}
	events       chan asyncEvent // async events, as the test raises them (raise: of the device's port)
	woke         chan struct{}
	wakeOnce     sync.Once
	// qpGate, when set, holds createQP after telling qpEntered; qpLate
	// counts QP calls made after close.
	qpGate, qpEntered chan struct{}
	devClosed         bool
	qpLate            int
	// destroyHook, when set (under mu), runs as destroyQP begins.
	destroyHook func(qpn uint32)
	// holdQPN's send completions are withheld: its sends stay under way.
	// busy is the send slots under way (posted, not reaped and their QP
	// not destroyed) with their QP and work request. A slot the port
	// takes (sendBuf) while under way is counted in overwrites: the
	// device may still be reading it.
	holdQPN    uint32
	busy       map[int]busySlot
	overwrites int
	// pollHook and createAHHook, when set (under mu), run as pollSend
	// and createAH begin.
	pollHook     func()
	createAHHook func(path)
}

// busySlot is a send slot under way: its QP and work request.
type busySlot struct {
	qpn  uint32
	wrID uint64
}

// fakeQP is a fake UD QP: its P_Key index and Q_Key.
type fakeQP struct {
	pkeyIndex int
	qkey      uint32
}

func newHub() *fakeHub { return &fakeHub{devs: map[ipoib.GID]*fakeDev{}} }

// opener returns the open hook of a RoCE device with GID g.
func (h *fakeHub) opener(g ipoib.GID) func(string, int, layout) (device, error) {
	return h.open(devAttr{gid: g, mtu: 4096, active: true, pkeys: []ipoib.PKey{0xffff}}, nil)
}

// openerIB returns the open hook of an IB device with GID g, P_Key table
// pkeys and subnet administrator sa.
func (h *fakeHub) openerIB(g ipoib.GID, sa *fakeSA, pkeys ...ipoib.PKey) func(string, int, layout) (device, error) {
	return h.open(devAttr{gid: g, mtu: 4096, active: true, ib: true, pkeys: pkeys}, sa)
}

// open returns the open hook of a device with attributes a, opened on
// the port New asks for.
func (h *fakeHub) open(a devAttr, sa *fakeSA) func(string, int, layout) (device, error) {
	return func(_ string, port int, lay layout) (device, error) {
		a.port = port
		d := &fakeDev{hub: h, lay: lay, a: a, table: a.pkeys, fsa: sa,
			nextQPN: 0x11, qps: map[uint32]*fakeQP{}, attached: map[ipoib.GID]map[uint32]uint16{}, ahs: map[handle]path{},
			inflight: map[handle]map[uint32]uint64{}, reaped: map[uint32]uint64{}, busy: map[int]busySlot{},
			send: make([]byte, lay.sendSlots*lay.slotSize), recv: make([]byte, lay.recvBufs*lay.recvSize),
			failAt: -1, notify: make(chan struct{}, 1), events: make(chan asyncEvent), woke: make(chan struct{})}
		if sa != nil {
			sa.woke = d.woke
		}
		h.mu.Lock()
		h.devs[a.gid] = d
		h.mu.Unlock()
		return d, nil
	}
}

func (d *fakeDev) attr() devAttr { return d.a }

func (d *fakeDev) sa() subnetAdmin {
	if d.fsa == nil {
		return nil
	}
	return d.fsa
}

func (d *fakeDev) createQP(pkeyIndex int, qkey, _ uint32) (uint32, error) {
	if d.qpGate != nil {
		d.qpEntered <- struct{}{}
		<-d.qpGate
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.devClosed {
		d.qpLate++
	}
	q := d.nextQPN
	d.nextQPN++
	d.qps[q] = &fakeQP{pkeyIndex: pkeyIndex, qkey: qkey}
	return q, nil
}

func (d *fakeDev) setQKey(qpn, qkey uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.qps[qpn]
	if q == nil {
		return errors.New("no such QP")
	}
	q.qkey = qkey
	return nil
}

// qkeyOf is QP qpn's Q_Key (0: no such QP).
func (d *fakeDev) qkeyOf(qpn uint32) uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if q := d.qps[qpn]; q != nil {
		return q.qkey
	}
	return 0
}

// pkeyIndexOf is QP qpn's P_Key index (-1: no such QP).
func (d *fakeDev) pkeyIndexOf(qpn uint32) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if q := d.qps[qpn]; q != nil {
		return q.pkeyIndex
	}
	return -1
}

func (d *fakeDev) pkeys() ([]ipoib.PKey, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.table, nil
}

func (d *fakeDev) destroyQP(q uint32) error {
	d.mu.Lock()
	hook := d.destroyHook
	d.mu.Unlock()
	if hook != nil {
		hook(q)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.devClosed {
		d.qpLate++
	}
	if d.qps[q] == nil {
		return errors.New("no such QP")
	}
	delete(d.qps, q)
	for slot, b := range d.busy {
		if b.qpn == q {
			delete(d.busy, slot)
		}
	}
	return nil
}

func (d *fakeDev) createAH(p path) (handle, error) {
	d.mu.Lock()
	hook := d.createAHHook
	d.mu.Unlock()
	if hook != nil {
		hook(p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextAH++
	d.ahs[d.nextAH] = p
	return d.nextAH, nil
}

func (d *fakeDev) destroyAH(h handle) {
	d.mu.Lock()
	for qpn, wr := range d.inflight[h] {
		if d.reaped[qpn] <= wr {
			d.busyDestroys++
		}
	}
	delete(d.inflight, h)
	delete(d.ahs, h)
	d.mu.Unlock()
}

func (d *fakeDev) attach(q uint32, g ipoib.GID, mlid uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.attached[g] == nil {
		d.attached[g] = map[uint32]uint16{}
	}
	d.attached[g][q] = mlid
	return nil
}

// attachedMLID is the MLID group QP q is attached to mgid with.
func (d *fakeDev) attachedMLID(mgid ipoib.GID, q uint32) (uint16, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.attached[mgid][q]
	return l, ok
}

func (d *fakeDev) detach(q uint32, g ipoib.GID, _ uint16) error {
	d.mu.Lock()
	delete(d.attached[g], q)
	d.mu.Unlock()
	return nil
}

func (d *fakeDev) sendBuf(slot int) []byte {
	d.mu.Lock()
	if _, ok := d.busy[slot]; ok {
		d.overwrites++
	}
	d.mu.Unlock()
	return d.slotBuf(slot)
}

// slotBuf is send slot slot's buffer, as the device reads it.
func (d *fakeDev) slotBuf(slot int) []byte {
	return d.send[slot*d.lay.slotSize : (slot+1)*d.lay.slotSize]
}

func (d *fakeDev) recvBuf(i int) []byte { return d.recv[i*d.lay.recvSize : (i+1)*d.lay.recvSize] }

func (d *fakeDev) postSend(s []sendDesc) (int, error) {
	for i, w := range s {
		d.mu.Lock()
		fail := d.failAt == i
		p, ok := d.ahs[w.ah]
		d.mu.Unlock()
		if fail || !ok {
			return i, errors.New("post failed")
		}
		d.mu.Lock()
		if d.inflight[w.ah] == nil {
			d.inflight[w.ah] = map[uint32]uint64{}
		}
		d.inflight[w.ah][w.qpn] = w.wrID
		d.busy[w.slot] = busySlot{w.qpn, w.wrID}
		d.mu.Unlock()
		data := d.slotBuf(w.slot)[:w.len]
		slid := d.lid()
		d.hub.mu.Lock()
		if p.gid.IsMulticast() {
			for _, to := range d.hub.devs {
				to.mu.Lock()
				qs := make([]uint32, 0, len(to.attached[p.gid]))
				for q := range to.attached[p.gid] {
					qs = append(qs, q)
				}
				to.mu.Unlock()
				for _, q := range qs {
					to.deliver(d.a.gid, p.gid, w.qpn, q, w.qkey, data, slid, true)
				}
			}
		} else if to := d.hub.devs[p.gid]; to != nil {
			to.deliver(d.a.gid, p.gid, w.qpn, w.rqpn, w.qkey, data, slid, !d.hub.noGRH)
		}
		d.hub.mu.Unlock()
		if w.signal && w.qpn != d.holdQPN {
			d.mu.Lock()
			d.sq = append(d.sq, sendDone{wrID: w.wrID, qpn: w.qpn, ok: true})
			d.mu.Unlock()
		}
	}
	return len(s), nil
}

// lid is the device's LID: its SM's, 0 on RoCE.
func (d *fakeDev) lid() uint16 {
	if d.fsa == nil {
		return 0
	}
	d.fsa.sm.mu.Lock()
	defer d.fsa.sm.mu.Unlock()
	return d.fsa.sm.lid(d.a.gid)
}

// deliver puts one packet from LID slid, with its GRH or without, into a
// posted receive buffer. It loses the packet when no buffer is posted,
// as an HCA would. A packet for a QP that does not exist, or whose Q_Key
// is not the QP's, is dropped.
func (d *fakeDev) deliver(src, dst ipoib.GID, srcQPN, qpn, qkey uint32, data []byte, slid uint16, grh bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.qps[qpn]
	if q == nil {
		return
	}
	if q.qkey != qkey {
		d.qkeyDrop++
		return
	}
	d.completeFrom(src, dst, srcQPN, qpn, data, slid, grh)
}

// complete makes a receive completion for QP qpn of a packet with its
// GRH, as deliver does once the QP took it; with d.mu held. A test
// calls it for a QP the port no longer has (a completion of a QP
// freed while it was queued). A packet is lost when no buffer is posted.
func (d *fakeDev) complete(src, dst ipoib.GID, srcQPN, qpn uint32, data []byte) {
	d.completeFrom(src, dst, srcQPN, qpn, data, 0, true)
}

// completeFrom is complete for a packet from LID slid, with a GRH or
// without (then the buffer's first 40 bytes are left as they were).
func (d *fakeDev) completeFrom(src, dst ipoib.GID, srcQPN, qpn uint32, data []byte, slid uint16, grh bool) {
	if d.postedAt == len(d.posted) {
		d.lost++
		return
	}
	b := d.posted[d.postedAt]
	d.postedAt++
	buf := d.recvBuf(int(b))
	if grh {
		clear(buf[:grhLen])
		buf[0] = 0x60
		copy(buf[8:24], src[:])
		copy(buf[24:40], dst[:])
	}
	copy(buf[grhLen:], data)
	d.rq = append(d.rq, recvDone{buf: int(b), len: grhLen + len(data), srcQPN: srcQPN, qpn: qpn, slid: slid, ok: true, grh: grh})
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

func (d *fakeDev) pollSend(out []sendDone) int {
	d.mu.Lock()
	hook := d.pollHook
	d.mu.Unlock()
	if hook != nil {
		hook()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := copy(out, d.sq)
	for _, c := range out[:n] {
		d.reaped[c.qpn] = max(d.reaped[c.qpn], c.wrID+1)
		for slot, b := range d.busy {
			if b.qpn == c.qpn && b.wrID <= c.wrID {
				delete(d.busy, slot)
			}
		}
	}
	d.sq = d.sq[:copy(d.sq, d.sq[n:])] // keeps its array: no allocation once warm
	return n
}

func (d *fakeDev) postRecv(bufs []uint32) error {
	d.mu.Lock()
	d.posted = append(d.posted[:copy(d.posted, d.posted[d.postedAt:])], bufs...)
	d.postedAt = 0
	d.mu.Unlock()
	return nil
}

func (d *fakeDev) pollRecv(out []recvDone) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := copy(out, d.rq)
	d.rq = d.rq[:copy(d.rq, d.rq[n:])]
	return n
}

func (d *fakeDev) waitRecv() (bool, error) {
	select {
	case <-d.notify:
		return true, nil
	case <-d.woke:
		return false, nil
	}
}

func (d *fakeDev) waitEvent() (asyncEvent, bool, error) {
	select {
	case ev := <-d.events:
		return ev, true, nil
	case <-d.woke:
		return asyncEvent{}, false, nil
	}
}

// raise reports port event ev of the port the device was opened on, as
// ibv_get_async_event gives it: with element.port_num.
func (d *fakeDev) raise(ev portEvent) { d.events <- asyncEvent{ev: ev, port: d.a.port} }

func (d *fakeDev) wake() { d.wakeOnce.Do(func() { close(d.woke) }) }

func (d *fakeDev) close() {
	d.mu.Lock()
	d.devClosed = true
	d.mu.Unlock()
	if d.fsa != nil {
		d.fsa.close()
	}
}
