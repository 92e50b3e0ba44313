package shim

import (
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
)

// TestSendOnlyFlood: a guest sending to 5,000 groups keeps at most
// maxSendOnly send-only memberships (least recently used evicted).
// Afterwards another guest's IGMP join still joins and receives. A new
// IPv6 address still gets its solicited-node group and its neighbour
// solicitations. The flood added at most two lines to the log.
func TestSendOnlyFlood(t *testing.T) {
	f := memFab(t, 2048)
	var logs syncBuffer
	a := newHV(t, f, "fe80::a", func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	b := newHV(t, f, "fe80::b", nil)
	// The guest's first frame (its VIF is created and logged), then the
	// flood; the log is measured across the flood only.
	a.dev.Inject(udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 2, 0, 0}, ipA1, netip.AddrFrom4([4]byte{239, 2, 0, 0}), 20, false))
	a.waitCounter(t, TxFrames, 1)
	testutil.WaitFor(t, "the start-up log", func() bool { return strings.Contains(logs.String(), "shim running") })
	before := strings.Count(logs.String(), "\n")
	const groups = 5000
	for i := 1; i < groups; i++ {
		g := netip.AddrFrom4([4]byte{239, 2, byte(i >> 8), byte(i)})
		a.dev.Inject(udpFrame(t, macA1, ether.MAC{1, 0, 0x5e, 2, byte(i >> 8), byte(i)}, ipA1, g, 20, false))
	}
	a.waitCounter(t, TxFrames, groups)
	// Each frame is sent once its group is joined, or dropped and
	// counted: at most maxSendOnly groups wait for their join at once.
	testutil.WaitFor(t, "every flood frame sent or counted", func() bool {
		return a.s.Get(TxMulticast)+a.s.Get(DropNoGroup)+a.s.Get(DropGroupPendingFull) == groups && a.s.Counters()["groups_send_only"] == maxSendOnly
	})
	if grew := strings.Count(logs.String(), "\n") - before; grew > 2 {
		t.Fatalf("the log grew by %d lines during the flood:\n%s", grew, logs.String())
	}
	c := a.s.Counters()
	if joined := c["groups_send_only"] + c["groups_send_only_evicted"]; c["groups_send_only"] != maxSendOnly || joined != c["tx_multicast"] {
		t.Fatalf("send-only %d, evicted %d, sent %d; want %d, and one send-only join per frame sent", c["groups_send_only"], c["groups_send_only_evicted"], c["tx_multicast"], maxSendOnly)
	}
	// Another guest joins a group and receives what b's guest sends to it.
	g := netip.MustParseAddr("239.9.9.9")
	a.dev.Inject(igmpReport(t, macA2, 4, g))
	testutil.WaitFor(t, "the join of 239.9.9.9", func() bool { return a.port.Joined(ipoib.IPv4MGID(g, 0xffff, 2)) })
	b.dev.Inject(udpFrame(t, macB1, ether.MAC{1, 0, 0x5e, 9, 9, 9}, ipB1, g, 100, false))
	if e := a.recv(t).Layer(layers.LayerTypeEthernet).(*layers.Ethernet); e.DstMAC.String() != "01:00:5e:09:09:09" {
		t.Fatalf("group traffic delivered to %s", e.DstMAC)
	}
	// A third guest's new IPv6 address (duplicate address detection)
	// gets its solicited-node group; a solicitation from b reaches it.
	macA3 := ether.MAC{0x52, 0x54, 0, 0, 0xa, 3}
	la3 := netip.MustParseAddr("fd00::a3")
	sn := solicitedNode(la3)
	snMAC := ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xa3}
	dad := &layers.ICMPv6NeighborSolicitation{TargetAddress: la3.AsSlice()}
	a.dev.Inject(ndpFrame(t, macA3, netip.IPv6Unspecified(), sn, snMAC, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0), dad))
	testutil.WaitFor(t, "the solicited-node group of fd00::a3", func() bool { return a.port.Joined(ipoib.IPv6MGID(sn, 0xffff, 2)) })
	ns := &layers.ICMPv6NeighborSolicitation{TargetAddress: la3.AsSlice(), Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptSourceAddress, Data: macB1[:]}}}
	b.dev.Inject(ndpFrame(t, macB1, netip.MustParseAddr("fd00::b1"), sn, snMAC, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0), ns))
	for {
		p := a.recv(t)
		if got, ok := p.Layer(layers.LayerTypeICMPv6NeighborSolicitation).(*layers.ICMPv6NeighborSolicitation); ok && netip.AddrFrom16([16]byte(got.TargetAddress)) == la3 && p.NetworkLayer().NetworkFlow().Src().String() == "fd00::b1" {
			break
		}
	}
}

