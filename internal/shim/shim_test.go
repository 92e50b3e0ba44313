package shim

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/metrics/stat"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
)

// hv is one hypervisor: a shim between an in-memory TAP and a port on an
// in-memory fabric.
type hv struct {
	s    *Shim
	dev  *tap.Mem
	port testPort
	clk  *clock.Fake
	done chan error
	stop context.CancelFunc
}

func newHV(t *testing.T, f fabric, gid string, mod func(*Config)) *hv {
	t.Helper()
	port := f.port(t, testutil.GID(gid))
	var err error
	h := &hv{dev: tap.NewMem(256), port: port, clk: clock.NewFake(time.Unix(1e6, 0)), done: make(chan error, 1)}
	cfg := Config{Device: h.dev, Port: port, Clock: h.clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Housekeeping: 10 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
		if m, ok := cfg.Device.(*tap.Mem); ok {
			h.dev = m
		}
	}
	h.s, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	go func() { h.done <- h.s.Run(ctx) }()
	t.Cleanup(func() { h.shutdown(t) })
	deadline := time.Now().Add(testutil.Settle)
	for !h.dev.Carrier() {
		if time.Now().After(deadline) {
			t.Fatal("carrier never came up")
		}
		time.Sleep(time.Millisecond)
	}
	return h
}

func (h *hv) shutdown(t *testing.T) {
	if h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	select {
	case err := <-h.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(testutil.Settle):
		t.Error("Run did not return")
	}
	h.port.Close()
}

// isQuery reports whether p is one of the shim's own IGMP/MLD queries.
func isQuery(p gopacket.Packet) bool {
	if p.Layer(layers.LayerTypeMLDv2MulticastListenerQuery) != nil {
		return true
	}
	ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	return ok && ip.Protocol == layers.IPProtocolIGMP && len(ip.Payload) > 0 && ip.Payload[0] == 0x11
}

// recv returns the next frame the shim delivered to guests, skipping the
// shim's MLD queries.
func (h *hv) recv(t *testing.T) gopacket.Packet {
	t.Helper()
	for {
		select {
		case f := <-h.dev.Sent():
			if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); !isQuery(p) {
				return p
			}
		case <-time.After(testutil.Settle):
			t.Fatal("no frame delivered")
		}
	}
}

// quiet asserts that nothing but queries is delivered for a while.
func (h *hv) quiet(t *testing.T) {
	t.Helper()
	for {
		select {
		case f := <-h.dev.Sent():
			if !isQuery(gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)) {
				t.Fatalf("unexpected frame %x", f)
			}
		case <-time.After(100 * time.Millisecond):
			return
		}
	}
}

// waitCounter waits until a counter reaches want.
func (h *hv) waitCounter(t *testing.T, c Counter, want uint64) {
	t.Helper()
	deadline := time.Now().Add(testutil.Settle)
	for h.s.Get(c) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d (counters %v)", c, h.s.Get(c), want, h.s.Counters())
		}
		time.Sleep(time.Millisecond)
	}
}

func serialize(t *testing.T, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

var (
	macA1 = ether.MAC{0x52, 0x54, 0, 0, 0xa, 1}
	macA2 = ether.MAC{0x52, 0x54, 0, 0, 0xa, 2}
	macB1 = ether.MAC{0x52, 0x54, 0, 0, 0xb, 1}
	ipA1  = netip.MustParseAddr("10.0.0.1")
	ipA2  = netip.MustParseAddr("10.0.0.3")
	ipB1  = netip.MustParseAddr("10.0.0.2")
)

func eth(src, dst ether.MAC, et layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: src[:], DstMAC: dst[:], EthernetType: et}
}

func arpFrame(t *testing.T, op uint16, sha ether.MAC, spa netip.Addr, dst, tha ether.MAC, tpa netip.Addr) []byte {
	return serialize(t, eth(sha, dst, layers.EthernetTypeARP), &layers.ARP{
		AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: op, SourceHwAddress: sha[:], SourceProtAddress: spa.AsSlice(), DstHwAddress: tha[:], DstProtAddress: tpa.AsSlice(),
	})
}

func udpFrame(t *testing.T, src, dst ether.MAC, sip, dip netip.Addr, size int, df bool) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: sip.AsSlice(), DstIP: dip.AsSlice(), Id: 7}
	if df {
		ip.Flags = layers.IPv4DontFragment
	}
	udp := &layers.UDP{SrcPort: 5000, DstPort: 6000}
	udp.SetNetworkLayerForChecksum(ip)
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	return serialize(t, eth(src, dst, layers.EthernetTypeIPv4), ip, udp, gopacket.Payload(payload))
}

