package shim

// Guests that migrate here. A local guest that talked to a
// remote one holds, in its ARP and neighbour caches, the REMAC this shim
// showed for the remote guest's QP. When that guest migrates onto this
// hypervisor's bridge, its old QP is gone, yet the local guest keeps
// sending to the REMAC. The bridge hands the frames to the TAP, and the
// fabric would carry them to a QP that no longer exists. That lasts
// until the local guest's kernel re-probes (about 6 s). Only this shim
// can see the move from here: the fabric taught it which addresses the
// old endpoint spoke for (srcTable), and the moved guest's VIF claims
// one of them in its ARP or NDP. From that moment:
//
//   - the neighbour is marked as moved to the VIF (Neighbour.MoveTo), and
//     a frame a guest still sends to its REMAC for an address of the VIF
//     goes back to the bridge, addressed to the VIF's MAC (deliverMoved);
//   - every other local guest of the VLAN is told the new MAC, three
//     times a second apart. It gets a gratuitous ARP or an unsolicited NA
//     (override), unicast, whose Ethernet source is the stale REMAC.
//     The bridge already forwards that REMAC to the TAP, so it learns
//     nothing wrong. Sourced from the moved guest's MAC, the frame would
//     move that MAC to the TAP port;
//   - the moved guest is asked about the old endpoint's other addresses
//     (an ARP probe, a DAD neighbour solicitation, unicast to it). Its
//     answers cross the TAP and teach the shim those addresses too: the
//     IPv6 address of a guest found by its IPv4 one.
//
// The mirror image: the moved guest's own caches hold, for the guests
// of this hypervisor it talked to, the REMACs other hypervisors show
// for their VIFs (VIF.REMAC). Its frames to those reach the TAP too.
// They go back to the bridge addressed to the guest's MAC, from that
// REMAC (which nothing on the bridge owns). The moved guest is told
// each local guest's addresses, unicast, from its REMAC.
//
// Frames to the guests are unicast, never broadcast: a broadcast would
// also reach the moved guest, for which an unsolicited NA of its own
// address is a duplicate-address failure while the address is
// tentative, and a warning otherwise (ndisc.c ndisc_recv_na).

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/mactrans"
)

// movedHere handles a local VIF claiming ip (new to it): if the fabric
// taught that a remote endpoint of the partition spoke for ip, that
// endpoint was the guest's QP before it migrated here. Called on the TX
// path within the TX worker's epoch; only for addresses new to the VIF.
func (m *mobility) movedHere(p *partition, v *mactrans.VIF, ip netip.Addr, now time.Time) {
	remac, ok := m.srcs.lookup(srcKey{p.pkey, ip})
	if !ok {
		return
	}
	nb, ok := m.neigh.LookupREMAC(p.pkey, remac)
	if !ok {
		return
	}
	if nb.MoveTo(v) {
		v.SetMovedIn()
		m.log.Info("guest moved here", "mac", v.Key.MAC, "vlan", p.vlan, "ip", ip, "old_rimac", nb.RIMAC, "old_remac", nb.REMAC)
		// seekMoved asked already about a neighbour with the QPN the
		// guest wishes for.
		if nb.RIMAC.QPN() != mactrans.QPNHint(v.Key) {
			for _, a := range m.srcs.ipsOf(p.pkey, remac) {
				if a != ip && !v.HasIP(a) && !a.IsLinkLocalUnicast() {
					m.queue(announcement{p: p, annKey: annKey{vif: v, ip: a, stale: remac, kind: annProbe}}, now)
				}
			}
		}
		for _, w := range m.vifs.All() {
			if w != v && w.Key.VLAN == p.vlan {
				for _, a := range w.IPs() {
					m.queue(announcement{p: p, annKey: annKey{vif: w, ip: a, stale: w.REMAC, hw: w.Key.MAC, kind: annLocal, to: v}}, now)
				}
			}
		}
	}
	m.queue(announcement{p: p, annKey: annKey{vif: v, ip: ip, stale: remac, hw: v.Key.MAC, kind: annLocal}}, now)
}

