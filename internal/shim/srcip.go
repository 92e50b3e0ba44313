package shim

// Unknown sources. A port that cannot tell a packet's sender marks it
// RxMeta.SrcUnknown. The kernel IPoIB backend cannot: af_packet.c
// packet_rcv sets sll_halen from dev_parse_header(), and
// ipoib_header_ops has only .create, so a packet socket never gets a
// source address. Nor can the verbs backend for a sender without a GRH
// whose LID it never saw. The sender is then found from what ARP and NDP
// taught: every ARP packet carries its sender's address, NDP options carry
// the sender's (SLLA) or target's (TLLA), and the RX rewrite has already
// turned those into REMACs. srcTable keeps (partition, IP) → REMAC; an IP
// packet takes the REMAC of its source IP.
//
// A source never seen in ARP/NDP is not guessed and not dropped. It is what
// a router forwards from another subnet: its source IP is off-link, and
// nobody on the fabric answers ARP/NDP for it. It is also multicast from a
// host that never sent ARP/NDP. Such a packet is delivered with the
// partition's stand-in MAC (partition.anon) as its source and counted
// (rx_unknown_source). No ARP or NDP is sent for its source: for an
// off-link address none would ever be answered, and a routed flow would
// make one per source IP again and again. An on-link sender teaches its
// address anyway when it resolves the guest (its neighbour entry's ARP/NDP,
// which carries its own address: net/ipv4/arp.c arp_solicit,
// net/ipv6/ndisc.c ndisc_send_ns). Ports that report sources never reach
// this file.

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

// srcTable maps source IPs to REMACs, bounded to max entries.
type srcTable struct {
	mu  sync.RWMutex
	m   map[srcKey]ether.MAC
	max int
}

func (t *srcTable) lookup(k srcKey) (ether.MAC, bool) {
	t.mu.RLock()
	mac, ok := t.m[k]
	t.mu.RUnlock()
	return mac, ok
}

// put stores mac under k, evicting an arbitrary entry when full.
func (t *srcTable) put(k srcKey, mac ether.MAC) {
	if t.m == nil {
		t.m = make(map[srcKey]ether.MAC)
	}
	if _, ok := t.m[k]; !ok && len(t.m) >= t.max {
		for old := range t.m {
			delete(t.m, old)
			break
		}
	}
	t.m[k] = mac
}

func (t *srcTable) learn(k srcKey, mac ether.MAC) {
	if !k.ip.IsValid() || k.ip.IsUnspecified() || k.ip.IsMulticast() || mac.IsMulticast() || mac.IsZero() {
		return
	}
	t.mu.Lock()
	t.put(k, mac)
	t.mu.Unlock()
}

// ipsOf returns the addresses mac (a REMAC) spoke for in partition pkey
// (a scan: for the rare guest that moved here, see moved.go).
func (t *srcTable) ipsOf(pkey ipoib.PKey, mac ether.MAC) []netip.Addr {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []netip.Addr
	for k, m := range t.m {
		if k.pkey == pkey && m == mac {
			out = append(out, k.ip)
		}
	}
	return out
}

// sourceOf returns the REMAC a packet from an unknown source came from
// (pkt is its rewritten IP/ARP payload), learning the addresses ARP and
// NDP carry; for a source IP ARP/NDP never taught, the partition's
// stand-in MAC, counted.
func (s *Shim) sourceOf(p *partition, et uint16, pkt []byte, now time.Time) ether.MAC {
	var sip netip.Addr
	switch et {
	case ether.TypeARP, ether.TypeRARP:
		s.noteIPs(p, et, pkt)
		return ether.MAC(arpndp.ARP(pkt).SenderHw())
	case ether.TypeIPv4:
		if len(pkt) >= 20 {
			sip = netip.AddrFrom4([4]byte(pkt[12:16]))
		}
	case ether.TypeIPv6:
		if len(pkt) >= 40 {
			sip = netip.AddrFrom16([16]byte(pkt[8:24]))
		}
		s.noteIPs(p, et, pkt)
	}
	if mac, ok := s.srcs.lookup(srcKey{p.pkey, sip}); ok {
		if n, ok := s.neigh.LookupREMAC(p.pkey, mac); ok {
			n.Touch(now)
			return mac
		}
	}
	s.ctr.inc(RxUnknownSource)
	return p.anon
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