// arpExchange has guest macA1 of a ask for ipB1 (ARP) and guest macB1 of
// b answer, and returns the REMAC b's guests see for macA1 and the one
// a's guests see for macB1.
func arpExchange(t *testing.T, a, b *hv) (remacA1, remacB1 ether.MAC) {
	t.Helper()
	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	p := b.recv(t)
	arp := p.Layer(layers.LayerTypeARP).(*layers.ARP)
	e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	remacA1 = ether.MAC(arp.SourceHwAddress)
	if ether.MAC(e.SrcMAC) != remacA1 || !ether.MAC(e.DstMAC).IsBroadcast() || arp.Operation != layers.ARPRequest {
		t.Fatalf("request as delivered: eth %s→%s arp %+v", e.SrcMAC, e.DstMAC, arp)
	}
	vif, ok := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
	if !ok {
		t.Fatal("no VIF for the sender")
	}
	if want := mactrans.DeriveREMAC(a.port.LocalGID(), vif.QPN, 0); remacA1 != want {
		t.Fatalf("REMAC %s, want %s", remacA1, want)
	}
	if netip.AddrFrom4([4]byte(arp.DstProtAddress)) != ipB1 || !ether.MAC(arp.DstHwAddress).IsZero() {
		t.Fatalf("target %v %x", arp.DstProtAddress, arp.DstHwAddress)
	}
	b.dev.Inject(arpFrame(t, layers.ARPReply, macB1, ipB1, remacA1, remacA1, ipA1))
	p = a.recv(t)
	arp = p.Layer(layers.LayerTypeARP).(*layers.ARP)
	e = p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	remacB1 = ether.MAC(arp.SourceHwAddress)
	if ether.MAC(e.DstMAC) != macA1 || ether.MAC(arp.DstHwAddress) != macA1 || arp.Operation != layers.ARPReply || ether.MAC(e.SrcMAC) != remacB1 {
		t.Fatalf("reply as delivered: eth %s→%s arp %+v", e.SrcMAC, e.DstMAC, arp)
	}
	// A VIF's first frames reach the fabric before the control goroutine
	// marks it ready (newvif.go): the exchange is over once both are, so
	// that VIFs and Guests list them.
	for _, h := range []struct {
		hv  *hv
		mac ether.MAC
	}{{a, macA1}, {b, macB1}} {
		testutil.WaitFor(t, "the VIF of "+h.mac.String()+" ready", func() bool {
			v, ok := h.hv.s.vifs.Lookup(mactrans.VIFKey{MAC: h.mac})
			return ok && v.Ready()
		})
	}
	return remacA1, remacB1
}

func pair(t *testing.T, mod func(*Config)) (*hv, *hv) {
	return pairOn(t, memFab(t, 2048), mod)
}

func pairOn(t *testing.T, f fabric, mod func(*Config)) (*hv, *hv) {
	return newHV(t, f, "fe80::a", mod), newHV(t, f, "fe80::b", mod)
}

func TestARPAndUnicast(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a, b := pairOn(t, f, nil)
		_, remacB1 := arpExchange(t, a, b)
		a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 100, true))
		p := b.recv(t)
		e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if !ok || ether.MAC(e.DstMAC) != macB1 || len(udp.Payload) != 100 || udp.Payload[99] != 99 {
			t.Fatalf("unicast as delivered: %v", p)
		}
		if a.s.Get(TxBroadcast) != 1 || a.s.Get(VIFsCreated) != 1 || b.s.Get(VIFsCreated) != 1 {
			t.Fatalf("counters A %v B %v", a.s.Counters(), b.s.Counters())
		}
	})
}

func TestTwoGuestsTwoQPs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a, b := pairOn(t, f, nil)
		a.dev.Inject(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
		a.dev.Inject(arpFrame(t, layers.ARPRequest, macA2, ipA2, ether.Broadcast, ether.MAC{}, ipB1))
		s1 := b.recv(t).Layer(layers.LayerTypeEthernet).(*layers.Ethernet).SrcMAC
		s2 := b.recv(t).Layer(layers.LayerTypeEthernet).(*layers.Ethernet).SrcMAC
		v1, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
		v2, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA2})
		if v1.QPN == v2.QPN || s1.String() == s2.String() {
			t.Fatalf("guests share QPN %#x / REMAC %s", v1.QPN, s1)
		}
		// Broadcast reaches a port once, not once per VIF.
		b.quiet(t)
	})
}

func ndpFrame(t *testing.T, src ether.MAC, sip, dip netip.Addr, dst ether.MAC, typ layers.ICMPv6TypeCode, body gopacket.SerializableLayer) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: 255, NextHeader: layers.IPProtocolICMPv6, SrcIP: sip.AsSlice(), DstIP: dip.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: typ}
	icmp.SetNetworkLayerForChecksum(ip)
	return serialize(t, eth(src, dst, layers.EthernetTypeIPv6), ip, icmp, body)
}

func TestNDP(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a, b := pairOn(t, f, nil)
		la, lb := netip.MustParseAddr("fd00::a1"), netip.MustParseAddr("fd00::b1")
		sn := solicitedNode(lb)
		// B's guest has an address: seeing it joins its solicited-node group.
		b.dev.Inject(ndpFrame(t, macB1, lb, netip.MustParseAddr("ff02::2"), ether.MAC{0x33, 0x33, 0, 0, 0, 2},
			layers.CreateICMPv6TypeCode(layers.ICMPv6TypeRouterSolicitation, 0), &layers.ICMPv6RouterSolicitation{}))
		deadline := time.Now().Add(testutil.Settle)
		for !b.port.Joined(ipoib.IPv6MGID(sn, 0xffff, 2)) {
			if time.Now().After(deadline) {
				t.Fatal("solicited-node group not joined")
			}
			time.Sleep(time.Millisecond)
		}
		ns := &layers.ICMPv6NeighborSolicitation{TargetAddress: lb.AsSlice(), Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptSourceAddress, Data: macA1[:]}}}
		a.dev.Inject(ndpFrame(t, macA1, la, sn, ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xb1}, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0), ns))
		p := b.recv(t)
		e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		icmp := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		icmp.SetNetworkLayerForChecksum(p.NetworkLayer())
		if err, res := icmp.VerifyChecksum(); err != nil || !res.Valid {
			t.Fatalf("NS checksum as delivered: %v", err)
		}
		got := p.Layer(layers.LayerTypeICMPv6NeighborSolicitation).(*layers.ICMPv6NeighborSolicitation)
		if ether.MAC(e.DstMAC) != (ether.MAC{0x33, 0x33, 0xff, 0, 0, 0xb1}) || len(got.Options) != 1 || ether.MAC(got.Options[0].Data) != ether.MAC(e.SrcMAC) {
			t.Fatalf("NS as delivered: %v", p)
		}
		remacA1 := ether.MAC(e.SrcMAC)
		na := &layers.ICMPv6NeighborAdvertisement{Flags: 0x60, TargetAddress: lb.AsSlice(), Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptTargetAddress, Data: macB1[:]}}}
		b.dev.Inject(ndpFrame(t, macB1, lb, la, remacA1, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborAdvertisement, 0), na))
		p = a.recv(t)
		gotNA := p.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement)
		e = p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		if ether.MAC(e.DstMAC) != macA1 || len(gotNA.Options) != 1 || ether.MAC(gotNA.Options[0].Data) != ether.MAC(e.SrcMAC) {
			t.Fatalf("NA as delivered: %v", p)
		}
	})
}