// TestGroupSet: full memberships are counted per MGID and never pushed
// out by send-only ones; send-only ones are bounded and the least
// recently used goes first; an idle send-only membership upgraded to a
// full one is not expired.
func TestGroupSet(t *testing.T) {
	f := memFab(t, 2048)
	port, _ := f.NewPort(testutil.GID("fe80::a"))
	var g groupSet
	g.init(4, 2)
	mgid := func(i byte) ipoib.GID { return ipoib.IPv4MGID(netip.AddrFrom4([4]byte{239, 0, 0, i}), 0xffff, 2) }
	t0 := time.Unix(1e6, 0)
	// Two snooped groups on one MGID: left with the second leave only.
	g.join(port, mgid(1), false)
	g.join(port, mgid(1), false)
	g.leave(port, mgid(1))
	if !port.Joined(mgid(1)) {
		t.Fatal("MGID left while a second membership uses it")
	}
	g.leave(port, mgid(1))
	if port.Joined(mgid(1)) {
		t.Fatal("MGID kept after its last membership")
	}
	// Send-only: at most 2, the least recently used evicted.
	for i := byte(1); i <= 3; i++ {
		if err := g.joinSendOnly(port, mgid(10+i), t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if port.SendOnly(mgid(11)) || !port.SendOnly(mgid(12)) || !port.SendOnly(mgid(13)) || g.evicted.Load() != 1 {
		t.Fatalf("send-only after 3 joins: 11 %v 12 %v 13 %v, evicted %d", port.SendOnly(mgid(11)), port.SendOnly(mgid(12)), port.SendOnly(mgid(13)), g.evicted.Load())
	}
	// Full joins fill the total bound (4), evicting send-only ones.
	for i := byte(1); i <= 4; i++ {
		if err := g.join(port, mgid(i), false); err != nil {
			t.Fatalf("full join %d refused: %v", i, err)
		}
	}
	if full, so := g.counts(); full != 4 || so != 0 || g.evicted.Load() != 3 {
		t.Fatalf("full %d, send-only %d, evicted %d; want 4, 0, 3", full, so, g.evicted.Load())
	}
	// Now nothing can be evicted: a fifth full join and a send-only one
	// are refused and counted.
	if err := g.join(port, mgid(5), false); !errors.Is(err, errGroupsFull) {
		t.Fatalf("fifth full join: %v", err)
	}
	if err := g.joinSendOnly(port, mgid(20), t0); !errors.Is(err, errGroupsFull) || g.overflow.Load() != 2 {
		t.Fatalf("send-only join into full memberships: %v, overflow %d", err, g.overflow.Load())
	}
	// A send-only membership upgraded to full is not expired as idle.
	g.leave(port, mgid(4))
	g.joinSendOnly(port, mgid(30), t0)
	g.join(port, mgid(30), false)
	if n, err := g.expireSendOnly(port, t0.Add(time.Hour), time.Minute); n != 0 || err != nil || !port.Joined(mgid(30)) {
		t.Fatalf("expired %d (%v); upgraded group joined %v", n, err, port.Joined(mgid(30)))
	}
}

// newTestGroups returns groups on rig r, its intents recorded by r.
func newTestGroups(r *partRig) *groups {
	cfg := Config{Scope: ipoib.ScopeLinkLocal, Multicast: snoop.Timers{}.WithDefaults()}
	g := &groups{}
	g.init(r.sh, &cfg, &r.byVLAN, r.parts, r.port.LocalGID, r.post)
	return g
}

// TestGroupsHoldUntilJoined: frames to a group the port is not in ask
// the control plane once for a send-only join and wait, up to
// mcastQueue; the join sends them in order, counting the guests' frames
// only. Frames to a group whose join failed are dropped and counted.
func TestGroupsHoldUntilJoined(t *testing.T) {
	r := newPartRig(t, "fe80::a")
	g := newTestGroups(r)
	v := r.vif(t, macA1)
	now := r.clk.Now()
	mgid := ipoib.IPv4MGID(netip.MustParseAddr("239.1.2.3"), 0xffff, 2)
	for range 2 {
		if got := g.sendTo(mgid, now); got != groupJoining {
			t.Fatalf("sendTo before the join: %d, want groupJoining", got)
		}
	}
	if len(r.posted) != 1 || r.posted[0].kind != intentSendOnly || r.posted[0].mgid != mgid {
		t.Fatalf("intents posted: %+v; want one send-only join of %s", r.posted, mgid)
	}
	pkt := func(i int) []byte { return append(make([]byte, ipoib.Headroom), byte(i), 0, 0, 0) }
	for i := range mcastQueue {
		f := heldFrame{buf: pkt(i), vif: v, own: i == 0}
		if got := g.holdForGroup(mgid, f); got != held {
			t.Fatalf("frame %d: verdict %d, want held", i, got)
		}
	}
	if got := g.holdForGroup(mgid, heldFrame{buf: pkt(99), vif: v}); got != verdict(DropGroupPendingFull) {
		t.Fatalf("frame past the bound: verdict %d, want drop_group_pending_full", got)
	}
	g.joinSendOnly(r.ctl, mgid, now)
	if !r.port.SendOnly(mgid) || g.sendTo(mgid, now) != groupReady {
		t.Fatalf("after the join: port send-only member %v, sendTo %d", r.port.SendOnly(mgid), g.sendTo(mgid, now))
	}
	if len(r.sent) != mcastQueue {
		t.Fatalf("sent %d held frames, want %d", len(r.sent), mcastQueue)
	}
	for i, b := range r.sent {
		if b[ipoib.Headroom] != byte(i) {
			t.Fatalf("held frame %d sent as frame %d", b[ipoib.Headroom], i)
		}
	}
	if q, fw, mc := r.ctr.c[TxQueuedGroup].Load(), r.ctr.c[TxForwarded].Load(), r.ctr.c[TxMulticast].Load(); q != mcastQueue-1 || fw != mcastQueue-1 || mc != mcastQueue-1 {
		t.Fatalf("tx_queued_group %d, tx_forwarded %d, tx_multicast %d; want %d each", q, fw, mc, mcastQueue-1)
	}
	// A join the port refuses: the held frames are dropped, counted.
	other := ipoib.IPv4MGID(netip.MustParseAddr("239.1.2.4"), 0xffff, 2)
	g.sendTo(other, now)
	g.holdForGroup(other, heldFrame{buf: pkt(1), vif: v})
	g.holdForGroup(other, heldFrame{buf: pkt(2), vif: v})
	g.failed(other)
	if n := r.ctr.c[DropNoGroup].Load(); n != 2 {
		t.Fatalf("drop_no_group %d after the failed join, want 2", n)
	}
	if got := g.holdForGroup(other, heldFrame{buf: pkt(3), vif: v}); got != verdict(DropNoGroup) {
		t.Fatalf("frame after the failed join: verdict %d, want drop_no_group", got)
	}
}

// TestGroupsSnoopedJoinLeave: a guest's report posts a join, which the
// control plane makes a full membership of the group's MGID; the
// guest's leave posts a leave that leaves it.
func TestGroupsSnoopedJoinLeave(t *testing.T) {
	r := newPartRig(t, "fe80::a")
	g := newTestGroups(r)
	grp := netip.MustParseAddr("239.5.5.5")
	mgid := ipoib.IPv4MGID(grp, 0xffff, 2)
	g.member(r.p, grp, ipA1, false, r.clk.Now())
	if len(r.posted) != 1 || r.posted[0].kind != intentJoin {
		t.Fatalf("intents after a report: %+v; want one join", r.posted)
	}
	g.join(r.ctl, r.posted[0].group, r.posted[0].gen)
	if !r.port.Joined(mgid) || !g.fullMember(r.p, grp) || r.ctr.c[McastJoins].Load() != 1 {
		t.Fatalf("after the join: port member %v, fullMember %v, mcast_joins %d", r.port.Joined(mgid), g.fullMember(r.p, grp), r.ctr.c[McastJoins].Load())
	}
	g.member(r.p, grp, ipA1, true, r.clk.Now())
	r.clk.Advance(g.snoop.Timers().LeaveTime())
	g.snoop.Tick(r.clk.Now())
	if len(r.posted) != 2 || r.posted[1].kind != intentLeave {
		t.Fatalf("intents after the leave: %+v; want a join and a leave", r.posted)
	}
	g.leave(r.port, r.posted[1].group)
	if r.port.Joined(mgid) || g.fullMember(r.p, grp) || r.ctr.c[McastLeaves].Load() != 1 {
		t.Fatalf("after the leave: port member %v, fullMember %v, mcast_leaves %d", r.port.Joined(mgid), g.fullMember(r.p, grp), r.ctr.c[McastLeaves].Load())
	}
}

// TestGroupsQueries: the querier sends a general IGMPv3 and MLDv2 query
// per partition and a group-specific query to the group's MAC, each
// from the MAC derived from the port's GID, to the guests only.
func TestGroupsQueries(t *testing.T) {
	r := newPartRig(t, "fe80::a")
	g := newTestGroups(r)
	g.sendQueries(time.Second)
	g.query(snoop.Key{Group: netip.MustParseAddr("239.1.2.3")})
	src := mactrans.DeriveREMAC(r.port.LocalGID(), 0, 0)
	want := []ether.MAC{{0x01, 0, 0x5e, 0, 0, 1}, {0x33, 0x33, 0, 0, 0, 1}, {0x01, 0, 0x5e, 1, 2, 3}}
	if len(r.guests) != len(want) || len(r.sent) != 0 || r.ctr.c[TxQueries].Load() != 3 {
		t.Fatalf("%d frames to guests, %d to the port, tx_queries %d; want 3, 0, 3", len(r.guests), len(r.sent), r.ctr.c[TxQueries].Load())
	}
	for i, f := range r.guests {
		e := f[tap.Headroom:]
		if ether.MAC(e[0:6]) != want[i] || ether.MAC(e[6:12]) != src {
			t.Fatalf("query %d: %s → %s, want %s → %s", i, ether.MAC(e[6:12]), ether.MAC(e[0:6]), src, want[i])
		}
	}
}

// TestGroupsQueryRounds: general queries go out at start-up (answers
// within the last member query interval), every query interval (within
// the query response interval), and once more on the second round after
// the carrier returns and the TAP is up.
func TestGroupsQueryRounds(t *testing.T) {
	r := newPartRig(t, "fe80::a")
	g := newTestGroups(r)
	mt := g.snoop.Timers()
	t0 := r.clk.Now()
	// maxResp is the IGMPv3 max response code (tenths of a second) of
	// the IPv4 query among the frames sent since sent.
	maxResp := func(sent int) []byte {
		var codes []byte
		for _, f := range r.guests[sent:] {
			if e := f[tap.Headroom:]; ether.Frame(e).EtherType() == ether.TypeIPv4 {
				codes = append(codes, e[14+int(e[14]&0x0f)*4+1])
			}
		}
		return codes
	}
	step := func(name string, round func(), want []byte) {
		t.Helper()
		sent := len(r.guests)
		round()
		if got := maxResp(sent); string(got) != string(want) || len(r.guests)-sent != 2*len(want) {
			t.Fatalf("%s: %d frames, IGMP max response codes %v; want %d frames, %v", name, len(r.guests)-sent, got, 2*len(want), want)
		}
	}
	lmq, qri := []byte{byte(mt.LastMemberQueryInterval / (100 * time.Millisecond))}, []byte{byte(mt.QueryResponseInterval / (100 * time.Millisecond))}
	step("start-up", func() { g.startQueries(t0) }, lmq)
	step("before the interval", func() { g.queryRound(t0.Add(mt.QueryInterval - time.Millisecond)) }, nil)
	step("at the interval", func() { g.queryRound(t0.Add(mt.QueryInterval)) }, qri)
	g.carrierReturned()
	up := false
	operUp := func() bool { return up }
	step("carrier back, TAP down", func() { g.requeryRound(t0, operUp) }, nil)
	up = true
	step("TAP up", func() { g.requeryRound(t0, operUp) }, nil)
	step("the round after", func() { g.requeryRound(t0, operUp) }, lmq)
	step("then", func() { g.requeryRound(t0, operUp) }, nil)
	if n := r.ctr.c[TxQueries].Load(); n != 6 {
		t.Fatalf("tx_queries %d, want 6", n)
	}
}

// TestGroupsSnoopIPv6: a guest's MLDv2 report joins its group, a packet
// from a new address joins that address's solicited-node group, and a
// duplicate address detection joins the target's. An MLD report with a
// bad checksum is dropped as drop_bad_mcast_report and joins nothing.
func TestGroupsSnoopIPv6(t *testing.T) {
	r := newPartRig(t, "fe80::a")
	g := newTestGroups(r)
	now := r.clk.Now()
	grp, la := netip.MustParseAddr("ff05::1:3"), netip.MustParseAddr("fd00::a3")
	bad := mldReport(t, macA1, 4, netip.MustParseAddr("ff05::9"))[14:]
	bad[len(bad)-1] ^= 1
	if v := g.snoopIPv6(r.p, bad, now); v != verdict(DropBadMcastReport) || len(r.posted) != 0 {
		t.Fatalf("bad report: verdict %d, %d intents; want drop_bad_mcast_report, 0", v, len(r.posted))
	}
	dad := &layers.ICMPv6NeighborSolicitation{TargetAddress: la.AsSlice()}
	for _, f := range [][]byte{
		mldReport(t, macA1, 4, grp),
		ndpFrame(t, macA1, netip.IPv6Unspecified(), solicitedNode(la), ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xa3}, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0), dad),
	} {
		if v := g.snoopIPv6(r.p, f[14:], now); v != pass {
			t.Fatalf("verdict %d, want pass", v)
		}
	}
	want := []netip.Addr{grp, solicitedNode(netip.MustParseAddr("fe80::a1")), solicitedNode(la)}
	var got []netip.Addr
	for _, it := range r.posted {
		if it.kind == intentJoin {
			got = append(got, it.group.Group)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("joins posted %v, want %v", got, want)
	}
}
