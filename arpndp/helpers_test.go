package arpndp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// mapTr is a fixed two-way translation for tests.
type mapTr struct {
	e2i map[ether.MAC]ipoib.HwAddr
	i2e map[ipoib.HwAddr]ether.MAC
}

func (m *mapTr) EthToIB(mac ether.MAC) (ipoib.HwAddr, bool) { h, ok := m.e2i[mac]; return h, ok }
func (m *mapTr) IBToEth(h ipoib.HwAddr) (ether.MAC, bool)   { e, ok := m.i2e[h]; return e, ok }

var (
	guestMAC  = ether.MAC{0x52, 0x54, 0, 0, 0, 1}
	remoteMAC = ether.MAC{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}
	guestHw   = ipoib.MakeHwAddr(0, 0x148, testutil.GID("fe80::1"))
	remoteHw  = ipoib.MakeHwAddr(0, 0x249, testutil.GID("fe80::2"))
)

func newTr() *mapTr {
	return &mapTr{
		e2i: map[ether.MAC]ipoib.HwAddr{guestMAC: guestHw, remoteMAC: remoteHw},
		i2e: map[ipoib.HwAddr]ether.MAC{guestHw: guestMAC, remoteHw: remoteMAC},
	}
}

// roomy returns a copy of b with spare capacity to grow into.
func roomy(b []byte) []byte { return append(make([]byte, 0, len(b)+256), b...) }

// option is one NDP option as raw bytes.
func ethOpt(typ byte, m ether.MAC) []byte { return append([]byte{typ, 1}, m[:]...) }

func ibOpt(typ byte, h ipoib.HwAddr) []byte { return append([]byte{typ, 3, 0, 0}, h[:]...) }

var (
	srcIP = netip.MustParseAddr("fd00::1")
	dstIP = netip.MustParseAddr("fd00::2")
)

// ndpPacket builds IPv6 + ICMPv6 of type typ with body (the fixed part
// after the 4-byte ICMPv6 header) and options, with a correct checksum.
func ndpPacket(typ byte, body []byte, opts ...[]byte) []byte {
	icmp := append([]byte{typ, 0, 0, 0}, body...)
	for _, o := range opts {
		icmp = append(icmp, o...)
	}
	p := make([]byte, 40, 40+len(icmp))
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(len(icmp)))
	p[6], p[7] = 58, 255
	s, d := srcIP.As16(), dstIP.As16()
	copy(p[8:24], s[:])
	copy(p[24:40], d[:])
	p = append(p, icmp...)
	finishICMPv6(p)
	return p
}

// ndpBodies are the fixed parts (after type, code, checksum) per type.
func ndpBodies() map[byte][]byte {
	target := dstIP.As16()
	return map[byte][]byte{
		TypeRouterSolicitation:    make([]byte, 4),
		TypeRouterAdvertisement:   {64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0},
		TypeNeighborSolicitation:  append(make([]byte, 4), target[:]...),
		TypeNeighborAdvertisement: append([]byte{0x60, 0, 0, 0}, target[:]...),
		TypeRedirect:              append(append(make([]byte, 4), target[:]...), target[:]...),
	}
}

// checkICMPv6 verifies the checksum and lengths with gopacket, an
// implementation independent of ours.
func checkICMPv6(t testing.TB, pkt []byte) {
	t.Helper()
	p := gopacket.NewPacket(pkt, layers.LayerTypeIPv6, gopacket.Default)
	if el := p.ErrorLayer(); el != nil {
		t.Fatalf("gopacket: %v", el.Error())
	}
	ip := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	if int(ip.Length) != len(pkt)-40 {
		t.Fatalf("payload length %d, packet %d", ip.Length, len(pkt))
	}
	icmp, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	if !ok {
		t.Fatal("gopacket found no ICMPv6")
	}
	if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	if err, res := icmp.VerifyChecksum(); err != nil || !res.Valid {
		t.Fatalf("ICMPv6 checksum: %v %+v", err, res)
	}
}

