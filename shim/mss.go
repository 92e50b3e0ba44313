package shim

// MSS clamping (Config.ClampMSS): guests whose path MTU discovery is off
// or broken send TCP segments sized for their own MTU. Lowering the MSS
// option of their SYNs and SYN-ACKs to what fits the IPoIB MTU makes
// both ends send segments that cross the fabric whole.

import (
	"encoding/binary"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/internal/header"
)

// TCP option kinds (RFC 9293 §3.2).
const (
	tcpOptEnd    = 0
	tcpOptNOP    = 1
	tcpOptMSS    = 2
	tcpOptMSSLen = 4
)

// clampMSS lowers the MSS option of a TCP SYN in pay (an IP packet
// checked by ipBounds) to the largest segment that fits ipMTU with
// minimal headers (MTU − 40 for IPv4, − 60 for IPv6), and fixes the TCP
// checksum incrementally (RFC 1624). It reports whether it changed the
// packet; anything but an unfragmented TCP SYN with a well-formed MSS
// option above the limit is left as it is.
func clampMSS(et uint16, pay []byte, ipMTU int) bool {
	var seg []byte
	var limit int
	switch et {
	case ether.TypeIPv4:
		ip := header.IPv4(pay)
		if ip.Protocol() != header.ProtoTCP || ip.FragmentOffset() != 0 || ip.MoreFragments() {
			return false
		}
		seg, limit = ip.Payload(), ipMTU-header.IPv4MinLen-header.TCPMinLen
	case ether.TypeIPv6:
		ip := header.IPv6(pay)
		if ip.NextHeader() != header.ProtoTCP {
			return false
		}
		seg, limit = ip.Payload(), ipMTU-header.IPv6Len-header.TCPMinLen
	default:
		return false
	}
	tcp, ok := header.ParseTCP(seg)
	if !ok || tcp.Flags()&header.TCPFlagSYN == 0 {
		return false
	}
	for opts := tcp[header.TCPMinLen:tcp.HeaderLen()]; len(opts) > 0; {
		switch {
		case opts[0] == tcpOptEnd:
			return false
		case opts[0] == tcpOptNOP:
			opts = opts[1:]
			continue
		case len(opts) < 2 || opts[1] < 2 || int(opts[1]) > len(opts):
			return false
		case opts[0] == tcpOptMSS && opts[1] == tcpOptMSSLen:
			old := binary.BigEndian.Uint16(opts[2:])
			if int(old) <= limit {
				return false
			}
			binary.BigEndian.PutUint16(opts[2:], uint16(limit))
			sum := binary.BigEndian.Uint16(tcp[header.TCPChecksumOff:])
			tcp.SetChecksum(csum.Fold(uint32(^sum) + uint32(^old) + uint32(limit)))
			return true
		}
		opts = opts[opts[1]:]
	}
	return false
}
