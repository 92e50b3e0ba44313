// Package routedtest is the routed topology that every backend able to
// hide a packet's sender runs the shim through. It has a guest behind
// the shim, and a native IPoIB host (ipoibhost, as a Linux ib0 is one)
// that routes between the fabric's subnet and a second subnet. An
// address X lives in that second subnet. Every packet from X reaches the
// guest through the router's QP with X's source IP, which no ARP or NDP
// on the fabric ever names. The kernel backend cannot tell who sent it.
// Neither can the verbs backend when the router sends without a GRH
// (Linux IPoIB does, inside a subnet) and its LID is unknown.
//
// The guest resolves the router (ARP and NDP). It then exchanges with X
// ping and ping -6 (exact reply counts) and a TCP stream each way over
// IPv4 and IPv6 (X echoes every segment: exact byte counts, in order).
// It receives X's routed IPv4 and IPv6 multicast, from a sender that
// never sent ARP or NDP. The second subnet is modelled in the test: what
// the router's stack receives for X is answered by X, as if forwarded to
// it and back.
package routedtest

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/ipoibhost"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// Setup is one backend's side of the topology.
type Setup struct {
	// Guest is the TAP of a running shim on a port of the fabric.
	Guest *tap.Mem
	// Counters is that shim's counters by name (Shim.Counters).
	Counters func() map[string]uint64
	// Joined reports whether the shim's port joined an MGID.
	Joined func(mgid ipoib.GID) bool
	// Router is another port of the same fabric, for the native router.
	Router ipoib.Port
	// Anon is the source MAC the guest must see on packets routed from
	// X: the partition's stand-in when the port cannot name the router,
	// zero when it can (then it is the router's REMAC, the guest's next
	// hop).
	Anon ether.MAC
}

// The addresses: the fabric's subnets 10.7.0.0/24 and fd07::/64 (the
// router .1 and ::1, the guest .2 and ::2), and X in the second subnets.
var (
	guestMAC = ether.MAC{0x52, 0x54, 0, 0, 7, 2}
	guest4   = netip.MustParseAddr("10.7.0.2")
	guest6   = netip.MustParseAddr("fd07::2")
	router4  = netip.MustParsePrefix("10.7.0.1/24")
	router6  = netip.MustParsePrefix("fd07::1/64")
	x4       = netip.MustParseAddr("192.168.9.9")
	x6       = netip.MustParseAddr("fd09::9")
	group4   = netip.MustParseAddr("239.7.7.7")
	group6   = netip.MustParseAddr("ff0e::7:7")
)

const (
	pings    = 4    // echo requests per family
	segments = 16   // TCP segments per family
	segSize  = 1000 // TCP payload bytes per segment
	xPort    = 7    // X's TCP echo port
	gPort    = 40000
)