func TestDropsCounted(t *testing.T) {
	a, b := pair(t, func(c *Config) { c.MaxVIFs = 2 })
	a.dev.Inject([]byte{1, 2, 3})                                                                                            // runt
	a.dev.Inject(serialize(t, eth(macA1, ether.Broadcast, layers.EthernetType(0x88cc)), gopacket.Payload(make([]byte, 46)))) // LLDP
	a.dev.Inject(serialize(t, &layers.Ethernet{SrcMAC: macA1[:], DstMAC: ether.Broadcast[:], EthernetType: layers.EthernetTypeDot1Q},
		&layers.Dot1Q{VLANIdentifier: 77, Type: layers.EthernetTypeARP}, gopacket.Payload(make([]byte, 28)))) // unmapped VLAN
	a.dev.Inject(udpFrame(t, ether.Broadcast, ether.Broadcast, ipA1, ipB1, 10, false)) // multicast source
	bad := udpFrame(t, macA1, ether.Broadcast, ipA1, ipB1, 10, false)
	bad[14+3] = 0xff // IPv4 total length past the frame
	a.dev.Inject(bad)
	for i := byte(0); i < 3; i++ { // third MAC exceeds --max-vifs 2
		a.dev.Inject(arpFrame(t, layers.ARPRequest, ether.MAC{2, 0, 0, 0, 0, i + 1}, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	}
	a.waitCounter(t, DropVIFLimit, 1)
	for c, want := range map[Counter]uint64{DropRunt: 1, DropEtherType: 1, DropVLANUnmapped: 1, DropBadSrcMAC: 1, DropBadIP: 1, VIFsCreated: 2} {
		if got := a.s.Get(c); got != want {
			t.Errorf("%s = %d, want %d", c, got, want)
		}
	}
	b.recv(t)
	b.recv(t)
	b.quiet(t)
}

func TestUnknownREMACQueuedAndResolved(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a, b := pairOn(t, f, nil)
		// Both sides know each other (ARP), then A forgets B (restart, aging):
		// A's guest still uses B1's REMAC.
		_, remacB1 := arpExchange(t, a, b)
		a.s.neigh.Expire(a.clk.Now().Add(time.Hour), time.Minute)
		a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 64, true))
		a.waitCounter(t, TxQueued, 1)
		// The shim asks on the guest's behalf; B's guest answers.
		p := b.recv(t)
		arp := p.Layer(layers.LayerTypeARP).(*layers.ARP)
		if arp.Operation != layers.ARPRequest || netip.AddrFrom4([4]byte(arp.DstProtAddress)) != ipB1 || netip.AddrFrom4([4]byte(arp.SourceProtAddress)) != ipA1 {
			t.Fatalf("resolution as delivered: %+v", arp)
		}
		b.dev.Inject(arpFrame(t, layers.ARPReply, macB1, ipB1, ether.MAC(arp.SourceHwAddress), ether.MAC(arp.SourceHwAddress), ipA1))
		a.recv(t) // the reply reaches the guest too (harmless)
		p = b.recv(t)
		if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); !ok || len(udp.Payload) != 64 {
			t.Fatalf("queued frame not delivered: %v", p)
		}
		if a.s.Get(TxResolveSent) != 1 || a.s.Get(DropUnresolved) != 0 {
			t.Fatalf("counters %v", a.s.Counters())
		}
		// Nobody answers for an unknown MAC: dropped and counted after the
		// tries.
		a.dev.Inject(udpFrame(t, macA1, ether.MAC{2, 9, 9, 9, 9, 9}, ipA1, netip.MustParseAddr("10.0.0.99"), 64, true))
		a.waitCounter(t, TxQueued, 2)
		a.resolveOut(t, 1)
		if got := a.s.Get(TxResolveSent); got != 1+resolveTries {
			t.Fatalf("resolutions sent %d, want %d", got, 1+resolveTries)
		}
	})
}

