package kernelfabric

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/ipoib"
)

// FastPathMaps are the fast path's maps and attachments as FastPath
// fills them: a *fastpath.Attached, or a fake in tests.
type FastPathMaps interface {
	// PutGuest, DeleteGuest, PutREMAC and DeleteREMAC fill the TX
	// program's maps (fastpath.TX).
	PutGuest(mac net.HardwareAddr, g fastpath.Guest) error
	DeleteGuest(mac net.HardwareAddr) error
	PutREMAC(mac net.HardwareAddr, addr ipoib.HwAddr) error
	DeleteREMAC(mac net.HardwareAddr) error
	// PutChild attaches the RX program to the child's ingress (once)
	// and puts its guest in the RX program's map; DeleteChild undoes
	// both.
	PutChild(child int, g fastpath.RXGuest) error
	DeleteChild(child int) error
	// PutSender and DeleteSender fill the RX program's senders map.
	PutSender(child uint32, ip netip.Addr, remac net.HardwareAddr) error
	DeleteSender(child uint32, ip netip.Addr) error
	// Counts sums both programs' per-CPU verdict counters.
	Counts() (tx [fastpath.NumReasons]uint64, rx [fastpath.NumRXReasons]uint64, err error)
	// Entries is what the maps hold: an earlier process's, if it
	// pinned them (--persist).
	Entries() (fastpath.Entries, error)
	// GuestHits, REMACHits and SenderHits read the programs' hit counts:
	// the frames they redirected using an entry since it was put (0 for
	// an entry not there). GuestHits sums the guest's TX entry and its
	// child's RX entry. They are called concurrently with the rest.
	GuestHits(mac net.HardwareAddr, child int) (uint64, error)
	REMACHits(mac net.HardwareAddr) (uint64, error)
	SenderHits(child uint32, ip netip.Addr) (uint64, error)
}

// The names under which Port.Counters reports the programs' verdicts,
// each followed by the verdict's name (fastpath.Reason, RXReason): the
// daemon exports them as one family (eipoibd_fast_path_total, labelled
// by direction and reason).
const (
	StatFastPathTX = "fast_path_tx_"
	StatFastPathRX = "fast_path_rx_"
)

// FastPath keeps a port's fast-path maps in step with what the shim's
// control goroutine says they may carry (shim.FastPath): each round
// states it in full, between Begin and Commit, and Commit puts what is
// new or changed and deletes what went, so that no map call is made for
// what stayed. It maps each guest's QPN to its child: TX sends the
// guest's frames to that child, and RX delivers what that child
// receives to the TAP with the guest's MAC, the sender's REMAC found by
// (child, source IP) in the senders the shim learned from ARP and NDP.
//
// Only children of the default partition take part: the programs carry
// untagged frames, which the shim maps to it. A child without carrier
// yet (its MTU unknown) waits for a later round. The senders map holds
// a copy of every sender per child, bounded by fastpath.MaxSenders: the
// rest stay with the user-space path.
//
// The programs count, in each entry, the frames they redirected using it
// (fastpath.TX, fastpath.RX). GuestUsed and NeighbourUsed compare those
// counts with the ones they read last time, one map lookup per entry, and
// only for the guest or REMAC asked about: the shim asks only when it is
// about to age or evict one.
//
// Begin, the stating methods and Commit are called from one goroutine,
// the shim's control goroutine. GuestUsed and NeighbourUsed may be called
// from any goroutine at any time.
type FastPath struct {
	p      *Port
	m      FastPathMaps
	tap    int // the TAP's ifindex
	tapMTU int
	// want is the round being stated, have what the maps hold. Only
	// Commit writes have, under mu; Used reads it under mu.
	want, have fastState

	mu sync.Mutex
	// The hit counts each entry had when last asked about.
	lastGuest  map[ether.MAC]uint64
	lastREMAC  map[ether.MAC]uint64
	lastSender map[fastSender]uint64
	// sendersOf is have.bySender by REMAC.
	sendersOf map[ether.MAC]map[fastSender]struct{}
}

// fastState is the content of the maps.
type fastState struct {
	guests   map[ether.MAC]uint32 // guest MAC → QPN, as stated
	children map[ether.MAC]fastChild
	remacs   map[ether.MAC]ipoib.HwAddr
	senders  map[netip.Addr]ether.MAC
	// bySender is the senders map's content: (child, IP) → REMAC.
	bySender map[fastSender]ether.MAC
}

// fastChild is a guest's child as the maps hold it.
type fastChild struct {
	index int
	mtu   int // the IPoIB MTU
}

type fastSender struct {
	child int
	ip    netip.Addr
}

