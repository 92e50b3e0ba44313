package simfabric

// Fault injection on send, for tests: loss, duplication, reordering and
// corruption, applied to each packet after it was encoded.

import (
	"fmt"

	"golang.org/x/net/ipv6"
)

// Faults are injected on send, for tests; all zero (off) by default.
// Probabilities are in [0, 1].
type Faults struct {
	Loss    float64 // drop the packet
	Dup     float64 // send it twice
	Reorder float64 // hold it back and send it after the next one
	Corrupt float64 // flip a byte after the ICRC was computed
}

// Validate checks the probabilities.
func (f Faults) Validate() error {
	for _, p := range []struct {
		n string
		v float64
	}{{"loss", f.Loss}, {"dup", f.Dup}, {"reorder", f.Reorder}, {"corrupt", f.Corrupt}} {
		if p.v < 0 || p.v > 1 {
			return fmt.Errorf("simfabric: fault %s=%v is not a probability in [0,1]", p.n, p.v)
		}
	}
	return nil
}

// SetFaults replaces the injected send faults.
func (p *Port) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.wmu.Lock()
	p.faults = f
	p.wmu.Unlock()
	return nil
}

// faulted reports whether a fault is configured (trains are then not
// built, so that each fault acts on single packets).
func (p *Port) faulted() bool {
	f := &p.faults
	return f.Loss != 0 || f.Dup != 0 || f.Reorder != 0 || f.Corrupt != 0
}

// faulty appends the packet (bufs[orig] of the chunk) to msgs, applying
// the configured faults.
func (p *Port) faulty(msgs []ipv6.Message, out []byte, to *peer, orig int, mcast bool) []ipv6.Message {
	f := &p.faults
	if f.Loss == 0 && f.Dup == 0 && f.Reorder == 0 && f.Corrupt == 0 {
		return p.add(msgs, out, to, orig)
	}
	if f.Loss > 0 && p.rng.Float64() < f.Loss {
		p.drop(DropFaultLoss)
		return msgs
	}
	corrupt := f.Corrupt > 0 && p.rng.Float64() < f.Corrupt
	if corrupt {
		out[HeaderLen+p.rng.IntN(len(out)-HeaderLen)] ^= 0x40
	}
	if f.Reorder > 0 && p.held == nil && p.rng.Float64() < f.Reorder {
		p.held = append(p.heldBuf[:0], out...)
		p.heldBuf = p.held
		p.heldTo, p.heldFrom, p.heldCorrupt, p.heldMcast = to, orig, corrupt, mcast
		return msgs
	}
	msgs = p.add(msgs, out, to, orig)
	sent := uint64(1)
	if f.Dup > 0 && p.rng.Float64() < f.Dup {
		msgs = p.add(msgs, out, to, orig)
		sent++
	}
	if corrupt {
		p.corrupted(mcast, sent)
	}
	return msgs
}

// corrupted counts n corrupted packets sent, to a group or not.
func (p *Port) corrupted(mcast bool, n uint64) {
	if mcast {
		p.faultCorruptMcast.Add(n)
	} else {
		p.faultCorrupt.Add(n)
	}
}