// dhcpRequest builds an Ethernet guest's DHCPDISCOVER with gopacket.
func dhcpRequest(t testing.TB, withClientID bool) []byte {
	t.Helper()
	d := &layers.DHCPv4{
		Operation:    layers.DHCPOpRequest,
		HardwareType: layers.LinkTypeEthernet,
		HardwareLen:  6,
		Xid:          0x12345678,
		ClientHWAddr: guestMAC[:],
		Options: layers.DHCPOptions{
			layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(layers.DHCPMsgTypeDiscover)}),
		},
	}
	if withClientID {
		d.Options = append(d.Options, layers.NewDHCPOption(layers.DHCPOptClientID, append([]byte{1}, guestMAC[:]...)))
	}
	return serializeDHCP(t, d, 68, 67, "0.0.0.0", "255.255.255.255")
}

// dhcpReply builds a server's DHCPOFFER to an IPoIB client (RFC 4390).
func dhcpReply(t testing.TB) []byte {
	t.Helper()
	d := &layers.DHCPv4{
		Operation:    layers.DHCPOpReply,
		HardwareType: layers.LinkType(HwTypeInfiniBand),
		HardwareLen:  0,
		Flags:        0x8000,
		Xid:          0x12345678,
		YourClientIP: netip.MustParseAddr("10.0.0.50").AsSlice(),
		ClientHWAddr: []byte{},
		Options: layers.DHCPOptions{
			layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(layers.DHCPMsgTypeOffer)}),
			layers.NewDHCPOption(layers.DHCPOptClientID, append([]byte{1}, guestMAC[:]...)),
		},
	}
	return serializeDHCP(t, d, 67, 68, "10.0.0.1", "255.255.255.255")
}

// dhcpOfLength returns an Ethernet guest's DHCPDISCOVER without a
// client-identifier, grown with PAD options to n bytes of IPv4.
func dhcpOfLength(t testing.TB, n int) []byte {
	t.Helper()
	req := dhcpRequest(t, false)
	endOpt := len(req) - 1
	for req[endOpt] != optEnd {
		endOpt--
	}
	b := make([]byte, 0, n+256)
	b = append(b, req[:endOpt]...)
	b = append(b, make([]byte, n-len(req))...)
	b = append(b, req[endOpt:]...)
	binary.BigEndian.PutUint16(b[2:4], uint16(n))
	binary.BigEndian.PutUint16(b[24:26], uint16(n-20))
	csum.IPv4Header(b[:20])
	b[26], b[27] = 0, 0
	m := dhcpMsg{ihl: 20, end: n}
	binary.BigEndian.PutUint16(b[26:28], udpSum(b, m))
	return b
}

func serializeDHCP(t testing.TB, d *layers.DHCPv4, sp, dp int, src, dst string) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: netip.MustParseAddr(src).AsSlice(), DstIP: netip.MustParseAddr(dst).AsSlice()}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sp), DstPort: layers.UDPPort(dp)}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, d); err != nil {
		t.Fatal(err)
	}
	return roomy(buf.Bytes())
}

// checkUDP verifies IPv4 and UDP checksums and lengths with gopacket and
// returns the decoded DHCP layer.
func checkUDP(t testing.TB, pkt []byte) *layers.DHCPv4 {
	t.Helper()
	p := gopacket.NewPacket(pkt, layers.LayerTypeIPv4, gopacket.Default)
	if el := p.ErrorLayer(); el != nil {
		t.Fatalf("gopacket: %v", el.Error())
	}
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if err, res := ip.VerifyChecksum(); err != nil || !res.Valid {
		t.Fatalf("IPv4 checksum: %v %+v", err, res)
	}
	if int(ip.Length) != len(pkt) {
		t.Fatalf("IPv4 length %d, packet %d", ip.Length, len(pkt))
	}
	udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	if err, res := udp.VerifyChecksum(); err != nil || !res.Valid {
		t.Fatalf("UDP checksum: %v %+v", err, res)
	}
	if int(udp.Length) != len(pkt)-int(ip.IHL)*4 {
		t.Fatalf("UDP length %d", udp.Length)
	}
	d, ok := p.Layer(layers.LayerTypeDHCPv4).(*layers.DHCPv4)
	if !ok {
		t.Fatal("gopacket found no DHCPv4")
	}
	return d
}
