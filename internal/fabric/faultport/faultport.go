// Package faultport injects faults into any ipoib.Port, for tests and
// the daemon's --fault flag.
//
// A Port wraps another. Loss, duplication and reordering act on the
// batches handed to Write before the inner port sees them; a TCP
// super-packet is one packet of the batch, lost, duplicated or held
// whole. Corruption needs the bytes after the ICRC was computed. So it
// acts inside the inner port's write path, one encoded packet at a time,
// through an encode hook (Hooked, which simfabric.Port implements).
//
// FreeQP also drops a held packet of the QP it frees. Every other method
// is the inner port's: Events, which the shim follows for the link
// state, is the inner port's channel. Nothing here runs
// unless a Port is made: the daemon wraps its port only when faults are
// asked for.
package faultport

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/eipoib/eipoibd/ipoib"
)

// Faults are the probabilities, each in [0, 1], of what happens to a
// packet written; all zero (off) by default.
type Faults struct {
	Loss    float64 // drop the packet
	Dup     float64 // send it twice
	Reorder float64 // hold it back and send it after the next ones
	Corrupt float64 // flip a byte after the ICRC was computed
}

// Validate checks that each fault is a probability.
func (f Faults) Validate() error {
	for _, p := range []struct {
		n string
		v float64
	}{{"loss", f.Loss}, {"dup", f.Dup}, {"reorder", f.Reorder}, {"corrupt", f.Corrupt}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("faultport: fault %s=%v is not a probability in [0,1]", p.n, p.v)
		}
	}
	return nil
}

// Hooked is a port that shows each packet it sends to a hook once the
// packet is encoded, ICRC included. body is what follows the transport
// headers: changing any byte of it makes the receiver's ICRC check fail.
// mcast says whether it goes to a group. The hook may change body in
// place. While a hook is set the port sends single packets (no trains of
// them), so that each fault acts on one packet. nil removes the hook.
// The corrupt fault needs it.
type Hooked interface {
	SetEncodeHook(fn func(body []byte, mcast bool))
}

// inner names the embedded port so that the field stays unexported.
type inner = ipoib.Port

// Port is a port with faults injected on Write. It implements ipoib.Port;
// Write may be called from several goroutines (one at a time goes
// through).
type Port struct {
	inner
	hooked Hooked // the inner port's hook, nil when it has none
	hookFn func(body []byte, mcast bool)

	mu  sync.Mutex // all below, and the calls into the inner Write
	f   Faults
	rng *rand.Rand
	// This call's batch as passed on, and the extra packets (duplicates
	// and a released held packet) sent after it.
	pass      [][]byte
	passMeta  []ipoib.TxMeta
	extra     [][]byte
	extraMeta []ipoib.TxMeta
	copies    [][]byte // reused storage of the duplicates
	held      []byte   // a reordered packet waiting for the next batch, nil for none
	heldMeta  ipoib.TxMeta
	heldBuf   []byte // reused storage of held

	loss, corrupt, corruptMcast atomic.Uint64
}

var _ ipoib.Port = (*Port)(nil)

