package shim

import (
	"encoding/binary"

	"github.com/eipoib/eipoibd/internal/header"
)

// TCP options (RFC 9293 §3.2).
const (
	tcpOptEnd = 0
	tcpOptNOP = 1
	tcpOptMSS = 2
)

// clampMSS lowers the MSS option of a TCP SYN in the IP packet pay (IPv4
// or IPv6, already checked by ipBounds) to fit mtu, the IPoIB MTU of its
// partition. That serves guests that do not do path MTU discovery. It
// fixes the TCP checksum incrementally (RFC 1624, eqn. 3), and reports
// whether it changed the packet.
func (s *Shim) clampMSS(pay []byte, v6 bool, mtu int) bool {
	var l4 []byte
	max := mtu - header.TCPMinLen
	if v6 {
		ip := header.IPv6(pay)
		if ip.NextHeader() != header.ProtoTCP {
			return false
		}
		l4, max = ip.Payload(), max-header.IPv6Len
	} else {
		ip := header.IPv4(pay)
		if ip.Protocol() != header.ProtoTCP || ip.FragmentOffset() != 0 || ip.MoreFragments() {
			return false
		}
		l4, max = ip.Payload(), max-header.IPv4MinLen
	}
	tcp, ok := header.ParseTCP(l4)
	if !ok || tcp.Flags()&header.TCPFlagSYN == 0 {
		return false
	}
	opts := tcp[header.TCPMinLen:tcp.HeaderLen()]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case tcpOptEnd:
			return false
		case tcpOptNOP:
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return false // malformed: leave it to the receiver
		}
		if opts[i] == tcpOptMSS && opts[i+1] == 4 {
			old := binary.BigEndian.Uint16(opts[i+2:])
			if int(old) <= max {
				return false
			}
			binary.BigEndian.PutUint16(opts[i+2:], uint16(max))
			// HC' = ~(~HC + ~m + m'), with m and m' as the 16-bit words
			// of the checksum's alignment: byte-swapped when the value
			// sits at an odd offset (after a lone NOP).
			m, m2 := old, uint16(max)
			if (header.TCPMinLen+i+2)%2 == 1 {
				m, m2 = m<<8|m>>8, m2<<8|m2>>8
			}
			c := ^binary.BigEndian.Uint16(tcp[header.TCPChecksumOff:])
			sum := uint32(c) + uint32(^m) + uint32(m2)
			sum = sum&0xffff + sum>>16
			sum = sum&0xffff + sum>>16
			tcp.SetChecksum(^uint16(sum))
			return true
		}
		i += int(opts[i+1])
	}
	return false
}
