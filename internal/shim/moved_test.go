package shim

import (
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// localFrames are frames a shim delivered to its guests, sorted by
// kind for one address ip. The kinds are a gratuitous ARP telling ip is
// at the ARP sender, an unsolicited NA (override) telling it, an ARP
// probe or DAD solicitation asking for it, and any other frame.
type localFrames struct {
	told, probed, other []gopacket.Packet
}

// delivered returns the frames h delivered to its guests within wait,
// the shim's queries left out.
func delivered(h *hv, wait time.Duration) []gopacket.Packet {
	var out []gopacket.Packet
	deadline := time.After(wait)
	for {
		select {
		case f := <-h.dev.Sent():
			if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); !isQuery(p) {
				out = append(out, p)
			}
		case <-deadline:
			return out
		}
	}
}

// about sorts ps for ip.
func about(ps []gopacket.Packet, ip netip.Addr) localFrames {
	var out localFrames
	for _, p := range ps {
		a, isARP := p.Layer(layers.LayerTypeARP).(*layers.ARP)
		na, isNA := p.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement)
		ns, isNS := p.Layer(layers.LayerTypeICMPv6NeighborSolicitation).(*layers.ICMPv6NeighborSolicitation)
		switch {
		case isARP && a.Operation == layers.ARPRequest && netip.AddrFrom4([4]byte(a.DstProtAddress)) == ip &&
			netip.AddrFrom4([4]byte(a.SourceProtAddress)) == ip:
			out.told = append(out.told, p)
		case isARP && a.Operation == layers.ARPRequest && netip.AddrFrom4([4]byte(a.DstProtAddress)) == ip &&
			netip.AddrFrom4([4]byte(a.SourceProtAddress)).IsUnspecified():
			out.probed = append(out.probed, p)
		case isNA && netip.AddrFrom16([16]byte(na.TargetAddress)) == ip && na.Override() && !na.Solicited():
			out.told = append(out.told, p)
		case isNS && netip.AddrFrom16([16]byte(ns.TargetAddress)) == ip:
			out.probed = append(out.probed, p)
		default:
			out.other = append(out.other, p)
		}
	}
	return out
}

// collect is about(delivered(h, wait), ip).
func collect(h *hv, ip netip.Addr, wait time.Duration) localFrames {
	return about(delivered(h, wait), ip)
}

// crossed fails if h delivers, within 100 ms, a frame with a layer of
// type lt (for ARP, of operation op): one that crossed the fabric.
func crossed(t *testing.T, h *hv, lt gopacket.LayerType, op uint16) {
	t.Helper()
	for _, p := range delivered(h, 100*time.Millisecond) {
		if l := p.Layer(lt); l != nil {
			if a, ok := l.(*layers.ARP); !ok || a.Operation == op {
				t.Fatalf("crossed the fabric: %v", p)
			}
		}
	}
}

// framed checks that every frame in ps went from src to dst.
func framed(t *testing.T, what string, ps []gopacket.Packet, src, dst ether.MAC) {
	t.Helper()
	for _, p := range ps {
		e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		if ether.MAC(e.SrcMAC) != src || ether.MAC(e.DstMAC) != dst {
			t.Fatalf("%s framed %s → %s, want %s → %s", what, e.SrcMAC, e.DstMAC, src, dst)
		}
	}
}

// TestMovedHere: guest A1 talked to B1 across the fabric. So B shows A1
// as remacA1 and learned A1's IPv4 and IPv6 addresses from its ARP and
// NDP, and A1 knows B1 as remacB1. Then A1 migrates onto B's bridge and
// claims its IPv4 address there.
//
// B tells B1, and never A1, that ipA1 is at macA1, three times a second
// apart, by gratuitous ARP unicast from remacA1. It tells A1, from
// remacB1, that ipB1 is at macB1. It asks A1 about its IPv6 address (DAD
// solicitation from remacA1). Once A1 answers, B tells B1 that too
// (unsolicited NA, override).
//
// Meanwhile B1's frames to remacA1 for ipA1 go back to the bridge
// addressed to macA1 (nothing crosses the fabric). Those for another
// address still cross it. A1's frames to remacB1 go back to the bridge
// for macB1. A1's own answer to its old REMAC is dropped and counted.
// A1's frames to the real MAC of A2, a guest it left on A, go to A2
// across the fabric, and A1 is told A2's REMAC.
//
// With hinted, A's backend gives A1 the QPN its MAC wishes for. So B,
// making A1's VIF, finds A1's old QP at once and asks A1 about both its
// addresses (seekMoved). Without, B asks once A1's claim made the link.
func TestMovedHere(t *testing.T) {
	t.Run("hinted", func(t *testing.T) { testMovedHere(t, true) })
	t.Run("unhinted", func(t *testing.T) { testMovedHere(t, false) })
}