// seekMoved looks for the QP a guest had on another hypervisor, when
// its VIF is made here (from its first frame, its RARP announcement
// after a migration, or a declaration). That QP is a neighbour of the
// partition on another port with the QPN the guest's MAC and VLAN wish
// for (QPNHint). The source hypervisor got that QPN if its backend lets
// QPNs be chosen. The guest is asked about each address that neighbour
// spoke for (annProbe). Only its own answers, which cross the TAP, make
// the link (movedHere), so a wrong guess costs a few probes. Without
// seekMoved, the link waits until the guest claims an address. A silent
// guest does that only when another hypervisor's resolution reaches it.
func (m *mobility) seekMoved(p *partition, v *mactrans.VIF, now time.Time) {
	want, gid := mactrans.QPNHint(v.Key), m.gid()
	for _, nb := range m.neigh.All() {
		if nb.PKey != p.pkey || nb.RIMAC.QPN() != want || nb.RIMAC.GID() == gid {
			continue
		}
		for _, a := range m.srcs.ipsOf(p.pkey, nb.REMAC) {
			if !a.IsLinkLocalUnicast() {
				m.queue(announcement{p: p, annKey: annKey{vif: v, ip: a, stale: nb.REMAC, kind: annProbe}}, now)
			}
		}
	}
}

// remoteOwner returns the neighbour for a frame from a guest that moved
// here (from) to an unknown MAC for the address target. It tells the
// guest that target is at the neighbour's REMAC. It returns nil when the
// fabric taught no such neighbour, or when its guest moved here too.
//
// The moved guest's cache holds the real MACs of the guests it left
// behind. Its frames to them reach the TAP as unknown unicast, yet the
// fabric has taught their addresses already (answering the resolution
// of the guest they talk to). Resolving them frame by frame would lose
// the frames: the queue waits for a REMAC they are not addressed to.
// The guest's kernel refuses that answer within a second of its last
// update (arp.c arp_process, LOCKTIME); a gratuitous ARP overrides
// (arp_is_garp). Called on the TX path, for unknown destinations of
// moved guests only.
func (m *mobility) remoteOwner(p *partition, from *mactrans.VIF, target netip.Addr, now time.Time) *mactrans.Neighbour {
	if !target.IsValid() || target.IsUnspecified() {
		return nil
	}
	remac, ok := m.srcs.lookup(srcKey{p.pkey, target})
	if !ok {
		return nil
	}
	nb, ok := m.neigh.LookupREMAC(p.pkey, remac)
	if !ok || nb.MovedTo() != nil && m.vifLive(nb.MovedTo()) {
		return nil
	}
	m.queue(announcement{p: p, annKey: annKey{vif: from, ip: target, stale: remac, hw: remac, kind: annLocal, to: from}}, now)
	return nb
}

// deliverMoved hands a frame for the REMAC of nb, an endpoint whose guest
// moved to the local VIF to, back to the bridge when its destination
// address is to's. The frame goes to to's MAC, from nb's REMAC (as the
// bridge already knows it, behind the TAP). It returns pass when it
// does not take the frame. from is the sending guest's VIF. The moved
// guest's answer to the shim's probe (addressed to its own old REMAC)
// is dropped, as any frame to a local guest that reaches the TAP is.
// Called for frames to a moved endpoint only, so the common path pays
// one atomic load.
func (m *mobility) deliverMoved(b *txBatch, buf []byte, n int, et uint16, pay []byte, nb *mactrans.Neighbour, to, from *mactrans.VIF) verdict {
	if !m.vifLive(to) {
		return pass
	}
	if to == from {
		return verdict(DropDstLocal)
	}
	if _, dip := ipAddrs(et, pay); !dip.IsValid() || !to.HasIP(dip) {
		return pass
	}
	return b.sendBack(buf, n, to.Key.MAC, nb.REMAC)
}

// sendBack readdresses the frame at buf[devHeadroom:devHeadroom+n] from
// src to dst and leaves it in b for txEnd to send back to the bridge
// once counted.
func (b *txBatch) sendBack(buf []byte, n int, dst, src ether.MAC) verdict {
	f := buf[devHeadroom : devHeadroom+n]
	copy(f[0:6], dst[:])
	copy(f[6:12], src[:])
	b.local[0], b.nlocal = buf[devHeadroom-tap.Headroom:devHeadroom+n], 1
	return verdict(TxMovedLocal)
}

