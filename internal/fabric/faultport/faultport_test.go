package faultport

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/ipoib"
)

// The simulated fabric's port has the encode hook the corrupt fault needs.
var _ Hooked = (*simfabric.Port)(nil)

// recorder is an inner port that records every Write: the payload of each
// packet (copied) and its metadata, batch by batch. Its other methods are
// not used.
type recorder struct {
	ipoib.Port
	writes [][]rec
	refuse uint32 // packets from this source QP are refused, as bad metadata
	events chan ipoib.Event
}

type rec struct {
	payload []byte
	meta    ipoib.TxMeta
	tail    int // capacity after the packet
}

func (r *recorder) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	return r.write(bufs, meta, offset, nil), nil
}

// write records the batch, calling hook (if any) on each packet's payload
// first, as a port does after encoding; it returns how many it accepted.
func (r *recorder) write(bufs [][]byte, meta []ipoib.TxMeta, offset int, hook func([]byte, bool)) int {
	var w []rec
	n := 0
	for i, b := range bufs {
		if meta[i].SrcQPN == r.refuse {
			continue
		}
		if hook != nil {
			hook(b[offset:], meta[i].Dst.GID().IsMulticast())
		}
		w = append(w, rec{append([]byte(nil), b[offset:]...), meta[i], cap(b) - len(b)})
		n++
	}
	r.writes = append(r.writes, w)
	return n
}

func (r *recorder) Counters() ipoib.PortCounters {
	return ipoib.PortCounters{Drops: map[string]uint64{"bad_meta": 7}}
}

func (r *recorder) Events() <-chan ipoib.Event { return r.events }

// hooked is a recorder with an encode hook.
type hooked struct {
	recorder
	hook func([]byte, bool)
	sets int // SetEncodeHook calls
}

func (h *hooked) SetEncodeHook(fn func([]byte, bool)) { h.hook, h.sets = fn, h.sets+1 }

func (h *hooked) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	return h.write(bufs, meta, offset, h.hook), nil
}

const offset = 32

var (
	uni   = ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, 0x42, ipoib.GID{0xfe, 0x80, 15: 1}), SrcQPN: 0x100, PKey: 0xffff}
	mcast = ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)), SrcQPN: 0x100, PKey: 0xffff}
)

// batch returns n packets with headroom and 16 bytes of tail room, packet
// i carrying first+i in its payload.
func batch(n, first int, m ipoib.TxMeta) ([][]byte, []ipoib.TxMeta) {
	bufs := make([][]byte, n)
	meta := make([]ipoib.TxMeta, n)
	for i := range bufs {
		b := make([]byte, offset, offset+8+16)
		bufs[i] = append(b, 8, 0, 0, 0, byte(first+i), 0xaa, 0xbb, 0xcc)
		meta[i] = m
	}
	return bufs, meta
}

// ids are the packet numbers of a recorded batch.
func ids(w []rec) []int {
	var s []int
	for _, r := range w {
		s = append(s, int(r.payload[4]))
	}
	return s
}