// hintless is a port that gives every QP another QPN than the one wished
// for, as a backend that cannot choose QPNs does.
type hintless struct{ ipoib.Port }

func (p hintless) AllocQP(pkey ipoib.PKey, hint uint32) (uint32, error) {
	return p.Port.AllocQP(pkey, hint^1)
}

func testMovedHere(t *testing.T, hinted bool) {
	f := memFab(t, 2048)
	a := newHV(t, f, "fe80::a", func(c *Config) {
		c.AnnounceWindow = 30 * time.Second
		if !hinted {
			c.Port = hintless{c.Port}
		}
	})
	b := newHV(t, f, "fe80::b", func(c *Config) { c.AnnounceWindow = 30 * time.Second })
	if v, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1}); v != nil {
		t.Fatal("A1 has a VIF before it speaks")
	}
	remacA1, remacB1 := arpExchange(t, a, b)
	la := netip.MustParseAddr("fd00::a1")
	allNodesMAC := ether.MAC{0x33, 0x33, 0, 0, 0, 1}
	naFrame := func(src ether.MAC) []byte {
		return ndpFrame(t, src, la, allNodes, allNodesMAC, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborAdvertisement, 0),
			&layers.ICMPv6NeighborAdvertisement{Flags: 0x20, TargetAddress: la.AsSlice(),
				Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptTargetAddress, Data: macA1[:]}}})
	}
	a.dev.Inject(naFrame(macA1)) // A1's IPv6 address, on A
	testutil.WaitFor(t, "B to learn A1's IPv6 address", func() bool {
		mac, ok := b.s.srcs.lookup(srcKey{0xffff, la})
		return ok && mac == remacA1
	})
	collect(b, la, 100*time.Millisecond) // A's announcements of A1
	// A2 stays on A, and A1 knows it by its real MAC; B learns ipA2.
	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA2, ipA2, ether.Broadcast, ether.MAC{}, ipB1))
	testutil.WaitFor(t, "B to learn A2's address", func() bool { _, ok := b.s.srcs.lookup(srcKey{0xffff, ipA2}); return ok })
	remacA2, _ := b.s.srcs.lookup(srcKey{0xffff, ipA2})
	delivered(b, 100*time.Millisecond)

	// A1 appears on B's bridge and ARPs for B1.
	b.dev.Inject(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	b.waitCounter(t, TxToldLocal, 2)
	ps := delivered(b, 100*time.Millisecond)
	first, mirror := about(ps, ipA1), about(ps, ipB1)
	if len(first.told) != 1 || len(mirror.told) != 1 {
		t.Fatalf("B1 told %d times of %s at once, A1 %d times of %s, want 1 each", len(first.told), ipA1, len(mirror.told), ipB1)
	}
	framed(t, "gratuitous ARP to B1", first.told, remacA1, macB1)
	if sha := ether.MAC(first.told[0].Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress); sha != macA1 {
		t.Fatalf("gratuitous ARP says %s is at %s, want %s", ipA1, sha, macA1)
	}
	// A1 knew B1 as remacB1, the REMAC A showed: it is told from there.
	framed(t, "gratuitous ARP to A1", mirror.told, remacB1, macA1)
	if sha := ether.MAC(mirror.told[0].Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress); sha != macB1 {
		t.Fatalf("gratuitous ARP says %s is at %s, want %s", ipB1, sha, macB1)
	}
	told, toldA1 := len(first.told), len(mirror.told)
	for i := range 3 {
		b.clk.Advance(time.Second)
		if i < 2 {
			b.waitCounter(t, TxToldLocal, uint64(4+2*i))
		}
		ps := delivered(b, 100*time.Millisecond)
		told += len(about(ps, ipA1).told)
		toldA1 += len(about(ps, ipB1).told)
	}
	if told != 3 || toldA1 != 3 || b.s.Get(TxToldLocal) != 6 {
		t.Fatalf("B1 told %d times in all, A1 %d times, want 3 each (tx_told_local %d)", told, toldA1, b.s.Get(TxToldLocal))
	}
	// The questions: for la, and with hinted for ipA1 too (which A1's
	// claim answered already).
	want := uint64(3)
	if hinted {
		want = 6
	}
	if p := b.s.Get(TxProbedLocal); p != want {
		t.Fatalf("tx_probed_local %d, want %d", p, want)
	}
	if v, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1}); (v.QPN == mactrans.QPNHint(v.Key)) != hinted {
		t.Fatalf("A1's QPN %#x, QPNHint %#x: hinted is %v", v.QPN, mactrans.QPNHint(v.Key), hinted)
	}

	// B1 still sends to remacA1: ipA1's frames come back for macA1.
	b.dev.Inject(udpFrame(t, macB1, remacA1, ipB1, ipA1, 10, true))
	p := b.recv(t)
	e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); !ok || ether.MAC(e.DstMAC) != macA1 || ether.MAC(e.SrcMAC) != remacA1 || len(udp.Payload) != 10 {
		t.Fatalf("frame for the moved guest delivered as %v", p)
	}
	if b.s.Get(TxMovedLocal) != 1 {
		t.Fatalf("tx_moved_local %d, want 1", b.s.Get(TxMovedLocal))
	}
	crossed(t, a, layers.LayerTypeUDP, 0)
	// Another address behind remacA1 is not the moved guest's.
	other := netip.MustParseAddr("10.0.0.77")
	b.dev.Inject(udpFrame(t, macB1, remacA1, ipB1, other, 10, true))
	if ip, ok := a.recv(t).Layer(layers.LayerTypeIPv4).(*layers.IPv4); !ok || netip.AddrFrom4([4]byte(ip.DstIP)) != other {
		t.Fatalf("frame for %s not sent across the fabric", other)
	}
	// A1 still sends to remacB1: back to the bridge, for macB1.
	b.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 10, true))
	p = b.recv(t)
	e = p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); !ok || ether.MAC(e.DstMAC) != macB1 || ether.MAC(e.SrcMAC) != remacB1 || len(udp.Payload) != 10 {
		t.Fatalf("frame from the moved guest delivered as %v", p)
	}
	if b.s.Get(TxMovedLocal) != 2 {
		t.Fatalf("tx_moved_local %d, want 2", b.s.Get(TxMovedLocal))
	}
	crossed(t, a, layers.LayerTypeUDP, 0)
	// A1 answering the probe, addressed to its own old REMAC.
	drops := b.s.Get(DropDstLocal)
	b.dev.Inject(arpFrame(t, layers.ARPReply, macA1, ipA1, remacA1, remacA1, netip.IPv4Unspecified()))
	b.waitCounter(t, DropDstLocal, drops+1)
	crossed(t, a, layers.LayerTypeARP, layers.ARPReply)

	// A1 to A2's real MAC, which B's bridge floods to the TAP: to A2
	// across the fabric, and A1 is told that ipA2 is at remacA2.
	b.dev.Inject(udpFrame(t, macA1, macA2, ipA1, ipA2, 10, true))
	if p := a.recv(t); p.Layer(layers.LayerTypeUDP) == nil || ether.MAC(p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet).DstMAC) != macA2 {
		t.Fatalf("frame from the moved guest to a guest it left delivered as %v", p)
	}
	b.waitCounter(t, TxToldLocal, 7)
	left := about(delivered(b, 100*time.Millisecond), ipA2)
	framed(t, "gratuitous ARP to A1", left.told, remacA2, macA1)
	if len(left.told) != 1 || ether.MAC(left.told[0].Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress) != remacA2 {
		t.Fatalf("A1 told %d times that %s is at %s", len(left.told), ipA2, remacA2)
	}

	// A1 defends its IPv6 address, as a DAD solicitation makes it: an
	// NA to all-nodes. B then tells B1.
	b.dev.Inject(naFrame(macA1))
	b.waitCounter(t, TxToldLocal, 8)
	six := collect(b, la, 100*time.Millisecond)
	if len(six.told) != 1 {
		t.Fatalf("B1 told %d times of %s at once, want 1", len(six.told), la)
	}
	framed(t, "unsolicited NA", six.told, remacA1, macB1)
	na := six.told[0].Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement)
	if len(na.Options) != 1 || na.Options[0].Type != layers.ICMPv6OptTargetAddress || ether.MAC(na.Options[0].Data) != macA1 {
		t.Fatalf("NA options %v, want A1's MAC as target link-layer address", na.Options)
	}
	if ip6 := six.told[0].Layer(layers.LayerTypeIPv6).(*layers.IPv6); ip6.HopLimit != 255 || netip.AddrFrom16([16]byte(ip6.DstIP)) != allNodes {
		t.Fatalf("NA hop limit %d to %s", ip6.HopLimit, ip6.DstIP)
	}
}

