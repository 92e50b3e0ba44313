package shim

// The shim is the querier towards its guests (RFC 3376 §6, RFC 3810 §7).
// It sends IGMPv3 and MLDv2 general queries at start-up and every query
// interval, and group-specific queries when a guest leaves. So
// memberships stay fresh without a multicast router, and leaves take
// effect within the leave time. The answers are snooped on TX. The
// queries go to guests only, never onto the fabric.

import (
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
)

// The steps of the general queries sent when the carrier returns.
const (
	requeryNone       = iota
	requeryWaitOperUp // the carrier is back; the bridge may not know yet
	requeryNextRound  // the TAP is operationally up: query next round
)

// querier is the state of the query rounds: housekeeping's goroutine
// alone touches it, but for back, which the port's events set.
type querier struct {
	next    time.Time    // the next general query
	requery int          // a requery step
	back    atomic.Bool  // the carrier came back (carrier.go)
	mt      snoop.Timers // this round's
}

// startQueries sends the start-up general queries.
func (g *groups) startQueries(now time.Time) {
	g.q.mt = g.snoop.Timers() // the timers' one home: a reload changes them there
	g.sendQueries(g.q.mt.LastMemberQueryInterval)
	g.q.next = now.Add(g.q.mt.QueryInterval)
}

// queryRound sends the general queries due at now and ages the snooped
// memberships.
func (g *groups) queryRound(now time.Time) {
	q := &g.q
	q.mt = g.snoop.Timers()
	if !now.Before(q.next) {
		g.sendQueries(q.mt.QueryResponseInterval)
		q.next = now.Add(q.mt.QueryInterval)
	} else if later := now.Add(q.mt.QueryInterval); later.Before(q.next) {
		q.next = later // a shorter interval takes effect at once
	}
	g.snoop.Tick(now)
}

// carrierReturned asks for general queries once the TAP is up again.
func (g *groups) carrierReturned() { g.q.back.Store(true) }

// requeryRound sends the general queries the carrier's return asked for.
// A Linux bridge forgets a port as a multicast router when its carrier
// goes (__br_multicast_disable_port_ctx drops it from the router list).
// Until it hears a query again, it keeps from the TAP the guests'
// multicast for groups with no member on this host (br_multicast_flood
// with mrouters_only). So query as after a start when the carrier
// returns, not at the next interval. But not before the bridge has seen
// the port up: the kernel acts on the carrier asynchronously (in
// linkwatch_do_dev), and a bridge drops what a disabled port sends it.
// So query once the TAP is operationally up (operUp), on the round
// after.
func (g *groups) requeryRound(now time.Time, operUp func() bool) {
	q := &g.q
	if q.back.Swap(false) {
		q.requery = requeryWaitOperUp
	}
	switch {
	case q.requery == requeryWaitOperUp && operUp():
		q.requery = requeryNextRound
	case q.requery == requeryNextRound:
		q.requery = requeryNone
		g.sendQueries(q.mt.LastMemberQueryInterval)
		q.next = now.Add(q.mt.QueryInterval)
	}
}

// querierAddrs returns the MAC and link-local address the queries come
// from: a locally administered MAC derived from the port GID, and its
// EUI-64 link-local address. (IGMP queries come from 0.0.0.0, as a
// snooping switch's do.)
func (g *groups) querierAddrs() (ether.MAC, netip.Addr) {
	mac := mactrans.DeriveREMAC(g.gid(), 0, 0)
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10], a[11], a[12] = mac[0]^0x02, mac[1], mac[2], 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return mac, netip.AddrFrom16(a)
}

// queryFrame builds a query frame into partition p, tap.Headroom bytes
// into the returned buffer: for group invalid a general query of the
// given family, else a group-specific one; guests answer within maxResp.
func (g *groups) queryFrame(p *partition, v6 bool, group netip.Addr, maxResp time.Duration) []byte {
	mac, src := g.querierAddrs()
	t := g.snoop.Timers()
	f := make([]byte, tap.Headroom+ether.VLANHeaderLen, tap.Headroom+ether.VLANHeaderLen+snoop.MLDv2QueryLen)
	if v6 {
		dst := ether.MAC{0x33, 0x33, 0, 0, 0, 1}
		if group.IsValid() {
			a := group.As16()
			dst = ether.MAC{0x33, 0x33, a[12], a[13], a[14], a[15]}
		}
		hl := ether.PutHeader(f[tap.Headroom:], dst, mac, p.vlan, ether.TypeIPv6)
		return snoop.AppendMLDv2Query(f[:tap.Headroom+hl], src, group, uint8(t.Robustness), t.QueryInterval, maxResp)
	}
	dst := ether.MAC{0x01, 0, 0x5e, 0, 0, 1}
	if group.IsValid() {
		a := group.As4()
		dst = ether.MAC{0x01, 0, 0x5e, a[1] & 0x7f, a[2], a[3]}
	}
	hl := ether.PutHeader(f[tap.Headroom:], dst, mac, p.vlan, ether.TypeIPv4)
	return snoop.AppendIGMPv3Query(f[:tap.Headroom+hl], group, uint8(t.Robustness), t.QueryInterval, maxResp)
}

// sendQueries sends IGMPv3 and MLDv2 general queries into every
// partition, answered within resp. The start-up queries ask for answers
// within the last member query interval rather than the query response
// interval: after a (re)start the shim knows no memberships, and NDP to
// silent guests needs their solicited-node groups back at once.
func (g *groups) sendQueries(resp time.Duration) {
	frames := make([][]byte, 0, 2*len(g.parts()))
	for _, p := range g.parts() {
		frames = append(frames, g.queryFrame(p, false, netip.Addr{}, resp), g.queryFrame(p, true, netip.Addr{}, resp))
	}
	g.toGuests(frames)
	g.ctr.c[TxQueries].Add(uint64(len(frames)))
}

// query is the snooping table's Query: a group-specific query after
// a leave, answered within the last member query interval (RFC 3376
// §6.6.3.1, RFC 3810 §7.6.3.1).
func (g *groups) query(k snoop.Key) {
	f := g.queryFrame(g.byVLAN[k.VLAN].Load(), k.Group.Is6(), k.Group, g.snoop.Timers().LastMemberQueryInterval)
	g.toGuests([][]byte{f})
	g.ctr.inc(TxQueries)
}
