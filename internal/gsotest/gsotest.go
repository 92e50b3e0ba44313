// Package gsotest builds TCP and UDP super-packets as a guest with TSO
// or UDP_SEGMENT hands them over and checks the segments cut from them,
// for the tests of every package that cuts them (tap, the ports, the
// shim).
package gsotest

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
)

// Seq is the sequence number of a super-packet's first byte.
const Seq = 1000

// Super returns link (the link header, copied as is) followed by an IPv4
// or IPv6 TCP packet carrying payload with ACK|PSH. It goes from
// 10.0.0.1 / fd00::1 port 40000 to 10.0.0.2 / fd00::2 port 5201. Its TCP
// checksum field holds the pseudo-header sum over the whole TCP length,
// as Linux leaves it for TSO. l4 is the TCP header's offset.
func Super(tb testing.TB, link []byte, v6 bool, payload []byte) (pkt []byte, l4 int) {
	tb.Helper()
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 5201, Seq: Seq, Ack: 777, Window: 500, ACK: true, PSH: true,
		Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: []byte{0, 0, 0, 1, 0, 0, 0, 2}}}}
	var ip gopacket.SerializableLayer
	if v6 {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}
		tcp.SetNetworkLayerForChecksum(ip6)
		ip, l4 = ip6, len(link)+header.IPv6Len
	} else {
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Id: 7, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolTCP,
			SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
		tcp.SetNetworkLayerForChecksum(ip4)
		ip, l4 = ip4, len(link)+header.IPv4MinLen
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tcp, gopacket.Payload(payload)); err != nil {
		tb.Fatal(err)
	}
	pkt = append(append([]byte(nil), link...), buf.Bytes()...)
	var sum uint32
	if v6 {
		h := header.IPv6(pkt[len(link):])
		sum = csum.Pseudo(h.SrcBytes(), h.DstBytes(), header.ProtoTCP, len(pkt)-l4)
	} else {
		h := header.IPv4(pkt[len(link):])
		sum = csum.Pseudo(h.SrcBytes(), h.DstBytes(), header.ProtoTCP, len(pkt)-l4)
	}
	header.TCP(pkt[l4:]).SetChecksum(^csum.Fold(sum))
	return pkt, l4
}

// Reassemble checks segments cut from a packet built by Super as a
// receiver would; each starts with the same link header of length l3.
// Each IP packet must be at most mtu bytes with a correct length, IPv4
// header checksum and TCP checksum. Sequence numbers must follow on from
// Seq, PSH must be on the last segment only, and link headers equal. It
// returns the payload they carry, in order.
func Reassemble(tb testing.TB, segs [][]byte, l3 int, v6 bool, mtu int) []byte {
	tb.Helper()
	var out []byte
	for i, s := range segs {
		if len(s)-l3 > mtu {
			tb.Fatalf("segment %d: IP packet of %d bytes, MTU %d", i, len(s)-l3, mtu)
		}
		if !bytes.Equal(s[:l3], segs[0][:l3]) {
			tb.Fatalf("segment %d: link header %x, first %x", i, s[:l3], segs[0][:l3])
		}
		var l4 int
		var sum uint32
		if v6 {
			ip, ok := header.ParseIPv6(s[l3:])
			if !ok || len(ip) != len(s)-l3 {
				tb.Fatalf("segment %d: bad IPv6 length", i)
			}
			l4 = l3 + header.IPv6Len
			sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(s)-l4)
		} else {
			ip, ok := header.ParseIPv4(s[l3:])
			if !ok || len(ip) != len(s)-l3 || csum.Fold(csum.Sum(0, ip[:ip.HeaderLen()])) != 0 {
				tb.Fatalf("segment %d: bad IPv4 header", i)
			}
			l4 = l3 + ip.HeaderLen()
			sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(s)-l4)
		}
		if csum.Fold(csum.Sum(sum, s[l4:])) != 0 {
			tb.Fatalf("segment %d: TCP checksum does not verify", i)
		}
		tcp, ok := header.ParseTCP(s[l4:])
		if !ok {
			tb.Fatalf("segment %d: bad TCP header", i)
		}
		if tcp.Seq() != Seq+uint32(len(out)) {
			tb.Fatalf("segment %d: seq %d, want %d", i, tcp.Seq(), Seq+len(out))
		}
		if psh := tcp.Flags()&header.TCPFlagPSH != 0; psh != (i == len(segs)-1) {
			tb.Fatalf("segment %d of %d: PSH %v", i, len(segs), psh)
		}
		out = append(out, s[l4+tcp.HeaderLen():]...)
	}
	return out
}