func eq(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mustNew(t *testing.T, inner ipoib.Port, f Faults) *Port {
	t.Helper()
	p, err := New(inner, f)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t *testing.T, p *Port, bufs [][]byte, meta []ipoib.TxMeta) int {
	t.Helper()
	n, err := p.Write(bufs, meta, offset)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNoFaults: with every probability 0 the batch reaches the inner port
// as it is, in one Write, unchanged; no hook is set (the port keeps its
// trains), and nothing is counted.
func TestNoFaults(t *testing.T) {
	in := &hooked{}
	p := mustNew(t, in, Faults{})
	bufs, meta := batch(5, 0, uni)
	if n := write(t, p, bufs, meta); n != 5 {
		t.Fatalf("n %d, want 5", n)
	}
	if len(in.writes) != 1 || !eq(ids(in.writes[0]), []int{0, 1, 2, 3, 4}) {
		t.Fatalf("inner writes %v, want one of packets 0-4", in.writes)
	}
	for i, r := range in.writes[0] {
		if !bytes.Equal(r.payload, bufs[i][offset:]) {
			t.Fatalf("packet %d changed: %x", i, r.payload)
		}
	}
	if in.hook != nil {
		t.Fatal("a hook is set with no fault")
	}
	c := p.Counters()
	if c.Drops["fault_loss"] != 0 || c.Stats["tx_fault_corrupt"] != 0 || c.Stats["tx_fault_corrupt_multicast"] != 0 || c.Drops["bad_meta"] != 7 {
		t.Fatalf("counters %+v, want the inner's drops and no fault counted", c)
	}
}

// TestLoss: loss=1 loses every packet: the inner port sees none, n is 0
// and fault_loss counts each one, added to the inner port's drops.
func TestLoss(t *testing.T) {
	in := &recorder{}
	p := mustNew(t, in, Faults{Loss: 1})
	bufs, meta := batch(5, 0, uni)
	if n := write(t, p, bufs, meta); n != 0 {
		t.Fatalf("n %d, want 0", n)
	}
	if len(in.writes) != 0 {
		t.Fatalf("inner writes %v, want none", in.writes)
	}
	if d := p.Counters().Drops; d["fault_loss"] != 5 || d["bad_meta"] != 7 {
		t.Fatalf("drops %v, want fault_loss 5 beside the inner's bad_meta 7", d)
	}
}

// TestDup: dup=1 sends every packet twice: the batch, then a copy of each
// with the same payload and tail room; n counts each packet once.
func TestDup(t *testing.T) {
	in := &recorder{}
	p := mustNew(t, in, Faults{Dup: 1})
	bufs, meta := batch(3, 0, uni)
	if n := write(t, p, bufs, meta); n != 3 {
		t.Fatalf("n %d, want 3", n)
	}
	if len(in.writes) != 2 || !eq(ids(in.writes[0]), []int{0, 1, 2}) || !eq(ids(in.writes[1]), []int{0, 1, 2}) {
		t.Fatalf("inner writes %v, want packets 0-2 twice", in.writes)
	}
	for i, r := range in.writes[1] {
		if !bytes.Equal(r.payload, bufs[i][offset:]) || r.tail != 16 || r.meta != meta[i] {
			t.Fatalf("copy %d: %x, tail room %d, meta %+v", i, r.payload, r.tail, r.meta)
		}
	}
}

// TestReorder: reorder=1 holds a packet back (n counts it) and sends it
// after the packets of the next batch that passes one on; one packet is
// held at a time.
func TestReorder(t *testing.T) {
	in := &recorder{}
	p := mustNew(t, in, Faults{Reorder: 1})
	b0, m0 := batch(1, 0, uni)
	if n := write(t, p, b0, m0); n != 1 || len(in.writes) != 0 {
		t.Fatalf("held: n %d, inner writes %v; want 1 and none", n, in.writes)
	}
	b0[0][offset+4] = 99 // the caller reuses its buffer: the held packet is a copy
	b1, m1 := batch(2, 1, uni)
	if n := write(t, p, b1, m1); n != 2 {
		t.Fatalf("n %d, want 2", n)
	}
	if len(in.writes) != 2 || !eq(ids(in.writes[0]), []int{1, 2}) || !eq(ids(in.writes[1]), []int{0}) {
		t.Fatalf("inner writes %v, want packets 1 and 2, then 0", in.writes)
	}
	if in.writes[1][0].tail != 16 {
		t.Fatalf("held packet sent with %d bytes of tail room, want 16", in.writes[1][0].tail)
	}
	// Everything lost: the held packet waits for a batch that passes one on.
	b3, m3 := batch(1, 3, uni)
	write(t, p, b3, m3) // 3 held
	if err := p.SetFaults(Faults{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	write(t, p, b3, m3)
	if err := p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	b4, m4 := batch(1, 4, uni)
	write(t, p, b4, m4)
	if len(in.writes) != 4 || !eq(ids(in.writes[2]), []int{4}) || !eq(ids(in.writes[3]), []int{3}) {
		t.Fatalf("inner writes %v, want 4 then the held 3 after the lost batch", in.writes)
	}
}

// TestReorderFreedQP: a packet held back (reorder) from a QP that is
// freed before the next Write is dropped at the free and counted as
// fault_loss. The inner port (memfabric, which applies
// ipoib.CheckTxOffloads) refuses nothing as bad_meta, and the packets of
// other QPs still go.
// Before the fix the held packet left after the free and the soak
// counted port_bad_meta.
func TestReorderFreedQP(t *testing.T) {
	f, err := memfabric.New(4096)
	if err != nil {
		t.Fatal(err)
	}
	in, err := f.NewPort(ipoib.GID{0xfe, 0x80, 15: 1})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := in.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := in.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := mustNew(t, in, Faults{Reorder: 1})
	m := uni
	m.SrcQPN = gone
	b0, m0 := batch(1, 0, m)
	if n := write(t, p, b0, m0); n != 1 {
		t.Fatalf("held: n %d, want 1", n)
	}
	if err := p.FreeQP(gone); err != nil {
		t.Fatal(err)
	}
	if err := p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	m.SrcQPN = kept
	b1, m1 := batch(2, 1, m)
	if n := write(t, p, b1, m1); n != 2 {
		t.Fatalf("n %d, want 2", n)
	}
	c := p.Counters()
	if c.Drops[ipoib.DropBadMeta.String()] != 0 || c.Drops[ipoib.DropFaultLoss.String()] != 1 || c.TxPackets != 2 {
		t.Fatalf("drops %v, tx packets %d: want no bad_meta, the held packet as fault_loss, the 2 of the live QP sent", c.Drops, c.TxPackets)
	}
	// Freeing another QP than the held packet's keeps it.
	m.SrcQPN = kept
	if err := p.SetFaults(Faults{Reorder: 1}); err != nil {
		t.Fatal(err)
	}
	write(t, p, b0[:1], []ipoib.TxMeta{m})
	other, err := in.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.FreeQP(other); err != nil {
		t.Fatal(err)
	}
	if err := p.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	write(t, p, b1[:1], m1[:1])
	if c := p.Counters(); c.TxPackets != 4 || c.Drops[ipoib.DropFaultLoss.String()] != 1 {
		t.Fatalf("tx packets %d, drops %v: want the held packet of a live QP sent (4 in all), no other loss", c.TxPackets, c.Drops)
	}
}

// TestRefusedNotCounted: n counts what the inner port accepted of the
// packets passed on, not the duplicates.
func TestRefusedNotCounted(t *testing.T) {
	in := &recorder{refuse: 0x200}
	p := mustNew(t, in, Faults{Dup: 1})
	bufs, meta := batch(3, 0, uni)
	meta[1].SrcQPN = 0x200
	if n := write(t, p, bufs, meta); n != 2 {
		t.Fatalf("n %d, want 2 (packet 1 refused, duplicates not counted)", n)
	}
}

// TestCorrupt: corrupt=1 flips one byte of every packet through the
// inner port's hook, after encoding: each packet sent differs from its
// source in exactly one byte, by 0x40, and the counters split unicast
// from multicast. With dup=1 too, each copy is corrupted on its own (the
// copy is taken before the original is corrupted).
func TestCorrupt(t *testing.T) {
	in := &hooked{}
	p := mustNew(t, in, Faults{Corrupt: 1})
	if in.hook == nil {
		t.Fatal("no hook set for corrupt=1")
	}
	// check compares the packets of each inner write, in order, with
	// clean copies of the sources of the packets in want.
	check := func(src [][]byte, want ...[]int) {
		t.Helper()
		if len(in.writes) != len(want) {
			t.Fatalf("%d inner writes, want %d", len(in.writes), len(want))
		}
		for w, ws := range want {
			if len(in.writes[w]) != len(ws) {
				t.Fatalf("write %d: %d packets, want %d", w, len(in.writes[w]), len(ws))
			}
			for k, i := range ws {
				got, diff := in.writes[w][k].payload, 0
				for j := range got {
					if d := got[j] ^ src[i][offset+j]; d != 0 {
						if d != 0x40 {
							t.Fatalf("write %d packet %d: byte %d flipped by %#x", w, k, j, d)
						}
						diff++
					}
				}
				if diff != 1 {
					t.Fatalf("write %d packet %d: %x differs from %x in %d bytes, want 1", w, k, got, src[i][offset:], diff)
				}
			}
		}
	}
	bufs, meta := batch(3, 0, uni)
	mb, mm := batch(1, 3, mcast)
	write(t, p, append(bufs, mb...), append(meta, mm...))
	clean, _ := batch(4, 0, uni)
	check(clean, []int{0, 1, 2, 3})
	if s := p.Counters().Stats; s["tx_fault_corrupt"] != 3 || s["tx_fault_corrupt_multicast"] != 1 {
		t.Fatalf("stats %v, want 3 unicast and 1 multicast corrupted", s)
	}
	in.writes = nil
	if err := p.SetFaults(Faults{Corrupt: 1, Dup: 1}); err != nil {
		t.Fatal(err)
	}
	bufs, meta = batch(2, 0, uni)
	write(t, p, bufs, meta)
	check(clean, []int{0, 1}, []int{0, 1})
	if s := p.Counters().Stats; s["tx_fault_corrupt"] != 7 {
		t.Fatalf("stats %v, want 7 unicast corrupted", s)
	}
	if err := p.SetFaults(Faults{}); err != nil || in.hook != nil {
		t.Fatalf("faults off: %v, hook still set %v", err, in.hook != nil)
	}
}

// TestCorruptNeedsHook: corrupt on a port without an encode hook is
// refused with a one-line error, by New and by SetFaults (which then
// keeps the faults it had); the other faults work on it.
func TestCorruptNeedsHook(t *testing.T) {
	if _, err := New(&recorder{}, Faults{Corrupt: 0.5}); err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "corrupt=0.5") {
		t.Fatalf("New: %v, want a one-line error naming corrupt=0.5", err)
	}
	in := &recorder{}
	p := mustNew(t, in, Faults{Loss: 1})
	if err := p.SetFaults(Faults{Loss: 1, Corrupt: 1}); err == nil {
		t.Fatal("SetFaults accepted corrupt on a port without a hook")
	}
	bufs, meta := batch(2, 0, uni)
	if n := write(t, p, bufs, meta); n != 0 || p.Counters().Drops["fault_loss"] != 2 {
		t.Fatalf("after the refusal: n %d, drops %v; want loss=1 still on", n, p.Counters().Drops)
	}
}

// TestValidate: each fault must be a probability in [0, 1].
func TestValidate(t *testing.T) {
	for _, c := range []struct {
		f  Faults
		ok bool
	}{
		{Faults{}, true},
		{Faults{Loss: 1, Dup: 1, Reorder: 1, Corrupt: 1}, true},
		{Faults{Loss: 0.01, Dup: 0.5}, true},
		{Faults{Loss: -0.1}, false},
		{Faults{Dup: 1.5}, false},
		{Faults{Reorder: 2}, false},
		{Faults{Corrupt: -1}, false},
		{Faults{Loss: math.NaN()}, false},
		{Faults{Dup: math.Inf(1)}, false},
	} {
		if err := c.f.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.f, err, c.ok)
		}
	}
}

// TestPassesThrough: the events (the link state the shim follows) and
// the inner port are the inner port's, faults on or off.
func TestPassesThrough(t *testing.T) {
	in := &recorder{events: make(chan ipoib.Event, 1)}
	p := mustNew(t, in, Faults{Loss: 1})
	if p.Events() != (<-chan ipoib.Event)(in.events) || p.Unwrap() != ipoib.Port(in) {
		t.Fatalf("Events %v (inner %v), Unwrap %v", p.Events(), in.events, p.Unwrap())
	}
	in.events <- ipoib.Event{Kind: ipoib.EventLink, Up: false}
	if e := <-p.Events(); e.Kind != ipoib.EventLink || e.Up {
		t.Fatalf("event %+v, want the inner port's link down", e)
	}
}

// TestWriteAllocs: once warm, a batch written with every fault on
// allocates nothing in the wrapper.
func TestWriteAllocs(t *testing.T) {
	p := mustNew(t, &nopPort{}, Faults{Loss: 0.2, Dup: 0.5, Reorder: 0.5})
	bufs, meta := batch(64, 0, uni)
	round := func() {
		if _, err := p.Write(bufs, meta, offset); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ {
		round() // warm: the copies' storage grows to the largest batch
	}
	if a := testing.AllocsPerRun(100, round); a != 0 {
		t.Fatalf("%.1f allocations per batch, want 0", a)
	}
}

// nopPort accepts every packet and keeps nothing.
type nopPort struct{ ipoib.Port }

func (nopPort) Write(bufs [][]byte, _ []ipoib.TxMeta, _ int) (int, error) { return len(bufs), nil }