func newFastState() fastState {
	return fastState{map[ether.MAC]uint32{}, map[ether.MAC]fastChild{}, map[ether.MAC]ipoib.HwAddr{}, map[netip.Addr]ether.MAC{}, map[fastSender]ether.MAC{}}
}

// NewFastPath returns the FastPath of port p filling m, for the TAP with
// ifindex tap and MTU tapMTU. It takes over what m holds (takeOver): the
// first Commit deletes what is stale and puts what is missing. From now
// until Stop, the port's Counters report the programs' verdicts.
func (p *Port) NewFastPath(m FastPathMaps, tap, tapMTU int) *FastPath {
	f := &FastPath{p: p, m: m, tap: tap, tapMTU: tapMTU, want: newFastState(), have: newFastState(),
		lastGuest: map[ether.MAC]uint64{}, lastREMAC: map[ether.MAC]uint64{}, lastSender: map[fastSender]uint64{},
		sendersOf: map[ether.MAC]map[fastSender]struct{}{}}
	if err := f.takeOver(); err != nil {
		p.log.Warn("kernel: fast path: the maps' entries were not all taken over", "err", err)
	}
	p.fast.Store(f)
	return f
}

// Stop ends the port's reporting of the programs' counters, before m is
// closed.
func (f *FastPath) Stop() { f.p.fast.CompareAndSwap(f, nil) }

// counts adds the programs' verdict counters to stats, every verdict,
// zero or not; none if they cannot be read (m closed meanwhile).
func (f *FastPath) counts(stats map[string]uint64) {
	tx, rx, err := f.m.Counts()
	if err != nil {
		return
	}
	for r, n := range tx {
		stats[StatFastPathTX+fastpath.Reason(r).String()] = n
	}
	for r, n := range rx {
		stats[StatFastPathRX+fastpath.RXReason(r).String()] = n
	}
}

// Begin starts a round.
func (f *FastPath) Begin() {
	clear(f.want.guests)
	clear(f.want.remacs)
	clear(f.want.senders)
}

// Guest states the guest with MAC mac, sending from QP qpn.
func (f *FastPath) Guest(mac ether.MAC, qpn uint32) { f.want.guests[mac] = qpn }

// Neighbour states the REMAC remac of the remote address rimac.
func (f *FastPath) Neighbour(remac ether.MAC, rimac ipoib.HwAddr) { f.want.remacs[remac] = rimac }

// Sender states that packets from ip come from remac.
func (f *FastPath) Sender(ip netip.Addr, remac ether.MAC) { f.want.senders[ip] = remac }

