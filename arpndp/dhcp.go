package arpndp

// DHCPv4 over IPoIB (RFC 4390). An IPoIB client sends htype 32, hlen 0, a
// zero chaddr and a client-identifier, and has its replies broadcast
// because the server cannot address a 20-byte link address. Ethernet
// guests' DHCP must still work across the fabric: their requests get the
// BROADCAST flag (RFC 2131 §4.1), optionally the full RFC 4390
// translation, and replies are restored for the Ethernet guest. pkt starts
// at the IPv4 header everywhere here; the IPv4 and UDP checksums are
// checked before and fixed after a rewrite.

import (
	"encoding/binary"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/ether"
)

// DHCP/BOOTP constants.
const (
	PortDHCPServer = 67
	PortDHCPClient = 68

	bootpFixedLen = 236 // op … file, RFC 2131 §2
	dhcpMinLen    = bootpFixedLen + 4
	optClientID   = 61
	optPad        = 0
	optEnd        = 255
	protoUDP      = 17
	clientIDLen   = 2 + 1 + 6 // code, length, type 1 + MAC
	flagBroadcast = 0x8000
	bootRequest   = 1
	bootReply     = 2
)

var magicCookie = [4]byte{99, 130, 83, 99}

// dhcpMsg holds the offsets of a validated DHCP packet.
type dhcpMsg struct {
	ihl      int // IPv4 header length
	bootp    int // start of the BOOTP message
	end      int // IPv4 total length
	endOpt   int // the END option
	clientID int // the client-identifier option, or -1
}

// parseDHCP validates IPv4, UDP, the DHCP fixed part, the options and
// the checksums.
func parseDHCP(pkt []byte) (m dhcpMsg, err error) {
	if len(pkt) < 20 {
		return m, ErrTruncated
	}
	if pkt[0]>>4 != 4 || pkt[9] != protoUDP {
		return m, ErrNotDHCP
	}
	m.ihl = int(pkt[0]&0x0f) * 4
	m.end = int(binary.BigEndian.Uint16(pkt[2:4]))
	if m.ihl < 20 || m.end < m.ihl+8 {
		return m, ErrBadLength
	}
	if m.end > len(pkt) {
		return m, ErrTruncated
	}
	if binary.BigEndian.Uint16(pkt[6:8])&0x3fff != 0 {
		return m, ErrNotDHCP // a fragment
	}
	udp := pkt[m.ihl:]
	sp, dp := binary.BigEndian.Uint16(udp[0:2]), binary.BigEndian.Uint16(udp[2:4])
	if !(sp == PortDHCPClient && dp == PortDHCPServer) && !(sp == PortDHCPServer && dp == PortDHCPClient) {
		return m, ErrNotDHCP
	}
	if int(binary.BigEndian.Uint16(udp[4:6])) != m.end-m.ihl {
		return m, ErrBadLength
	}
	if csum.Fold(csum.Sum(0, pkt[:m.ihl])) != 0 || !udpChecksumOK(pkt, m) {
		return m, ErrBadChecksum
	}
	m.bootp = m.ihl + 8
	if m.end-m.bootp < dhcpMinLen {
		return m, ErrTruncated
	}
	if [4]byte(pkt[m.bootp+bootpFixedLen:]) != magicCookie {
		return m, ErrBadCookie
	}
	m.clientID, m.endOpt, err = findOption(pkt, m, optClientID)
	return m, err
}

func udpSum(pkt []byte, m dhcpMsg) uint16 {
	acc := csum.Pseudo(pkt[12:16], pkt[16:20], protoUDP, m.end-m.ihl)
	return csum.Fold(csum.Sum(acc, pkt[m.ihl:m.end]))
}

func udpChecksumOK(pkt []byte, m dhcpMsg) bool {
	return binary.BigEndian.Uint16(pkt[m.ihl+6:]) == 0 || udpSum(pkt, m) == 0
}

// fixUDP recomputes the UDP checksum unless the sender sent none (zero).
func fixUDP(pkt []byte, m dhcpMsg) {
	c := pkt[m.ihl+6 : m.ihl+8]
	if c[0] == 0 && c[1] == 0 {
		return
	}
	c[0], c[1] = 0, 0
	s := udpSum(pkt, m)
	if s == 0 {
		s = 0xffff
	}
	binary.BigEndian.PutUint16(c, s)
}

// findOption walks the options and returns the offset of option code (or
// -1) and the offset of the END option.
func findOption(pkt []byte, m dhcpMsg, code byte) (at, end int, err error) {
	at = -1
	for o := m.bootp + dhcpMinLen; o < m.end; {
		switch pkt[o] {
		case optPad:
			o++
			continue
		case optEnd:
			return at, o, nil
		}
		if o+2 > m.end || o+2+int(pkt[o+1]) > m.end {
			return -1, -1, ErrOptOverrun
		}
		if pkt[o] == code && at < 0 {
			at = o
		}
		o += 2 + int(pkt[o+1])
	}
	return -1, -1, ErrNoEnd
}

