package shim

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/internal/header"
)

// synPacket builds a TCP segment with the given flags and MSS option (0:
// none) in an IPv4 or IPv6 packet, checksums computed by gopacket.
func synPacket(t testing.TB, v6, syn bool, mss uint16) []byte {
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 5001, SYN: syn, ACK: !syn, Window: 64240, Options: []layers.TCPOption{
		{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}},
	}}
	if mss != 0 {
		tcp.Options = append(tcp.Options, layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: binary.BigEndian.AppendUint16(nil, mss)})
	}
	var ip gopacket.SerializableLayer
	if v6 {
		l := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: net.ParseIP("fd77::11"), DstIP: net.ParseIP("fd77::21")}
		tcp.SetNetworkLayerForChecksum(l)
		ip = l
	} else {
		l := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolTCP, SrcIP: net.IPv4(10, 77, 0, 11), DstIP: net.IPv4(10, 77, 0, 21)}
		tcp.SetNetworkLayerForChecksum(l)
		ip = l
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tcp); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tcpSegment returns the TCP segment of an IP packet and whether its
// checksum verifies.
func tcpSegment(et uint16, pkt []byte) (header.TCP, bool) {
	if et == ether.TypeIPv4 {
		ip := header.IPv4(pkt)
		seg := ip.Payload()
		return header.TCP(seg), csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(seg)), seg)) == 0
	}
	ip := header.IPv6(pkt)
	seg := ip.Payload()
	return header.TCP(seg), csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(seg)), seg)) == 0
}

// mssOf returns the MSS option of a segment built by synPacket.
func mssOf(tcp header.TCP) uint16 { return binary.BigEndian.Uint16(tcp[header.TCPMinLen+4+2:]) }

// TestClampMSS: a SYN's MSS above the IPoIB MTU's is lowered to MTU − 40
// (IPv4) or − 60 (IPv6) with a checksum that still verifies; a lower MSS,
// a segment without SYN and a SYN without the option are left alone.
func TestClampMSS(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		et, want := uint16(ether.TypeIPv4), uint16(4092-40)
		if v6 {
			et, want = ether.TypeIPv6, 4092-60
		}
		p := synPacket(t, v6, true, 8960)
		if !clampMSS(et, p, 4092) {
			t.Fatalf("v6 %v: SYN with MSS 8960 not clamped", v6)
		}
		tcp, ok := tcpSegment(et, p)
		if got := mssOf(tcp); got != want || !ok {
			t.Errorf("v6 %v: MSS %d, checksum good %v; want %d, true", v6, got, ok, want)
		}
		for name, q := range map[string][]byte{
			"low MSS": synPacket(t, v6, true, 1460), "no SYN": synPacket(t, v6, false, 8960), "no option": synPacket(t, v6, true, 0),
		} {
			orig := string(q)
			if clampMSS(et, q, 4092) || string(q) != orig {
				t.Errorf("v6 %v: %s: changed", v6, name)
			}
		}
	}
}

// FuzzClampMSS: any IPv4 or IPv6 packet that ipBounds accepts is either
// left untouched or clamped with its TCP checksum as good as before.
func FuzzClampMSS(f *testing.F) {
	f.Add(synPacket(f, false, true, 8960), false)
	f.Add(synPacket(f, true, true, 65000), true)
	f.Add(synPacket(f, false, true, 1000), false)
	f.Fuzz(func(t *testing.T, b []byte, v6 bool) {
		et := uint16(ether.TypeIPv4)
		if v6 {
			et = ether.TypeIPv6
		}
		pay, ok := ipBounds(et, b)
		if !ok {
			return
		}
		orig := append([]byte(nil), pay...)
		_, goodBefore := tcpSegmentOK(et, orig)
		if !clampMSS(et, pay, 2044) {
			if string(pay) != string(orig) {
				t.Fatal("changed but reported unchanged")
			}
			return
		}
		if _, goodAfter := tcpSegmentOK(et, pay); goodAfter != goodBefore {
			t.Fatalf("checksum good before %v, after %v", goodBefore, goodAfter)
		}
	})
}

// tcpSegmentOK is tcpSegment for arbitrary input: ok is false when the
// packet holds no whole TCP header.
func tcpSegmentOK(et uint16, pkt []byte) (header.TCP, bool) {
	if et == ether.TypeIPv4 && (header.IPv4(pkt).Protocol() != header.ProtoTCP) ||
		et == ether.TypeIPv6 && header.IPv6(pkt).NextHeader() != header.ProtoTCP {
		return nil, false
	}
	return tcpSegment(et, pkt)
}