func TestOversize(t *testing.T) {
	a, b := pair(t, nil)
	_, remacB1 := arpExchange(t, a, b)
	mtu := a.s.IPMTU()
	if mtu != ipoib.MTU2044 {
		t.Fatalf("IPoIB MTU %d", mtu)
	}
	// IPv4 with DF: ICMP fragmentation needed, next-hop MTU 2044.
	a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 3000, true))
	p := a.recv(t)
	icmp, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
	if !ok || icmp.TypeCode != layers.CreateICMPv4TypeCode(3, 4) || icmp.Seq != uint16(mtu) {
		t.Fatalf("not a fragmentation-needed with MTU %d: %v", mtu, p)
	}
	if ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ip.SrcIP.String() != ipB1.String() || ip.DstIP.String() != ipA1.String() {
		t.Fatalf("ICMP addresses %s → %s", ip.SrcIP, ip.DstIP)
	}
	// IPv4 without DF: fragmented; both fragments arrive and reassemble.
	a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 3000, false))
	var total int
	for i := 0; i < 2; i++ {
		ip := b.recv(t).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if int(ip.Length) > mtu {
			t.Fatalf("fragment of %d bytes over MTU %d", ip.Length, mtu)
		}
		total += len(ip.Payload)
		if (i == 0) != (ip.Flags&layers.IPv4MoreFragments != 0) {
			t.Fatalf("fragment %d flags %v", i, ip.Flags)
		}
	}
	if total != 8+3000 || a.s.Get(TxFragmented) != 1 {
		t.Fatalf("fragments carry %d bytes", total)
	}
	// IPv6: packet too big.
	la, lb := netip.MustParseAddr("fd00::a1"), netip.MustParseAddr("fd00::b1")
	ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: la.AsSlice(), DstIP: lb.AsSlice()}
	udp := &layers.UDP{SrcPort: 1, DstPort: 2}
	udp.SetNetworkLayerForChecksum(ip6)
	a.dev.Inject(serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv6), ip6, udp, gopacket.Payload(make([]byte, 3000))))
	p = a.recv(t)
	ptb, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	if !ok || ptb.TypeCode.Type() != layers.ICMPv6TypePacketTooBig {
		t.Fatalf("not a packet-too-big: %v", p)
	}
	ptb.SetNetworkLayerForChecksum(p.NetworkLayer())
	if err, res := ptb.VerifyChecksum(); err != nil || !res.Valid {
		t.Fatal("packet-too-big checksum")
	}
	if got := int(ptb.LayerPayload()[0])<<24 | int(ptb.LayerPayload()[1])<<16 | int(ptb.LayerPayload()[2])<<8 | int(ptb.LayerPayload()[3]); got != mtu {
		t.Fatalf("packet-too-big MTU %d", got)
	}
	if len(p.Data()) > 14+1280 {
		t.Fatalf("packet-too-big of %d bytes exceeds the IPv6 minimum MTU", len(p.Data())-14)
	}
}

// nextQuery returns the next query the shim sends its guests.
func (h *hv) nextQuery(t *testing.T) gopacket.Packet {
	t.Helper()
	for {
		select {
		case f := <-h.dev.Sent():
			if p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default); isQuery(p) {
				return p
			}
		case <-time.After(testutil.Settle):
			t.Fatal("no query")
		}
	}
}

func TestQuerierGeneral(t *testing.T) {
	a, _ := pair(t, func(c *Config) { c.Multicast.QueryInterval = time.Minute })
	kinds := map[string]int{}
	for i := 0; i < 4; i++ {
		p := a.nextQuery(t)
		if ip, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
			if !ip.SrcIP.IsLinkLocalUnicast() || ip.HopLimit != 1 || ip.DstIP.String() != "ff02::1" {
				t.Fatalf("MLD query from %s to %s hop limit %d", ip.SrcIP, ip.DstIP, ip.HopLimit)
			}
			kinds["mld"]++
		} else {
			if ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ip.TTL != 1 || ip.DstIP.String() != "224.0.0.1" {
				t.Fatalf("IGMP query to %s TTL %d", ip.DstIP, ip.TTL)
			}
			kinds["igmp"]++
		}
		if i == 1 {
			a.clk.Advance(time.Minute) // the next pair is due
		}
	}
	if kinds["mld"] != 2 || kinds["igmp"] != 2 {
		t.Fatalf("queries %v; want an IGMP and an MLD query at start-up and after one interval", kinds)
	}
	a.waitCounter(t, TxQueries, 4) // counted once written
	if n := a.s.Get(TxQueries); n != 4 {
		t.Fatalf("tx_queries %d, want 4", n)
	}
}

// TestQuerierIntervalChange: a query interval shortened while running
// takes effect at once: the next general queries come after the new
// interval, not the old one.
func TestQuerierIntervalChange(t *testing.T) {
	a, _ := pair(t, func(c *Config) { c.Multicast.QueryInterval = 3000 * time.Second })
	a.nextQuery(t)
	a.nextQuery(t) // start-up: IGMP and MLD
	if err := a.s.SetMulticastTimers(snoop.Timers{QueryInterval: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	a.rounds(t, 2) // the second began after the change: it took the new interval
	a.clk.Advance(30 * time.Second)
	a.nextQuery(t)
	a.nextQuery(t)
	a.waitCounter(t, TxQueries, 4) // 2 at start-up, 2 when the new 30 s interval ended
	if n := a.s.Get(TxQueries); n != 4 {
		t.Fatalf("tx_queries %d, want 4", n)
	}
}

func mldReport(t *testing.T, src ether.MAC, recType byte, group netip.Addr) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: 1, NextHeader: layers.IPProtocolICMPv6, SrcIP: netip.MustParseAddr("fe80::a1").AsSlice(), DstIP: netip.MustParseAddr("ff02::16").AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeMLDv2MulticastListenerReportMessageV2, 0)}
	icmp.SetNetworkLayerForChecksum(ip)
	report := append([]byte{0, 0, 0, 1, recType, 0, 0, 0}, group.AsSlice()...)
	return serialize(t, eth(src, ether.MAC{0x33, 0x33, 0, 0, 0, 0x16}, layers.EthernetTypeIPv6), ip, icmp, gopacket.Payload(report))
}