// IsDHCPClient reports whether pkt is UDP/IPv4 from port 68 to port 67.
func IsDHCPClient(pkt []byte) bool { return dhcpPorts(pkt, PortDHCPClient, PortDHCPServer) }

// IsDHCPServer reports whether pkt is UDP/IPv4 from port 67 to port 68.
func IsDHCPServer(pkt []byte) bool { return dhcpPorts(pkt, PortDHCPServer, PortDHCPClient) }

func dhcpPorts(pkt []byte, sp, dp uint16) bool {
	if len(pkt) < 20 || pkt[0]>>4 != 4 || pkt[9] != protoUDP {
		return false
	}
	ihl := int(pkt[0]&0x0f) * 4
	if ihl < 20 || len(pkt) < ihl+4 {
		return false
	}
	return binary.BigEndian.Uint16(pkt[ihl:]) == sp && binary.BigEndian.Uint16(pkt[ihl+2:]) == dp
}

// SetBroadcastFlag sets the BROADCAST flag of a client message so that the
// server's reply, which cannot be unicast to an IPoIB client without a
// 20-byte address, reaches the guest. The UDP checksum is fixed.
func SetBroadcastFlag(pkt []byte) error {
	m, err := parseDHCP(pkt)
	if err != nil {
		return err
	}
	if pkt[m.bootp] != bootRequest {
		return ErrNotDHCP
	}
	f := pkt[m.bootp+10:]
	binary.BigEndian.PutUint16(f, binary.BigEndian.Uint16(f)|flagBroadcast)
	fixUDP(pkt, m)
	return nil
}

// DHCPToIB applies the RFC 4390 client translation to an Ethernet guest's
// request: htype 32, hlen 0, chaddr zeroed, the BROADCAST flag set, and a
// client-identifier (type 1 + the guest MAC, as RFC 2132 §9.14 suggests)
// added when missing, which grows the packet by 9 bytes within pkt's
// capacity. It returns the rewritten packet.
func DHCPToIB(pkt []byte) ([]byte, error) {
	m, err := parseDHCP(pkt)
	if err != nil {
		return nil, err
	}
	b := pkt[m.bootp:]
	if b[0] != bootRequest || b[1] != HwTypeEthernet || b[2] != 6 {
		return nil, ErrBadHwType
	}
	cid, endOpt := m.clientID, m.endOpt
	mac := ether.MAC(b[28:34])
	out := pkt[:m.end]
	if cid < 0 {
		if m.end+clientIDLen > 0xffff {
			return nil, ErrBadLength // the IPv4 total length would wrap
		}
		if cap(pkt) < m.end+clientIDLen {
			return nil, ErrNoRoom
		}
		out = pkt[:m.end+clientIDLen]
		copy(out[endOpt+clientIDLen:], pkt[endOpt:m.end])
		out[endOpt], out[endOpt+1], out[endOpt+2] = optClientID, 7, HwTypeEthernet
		copy(out[endOpt+3:endOpt+clientIDLen], mac[:])
		m.end += clientIDLen
		binary.BigEndian.PutUint16(out[2:4], uint16(m.end))
		binary.BigEndian.PutUint16(out[m.ihl+4:], uint16(m.end-m.ihl))
		csum.IPv4Header(out[:m.ihl])
	}
	b = out[m.bootp:]
	b[1], b[2] = HwTypeInfiniBand, 0
	clear(b[28:44])
	binary.BigEndian.PutUint16(b[10:12], binary.BigEndian.Uint16(b[10:12])|flagBroadcast)
	fixUDP(out, m)
	return out, nil
}

// DHCPClientID returns the MAC in a type-1 client-identifier option.
func DHCPClientID(pkt []byte) (ether.MAC, bool) {
	m, err := parseDHCP(pkt)
	if err != nil {
		return ether.MAC{}, false
	}
	at := m.clientID
	if at < 0 || pkt[at+1] != 7 || pkt[at+2] != HwTypeEthernet {
		return ether.MAC{}, false
	}
	return ether.MAC(pkt[at+3 : at+9]), true
}

// DHCPXID returns the transaction ID of a valid DHCP message.
func DHCPXID(pkt []byte) (uint32, bool) {
	m, err := parseDHCP(pkt)
	if err != nil {
		return 0, false
	}
	return binary.BigEndian.Uint32(pkt[m.bootp+4:]), true
}

// DHCPToEth restores a server reply written for an IPoIB client (htype 32,
// hlen 0, zero chaddr) for the Ethernet guest with MAC mac: htype 1, hlen
// 6, chaddr = mac. The length does not change.
func DHCPToEth(pkt []byte, mac ether.MAC) error {
	m, err := parseDHCP(pkt)
	if err != nil {
		return err
	}
	b := pkt[m.bootp:]
	if b[0] != bootReply || b[1] != HwTypeInfiniBand {
		return ErrBadHwType
	}
	b[1], b[2] = HwTypeEthernet, 6
	clear(b[28:44])
	copy(b[28:34], mac[:])
	fixUDP(pkt, m)
	return nil
}
