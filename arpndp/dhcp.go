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
	"bytes"
	"encoding/binary"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
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

// ClientIDForm is the client-identifier DHCPToIB gives a guest's
// request. RFC 4390 §2.1 requires one of an IPoIB client and leaves its
// form to the client; DHCP servers key their host entries by it.
type ClientIDForm uint8

const (
	// ClientIDMAC is type 1 and the guest's MAC (RFC 2132 §9.14), added
	// only when the guest sent no client-identifier of its own.
	ClientIDMAC ClientIDForm = iota
	// ClientIDMlnx is the form that OpenStack's Mellanox driver
	// (networking-mlnx) keys its dnsmasq host entries by, and that
	// Mellanox adapters' boot firmware sends. It is type 255 (RFC 4361),
	// IAID 0, a DUID-EN with Mellanox's enterprise number 713, and the
	// port GUID. The GUID is made here from the guest's MAC m as m0 m1
	// m2 00 00 m3 m4 m5. It replaces any client-identifier the guest
	// sent.
	ClientIDMlnx
)

// mlnxClientIDPrefix is the first 12 bytes of a ClientIDMlnx identifier.
var mlnxClientIDPrefix = [12]byte{0xff, 0, 0, 0, 0, 0, 0x02, 0, 0, 0x02, 0xc9, 0}

const mlnxClientIDLen = 2 + 20 // code, length, prefix + GUID

// ParseClientIDForm reads "mac" or "mlnx".
func ParseClientIDForm(s string) (ClientIDForm, bool) {
	switch s {
	case "mac":
		return ClientIDMAC, true
	case "mlnx":
		return ClientIDMlnx, true
	}
	return 0, false
}

// String is the form's name, as ParseClientIDForm reads it.
func (f ClientIDForm) String() string {
	if f == ClientIDMlnx {
		return "mlnx"
	}
	return "mac"
}

// putClientID writes the client-identifier option of form f for mac at
// opt, which has room for it, and returns its length.
func putClientID(opt []byte, f ClientIDForm, mac ether.MAC) int {
	if f == ClientIDMlnx {
		opt[0], opt[1] = optClientID, mlnxClientIDLen-2
		copy(opt[2:14], mlnxClientIDPrefix[:])
		copy(opt[14:17], mac[0:3])
		opt[17], opt[18] = 0, 0
		copy(opt[19:22], mac[3:6])
		return mlnxClientIDLen
	}
	opt[0], opt[1], opt[2] = optClientID, 7, HwTypeEthernet
	copy(opt[3:9], mac[:])
	return clientIDLen
}

// DHCPToIB applies the RFC 4390 client translation to an Ethernet
// guest's request: htype 32, hlen 0, chaddr zeroed and the BROADCAST
// flag set. It inserts a client-identifier of form f for the guest's MAC
// before END, growing the packet within pkt's capacity; where f replaces
// the guest's own, it goes in its place. It returns the rewritten
// packet.
func DHCPToIB(pkt []byte, f ClientIDForm) ([]byte, error) {
	m, err := parseDHCP(pkt)
	if err != nil {
		return nil, err
	}
	b := pkt[m.bootp:]
	if b[0] != bootRequest || b[1] != HwTypeEthernet || b[2] != 6 {
		return nil, ErrBadHwType
	}
	mac := ether.MAC(b[28:34])
	var want [mlnxClientIDLen]byte
	wantLen := putClientID(want[:], f, mac)
	cid := m.clientID
	drop, add := 0, 0 // bytes of the guest's option removed, of ours inserted
	switch {
	case cid < 0:
		add = wantLen
	case f == ClientIDMlnx && !bytes.Equal(pkt[cid:cid+2+int(pkt[cid+1])], want[:wantLen]):
		drop, add = 2+int(pkt[cid+1]), wantLen
	}
	out := pkt[:m.end]
	if drop+add > 0 {
		end := m.end - drop + add
		if end > 0xffff {
			return nil, ErrBadLength // the IPv4 total length would wrap
		}
		if cap(pkt) < end {
			return nil, ErrNoRoom
		}
		endOpt := m.endOpt
		if drop > 0 { // close the gap; END and what follows move back
			copy(pkt[cid:], pkt[cid+drop:m.end])
			endOpt -= drop
		}
		out = pkt[:end]
		copy(out[endOpt+add:], pkt[endOpt:m.end-drop])
		copy(out[endOpt:], want[:add])
		m.end = end
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

// DHCPClientID returns the MAC in a client-identifier option of either
// form DHCPToIB writes: type 1 and the MAC, or the Mellanox form.
func DHCPClientID(pkt []byte) (ether.MAC, bool) {
	m, err := parseDHCP(pkt)
	if err != nil {
		return ether.MAC{}, false
	}
	at := m.clientID
	switch {
	case at < 0:
		return ether.MAC{}, false
	case pkt[at+1] == 7 && pkt[at+2] == HwTypeEthernet:
		return ether.MAC(pkt[at+3 : at+9]), true
	case int(pkt[at+1]) == mlnxClientIDLen-2:
		var mac ether.MAC
		copy(mac[0:3], pkt[at+14:at+17])
		copy(mac[3:6], pkt[at+19:at+22])
		var want [mlnxClientIDLen]byte
		putClientID(want[:], ClientIDMlnx, mac) // the layout's one home
		if bytes.Equal(pkt[at:at+mlnxClientIDLen], want[:]) {
			return mac, true
		}
	}
	return ether.MAC{}, false
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