func igmpReport(t *testing.T, src ether.MAC, recType byte, group netip.Addr) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 1, Protocol: layers.IPProtocolIGMP, SrcIP: ipA1.AsSlice(), DstIP: netip.MustParseAddr("224.0.0.22").AsSlice()}
	igmp := append([]byte{0x22, 0, 0, 0, 0, 0, 0, 1, recType, 0, 0, 0}, group.AsSlice()...)
	binary.BigEndian.PutUint16(igmp[2:], csum.Fold(csum.Sum(0, igmp)))
	return serialize(t, eth(src, ether.MAC{1, 0, 0x5e, 0, 0, 0x16}, layers.EthernetTypeIPv4), ip, gopacket.Payload(igmp))
}

// rounds waits for n housekeeping rounds to end after the call; with n
// 2, the second began after the call, so it saw all that came before.
func (h *hv) rounds(t *testing.T, n int) {
	t.Helper()
	for range n {
		last := h.s.lastRound.Load()
		testutil.WaitFor(t, "a housekeeping round", func() bool { return h.s.lastRound.Load() != last })
	}
}

// resolveOut moves h's clock through the tries of the unresolved
// destinations queued at the clock's time (their first try sent), one
// resolveInterval at a time. It takes each step once no destination is
// due at the step before it (a round has tried every one: tick set each
// next try later), so that no two steps fall in one round, however many
// destinations wait. After the last step, it waits for drop_unresolved
// to reach drops.
func (h *hv) resolveOut(t *testing.T, drops uint64) {
	t.Helper()
	for range resolveTries - 1 {
		h.clk.Advance(resolveInterval)
		now := h.clk.Now()
		testutil.WaitFor(t, "every unresolved destination tried again", func() bool { return h.s.resolver.pending.noneDue(now) })
	}
	h.clk.Advance(resolveInterval)
	h.waitCounter(t, DropUnresolved, drops)
}

// noneDue reports whether no destination in q is due for a try at now.
func (q *pendingQueue) noneDue(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.m {
		if !now.Before(e.next) {
			return false
		}
	}
	return true
}

// TestSnooping: reports join MGIDs, a leave triggers group-specific
// queries and, unanswered, leaves the MGID after the leave time;
// multicast from a guest reaches the members' hypervisors only, through
// a send-only join on the sender's.
func TestSnooping(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a := newHV(t, f, "fe80::a", nil)
		b := newHV(t, f, "fe80::b", nil)
		c := newHV(t, f, "fe80::c", nil)
		g4, g6 := netip.MustParseAddr("239.1.1.1"), netip.MustParseAddr("ff15::1234")
		m4, m6 := ipoib.IPv4MGID(g4, 0xffff, 2), ipoib.IPv6MGID(g6, 0xffff, 2)
		a.dev.Inject(igmpReport(t, macA1, 4, g4)) // CHANGE_TO_EXCLUDE({}): join
		a.dev.Inject(mldReport(t, macA1, 4, g6))
		testutil.WaitFor(t, "joins on a", func() bool { return a.port.Joined(m4) && a.port.Joined(m6) })
		// Three: the two groups and the solicited-node group of the MLD
		// report's own source address. The port has a group before the
		// shim counts it (groups.join), and the control goroutine joins
		// them one by one, so the count is waited for; a fourth would
		// fail the wait.
		testutil.WaitFor(t, "three joins on a", func() bool { return a.s.Get(McastJoins) == 3 })

		// c's guest announces its addresses (a gratuitous ARP, an
		// unsolicited advertisement) as a booting host does: a port that
		// cannot tell senders learns them from these.
		c.dev.Inject(arpFrame(t, layers.ARPRequest, macB1, ipB1, ether.Broadcast, ether.MAC{}, ipB1))
		a.recv(t)
		b.recv(t)
		c1 := netip.MustParseAddr("fd00::c1")
		na := &layers.ICMPv6NeighborAdvertisement{Flags: 0x20, TargetAddress: c1.AsSlice(), Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptTargetAddress, Data: macB1[:]}}}
		c.dev.Inject(ndpFrame(t, macB1, c1, netip.MustParseAddr("ff02::1"), ether.MAC{0x33, 0x33, 0, 0, 0, 1}, layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborAdvertisement, 0), na))
		a.recv(t)
		b.recv(t)

		// c sends to both groups: a receives with the right MACs, b nothing;
		// c is a send-only member, not a full one.
		c.dev.Inject(udpFrame(t, macB1, ether.MAC{1, 0, 0x5e, 1, 1, 1}, ipB1, g4, 100, false))
		p := a.recv(t)
		if e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet); e.DstMAC.String() != "01:00:5e:01:01:01" {
			t.Fatalf("IPv4 multicast delivered to %s", e.DstMAC)
		}
		ip6 := &layers.IPv6{Version: 6, HopLimit: 5, NextHeader: layers.IPProtocolUDP, SrcIP: netip.MustParseAddr("fd00::c1").AsSlice(), DstIP: g6.AsSlice()}
		udp := &layers.UDP{SrcPort: 1, DstPort: 2}
		udp.SetNetworkLayerForChecksum(ip6)
		c.dev.Inject(serialize(t, eth(macB1, ether.MAC{0x33, 0x33, 0, 0, 0x12, 0x34}, layers.EthernetTypeIPv6), ip6, udp, gopacket.Payload([]byte("hi"))))
		p = a.recv(t)
		if e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet); e.DstMAC.String() != "33:33:00:00:12:34" {
			t.Fatalf("IPv6 multicast delivered to %s", e.DstMAC)
		}
		b.quiet(t)
		if c.port.Joined(m4) || !c.port.SendOnly(m4) || !c.port.SendOnly(m6) || b.port.Joined(m4) || b.port.SendOnly(m4) {
			t.Fatalf("memberships: c full %v send-only %v/%v, b %v/%v", c.port.Joined(m4), c.port.SendOnly(m4), c.port.SendOnly(m6), b.port.Joined(m4), b.port.SendOnly(m4))
		}

		// A leave (CHANGE_TO_INCLUDE({})): a group-specific query to the
		// group; nobody answers, and after the leave time (2 s) the MGID is
		// left.
		a.dev.Inject(igmpReport(t, macA1, 3, g4))
		q := a.nextQuery(t)
		if ip := q.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ip.DstIP.String() != "239.1.1.1" {
			t.Fatalf("group-specific query to %s", ip.DstIP)
		}
		if !a.port.Joined(m4) {
			t.Fatal("left before the leave time")
		}
		a.clk.Advance(2 * time.Second)
		// The port leaves before the shim counts it (groups.leave).
		testutil.WaitFor(t, "leave after the leave time", func() bool { return !a.port.Joined(m4) && a.s.Get(McastLeaves) == 1 })
		if !a.port.Joined(m6) || a.s.Get(McastLeaves) != 1 {
			t.Fatalf("IPv6 group left too, or leaves %d", a.s.Get(McastLeaves))
		}
		// The static groups survive a guest's leave of them.
		frames := a.s.Get(TxFrames)
		a.dev.Inject(mldReport(t, macA1, 3, allNodes))
		a.waitCounter(t, TxFrames, frames+1)
		a.clk.Advance(3 * time.Second)
		a.rounds(t, 2) // one began after the leave time had passed
		if !a.port.Joined(ipoib.IPv6MGID(allNodes, 0xffff, 2)) {
			t.Fatal("all-nodes group left on a guest's request")
		}
		// Malformed reports are dropped and counted.
		bad := igmpReport(t, macA1, 4, g4)
		bad[14+20+8] = 9 // record type 9 (the frame is padded to 60 bytes)
		a.dev.Inject(bad)
		a.waitCounter(t, DropBadMcastReport, 1)
		// Send-only memberships are left after a membership interval unused.
		c.clk.Advance(261 * time.Second)
		testutil.WaitFor(t, "send-only expiry", func() bool { return !c.port.SendOnly(m4) && !c.port.SendOnly(m6) })
	})
}