// TestMovedProbe: the questions B asks a guest that moved there are the
// ones Linux answers. They are an ARP probe (sender address 0) and a
// duplicate address detection solicitation (from ::, to the
// solicited-node group, no link-layer option). Each goes from the stale
// REMAC to the guest's MAC, with valid checksums.
func TestMovedProbe(t *testing.T) {
	stale := ether.MAC{2, 0, 0, 0, 0, 9}
	p := gopacket.NewPacket(localFrame(macA1, stale, 0, ipA1, stale, true)[tap.Headroom:], layers.LayerTypeEthernet, gopacket.Default)
	a, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP)
	if !ok || a.Operation != layers.ARPRequest || ether.MAC(a.SourceHwAddress) != stale ||
		!netip.AddrFrom4([4]byte(a.SourceProtAddress)).IsUnspecified() || netip.AddrFrom4([4]byte(a.DstProtAddress)) != ipA1 {
		t.Fatalf("ARP probe %v", p)
	}
	la := netip.MustParseAddr("fd00::a1")
	raw := localFrame(macA1, stale, 0, la, stale, true)[tap.Headroom:]
	p = gopacket.NewPacket(raw, layers.LayerTypeEthernet, gopacket.Default)
	ip6, _ := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	ns, ok := p.Layer(layers.LayerTypeICMPv6NeighborSolicitation).(*layers.ICMPv6NeighborSolicitation)
	if !ok || ip6 == nil || !netip.AddrFrom16([16]byte(ip6.SrcIP)).IsUnspecified() ||
		netip.AddrFrom16([16]byte(ip6.DstIP)) != solicitedNode(la) || ip6.HopLimit != 255 ||
		netip.AddrFrom16([16]byte(ns.TargetAddress)) != la || len(ns.Options) != 0 {
		t.Fatalf("DAD solicitation %v", p)
	}
	// Re-serialise with checksums computed and compare.
	icmp := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	want := icmp.Checksum
	icmp.SetNetworkLayerForChecksum(ip6)
	again := serialize(t, p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet), ip6, icmp, ns)
	if got := gopacket.NewPacket(again, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6).Checksum; got != want {
		t.Fatalf("ICMPv6 checksum %#04x, want %#04x", want, got)
	}
	e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if ether.MAC(e.SrcMAC) != stale || ether.MAC(e.DstMAC) != macA1 {
		t.Fatalf("probe framed %s → %s", e.SrcMAC, e.DstMAC)
	}
}

