package shim

import (
	"encoding/binary"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/header"
)

// synPacket is an IP packet with a TCP segment carrying opts, with a
// valid checksum.
func synPacket(t *testing.T, v6, syn bool, opts []layers.TCPOption) []byte {
	t.Helper()
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 5201, Seq: 1, SYN: syn, ACK: !syn, Window: 64000, Options: opts}
	var ip gopacket.SerializableLayer
	if v6 {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: []byte{0xfd, 15: 1}, DstIP: []byte{0xfd, 15: 2}}
		tcp.SetNetworkLayerForChecksum(ip6)
		ip = ip6
	} else {
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: ipA1.AsSlice(), DstIP: ipB1.AsSlice()}
		tcp.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	}
	return serialize(t, ip, tcp)
}

func mssOpt(v uint16) layers.TCPOption {
	return layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: binary.BigEndian.AppendUint16(nil, v)}
}

// tcpChecksumOK verifies the TCP checksum of an IP packet.
func tcpChecksumOK(pay []byte, v6 bool) bool {
	var src, dst, l4 []byte
	if v6 {
		ip := header.IPv6(pay)
		src, dst, l4 = ip.SrcBytes(), ip.DstBytes(), ip.Payload()
	} else {
		ip := header.IPv4(pay)
		src, dst, l4 = ip.SrcBytes(), ip.DstBytes(), ip.Payload()
	}
	return csum.Fold(csum.Sum(csum.Pseudo(src, dst, header.ProtoTCP, len(l4)), l4)) == 0
}

// TestClampMSS: a SYN's MSS above what the IPoIB MTU carries (4092 less
// the IP and TCP headers) is lowered to it, and the checksum still
// verifies. That holds with the MSS option at an even and at an odd
// offset, IPv4 and IPv6. A smaller MSS, a segment that is no SYN, a SYN
// without the option and one whose options end first are left alone.
func TestClampMSS(t *testing.T) {
	f, _ := memfabric.New(4096)
	s, _ := stillShim(t, f, "fe80::a", func(c *Config) { c.ClampMSS = true })
	nop := layers.TCPOption{OptionType: layers.TCPOptionKindNop, OptionLength: 1}
	ws := layers.TCPOption{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}
	for _, v6 := range []bool{false, true} {
		want, first := uint16(4092-20-20), layers.LayerTypeIPv4
		if v6 {
			want, first = 4092-40-20, layers.LayerTypeIPv6
		}
		for name, opts := range map[string][]layers.TCPOption{
			"even": {mssOpt(8960), ws, nop},
			"odd":  {nop, mssOpt(8960), ws},
		} {
			pay := synPacket(t, v6, true, opts)
			if !s.clampMSS(pay, v6, s.ipMTU) {
				t.Fatalf("v6 %v %s: not clamped", v6, name)
			}
			tcp := gopacket.NewPacket(pay, first, gopacket.Default).Layer(layers.LayerTypeTCP).(*layers.TCP)
			var mss uint16
			for _, o := range tcp.Options {
				if o.OptionType == layers.TCPOptionKindMSS {
					mss = binary.BigEndian.Uint16(o.OptionData)
				}
			}
			if mss != want || !tcpChecksumOK(pay, v6) {
				t.Fatalf("v6 %v %s: MSS %d (want %d), checksum ok %v", v6, name, mss, want, tcpChecksumOK(pay, v6))
			}
		}
		for name, pay := range map[string][]byte{
			"small MSS":  synPacket(t, v6, true, []layers.TCPOption{mssOpt(1400)}),
			"not a SYN":  synPacket(t, v6, false, []layers.TCPOption{mssOpt(8960)}),
			"no MSS":     synPacket(t, v6, true, []layers.TCPOption{ws, nop}),
			"option end": synPacket(t, v6, true, []layers.TCPOption{{OptionType: layers.TCPOptionKindEndList, OptionLength: 1}, nop, nop, mssOpt(8960)}),
		} {
			before := string(pay)
			if s.clampMSS(pay, v6, s.ipMTU) || string(pay) != before {
				t.Fatalf("v6 %v %s: changed", v6, name)
			}
		}
	}
}

// FuzzClampMSS: any TCP options in a SYN never crash the clamp, and a
// packet it changes keeps a valid checksum.
func FuzzClampMSS(f *testing.F) {
	f.Add([]byte{2, 4, 0x23, 0x00, 1, 3, 3, 7}, false)
	f.Add([]byte{1, 2, 4, 0x23, 0x00, 0, 0, 0}, true)
	f.Add([]byte{2, 0, 2, 4}, false)
	mf, _ := memfabric.New(4096)
	s, _ := stillShim(f, mf, "fe80::a", func(c *Config) { c.ClampMSS = true })
	f.Fuzz(func(t *testing.T, opts []byte, v6 bool) {
		if len(opts) > 40 || len(opts)%4 != 0 {
			return
		}
		// A SYN without options, the fuzzed ones spliced in.
		pay := synPacket(t, v6, true, nil)
		l3 := header.IPv4MinLen
		if v6 {
			l3 = header.IPv6Len
		}
		pkt := append(append(append([]byte(nil), pay[:l3+header.TCPMinLen]...), opts...), pay[l3+header.TCPMinLen:]...)
		pkt[l3+12] = byte((header.TCPMinLen+len(opts))/4) << 4
		var src, dst []byte
		if v6 {
			ip := header.IPv6(pkt)
			ip.SetPayloadLen(len(pkt) - l3)
			src, dst = ip.SrcBytes(), ip.DstBytes()
		} else {
			ip := header.IPv4(pkt)
			ip.SetTotalLen(len(pkt))
			ip.SetChecksum()
			src, dst = ip.SrcBytes(), ip.DstBytes()
		}
		tcp := header.TCP(pkt[l3:])
		tcp.SetChecksum(0)
		tcp.SetChecksum(csum.Fold(csum.Sum(csum.Pseudo(src, dst, header.ProtoTCP, len(tcp)), tcp)))
		if s.clampMSS(pkt, v6, s.ipMTU) && !tcpChecksumOK(pkt, v6) {
			t.Fatalf("options %x: clamped, checksum broken", opts)
		}
	})
}