func TestVIFAgingAndShutdown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a, b := pairOn(t, f, func(c *Config) { c.VIFIdle = time.Minute })
		arpExchange(t, a, b)
		v, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
		a.clk.Advance(2 * time.Minute)
		a.waitCounter(t, VIFsAged, 1)
		if _, ok := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1}); ok {
			t.Fatal("idle VIF still present")
		}
		// Its QP was freed.
		if err := a.port.FreeQP(v.QPN); err == nil {
			t.Fatalf("QPN %#x not freed", v.QPN)
		}
		if f.hints() { // and the same QPN can be allocated again
			if q, err := a.port.AllocQP(0xffff, v.QPN); err != nil || q != v.QPN {
				t.Fatalf("QPN %#x not reusable (%#x, %v)", v.QPN, q, err)
			}
			a.port.FreeQP(v.QPN)
		}
		// Shutdown frees every QP and leaves every group.
		vb, _ := b.s.vifs.Lookup(mactrans.VIFKey{MAC: macB1})
		bc := ipoib.BroadcastMGID(0xffff, 2)
		if !b.port.Joined(bc) {
			t.Fatal("broadcast group not joined")
		}
		b.shutdown(t)
		if b.port.Joined(bc) {
			t.Fatal("broadcast group still joined after shutdown")
		}
		if err := b.port.FreeQP(vb.QPN); err == nil {
			t.Fatal("QP still allocated after shutdown")
		}
		if _, err := b.dev.Read([][]byte{make([]byte, 10)}, []int{0}, 0); err != net.ErrClosed {
			t.Fatalf("device not closed: %v", err)
		}
	})
}

// TestDeclaredVIFStays: a guest declared over the control socket keeps
// its VIF while silent past --vif-idle (the learned one beside it ages).
// A learned declaration of it (the auto-mode preload) does not lower its
// origin. A switch's learned or static entry of its MAC going does not
// free it; only the control socket does.
func TestDeclaredVIFStays(t *testing.T) {
	a, b := pair(t, func(c *Config) { c.VIFIdle = time.Minute })
	arpExchange(t, a, b) // macA1: learned
	if err := a.s.DeclareVIF(macA2, 0, mactrans.OriginDeclared); err != nil {
		t.Fatal(err)
	}
	// The auto-mode preload declares learned entries as learned: that
	// does not lower a declared VIF.
	if err := a.s.DeclareVIF(macA2, 0, mactrans.OriginLearned); err != nil {
		t.Fatal(err)
	}
	if v, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA2}); v.Origin() != mactrans.OriginDeclared {
		t.Fatalf("origin %v after a learned declaration, want declared", v.Origin())
	}
	a.clk.Advance(2 * time.Minute)
	a.waitCounter(t, VIFsAged, 1)
	if _, ok := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1}); ok {
		t.Fatal("the idle learned VIF did not age")
	}
	for _, by := range []mactrans.Origin{mactrans.OriginLearned, mactrans.OriginBridge, mactrans.OriginOVS} {
		if removed, err := a.s.RemoveVIF(macA2, 0, by); removed || err != nil {
			t.Fatalf("a removal by %v of the declared VIF: removed %v, %v", by, removed, err)
		}
	}
	if _, ok := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA2}); !ok || a.s.Get(VIFsAged) != 1 {
		t.Fatalf("the declared VIF went (aged %d)", a.s.Get(VIFsAged))
	}
	if removed, err := a.s.RemoveVIF(macA2, 0, mactrans.OriginDeclared); !removed || err != nil {
		t.Fatalf("vif-del: removed %v, %v", removed, err)
	}
	a.waitCounter(t, VIFsRemoved, 1)
}