// Commit applies the round: deletions first (a sender before its child,
// a child's entries before the child goes), then additions and changes.
// It returns the first error; the rest of the round is applied all the
// same, and an entry whose call failed is tried again next round. Once
// the port keeps its children (Port.Keep) it changes nothing: the maps
// are left as they are for the next run.
func (f *FastPath) Commit() error {
	if f.p.kept.Load() {
		return nil
	}
	var errs []error
	try := func(err error) bool {
		if err != nil && len(errs) < 4 {
			errs = append(errs, err)
		}
		return err == nil
	}
	// The children the stated guests have now.
	clear(f.want.children)
	for mac, qpn := range f.want.guests {
		if c, ok := f.childOf(qpn); ok {
			f.want.children[mac] = c
		}
	}
	clear(f.want.bySender)
	for ip, remac := range f.want.senders {
		for _, c := range f.want.children {
			if len(f.want.bySender) < fastpath.MaxSenders {
				f.want.bySender[fastSender{c.index, ip}] = remac
			}
		}
	}

	for k, remac := range f.have.bySender {
		if _, ok := f.want.bySender[k]; !ok && try(f.m.DeleteSender(uint32(k.child), k.ip)) {
			f.setSender(k, remac, false)
		}
	}
	for mac, c := range f.have.children {
		if w, ok := f.want.children[mac]; ok && w == c {
			continue
		}
		if try(f.m.DeleteGuest(mac[:])) && try(f.m.DeleteChild(c.index)) {
			f.setChild(mac, c, false)
		}
	}
	for mac := range f.have.remacs {
		if _, ok := f.want.remacs[mac]; !ok && try(f.m.DeleteREMAC(mac[:])) {
			f.setREMAC(mac, ipoib.HwAddr{}, false)
		}
	}

	for mac, c := range f.want.children {
		if _, ok := f.have.children[mac]; ok {
			continue
		}
		if try(f.m.PutChild(c.index, fastpath.RXGuest{MAC: mac[:], TAP: uint32(f.tap), MTU: uint32(f.tapMTU)})) &&
			try(f.m.PutGuest(mac[:], fastpath.Guest{Ifindex: uint32(c.index), MTU: uint32(c.mtu)})) {
			f.setChild(mac, c, true)
		}
	}
	for mac, rimac := range f.want.remacs {
		if h, ok := f.have.remacs[mac]; ok && h == rimac {
			continue
		}
		if try(f.m.PutREMAC(mac[:], rimac)) {
			f.setREMAC(mac, rimac, true)
		}
	}
	for ip, remac := range f.want.senders {
		for mac, c := range f.want.children {
			k := fastSender{c.index, ip}
			if _, ok := f.have.children[mac]; !ok {
				continue // its child is not in the maps
			}
			if _, ok := f.want.bySender[k]; !ok {
				continue // past the bound
			}
			if h, ok := f.have.bySender[k]; ok && h == remac {
				continue
			}
			if try(f.m.PutSender(uint32(k.child), k.ip, remac[:])) {
				if h, ok := f.have.bySender[k]; ok {
					f.setSender(k, h, false) // out of its old REMAC's index
				}
				f.setSender(k, remac, true)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("kernel: fast path: %w", errors.Join(errs...))
	}
	return nil
}

// setChild records that the maps now hold (put) or no longer hold the
// guest mac's entries for child c; a put entry's hit count starts at 0.
func (f *FastPath) setChild(mac ether.MAC, c fastChild, put bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if put {
		f.have.children[mac], f.lastGuest[mac] = c, 0
		return
	}
	delete(f.have.children, mac)
	delete(f.lastGuest, mac)
}

// setREMAC is setChild for a REMAC's entry.
func (f *FastPath) setREMAC(mac ether.MAC, rimac ipoib.HwAddr, put bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if put {
		f.have.remacs[mac], f.lastREMAC[mac] = rimac, 0
		return
	}
	delete(f.have.remacs, mac)
	delete(f.lastREMAC, mac)
}

// setSender is setChild for a sender's entry, which names remac.
func (f *FastPath) setSender(k fastSender, remac ether.MAC, put bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if put {
		f.have.bySender[k], f.lastSender[k] = remac, 0
		if f.sendersOf[remac] == nil {
			f.sendersOf[remac] = map[fastSender]struct{}{}
		}
		f.sendersOf[remac][k] = struct{}{}
		return
	}
	delete(f.have.bySender, k)
	delete(f.lastSender, k)
	delete(f.sendersOf[remac], k)
	if len(f.sendersOf[remac]) == 0 {
		delete(f.sendersOf, remac)
	}
}

// GuestUsed reports whether the programs redirected frames from or to
// the guest with MAC mac since the last call about it (or since its
// entries were put): one lookup in each program's guests map. A guest
// not in the maps, or whose counts cannot be read, was not used.
func (f *FastPath) GuestUsed(mac ether.MAC) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.have.children[mac]
	if !ok {
		return false
	}
	n, err := f.m.GuestHits(mac[:], c.index)
	if err != nil {
		return false
	}
	used := n != f.lastGuest[mac]
	f.lastGuest[mac] = n
	return used
}

// NeighbourUsed reports whether the TX program redirected frames to the
// REMAC remac (sent) and whether the RX program redirected packets from
// any address that names it (received) since the last call about it:
// one lookup in the REMACs map and, unless that says sent, one per
// (child, address) of it in the senders map, up to the first that
// moved. Either answer keeps the neighbour (mactrans), so one suffices.
// A sender not read this time keeps its old baseline, so a later call
// may answer received for packets already seen: it keeps a neighbour a
// while longer, never drops one early.
func (f *FastPath) NeighbourUsed(remac ether.MAC) (sent, received bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.have.remacs[remac]; ok {
		if n, err := f.m.REMACHits(remac[:]); err == nil {
			sent = n != f.lastREMAC[remac]
			f.lastREMAC[remac] = n
		}
	}
	if sent {
		return true, false
	}
	for k := range f.sendersOf[remac] {
		if n, err := f.m.SenderHits(uint32(k.child), k.ip); err == nil && n != f.lastSender[k] {
			f.lastSender[k] = n
			return false, true
		}
	}
	return false, false
}

// childOf is the child of VIF QP qpn that may take part: one of the
// default partition with carrier (so its MTU is known).
func (f *FastPath) childOf(qpn uint32) (fastChild, bool) {
	q, ok := f.p.qps.Lookup(qpn)
	if !ok || q.PKey.Full() != ipoib.DefaultPKey {
		return fastChild{}, false
	}
	c := q.Data.(*child)
	mtu := int(c.mtu.Load())
	if mtu == 0 || !c.carrier.Load() {
		return fastChild{}, false
	}
	return fastChild{index: c.index, mtu: mtu - ipoib.HeaderLen}, true
}

var _ FastPathMaps = (*fastpath.Attached)(nil)