// New wraps port with faults f. It refuses probabilities outside [0, 1]
// and a corrupt fault on a port that is not Hooked.
func New(port ipoib.Port, f Faults) (*Port, error) {
	p := &Port{inner: port, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	p.hooked, _ = port.(Hooked)
	p.hookFn = p.corruptHook
	if err := p.SetFaults(f); err != nil {
		return nil, err
	}
	return p, nil
}

// SetFaults replaces the faults. It refuses what New refuses, and then
// keeps the faults it had.
func (p *Port) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if f.Corrupt > 0 && p.hooked == nil {
		return fmt.Errorf("faultport: fault corrupt=%v needs a port that shows its encoded packets (the simulated fabric); %T cannot be corrupted", f.Corrupt, p.inner)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.f = f
	if p.hooked != nil {
		if f == (Faults{}) {
			p.hooked.SetEncodeHook(nil)
		} else {
			p.hooked.SetEncodeHook(p.hookFn)
		}
	}
	return nil
}

// RxQueues is the inner port's receive queues (faults act on Write
// alone), or its Read alone for a port with one.
func (p *Port) RxQueues() []ipoib.RxQueue { return ipoib.RxQueuesOf(p.inner) }

// Unwrap returns the inner port.
func (p *Port) Unwrap() ipoib.Port { return p.inner }

// Write applies the faults to each packet of the batch and writes the
// rest to the inner port. First go the packets passed on. Then, in a
// second inner Write, go the duplicates (copies, so that corrupting one
// leaves the other) and a packet held back by an earlier call, which so
// leaves after the next ones. n counts the packets of bufs the inner
// port accepted, and a packet held back now as accepted. A lost one is
// counted as fault_loss (ipoib.DropFaultLoss) and not in n; a held one
// that FreeQP drops later was in n and is counted as fault_loss too.
func (p *Port) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := &p.f
	if f.Loss == 0 && f.Dup == 0 && f.Reorder == 0 && p.held == nil {
		return p.inner.Write(bufs, meta, offset)
	}
	if len(meta) < len(bufs) {
		return 0, fmt.Errorf("faultport: write of %d packets with %d metadata", len(bufs), len(meta))
	}
	p.pass, p.passMeta, p.extra, p.extraMeta = p.pass[:0], p.passMeta[:0], p.extra[:0], p.extraMeta[:0]
	release := p.held != nil // a packet held by an earlier call
	heldNow := 0
	for i, b := range bufs {
		switch {
		case f.Loss > 0 && p.rng.Float64() < f.Loss:
			p.loss.Add(1)
			continue
		case f.Reorder > 0 && p.held == nil && p.rng.Float64() < f.Reorder:
			p.held = clone(p.heldBuf, b)
			p.heldBuf, p.heldMeta = p.held, meta[i]
			heldNow++
			continue
		}
		p.pass, p.passMeta = append(p.pass, b), append(p.passMeta, meta[i])
		if f.Dup > 0 && p.rng.Float64() < f.Dup {
			k := len(p.extra)
			if k == len(p.copies) {
				p.copies = append(p.copies, nil)
			}
			p.copies[k] = clone(p.copies[k], b)
			p.extra, p.extraMeta = append(p.extra, p.copies[k]), append(p.extraMeta, meta[i])
		}
	}
	if release && len(p.pass) > 0 {
		p.extra, p.extraMeta = append(p.extra, p.held), append(p.extraMeta, p.heldMeta)
		p.held = nil
	}
	n := heldNow
	if len(p.pass) > 0 {
		k, err := p.inner.Write(p.pass, p.passMeta, offset)
		if n += k; err != nil {
			return n, err
		}
	}
	if len(p.extra) > 0 {
		if _, err := p.inner.Write(p.extra, p.extraMeta, offset); err != nil {
			return n, err
		}
	}
	return n, nil
}

// FreeQP drops a packet held back (reorder) from QP qpn, counted as
// fault_loss, then frees the QP in the inner port. The caller frees a QP
// once none of its own sends can still use it (the shim's epochs), but
// a held packet outlives the Write that took it: sent after the free, the
// inner port would refuse its source QP (bad_meta). An HCA, too, sends
// none of the work requests a QP still has queued when it is destroyed
// (ibv_destroy_qp).
func (p *Port) FreeQP(qpn uint32) error {
	p.mu.Lock()
	if p.held != nil && p.heldMeta.SrcQPN == qpn {
		p.held = nil
		p.loss.Add(1)
	}
	p.mu.Unlock()
	return p.inner.FreeQP(qpn)
}

// clone copies b into storage (grown when too small) with the same
// capacity after its length, which the inner port may need.
func clone(storage, b []byte) []byte {
	if need := cap(b); cap(storage) < need {
		storage = make([]byte, 0, need)
	}
	return append(storage[:0], b...)
}

// corruptHook is the encode hook: it flips a byte of body with the
// corrupt probability and counts it. The inner port calls it from the
// inner Write, under p.mu.
func (p *Port) corruptHook(body []byte, mcast bool) {
	if p.f.Corrupt == 0 || len(body) == 0 || p.rng.Float64() >= p.f.Corrupt {
		return
	}
	body[p.rng.IntN(len(body))] ^= 0x40
	if mcast {
		p.corruptMcast.Add(1)
	} else {
		p.corrupt.Add(1)
	}
}

// Counters are the inner port's, with the faults' own: fault_loss
// (ipoib.DropFaultLoss) among the drops, and the corrupted packets sent as tx_fault_corrupt (unicast:
// the peer counts each as bad_icrc) and tx_fault_corrupt_multicast (only
// the group's members count them).
func (p *Port) Counters() ipoib.PortCounters {
	c := p.inner.Counters()
	if v := p.loss.Load(); v != 0 {
		if c.Drops == nil {
			c.Drops = make(map[string]uint64)
		}
		c.Drops[ipoib.DropFaultLoss.String()] += v
	}
	if c.Stats == nil {
		c.Stats = make(map[string]uint64)
	}
	c.Stats["tx_fault_corrupt"] = p.corrupt.Load()
	c.Stats["tx_fault_corrupt_multicast"] = p.corruptMcast.Load()
	return c
}