func TestFromFabricBadInput(t *testing.T) {
	a, b := pair(t, nil)
	arpExchange(t, a, b)
	v, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
	qb, _ := b.port.AllocQP(0xffff, 0)
	send := func(payload []byte, dstQPN uint32, pkey ipoib.PKey) {
		buf := append(make([]byte, ipoib.Headroom), payload...)
		if _, err := b.port.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, dstQPN, a.port.LocalGID()), SrcQPN: qb, PKey: pkey}}, ipoib.Headroom); err != nil {
			t.Fatal(err)
		}
	}
	send([]byte{8, 0, 0, 1, 0x45}, v.QPN, 0xffff)                     // reserved bits set
	send([]byte{0x88, 0xcc, 0, 0, 1, 2, 3}, v.QPN, 0xffff)            // LLDP over IPoIB
	send([]byte{8, 6, 0, 0, 0, 32, 8, 0, 20, 4, 0, 1}, v.QPN, 0xffff) // truncated ARP
	send([]byte{8, 0, 0}, v.QPN, 0xffff)                              // shorter than the IPoIB header
	a.waitCounter(t, RxPackets, 5)                                    // 1 from the ARP exchange
	for c, want := range map[Counter]uint64{DropRxBadHeader: 2, DropRxEtherType: 1, DropRxRewrite: 1} {
		if got := a.s.Get(c); got != want {
			t.Errorf("%s = %d, want %d", c, got, want)
		}
	}
	a.quiet(t)
}

// TestVLANPartitions: VLAN 10 ↔ 0x800a, 20 ↔ 0x8014. A tagged broadcast
// reaches the other hypervisor tagged with its VLAN and nothing of the
// other partition; unicast across partitions is refused on receive by the
// P_Key check; an unmapped VLAN is dropped and counted.
func TestVLANPartitions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f fabric) {
		a, b := pairOn(t, f, func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{10: 0x800a, 20: 0x8014} })
		tagged := func(vlan uint16, src ether.MAC, op uint16, dst, tha ether.MAC, spa, tpa netip.Addr) []byte {
			return serialize(t, &layers.Ethernet{SrcMAC: src[:], DstMAC: dst[:], EthernetType: layers.EthernetTypeDot1Q},
				&layers.Dot1Q{VLANIdentifier: vlan, Type: layers.EthernetTypeARP},
				&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
					Operation: op, SourceHwAddress: src[:], SourceProtAddress: spa.AsSlice(), DstHwAddress: tha[:], DstProtAddress: tpa.AsSlice()})
		}
		a.dev.Inject(tagged(10, macA1, layers.ARPRequest, ether.Broadcast, ether.MAC{}, ipA1, ipB1))
		p := b.recv(t)
		d, ok := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
		if !ok || d.VLANIdentifier != 10 {
			t.Fatalf("broadcast delivered untagged or on the wrong VLAN: %v", p)
		}
		b.quiet(t) // once, and only in VLAN 10
		remac := ether.MAC(p.Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress)
		va, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1, VLAN: 10})
		if va.PKey != 0x800a {
			t.Fatalf("VIF of VLAN 10 in partition %s", va.PKey)
		}
		// B's VLAN 20 guest answers to that REMAC: B has no such neighbour in
		// partition 0x8014, so nothing crosses (it waits for resolution).
		b.dev.Inject(tagged(20, macB1, layers.ARPReply, remac, remac, ipB1, ipA1))
		a.quiet(t)
		// A packet from B's VLAN 20 QP straight to A's VLAN 10 QP: the
		// fabric's receive P_Key check drops it.
		vb, _, err := b.s.vifs.Create(mactrans.VIFKey{MAC: macB1, VLAN: 20}, 0x8014, mactrans.OriginLearned, time.Now(), b.port.AllocQP)
		if err != nil {
			t.Fatal(err)
		}
		buf := append(make([]byte, ipoib.Headroom), 8, 0, 0, 0)
		b.port.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: va.LIMAC, SrcQPN: vb.QPN, PKey: 0x8014}}, ipoib.Headroom)
		if f.countsPKeyDrops() {
			testutil.WaitFor(t, "P_Key drop", func() bool { return a.port.Counters().Drops[ipoib.DropPKey.String()] == 1 })
		}
		a.quiet(t)
		a.dev.Inject(tagged(30, macA1, layers.ARPRequest, ether.Broadcast, ether.MAC{}, ipA1, ipB1))
		a.waitCounter(t, DropVLANUnmapped, 1)
		for _, bad := range []map[uint16]ipoib.PKey{{0: 0x8001}, {10: 0x8000}, {10: 0x800a, 11: 0x000a}, {5000: 0x8001}} {
			if _, err := New(Config{Device: tap.NewMem(1), Port: a.port, Partitions: bad}); err == nil {
				t.Errorf("partitions %v accepted", bad)
			}
		}
	})
}