// tellLocal sends one announcement to local guests: for annLocal, that
// ip is at a.hw, to a.to or else every guest of the VLAN but a.vif's;
// for annProbe, the question whether the moved guest a.vif has ip, to
// it. Each frame comes from a.stale.
func (m *mobility) tellLocal(a announcement) {
	var frames [][]byte
	if a.kind == annProbe {
		frames = append(frames, localFrame(a.vif.Key.MAC, a.stale, a.p.vlan, a.ip, a.stale, true))
		m.ctr.inc(TxProbedLocal)
	} else {
		tell := func(w *mactrans.VIF) {
			frames = append(frames, localFrame(w.Key.MAC, a.stale, a.p.vlan, a.ip, a.hw, false))
		}
		switch {
		case a.to != nil: // one guest: no need to list them all
			if m.vifLive(a.to) && a.to.Key.VLAN == a.p.vlan {
				tell(a.to)
			}
		default:
			for _, w := range m.vifs.All() {
				if w.Key.VLAN == a.p.vlan && w != a.vif {
					tell(w)
				}
			}
		}
		m.ctr.add(TxToldLocal, uint64(len(frames)))
	}
	if len(frames) > 0 {
		m.toGuests(frames)
	}
}

// localFrame builds a frame from src to dst on vlan, tap.Headroom bytes
// into the returned buffer.
//
// Unless probe, it says ip is at mac. For IPv4 that is a gratuitous ARP
// request (sender and target ip), which arp.c arp_process lets override
// an existing entry (arp_is_garp). For IPv6 it is an unsolicited
// neighbour advertisement with the override flag to all-nodes, which
// ndisc.c ndisc_recv_na applies with NEIGH_UPDATE_F_OVERRIDE. Both leave
// the entry STALE, so the next packet goes to mac.
//
// With probe it asks whether the receiver has ip, expecting the answer
// at mac. For IPv4 that is an ARP probe (sender address 0, RFC 5227),
// which arp_process answers to the sender's hardware address. For IPv6
// it is a duplicate address detection solicitation (source ::, to ip's
// solicited-node group). ndisc_recv_ns answers it with an NA to
// all-nodes with the override flag.
func localFrame(dst, src ether.MAC, vlan uint16, ip netip.Addr, mac ether.MAC, probe bool) []byte {
	f := make([]byte, tap.Headroom+ether.VLANHeaderLen, tap.Headroom+ether.VLANHeaderLen+header.IPv6Len+32)
	if ip.Is4() {
		hl := ether.PutHeader(f[tap.Headroom:], dst, src, vlan, ether.TypeARP)
		f = binary.BigEndian.AppendUint16(f[:tap.Headroom+hl], 1) // Ethernet
		f = binary.BigEndian.AppendUint16(f, ether.TypeIPv4)
		f = append(f, 6, 4, 0, arpndp.OpRequest)
		f = append(f, mac[:]...)
		a4 := ip.As4()
		if probe {
			f = append(f, 0, 0, 0, 0)
		} else {
			f = append(f, a4[:]...)
		}
		f = append(f, 0, 0, 0, 0, 0, 0)
		return append(f, a4[:]...)
	}
	hl := ether.PutHeader(f[tap.Headroom:], dst, src, vlan, ether.TypeIPv6)
	f = f[:tap.Headroom+hl]
	from, to := ip, allNodes
	typ, flags, opt := byte(arpndp.TypeNeighborAdvertisement), byte(0x20), byte(arpndp.OptTLLA) // override
	plen := 24 + 8                                                                              // the message and its Ethernet link-layer option
	if probe {
		from, to = netip.IPv6Unspecified(), solicitedNode(ip)
		typ, flags, plen = arpndp.TypeNeighborSolicitation, 0, 24 // no option from ::
	}
	start := len(f)
	f = f[:start+header.IPv6Len]
	h := header.EncodeIPv6(f[start:], header.IPv6Fields{PayloadLen: plen, NextHeader: header.ProtoICMPv6, HopLimit: 255, Src: from, Dst: to})
	t16 := ip.As16()
	f = append(f, typ, 0, 0, 0, flags, 0, 0, 0)
	f = append(f, t16[:]...)
	if !probe {
		f = append(f, opt, 1)
		f = append(f, mac[:]...)
	}
	icmp := f[start+header.IPv6Len:]
	binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(csum.Pseudo(h.SrcBytes(), h.DstBytes(), header.ProtoICMPv6, plen), icmp)))
	return f
}
