package shim

// Unknown sources: a port that cannot tell a packet's sender (the kernel
// IPoIB backend: packet sockets get no source address) marks it
// RxMeta.SrcUnknown. The sender is then found from what ARP and NDP
// taught: every ARP packet carries its sender's address, NDP options carry
// the sender's (SLLA) or target's (TLLA), and the RX rewrite has already
// turned those into REMACs. srcTable keeps (partition, IP) → REMAC; an IP
// packet takes the REMAC of its source IP. A source never seen in ARP/NDP
// is not guessed: the packet is dropped and counted, and the shim asks for
// it (ARP request or neighbour solicitation from the receiving guest's
// VIF), at most once per resolveInterval, so that the next packet passes.
// Ports that report sources never reach this file.

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

type srcKey struct {
	pkey ipoib.PKey
	ip   netip.Addr
}

type srcEntry struct {
	mac   ether.MAC // zero while only asked for
	asked time.Time // last resolution sent for it
}

// srcTable maps source IPs to REMACs, bounded to max entries.
type srcTable struct {
	mu  sync.RWMutex
	m   map[srcKey]srcEntry
	max int
}

func (t *srcTable) lookup(k srcKey) (ether.MAC, bool) {
	t.mu.RLock()
	e, ok := t.m[k]
	t.mu.RUnlock()
	return e.mac, ok && !e.mac.IsZero()
}

// put stores e under k, evicting an arbitrary entry when full.
func (t *srcTable) put(k srcKey, e srcEntry) {
	if t.m == nil {
		t.m = make(map[srcKey]srcEntry)
	}
	if _, ok := t.m[k]; !ok && len(t.m) >= t.max {
		for old := range t.m {
			delete(t.m, old)
			break
		}
	}
	t.m[k] = e
}

func (t *srcTable) learn(k srcKey, mac ether.MAC) {
	if !k.ip.IsValid() || k.ip.IsUnspecified() || k.ip.IsMulticast() || mac.IsMulticast() || mac.IsZero() {
		return
	}
	t.mu.Lock()
	t.put(k, srcEntry{mac: mac})
	t.mu.Unlock()
}

// ipsOf returns the addresses mac (a REMAC) spoke for in partition pkey
// (a scan: for the rare guest that moved here, see moved.go).
func (t *srcTable) ipsOf(pkey ipoib.PKey, mac ether.MAC) []netip.Addr {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []netip.Addr
	for k, e := range t.m {
		if k.pkey == pkey && e.mac == mac {
			out = append(out, k.ip)
		}
	}
	return out
}

// ask reports whether a resolution of k is due at now, and records it.
func (t *srcTable) ask(k srcKey, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if !e.mac.IsZero() || now.Sub(e.asked) < resolveInterval {
		return false
	}
	e.asked = now
	t.put(k, e)
	return true
}

// sourceOf returns the REMAC a packet from an unknown source came from
// (pkt is its rewritten IP/ARP payload), learning the addresses ARP and
// NDP carry; for an unknown source it counts the drop, starts a
// resolution and reports false.
func (s *Shim) sourceOf(p *partition, et uint16, pkt []byte, m *ipoib.RxMeta, now time.Time) (ether.MAC, bool) {
	var sip, dip netip.Addr
	switch et {
	case ether.TypeARP, ether.TypeRARP:
		s.noteIPs(p, et, pkt)
		return ether.MAC(arpndp.ARP(pkt).SenderHw()), true
	case ether.TypeIPv4:
		if len(pkt) < 20 {
			break
		}
		sip, dip = netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20]))
	case ether.TypeIPv6:
		if len(pkt) < 40 {
			break
		}
		sip, dip = netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40]))
		s.noteIPs(p, et, pkt)
	}
	k := srcKey{p.pkey, sip}
	if mac, ok := s.srcs.lookup(k); ok {
		if n, ok := s.neigh.LookupREMAC(p.pkey, mac); ok {
			n.Touch(now)
			return mac, true
		}
	}
	s.ctr.inc(DropRxUnknownSource)
	if m.DstQPN == ipoib.MulticastQPN || !sip.IsValid() || sip.IsUnspecified() || !s.srcs.ask(k, now) {
		return ether.MAC{}, false
	}
	if vif, ok := s.vifs.LookupQPN(m.DstQPN); ok {
		s.sendResolve(p, vif, dip, sip) // within the RX worker's epoch
	}
	return ether.MAC{}, false
}

// noteIPs learns which IPs the sender of an accepted ARP or NDP packet
// (pkt, its payload rewritten to Ethernet addresses) speaks for: the
// source table of ports that cannot tell senders, and what the CLI shows
// of each neighbour. Only ARP and NDP, never a data packet.
func (s *Shim) noteIPs(p *partition, et uint16, pkt []byte) {
	switch {
	case et == ether.TypeARP || et == ether.TypeRARP:
		a := arpndp.ARP(pkt) // valid: the rewrite checked it
		s.srcs.learn(srcKey{p.pkey, netip.AddrFrom4(a.SenderIP())}, ether.MAC(a.SenderHw()))
	case et == ether.TypeIPv6 && len(pkt) >= 40 && arpndp.IsNDP(pkt):
		s.learnNDP(p, pkt, netip.AddrFrom16([16]byte(pkt[8:24])))
	}
}

// ndpFixed is the length of an NDP message before its options.
func ndpFixed(typ byte) int {
	switch typ {
	case arpndp.TypeRouterSolicitation:
		return 8
	case arpndp.TypeRouterAdvertisement:
		return 16
	case arpndp.TypeNeighborSolicitation, arpndp.TypeNeighborAdvertisement:
		return 24
	}
	return 0
}

// learnNDP learns from a rewritten NDP packet's Ethernet link-layer
// options: the source's (SLLA) and, in an advertisement, the target's
// (TLLA).
func (s *Shim) learnNDP(p *partition, pkt []byte, sip netip.Addr) {
	typ := pkt[40]
	fixed := ndpFixed(typ)
	end := min(len(pkt), 40+int(binary.BigEndian.Uint16(pkt[4:6])))
	if fixed == 0 || 40+fixed > end {
		return
	}
	for off := 40 + fixed; off+8 <= end && pkt[off+1] != 0; off += int(pkt[off+1]) * 8 {
		if pkt[off+1] != 1 {
			continue
		}
		mac := ether.MAC(pkt[off+2 : off+8])
		switch pkt[off] {
		case arpndp.OptSLLA:
			s.srcs.learn(srcKey{p.pkey, sip}, mac)
		case arpndp.OptTLLA:
			if typ == arpndp.TypeNeighborAdvertisement {
				s.srcs.learn(srcKey{p.pkey, netip.AddrFrom16([16]byte(pkt[48:64]))}, mac)
			}
		}
	}
}