// countingDev is a device whose Counters are fixed, as a TAP's.
type countingDev struct {
	tap.Device
	m map[string]uint64
}

func (d countingDev) Counters() map[string]uint64 { return d.m }

// TestStats: every number of the snapshot is declared once with a help
// line. The levels (table sizes, queue depths) are levels and the totals
// totals. Counters holds exactly Stats' numbers. A level the port
// reports is a level on the first snapshot (declared by the port, not
// learned from an earlier call), its stats totals; so are the TAP's
// offload states (tap.IsLevel), its other counters totals.
func TestStats(t *testing.T) {
	f := memFab(t, 2048)
	lp := &levelPort{levels: map[string]uint64{"address_handles": 7}}
	s, _ := stillShim(t, f.Fabric, "fe80::a", func(c *Config) {
		lp.Port = c.Port
		c.Port = lp
		c.Device = countingDev{c.Device, map[string]uint64{"gro": 1, "uso": 0, "gso_frames_read": 3}}
	})
	st := s.Stats()
	kinds := map[string]stat.Kind{}
	for _, v := range st {
		if _, dup := kinds[v.Name]; dup {
			t.Errorf("%s is in Stats twice", v.Name)
		}
		kinds[v.Name] = v.Kind
		if v.Help == "" {
			t.Errorf("%s has no help", v.Name)
		}
	}
	levels := []string{"vifs", "vifs_pending", "neighbours", "groups", "groups_send_only", "snooped_groups", "pending", "pending_frames", "port_address_handles", "tap_gro", "tap_uso"}
	for _, name := range levels {
		if k, ok := kinds[name]; !ok || k != stat.Level {
			t.Errorf("%s is a level but Stats has it as %v (present: %v)", name, k, ok)
		}
	}
	nLevels := 0
	for _, k := range kinds {
		if k == stat.Level {
			nLevels++
		}
	}
	if nLevels != len(levels) {
		t.Errorf("Stats has %d levels, want the %d declared: %v", nLevels, len(levels), kinds)
	}
	for _, name := range []string{"tx_frames", "drop_unresolved", "groups_send_only_evicted", "port_rx_packets", "port_tx_trains", "tx_rewrite_truncated", "rx_rewrite_bad_checksum", "tap_gso_frames_read"} {
		if k, ok := kinds[name]; !ok || k != stat.Total {
			t.Errorf("%s is a total but Stats has it as %v (present: %v)", name, k, ok)
		}
	}
	c := s.Counters()
	if len(c) != len(st) {
		t.Errorf("Counters has %d names, Stats %d", len(c), len(st))
	}
	for _, v := range st {
		if got, ok := c[v.Name]; !ok || got != v.Value {
			t.Errorf("Counters[%s] = %d (present: %v), Stats says %d", v.Name, got, ok, v.Value)
		}
	}
	if c["port_address_handles"] != 7 || c["port_tx_trains"] != 3 {
		t.Errorf("port_address_handles = %d, port_tx_trains = %d, want the port's 7 and 3", c["port_address_handles"], c["port_tx_trains"])
	}
	for k := Counter(0); k < numCounters; k++ {
		if k.String() == "" || counterTable[k].Kind != stat.Total {
			t.Errorf("counter %d: name %q, kind %v, want a named total", k, k.String(), counterTable[k].Kind)
		}
	}
}

// levelPort is a port that reports levels and stats beside its own
// counters.
type levelPort struct {
	ipoib.Port
	levels map[string]uint64
}

func (p *levelPort) Counters() ipoib.PortCounters {
	c := p.Port.Counters()
	c.Levels = p.levels
	c.Stats = map[string]uint64{"tx_trains": 3}
	return c
}

// TestQueriesWhenCarrierReturns: when the port comes back after being
// down, the shim sends general queries (IGMP and MLD) at once, not at the
// next query interval. A Linux bridge drops the TAP from its multicast
// router ports when the carrier goes. It would keep guests' multicast
// from it until it hears a query. The clock never moves here, so only the
// carrier's return can cause them.
func TestQueriesWhenCarrierReturns(t *testing.T) {
	f := memFab(t, 2048)
	h := newHV(t, f, "fe80::a", nil)
	dp := h.port.(*memfabric.Port)
	testutil.WaitFor(t, "the 2 start-up queries", func() bool { return h.s.Get(TxQueries) == 2 })
	dp.SetDown(true)
	testutil.WaitFor(t, "the carrier to go with the port", func() bool { return !h.dev.Carrier() })
	if n := h.s.Get(TxQueries); n != 2 {
		t.Fatalf("%d queries with the port down, want the 2 of the start", n)
	}
	dp.SetDown(false)
	testutil.WaitFor(t, "the carrier to come back with the port", h.dev.Carrier)
	testutil.WaitFor(t, "4 queries (the start's 2, then 2 as the carrier came back)", func() bool { return h.s.Get(TxQueries) == 4 })
	igmp, mld := 0, 0
	for len(h.dev.Sent()) > 0 {
		p := gopacket.NewPacket(<-h.dev.Sent(), layers.LayerTypeEthernet, gopacket.Default)
		switch {
		case p.Layer(layers.LayerTypeMLDv2MulticastListenerQuery) != nil:
			mld++
		case isQuery(p):
			igmp++
		}
	}
	if igmp != 2 || mld != 2 {
		t.Errorf("delivered %d IGMP and %d MLD queries, want 2 each (start, carrier back)", igmp, mld)
	}
}