// Run runs the topology and its checks.
func Run(t *testing.T, s Setup) {
	t.Helper()
	rdev := tap.NewMem(256)
	sn := solicitedNode(router6.Addr())
	router, err := ipoibhost.New(ipoibhost.Config{
		Device: rdev, Port: s.Router, Name: "ib0", Poll: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Link: func() (ipoibhost.LinkState, error) {
			return ipoibhost.LinkState{Addrs: []netip.Prefix{router4, router6}, Groups: []netip.Addr{sn}}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := router.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	go func() { defer wg.Done(); secondSubnet(ctx, rdev) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	testutil.WaitFor(t, "the router's addresses announced", func() bool { return router.Get(ipoibhost.Gratuitous) >= 2 })

	g := &guest{t: t, dev: s.Guest}
	// The guest resolves its next hop, over IPv4 and IPv6: the answers
	// name the router (the ARP/NDP payload does, whatever the port). It
	// asks again until answered, as a guest's stack does: the router's
	// groups and the guest's VIF come up in their own time.
	p := g.ask("the router's ARP reply", serialize(t, &layers.Ethernet{SrcMAC: guestMAC[:], DstMAC: ether.Broadcast[:], EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: guestMAC[:], SourceProtAddress: guest4.AsSlice(),
			DstHwAddress: make([]byte, 6), DstProtAddress: router4.Addr().AsSlice()}), func(p gopacket.Packet) bool {
		a, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP)
		return ok && a.Operation == layers.ARPReply && netip.AddrFrom4([4]byte(a.SourceProtAddress)) == router4.Addr()
	})
	rmac := ether.MAC(p.Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress)
	if src := ether.MAC(p.LinkLayer().(*layers.Ethernet).SrcMAC); src != rmac {
		t.Fatalf("ARP reply from %s, its sender hardware address %s", src, rmac)
	}
	ns := &layers.ICMPv6NeighborSolicitation{TargetAddress: router6.Addr().AsSlice(),
		Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptSourceAddress, Data: guestMAC[:]}}}
	snMAC := ether.MAC{0x33, 0x33, 0xff, 0, 0, 1}
	p = g.ask("the router's neighbour advertisement", ip6Frame(t, snMAC, guest6, sn, 255, &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0)}, ns), func(p gopacket.Packet) bool {
		na, ok := p.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement)
		return ok && netip.AddrFrom16([16]byte(na.TargetAddress)) == router6.Addr()
	})
	var tlla ether.MAC
	for _, o := range p.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement).Options {
		if o.Type == layers.ICMPv6OptTargetAddress && len(o.Data) == 6 {
			tlla = ether.MAC(o.Data)
		}
	}
	if tlla != rmac {
		t.Fatalf("router's TLLA %s, its ARP %s: one QP, one REMAC", tlla, rmac)
	}
	from := s.Anon
	if from.IsZero() {
		from = rmac
	}

	// ping and ping -6 X through the router: every reply arrives, once.
	for _, x := range []netip.Addr{x4, x6} {
		for seq := uint16(1); seq <= pings; seq++ {
			g.send(g.echo(rmac, x, seq))
			p := g.next("echo reply "+x.String(), func(p gopacket.Packet) bool {
				got, ok := echoReply(p)
				return ok && got == seq && srcIP(p) == x
			})
			g.from(p, from)
		}
	}
	// TCP through the router, both families: X echoes each segment; the
	// guest gets back exactly the bytes it sent, in order.
	for _, x := range []netip.Addr{x4, x6} {
		var got int
		for i := range segments {
			g.send(g.tcp(rmac, x, uint32(i*segSize)))
			p := g.next("TCP segment from "+x.String(), func(p gopacket.Packet) bool {
				tc, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
				return ok && srcIP(p) == x && tc.SrcPort == xPort
			})
			g.from(p, from)
			tc := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
			if int(tc.Seq) != got || len(tc.Payload) != segSize || tc.Payload[0] != byte(i) {
				t.Fatalf("segment %d from %s: seq %d, %d bytes starting %d; want seq %d, %d bytes starting %d", i, x, tc.Seq, len(tc.Payload), tc.Payload[0], got, segSize, byte(i))
			}
			got += len(tc.Payload)
		}
		if got != segments*segSize {
			t.Fatalf("TCP from %s: %d bytes, want %d", x, got, segments*segSize)
		}
	}

	// Multicast routed from X, whose source never sent ARP or NDP, over
	// IPv4 and IPv6: the guest joins the group (IGMPv3, MLDv2), X's
	// packet reaches it.
	for _, m := range []struct {
		x, group netip.Addr
		join     []byte
		mgid     ipoib.GID
		mac      ether.MAC
	}{
		{x4, group4, igmpJoin(t, group4), ipoib.IPv4MGID(group4, ipoib.DefaultPKey, ipoib.ScopeLinkLocal), ether.MAC{1, 0, 0x5e, 7, 7, 7}},
		{x6, group6, mldJoin(t, group6), ipoib.IPv6MGID(group6, ipoib.DefaultPKey, ipoib.ScopeLinkLocal), ether.MAC{0x33, 0x33, 0, 7, 0, 7}},
	} {
		g.send(m.join)
		testutil.WaitFor(t, "the group "+m.group.String()+" joined", func() bool { return s.Joined(m.mgid) })
		rdev.Inject(udpPacket(t, m.x, m.group, []byte("routed multicast")))
		p = g.next("routed multicast from "+m.x.String(), func(p gopacket.Packet) bool {
			u, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			return ok && srcIP(p) == m.x && string(u.Payload) == "routed multicast"
		})
		g.from(p, from)
		if dst := ether.MAC(p.LinkLayer().(*layers.Ethernet).DstMAC); dst != m.mac {
			t.Fatalf("routed multicast from %s to %s, want %s", m.x, dst, m.mac)
		}
	}

	// Every packet from X came as one frame, under one source MAC; the
	// shim dropped nothing (every drop_* is 0) and asked nobody for X.
	unknown := uint64(2*pings + 2*segments + 2)
	if !s.Anon.IsZero() {
		testutil.WaitFor(t, "rx_unknown_source", func() bool { return s.Counters()["rx_unknown_source"] >= unknown })
	} else {
		unknown = 0
	}
	c := s.Counters()
	if c["rx_unknown_source"] != unknown || c["tx_resolve_sent"] != 0 {
		t.Fatalf("rx_unknown_source %d, tx_resolve_sent %d; want %d and 0 (counters %v)", c["rx_unknown_source"], c["tx_resolve_sent"], unknown, c)
	}
	if _, ok := c["drop_tap_write"]; !ok {
		t.Fatalf("no drop_tap_write among the shim's counters %v", c)
	}
	for name, n := range c {
		if strings.HasPrefix(name, "drop_") && n != 0 {
			t.Errorf("%s %d, want 0: nothing is dropped (counters %v)", name, n, c)
		}
	}
}

