package shim

// Announcements. A guest's MAC appears on this hypervisor when its VIF
// is created: from its first frame, a bridge or OVS declaration, or the
// RARP QEMU sends after a live migration. The addresses it shows in its
// traffic during the announcement window are then announced on the
// fabric three times, a second apart, each from the guest's VIF. For
// IPv4 that is a gratuitous ARP (a request with the guest's address as
// sender and target). For IPv6 it is an unsolicited neighbour
// advertisement (override set) to all-nodes. Peers' shims turn them
// into frames from the guest's REMAC there. So their guests' neighbour
// caches move to the guest's new QP at once instead of timing out. A
// guest on the hypervisor it left learns the same way. Meanwhile it is
// resolved by IP: its frames to the guest's real MAC are unknown
// unicast.

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

const (
	announceTimes    = 3
	announceInterval = time.Second
	announceMax      = 1024 // announcements queued at once
)

// The announcements' kinds: to the fabric, to the local guests (see
// moved.go), or a question to a guest that moved here.
const (
	annFabric = iota // ip is at vif's QP: to the fabric
	annLocal         // ip is at hw: to the local guest to, or every other one than vif's
	annProbe         // has vif ip? To the guest of vif
)

// annKey is what an announcement says and to whom: a local one already
// queued is not queued again.
type annKey struct {
	vif   *mactrans.VIF
	ip    netip.Addr
	kind  int
	stale ether.MAC     // annLocal, annProbe: the Ethernet source (see moved.go)
	hw    ether.MAC     // annLocal: the MAC told
	to    *mactrans.VIF // annLocal: the one guest to tell; nil: every other one of the VLAN
}

type announcement struct {
	annKey
	p    *partition
	next time.Time
	left int
}

// mobility says where guests are when their MAC appears here or they
// migrate here (moved.go). It owns the queued announcements to the
// fabric and to local guests (ann, under its own lock). It marks moves
// in the neighbour table it borrows. TX workers queue announcements and
// housekeeping sends them, each within its epoch. It makes no port
// control call.
type mobility struct {
	shared
	ann      announcer
	srcs     *srcTable // what the fabric taught each remote endpoint spoke for
	neigh    *mactrans.NeighTable
	resolver *resolver     // fabric announcements are its ARP and NDP
	window   time.Duration // Config.AnnounceWindow
	gid      func() ipoib.GID
}

// init readies m.
func (m *mobility) init(sh shared, srcs *srcTable, neigh *mactrans.NeighTable, r *resolver, window time.Duration, gid func() ipoib.GID) {
	m.shared, m.srcs, m.neigh, m.resolver, m.window, m.gid = sh, srcs, neigh, r, window, gid
}

// announcer queues announcements for the housekeeping rounds; local
// marks the local ones queued (a move queues one per guest and address,
// which a scan of the queue per insertion would make quadratic).
type announcer struct {
	mu    sync.Mutex
	q     []announcement
	local map[annKey]bool
}

// announce queues the announcements of ip for the guest of vif.
func (m *mobility) announce(p *partition, vif *mactrans.VIF, ip netip.Addr, now time.Time) {
	m.queue(announcement{p: p, annKey: annKey{vif: vif, ip: ip, kind: annFabric}}, now)
}

// queue queues a, to be sent announceTimes times from now on; the same
// local announcement queued already is not queued again.
func (m *mobility) queue(a announcement, now time.Time) {
	m.ann.mu.Lock()
	defer m.ann.mu.Unlock()
	if a.kind != annFabric && m.ann.local[a.annKey] {
		return
	}
	if len(m.ann.q) >= announceMax {
		m.ctr.inc(DropAnnounce)
		return
	}
	if a.kind != annFabric {
		if m.ann.local == nil {
			m.ann.local = make(map[annKey]bool)
		}
		m.ann.local[a.annKey] = true
	}
	a.next, a.left = now, announceTimes
	m.ann.q = append(m.ann.q, a)
}

// tick sends the announcements due; called within housekeeping's
// epoch (control.go); an unpublished VIF's are dropped.
func (m *mobility) tick(now time.Time) {
	m.ann.mu.Lock()
	defer m.ann.mu.Unlock()
	keep := m.ann.q[:0]
	for _, a := range m.ann.q {
		live := m.vifLive(a.vif)
		if live && !now.Before(a.next) {
			if a.kind == annFabric {
				m.sendAnnounce(a.p, a.vif, a.ip)
			} else {
				m.tellLocal(a)
			}
			a.left--
			a.next = now.Add(announceInterval)
		}
		if live && a.left > 0 {
			keep = append(keep, a)
		} else if a.kind != annFabric {
			delete(m.ann.local, a.annKey)
		}
	}
	clear(m.ann.q[len(keep):])
	m.ann.q = keep
}

// guestIP is the address a guest claims in a frame: the sender address
// of its ARP, the source of its NDP message; invalid for none. Only ARP
// and NDP count, never an IP packet's source. A guest announces its own
// addresses by its link-layer protocols (which the shim forwards
// anyway). A forged source address in a datagram (a MAC flood's, say)
// must not become a claim on the fabric. Link-local addresses are
// not announced: nothing routes to them and every host has some.
func guestIP(et uint16, pay []byte) netip.Addr {
	var a netip.Addr
	switch {
	case et == ether.TypeARP && len(pay) >= 28 && pay[4] == 6 && pay[5] == 4:
		a = netip.AddrFrom4([4]byte(pay[14:18]))
	case et == ether.TypeIPv6 && len(pay) >= 40 && arpndp.IsNDP(pay):
		a = netip.AddrFrom16([16]byte(pay[8:24]))
	}
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() {
		return netip.Addr{}
	}
	return a
}

// isRARPAnnounce reports whether an Ethernet RARP payload is a QEMU
// announcement of mac: a request (opcode 3) with mac as sender.
func isRARPAnnounce(pay []byte, mac ether.MAC) bool {
	return len(pay) >= 28 && binary.BigEndian.Uint16(pay[6:8]) == 3 && ether.MAC(pay[8:14]) == mac
}

// learnGuest notes the address a guest's frame shows and queues its
// announcement when it is new and the VIF is in its window; a RARP
// announcement reopens the window and announces every address known.
// The data path calls it for every frame: the known case allocates
// nothing and takes no lock.
func (m *mobility) learnGuest(p *partition, vif *mactrans.VIF, et uint16, pay []byte, now time.Time) {
	if et == ether.TypeRARP {
		if isRARPAnnounce(pay, vif.Key.MAC) {
			m.ctr.inc(RARPAnnouncements)
			vif.AnnounceUntil(now.Add(m.window))
			for _, ip := range vif.IPs() {
				m.announce(p, vif, ip, now)
			}
		}
		return
	}
	ip := guestIP(et, pay)
	if !ip.IsValid() || vif.HasIP(ip) || !vif.AddIP(ip) {
		return
	}
	if vif.Announcing(now) {
		m.announce(p, vif, ip, now)
	}
	m.movedHere(p, vif, ip, now)
}

// sendAnnounce sends one announcement of ip from vif.
func (m *mobility) sendAnnounce(p *partition, vif *mactrans.VIF, ip netip.Addr) {
	if ip.Is4() {
		m.resolver.sendARPRequest(p, vif, ip, ip)
	} else {
		m.resolver.sendNDP(p, vif, ndAdvert, ip, allNodes, ip)
	}
	m.ctr.inc(TxAnnounced)
}
