package shim

// The port's events (ipoib.Port.Events): its link state drives the TAP's
// carrier, its partitions' MTUs the partitions' IPoIB MTUs. One goroutine
// of Run applies them as they come; housekeeping sends the general
// queries once a returned carrier has reached the bridge.

import (
	"errors"
	"net"

	"github.com/eipoib/eipoibd/ipoib"
)

// followEvents applies the port's events until the port closes the
// channel (Run closes the port on its way out).
func (s *Shim) followEvents(events <-chan ipoib.Event) error {
	for ev := range events {
		s.applyEvent(ev)
	}
	return nil
}

// applyEvent applies one port event. An event of a kind the shim does
// not know is logged: port events are rare, never per frame.
func (s *Shim) applyEvent(ev ipoib.Event) {
	switch ev.Kind {
	case ipoib.EventLink:
		if s.followCarrier(ev.Up) {
			s.groups.carrierReturned()
		}
	case ipoib.EventPartitionMTU:
		// Looked up under mtuMu: a partition being added holds it from
		// reading its MTU until it is published (joinPartition).
		s.mtuMu.Lock()
		if p := s.partitions()[ev.PKey.Full()]; p != nil {
			s.setMTU(p, ev.MTU)
		}
		s.mtuMu.Unlock()
	default:
		s.log.Warn("port event of an unknown kind ignored", "kind", ev.Kind)
	}
}

// followCarrier sets the device carrier to the port's link state up, and
// reports whether it just came back on after being off.
func (s *Shim) followCarrier(up bool) (back bool) {
	if up == s.carrier.Load() && s.carrierSet.Load() {
		return false
	}
	if err := s.dev.SetCarrier(up); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			s.log.Warn("set carrier", "up", up, "err", err)
		}
		return false
	}
	back = up && s.carrierSet.Load()
	s.carrier.Store(up)
	s.carrierSet.Store(true)
	s.log.Info("link state", "up", up)
	return back
}

// ipMTUOf is the IPoIB MTU of a partition of IB MTU ib, as the port
// reports it (an event, or PartitionMTU), never above the port's. A
// value no port should give, at or below the IPoIB header, reads as the
// port's.
func (s *Shim) ipMTUOf(ib int) int {
	m := ib - ipoib.HeaderLen
	if m <= 0 || m > s.ipMTU {
		return s.ipMTU
	}
	return m
}

// setMTU sets partition p's IPoIB MTU from its IB MTU ib and logs a
// change; call with mtuMu held.
func (s *Shim) setMTU(p *partition, ib int) {
	m := s.ipMTUOf(ib)
	if old := int(p.ipMTU.Swap(int32(m))); old != m {
		s.log.Info("partition MTU", "vlan", p.vlan, "pkey", p.pkey, "ipoib_mtu", m, "was", old)
	}
}