// guest is the guest's side of its TAP.
type guest struct {
	t   *testing.T
	dev *tap.Mem
}

func (g *guest) send(frame []byte) { g.dev.Inject(frame) }

// next returns the next frame delivered to the guest that match
// accepts, passing over the others (the shim's IGMP/MLD queries, the
// router's announcements).
func (g *guest) next(what string, match func(gopacket.Packet) bool) gopacket.Packet {
	g.t.Helper()
	p := g.within(testutil.Settle, match)
	if p == nil {
		g.t.Fatalf("the guest never got %s", what)
	}
	return p
}

// within is next with a deadline d, nil when it passes.
func (g *guest) within(d time.Duration, match func(gopacket.Packet) bool) gopacket.Packet {
	deadline := time.After(d)
	for {
		select {
		case f := <-g.dev.Sent():
			if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); match(p) {
				return p
			}
		case <-deadline:
			return nil
		}
	}
}

// ask sends a request every half second until an answer match accepts
// arrives, for at most testutil.Settle.
func (g *guest) ask(what string, req []byte, match func(gopacket.Packet) bool) gopacket.Packet {
	g.t.Helper()
	for deadline := time.Now().Add(testutil.Settle); time.Now().Before(deadline); {
		g.send(req)
		if p := g.within(500*time.Millisecond, match); p != nil {
			return p
		}
	}
	g.t.Fatalf("the guest never got %s", what)
	return nil
}

// from checks a frame routed from X: to the guest's MAC (or a group's),
// from want.
func (g *guest) from(p gopacket.Packet, want ether.MAC) {
	g.t.Helper()
	e := p.LinkLayer().(*layers.Ethernet)
	if src := ether.MAC(e.SrcMAC); src != want {
		g.t.Fatalf("from %s: source MAC %s, want %s", srcIP(p), src, want)
	}
	if dst := ether.MAC(e.DstMAC); dst != guestMAC && !dst.IsMulticast() {
		g.t.Fatalf("from %s: to %s", srcIP(p), dst)
	}
}

// echo is the guest's echo request seq to x through the router (rmac).
func (g *guest) echo(rmac ether.MAC, x netip.Addr, seq uint16) []byte {
	payload := gopacket.Payload(make([]byte, 56))
	if x.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: guest4.AsSlice(), DstIP: x.AsSlice()}
		return serialize(g.t, &layers.Ethernet{SrcMAC: guestMAC[:], DstMAC: rmac[:], EthernetType: layers.EthernetTypeIPv4}, ip,
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 0x77, Seq: seq}, payload)
	}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
	return ip6Frame(g.t, rmac, guest6, x, 64, icmp, &layers.ICMPv6Echo{Identifier: 0x77, SeqNumber: seq}, payload)
}