// TestMobilityMovedHere drives mobility alone: a local guest claims an
// address the fabric taught for a remote QP. That QP's neighbour moves
// to the guest's VIF. The guest is probed for the QP's other address,
// told the other local guest's address, and that guest is told the
// moved one's, each announceTimes times. A frame to the old REMAC for
// the moved guest's address goes back to the bridge, readdressed.
func TestMobilityMovedHere(t *testing.T) {
	rig := newPartRig(t, "fe80::a")
	neigh := mactrans.NewNeighTable(64)
	srcs := &srcTable{max: 64}
	var res resolver
	res.init(rig.sh, neigh, newTestGroups(rig), ipoib.ScopeLinkLocal)
	var m mobility
	m.init(rig.sh, srcs, neigh, &res, time.Second, rig.port.LocalGID)
	old, err := neigh.Learn(rig.p.pkey, ipoib.MakeHwAddr(0, 0x77, testutil.GID("fe80::b")), rig.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	ip4, ip6 := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("fd00::9")
	srcs.learn(srcKey{rig.p.pkey, ip4}, old.REMAC)
	srcs.learn(srcKey{rig.p.pkey, ip6}, old.REMAC)
	w := rig.vif(t, macA2)
	w.AddIP(ipA2)
	v := rig.vif(t, macA1)
	claim := arpFrame(t, 1, macA1, ip4, ether.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ether.MAC{}, ip4)
	m.learnGuest(rig.p, v, ether.TypeARP, claim[14:], rig.clk.Now())
	if old.MovedTo() != v || !v.MovedIn() {
		t.Fatalf("neighbour moved to %v, VIF moved in %v", old.MovedTo(), v.MovedIn())
	}
	type hop struct{ dst, src ether.MAC }
	want := map[hop]bool{{macA1, old.REMAC}: true, {macA1, w.REMAC}: true, {macA2, old.REMAC}: true}
	for round := range announceTimes + 1 {
		rig.guests = nil
		m.tick(rig.clk.Now())
		rig.clk.Advance(announceInterval)
		if round == announceTimes {
			if len(rig.guests) != 0 {
				t.Fatalf("%d frames after %d rounds", len(rig.guests), announceTimes)
			}
			break
		}
		got := map[hop]bool{}
		for _, f := range rig.guests {
			e := f[tap.Headroom:]
			got[hop{ether.MAC(e[0:6]), ether.MAC(e[6:12])}] = true
		}
		if len(rig.guests) != 3 || !maps.Equal(got, want) {
			t.Fatalf("round %d: %d frames %v, want %v", round, len(rig.guests), got, want)
		}
	}
	if p, l := rig.ctr.c[TxProbedLocal].Load(), rig.ctr.c[TxToldLocal].Load(); p != announceTimes || l != 2*announceTimes || len(rig.sent) != 0 {
		t.Fatalf("tx_probed_local %d, tx_told_local %d, %d to the fabric; want %d, %d, 0", p, l, len(rig.sent), announceTimes, 2*announceTimes)
	}
	// w's frame to the old REMAC for the moved guest goes back to it.
	frame := udpFrame(t, macA2, old.REMAC, ipA2, ip4, 20, false)
	buf := make([]byte, devBufSize)
	n := copy(buf[devHeadroom:], frame)
	b := newTxBatch(1)
	if got := m.deliverMoved(b, buf, n, ether.TypeIPv4, buf[devHeadroom+14:devHeadroom+n], old, v, w); got != verdict(TxMovedLocal) || b.nlocal != 1 {
		t.Fatalf("frame to the moved guest: verdict %d, %d frames back to the bridge", got, b.nlocal)
	}
	if f := b.local[0][tap.Headroom:]; ether.MAC(f[0:6]) != macA1 || ether.MAC(f[6:12]) != old.REMAC {
		t.Fatalf("sent back as %s → %s, want %s → %s", ether.MAC(f[6:12]), ether.MAC(f[0:6]), old.REMAC, macA1)
	}
	if got := m.deliverMoved(newTxBatch(1), buf, n, ether.TypeIPv4, buf[devHeadroom+14:devHeadroom+n], old, v, v); got != verdict(DropDstLocal) {
		t.Fatalf("the moved guest's own frame to its old REMAC: verdict %d, want drop_dst_local", got)
	}
}
