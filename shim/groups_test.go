package shim

import (
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestSendOnlyFlood: a guest sending to 5,000 groups keeps at most
// maxSendOnly send-only memberships (least recently used evicted), and
// afterwards another guest's IGMP join still joins and receives, a new
// IPv6 address still gets its solicited-node group and its neighbour
// solicitations, and the flood added at most two lines to the log.
// Before the bound, the send-only joins filled the 4,096-group table,
// the join and the solicited-node group were refused, and a warning was
// logged per frame.
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