// tcp is the guest's data segment at stream offset off to X's echo port.
func (g *guest) tcp(rmac ether.MAC, x netip.Addr, off uint32) []byte {
	data := make([]byte, segSize)
	for i := range data {
		data[i] = byte(off/segSize) + byte(i)
	}
	tc := &layers.TCP{SrcPort: gPort, DstPort: xPort, Seq: off, ACK: true, PSH: true, Window: 65535}
	e := &layers.Ethernet{SrcMAC: guestMAC[:], DstMAC: rmac[:], EthernetType: layers.EthernetTypeIPv6}
	var ip gopacket.NetworkLayer = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: guest6.AsSlice(), DstIP: x.AsSlice()}
	if x.Is4() {
		e.EthernetType = layers.EthernetTypeIPv4
		ip = &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: guest4.AsSlice(), DstIP: x.AsSlice()}
	}
	if err := tc.SetNetworkLayerForChecksum(ip); err != nil {
		g.t.Fatal(err)
	}
	return serialize(g.t, e, ip.(gopacket.SerializableLayer), tc, gopacket.Payload(data))
}

// secondSubnet is the router's forwarding and X behind it: each IP
// packet the router's stack receives for X is answered as X would, TTL
// (hop limit) one less for the hop back through the router. It returns
// when ctx ends.
func secondSubnet(ctx context.Context, rdev *tap.Mem) {
	for {
		var b []byte
		select {
		case b = <-rdev.Sent():
		case <-ctx.Done():
			return
		}
		var p gopacket.Packet
		switch b[0] >> 4 {
		case 4:
			p = gopacket.NewPacket(b, layers.LayerTypeIPv4, gopacket.Default)
		case 6:
			p = gopacket.NewPacket(b, layers.LayerTypeIPv6, gopacket.Default)
		default:
			continue
		}
		if reply := answer(p); reply != nil {
			rdev.Inject(reply)
		}
	}
}

// answer is X's answer to p (nil for none): an echo reply, or a TCP
// segment carrying p's payload back at the same stream offset.
func answer(p gopacket.Packet) []byte {
	dst := dstIP(p)
	if dst != x4 && dst != x6 {
		return nil
	}
	src := srcIP(p)
	var l3 gopacket.NetworkLayer
	var ip4 *layers.IPv4
	var ip6 *layers.IPv6
	if dst.Is4() {
		ip4 = &layers.IPv4{Version: 4, TTL: 63, SrcIP: dst.AsSlice(), DstIP: src.AsSlice()}
		l3 = ip4
	} else {
		ip6 = &layers.IPv6{Version: 6, HopLimit: 63, SrcIP: dst.AsSlice(), DstIP: src.AsSlice()}
		l3 = ip6
	}
	setProto := func(proto layers.IPProtocol) {
		if ip4 != nil {
			ip4.Protocol = proto
		} else {
			ip6.NextHeader = proto
		}
	}
	first := l3.(gopacket.SerializableLayer)
	switch {
	case p.Layer(layers.LayerTypeICMPv4) != nil:
		e := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if e.TypeCode.Type() != layers.ICMPv4TypeEchoRequest {
			return nil
		}
		setProto(layers.IPProtocolICMPv4)
		return encode(first, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoReply, 0), Id: e.Id, Seq: e.Seq}, gopacket.Payload(e.Payload))
	case p.Layer(layers.LayerTypeICMPv6Echo) != nil:
		e := p.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo)
		setProto(layers.IPProtocolICMPv6)
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoReply, 0)}
		if err := icmp.SetNetworkLayerForChecksum(l3); err != nil {
			return nil
		}
		return encode(first, icmp, &layers.ICMPv6Echo{Identifier: e.Identifier, SeqNumber: e.SeqNumber}, gopacket.Payload(e.Payload))
	case p.Layer(layers.LayerTypeTCP) != nil:
		tc := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if tc.DstPort != xPort {
			return nil
		}
		setProto(layers.IPProtocolTCP)
		back := &layers.TCP{SrcPort: xPort, DstPort: tc.SrcPort, Seq: tc.Seq, Ack: tc.Seq + uint32(len(tc.Payload)), ACK: true, PSH: true, Window: 65535}
		if err := back.SetNetworkLayerForChecksum(l3); err != nil {
			return nil
		}
		return encode(first, back, gopacket.Payload(tc.Payload))
	}
	return nil
}