// Pattern returns n bytes that differ from one offset to the next, so a
// misplaced or repeated chunk shows.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// UDP ports and the IPv4 ID of the datagrams SuperUDP builds.
const (
	UDPSrcPort = 40001
	UDPDstPort = 5202
	UDPID      = 7
)

// Datagram returns link followed by an IPv4 or IPv6 UDP datagram
// carrying payload, from 10.0.0.1 / fd00::1 port UDPSrcPort to 10.0.0.2
// / fd00::2 port UDPDstPort. It has the IPv4 ID id, and its lengths and
// checksums are computed by gopacket. It is what a guest sends one
// datagram at a time, and what cutting a super-packet must give byte for
// byte.
func Datagram(tb testing.TB, link []byte, v6 bool, id uint16, payload []byte) []byte {
	tb.Helper()
	udp := &layers.UDP{SrcPort: UDPSrcPort, DstPort: UDPDstPort}
	var ip gopacket.SerializableLayer
	if v6 {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}
		udp.SetNetworkLayerForChecksum(ip6)
		ip = ip6
	} else {
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Id: id, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
			SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
		udp.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, gopacket.Payload(payload)); err != nil {
		tb.Fatal(err)
	}
	return append(append([]byte(nil), link...), buf.Bytes()...)
}

// SuperUDP returns the UDP super-packet a guest's UDP_SEGMENT send of
// payload hands over (Linux's SKB_GSO_UDP_L4 skb). It has the headers of
// Datagram with the IPv4 ID UDPID and the whole payload. The UDP length
// is the whole UDP length, and the checksum field holds the
// pseudo-header sum over it (CHECKSUM_PARTIAL). l4 is the UDP header's
// offset.
func SuperUDP(tb testing.TB, link []byte, v6 bool, payload []byte) (pkt []byte, l4 int) {
	tb.Helper()
	pkt = Datagram(tb, link, v6, UDPID, payload)
	var sum uint32
	if v6 {
		l4 = len(link) + header.IPv6Len
		h := header.IPv6(pkt[len(link):])
		sum = csum.Pseudo(h.SrcBytes(), h.DstBytes(), header.ProtoUDP, len(pkt)-l4)
	} else {
		l4 = len(link) + header.IPv4MinLen
		h := header.IPv4(pkt[len(link):])
		sum = csum.Pseudo(h.SrcBytes(), h.DstBytes(), header.ProtoUDP, len(pkt)-l4)
	}
	binary.BigEndian.PutUint16(pkt[l4+6:], ^csum.Fold(sum))
	return pkt, l4
}

// CheckUDPCut checks datagrams cut from SuperUDP(link, v6, payload) into
// size-byte payloads, byte for byte against Datagram: IPv4 IDs following
// on from UDPID, each datagram its own lengths and checksums.
func CheckUDPCut(tb testing.TB, dgrams [][]byte, link []byte, v6 bool, payload []byte, size int) {
	tb.Helper()
	want := (len(payload) + size - 1) / size
	if len(dgrams) != want {
		tb.Fatalf("%d datagrams, want %d", len(dgrams), want)
	}
	for i, d := range dgrams {
		exp := Datagram(tb, link, v6, UDPID+uint16(i), payload[i*size:min((i+1)*size, len(payload))])
		if !bytes.Equal(d, exp) {
			tb.Fatalf("datagram %d of %d:\n got %x\nwant %x", i, want, d, exp)
		}
	}
}
