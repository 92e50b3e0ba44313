package shim

import (
	"log/slog"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// The fast path's maps checked against the shim's tables. FuzzFastPathMaps
// drives a random sequence of state changes through a shim that is not
// running, on the kernel backend over the fake kernel, whose FastPath
// (kernelfabric) fills fake maps (fakekernel.FastMaps). After each change
// a control round runs, and the maps must hold exactly what fastPathWant
// derives from the shim's tables and the fake kernel's links, by the
// rules docs/kernel-backend.md states, without the code under test.

const (
	fpTAP    = 77 // the TAP's ifindex and MTU the maps are given
	fpTAPMTU = 1500
	fpVLAN   = 10 // ↔ 0x800a
	fpIdle   = time.Minute
	fpTTL    = 10 * time.Minute
	fpWindow = 30 * time.Second
)

// The fast-path fuzz ops: the first byte of each pair, modulo fpOps.
const (
	fpMakeVIF   = iota // a guest (arg: which of 4, and the VLAN) gets a VIF
	fpRemoveVIF        // the control socket frees a guest's VIF
	fpLearn            // a remote endpoint (arg: which of 8, the partition) is learned; a full table evicts
	fpAdvance          // time passes (arg × 20 s): neighbours and VIFs age, windows end
	fpMove             // a neighbour is marked moved to a local VIF, or back
	fpFlush            // the neighbours are flushed
	fpSource           // a source IP (arg: which of 8) is learned for a REMAC
	fpCarrier          // the port's carrier goes down or up
	fpCapture          // a capture starts or stops
	fpClampMSS         // --clamp-mss is switched
	fpAnnounce         // a VIF announces again (its window restarts)
	fpHit              // the programs carry a guest's frames to and from a neighbour
	fpOps
)

var fpOpNames = [fpOps]string{"make VIF", "remove VIF", "learn", "advance", "move", "flush", "source", "carrier", "capture", "clamp-mss", "announce", "hit"}

// fpEnv is one fuzz input's world.
type fpEnv struct {
	t       *testing.T
	s       *Shim
	k       *fakekernel.Kernel
	port    *kernelfabric.Port
	m       *fakekernel.FastMaps
	clk     *clock.Fake
	capture *Capture
	carrier bool
}

func newFPEnv(t *testing.T) *fpEnv {
	k := fakekernel.NewFabric().NewHost(fuzzGID, "ib0", 2044)
	port, err := kernelfabric.New(kernelfabric.Config{Kernel: k, Parent: "ib0", FastPath: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { port.Close() })
	m := fakekernel.NewFastMaps()
	clk := clock.NewFake(fuzzStart)
	s, err := New(Config{Device: tap.NewMem(64), Port: port, Logger: slog.New(slog.DiscardHandler), Clock: clk,
		Partitions: map[uint16]ipoib.PKey{fpVLAN: 0x800a}, FastPath: port.NewFastPath(m, fpTAP, fpTAPMTU),
		MaxNeighbours: 6, VIFIdle: fpIdle, NeighTTL: fpTTL, AnnounceWindow: fpWindow})
	if err != nil {
		t.Fatal(err)
	}
	return &fpEnv{t: t, s: s, k: k, port: port, m: m, clk: clk, carrier: true}
}

func fpGuest(i byte) ether.MAC { return ether.MAC{0x52, 0x54, 0, 0, 0xf0, i % 4} }

func fpRemote(i byte) ipoib.HwAddr {
	return ipoib.MakeHwAddr(0, 0x100+uint32(i%8), testutil.GID("fe80::b"))
}

func fpIP(i byte) netip.Addr {
	if i&1 == 0 {
		return netip.AddrFrom4([4]byte{10, 0, 0, 10 + i%8})
	}
	return netip.AddrFrom16([16]byte{0xfd, 15: 10 + i%8})
}

// pick is the i-th element of xs modulo its length, or the zero value.
func pick[T any](xs []T, i byte) (T, bool) {
	var zero T
	if len(xs) == 0 {
		return zero, false
	}
	return xs[int(i)%len(xs)], true
}

// do applies one op with argument a.
func (e *fpEnv) do(op, a byte) {
	s, now := e.s, e.clk.Now()
	partition := func(b byte) *partition {
		if b&0x80 != 0 {
			return s.byVLAN[fpVLAN].Load()
		}
		return s.byVLAN[0].Load()
	}
	switch op % fpOps {
	case fpMakeVIF:
		if e.carrier { // without carrier a child never gets ready
			s.ctl.own.Lock()
			_, _ = s.vif(partition(a), fpGuest(a), mactrans.OriginLearned, now)
			s.ctl.own.Unlock()
		}
	case fpRemoveVIF:
		vlan := uint16(0)
		if a&0x80 != 0 {
			vlan = fpVLAN
		}
		if _, err := s.RemoveVIF(fpGuest(a), vlan, mactrans.OriginDeclared); err != nil {
			e.t.Fatal(err)
		}
	case fpLearn:
		if _, err := s.neigh.Learn(partition(a).pkey, fpRemote(a), now); err != nil {
			e.t.Fatal(err)
		}
	case fpAdvance:
		e.clk.Advance(time.Duration(a%8) * 20 * time.Second)
		now = e.clk.Now()
		s.neigh.Expire(now, fpTTL)
		s.ctl.own.Lock()
		s.ageVIFs(now)
		s.freeDrained()
		s.ctl.own.Unlock()
	case fpMove:
		if n, ok := pick(s.neigh.All(), a); ok {
			v, _ := pick(s.vifs.All(), a>>4)
			if a&8 != 0 {
				v = nil
			}
			n.MoveTo(v)
		}
	case fpFlush:
		s.FlushNeighbours()
	case fpSource:
		remac := ether.MAC{0x02, 0, 0, 0, 0xee, a} // a REMAC no neighbour has
		if n, ok := pick(s.neigh.All(), a>>3); ok && a&4 == 0 {
			remac = n.REMAC
		}
		s.srcs.learn(srcKey{partition(a).pkey, fpIP(a)}, remac)
	case fpCarrier:
		// Only a change: the fake kernel's SetCarrier(true) on a port
		// already up drops its children's carrier without telling.
		if up := a&1 == 1; up != e.carrier {
			e.carrier = up
			e.setCarrier(up)
		}
	case fpCapture:
		if e.capture == nil {
			c, err := s.StartCapture(CaptureTAP, 4)
			if err != nil {
				e.t.Fatal(err)
			}
			e.capture = c
		} else {
			e.capture.Stop()
			e.capture = nil
		}
	case fpClampMSS:
		s.cfg.ClampMSS = !s.cfg.ClampMSS
	case fpAnnounce:
		if v, ok := pick(s.vifs.All(), a); ok {
			v.AnnounceUntil(now.Add(fpWindow))
		}
	case fpHit:
		// What the fast path carries changes what aging keeps: the maps
		// must follow the tables all the same.
		if n, ok := pick(s.neigh.All(), a>>4); ok {
			e.m.HitTX(fpGuest(a), n.REMAC, 1)
		}
		if v, ok := s.vifs.Lookup(mactrans.VIFKey{MAC: fpGuest(a)}); ok {
			if c, ok := e.childOf(v.QPN); ok {
				e.m.HitRX(c.Index, fpIP(a>>2), 1)
			}
		}
	}
}

// setCarrier switches the port's carrier and waits until the port has
// followed every child's (it does from link notifications, on its own
// goroutine, in the order the kernel sent them). Down: each child that
// had carrier counts one child_carrier_lost. Up: once every child has
// its carrier again, a new child's carrier, which the port waits for
// when it makes the child, comes after theirs.
func (e *fpEnv) setCarrier(up bool) {
	lost := func() uint64 { return e.port.Counters().Stats["child_carrier_lost"] }
	children := func() (n, carrier int) {
		ls, err := e.k.Links()
		if err != nil {
			e.t.Fatal(err)
		}
		for _, l := range ls {
			if l.ParentIndex != 0 {
				n++
				if l.Carrier {
					carrier++
				}
			}
		}
		return n, carrier
	}
	_, had := children()
	want := lost() + uint64(had)
	e.k.SetCarrier(up)
	deadline := time.Now().Add(10 * time.Second)
	wait := func(what string, done func() bool) {
		for !done() {
			if time.Now().After(deadline) {
				e.t.Fatalf("carrier %v: %s", up, what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if !up {
		wait("the port saw no child lose carrier", func() bool { return lost() >= want })
		return
	}
	wait("the children got no carrier", func() bool { n, c := children(); return n == c })
	qpn, err := e.port.AllocQP(ipoib.DefaultPKey, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.port.FreeQP(qpn); err != nil {
		e.t.Fatal(err)
	}
}

// childOf is the fake kernel's IPoIB child with QP qpn.
func (e *fpEnv) childOf(qpn uint32) (kernelfabric.Link, bool) {
	ls, err := e.k.Links()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, l := range ls {
		if l.ParentIndex != 0 && l.HwAddr.QPN() == qpn {
			return l, true
		}
	}
	return kernelfabric.Link{}, false
}

// fastMapsWant is what the maps should hold.
type fastMapsWant struct {
	guests   map[ether.MAC]fastpath.Guest
	children map[int]ether.MAC // child → guest (TAP and MTU are fixed)
	remacs   map[ether.MAC]ipoib.HwAddr
	senders  map[fakekernel.FastSender]ether.MAC
}

// fastPathWant derives the maps' content from the shim's tables: nothing
// under --clamp-mss, a capture or a stop; else each ready guest of the
// untagged partition past its announcement window whose child has
// carrier, each neighbour of that partition no guest moved from, and each
// of that partition's sources once per such child.
func (e *fpEnv) fastPathWant() fastMapsWant {
	s, now := e.s, e.clk.Now()
	w := fastMapsWant{map[ether.MAC]fastpath.Guest{}, map[int]ether.MAC{}, map[ether.MAC]ipoib.HwAddr{}, map[fakekernel.FastSender]ether.MAC{}}
	if s.cfg.ClampMSS || e.capture != nil || s.stopping.Load() {
		return w
	}
	for _, v := range s.vifs.All() {
		if v.Key.VLAN != 0 || !v.Ready() || v.Announcing(now) {
			continue
		}
		if l, ok := e.childOf(v.QPN); ok && l.Carrier {
			w.guests[v.Key.MAC] = fastpath.Guest{Ifindex: uint32(l.Index), MTU: uint32(l.MTU)}
			w.children[l.Index] = v.Key.MAC
		}
	}
	for _, n := range s.neigh.All() {
		if n.PKey == ipoib.DefaultPKey.Full() && n.MovedTo() == nil {
			w.remacs[n.REMAC] = n.RIMAC.WithoutFlags()
		}
	}
	s.srcs.mu.RLock()
	for k, mac := range s.srcs.m {
		if k.pkey.Full() != ipoib.DefaultPKey.Full() {
			continue
		}
		for c := range w.children {
			w.senders[fakekernel.FastSender{Child: uint32(c), IP: k.ip.Unmap()}] = mac
		}
	}
	s.srcs.mu.RUnlock()
	return w
}

// mismatch compares the maps with w, "" when they agree.
func (e *fpEnv) mismatch(w fastMapsWant) string {
	m := e.m
	m.Lock()
	defer m.Unlock()
	children := map[int]ether.MAC{}
	for c, g := range m.Children {
		if g.TAP != fpTAP || g.MTU != fpTAPMTU {
			return "a child's TAP or MTU is wrong"
		}
		children[c] = ether.MAC(g.MAC)
	}
	switch {
	case !maps.Equal(m.Guests, w.guests):
		return "TX guests"
	case !maps.Equal(children, w.children):
		return "RX children"
	case !maps.Equal(m.REMACs, w.remacs):
		return "REMACs"
	case !maps.Equal(m.Senders, w.senders):
		return "senders"
	}
	return ""
}

// round runs a control round and checks the maps.
func (e *fpEnv) round(what string) {
	e.t.Helper()
	e.s.ctl.own.Lock()
	e.s.syncFastPath(e.clk.Now())
	e.s.ctl.own.Unlock()
	w := e.fastPathWant()
	if bad := e.mismatch(w); bad != "" {
		e.m.Lock()
		defer e.m.Unlock()
		e.t.Fatalf("after %s: %s differ:\n guests %v\n want %v\n children %v\n want %v\n REMACs %v\n want %v\n senders %v\n want %v",
			what, bad, e.m.Guests, w.guests, e.m.Children, w.children, e.m.REMACs, w.remacs, e.m.Senders, w.senders)
	}
}

// FuzzFastPathMaps: ops is a sequence of (op, argument) byte pairs (at
// most 32 of them), each a state change of the shim or the port; after
// each, and after the shim stops (every map empty), the fast path's maps
// must hold exactly what the tables say it may carry.
func FuzzFastPathMaps(f *testing.F) {
	pairs := func(ops ...byte) []byte { return ops }
	// Guests on both partitions, their windows over, neighbours and
	// sources learned, then each other op in turn.
	base := pairs(fpMakeVIF, 0, fpMakeVIF, 1, fpMakeVIF, 0x82, fpLearn, 0, fpLearn, 1, fpLearn, 0x82,
		fpSource, 0, fpSource, 1, fpSource, 0x83, fpAdvance, 2)
	f.Add(base)
	for op := range byte(fpOps) {
		f.Add(append(append([]byte{}, base...), op, 0x11, op, 0x22, fpAdvance, 1))
	}
	f.Add(append(append([]byte{}, base...), fpLearn, 3, fpLearn, 4, fpLearn, 5, fpLearn, 6, fpLearn, 7)) // evictions
	f.Add(append(append([]byte{}, base...), fpCarrier, 0, fpMakeVIF, 3, fpCarrier, 1, fpMakeVIF, 3, fpAdvance, 2))
	f.Add(append(append([]byte{}, base...), fpHit, 0x10, fpAdvance, 7, fpAdvance, 7, fpHit, 0x21, fpAdvance, 7))
	f.Add(append(append([]byte{}, base...), fpCapture, 0, fpClampMSS, 0, fpCapture, 0, fpClampMSS, 0))
	f.Add(append(append([]byte{}, base...), fpMove, 0x00, fpMove, 0x08, fpFlush, 0, fpLearn, 0))
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		e := newFPEnv(t)
		e.round("start")
		for i := 0; i+1 < len(ops); i += 2 {
			e.do(ops[i], ops[i+1])
			e.round(fpOpNames[ops[i]%fpOps])
		}
		// The shim stopping: every map empties.
		e.s.stopping.Store(true)
		e.round("stopping")
		if e.capture != nil {
			e.capture.Stop()
		}
	})
}