func srcIP(p gopacket.Packet) netip.Addr {
	if n := p.NetworkLayer(); n != nil {
		a, _ := netip.AddrFromSlice(n.NetworkFlow().Src().Raw())
		return a
	}
	return netip.Addr{}
}

func dstIP(p gopacket.Packet) netip.Addr {
	if n := p.NetworkLayer(); n != nil {
		a, _ := netip.AddrFromSlice(n.NetworkFlow().Dst().Raw())
		return a
	}
	return netip.Addr{}
}

// echoReply is the sequence number of an ICMP or ICMPv6 echo reply.
func echoReply(p gopacket.Packet) (uint16, bool) {
	if e, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok && e.TypeCode.Type() == layers.ICMPv4TypeEchoReply {
		return e.Seq, true
	}
	if i, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok && i.TypeCode.Type() == layers.ICMPv6TypeEchoReply {
		if e, ok := p.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo); ok {
			return e.SeqNumber, true
		}
	}
	return 0, false
}

func ip6Frame(t *testing.T, dst ether.MAC, src, to netip.Addr, hops uint8, icmp *layers.ICMPv6, rest ...gopacket.SerializableLayer) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: hops, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: to.AsSlice()}
	if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	return serialize(t, append([]gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: guestMAC[:], DstMAC: dst[:], EthernetType: layers.EthernetTypeIPv6}, ip, icmp}, rest...)...)
}

// igmpJoin is the guest's IGMPv3 report joining group (EXCLUDE {}).
func igmpJoin(t *testing.T, group netip.Addr) []byte {
	igmp := append([]byte{0x22, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0}, group.AsSlice()...)
	binary.BigEndian.PutUint16(igmp[2:], csum.Fold(csum.Sum(0, igmp)))
	ip := &layers.IPv4{Version: 4, TTL: 1, Protocol: layers.IPProtocolIGMP, SrcIP: guest4.AsSlice(), DstIP: netip.MustParseAddr("224.0.0.22").AsSlice()}
	return serialize(t, &layers.Ethernet{SrcMAC: guestMAC[:], DstMAC: []byte{1, 0, 0x5e, 0, 0, 0x16}, EthernetType: layers.EthernetTypeIPv4}, ip, gopacket.Payload(igmp))
}

// mldJoin is the guest's MLDv2 report joining group (EXCLUDE {}).
func mldJoin(t *testing.T, group netip.Addr) []byte {
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeMLDv2MulticastListenerReportMessageV2, 0)}
	report := append([]byte{0, 0, 0, 1, 4, 0, 0, 0}, group.AsSlice()...)
	return ip6Frame(t, ether.MAC{0x33, 0x33, 0, 0, 0, 0x16}, netip.MustParseAddr("fe80::7:2"), netip.MustParseAddr("ff02::16"), 1, icmp, gopacket.Payload(report))
}

// udpPacket is a bare UDP packet, as the router's stack forwards it.
func udpPacket(t *testing.T, src, dst netip.Addr, payload []byte) []byte {
	var ip gopacket.NetworkLayer = &layers.IPv6{Version: 6, HopLimit: 63, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	if src.Is4() {
		ip = &layers.IPv4{Version: 4, TTL: 63, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	}
	u := &layers.UDP{SrcPort: 5000, DstPort: 6000}
	if err := u.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	return serialize(t, ip.(gopacket.SerializableLayer), u, gopacket.Payload(payload))
}

// solicitedNode is a's solicited-node multicast group.
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 2, 11: 1, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

func serialize(t *testing.T, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	b := encode(ls...)
	if b == nil {
		t.Fatal("serialize failed")
	}
	return b
}

// encode serializes ls with lengths and checksums filled in (nil on
// failure).
func encode(ls ...gopacket.SerializableLayer) []byte {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil
	}
	return append([]byte(nil), buf.Bytes()...)
}
