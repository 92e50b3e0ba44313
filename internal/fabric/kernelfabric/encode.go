package kernelfabric

// The kernel's structures, encoded by hand: x/sys/unix.SockaddrLinklayer
// holds an 8-byte address and cannot say "20 bytes"; packet_mreq_max and
// virtio_net_hdr have no x/sys encoder. Host byte order is little-endian on
// every platform the daemon targets, as binary.NativeEndian says.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// struct sockaddr_ll (linux/if_packet.h) layout.
const (
	// SockaddrLLSize is sizeof(struct sockaddr_ll): 8 bytes of sll_addr.
	SockaddrLLSize = 20
	// sllAddrOff is offsetof(struct sockaddr_ll, sll_addr).
	sllAddrOff = 12
	// SockaddrLLIPoIBLen is the name length that carries a 20-byte
	// address: offsetof(sll_addr) + 20. packet_snd refuses a SOCK_DGRAM
	// send whose name length is below dev->addr_len + offsetof(sll_addr).
	SockaddrLLIPoIBLen = sllAddrOff + ipoib.HwAddrLen
	// ARPHRDInfiniBand is dev->type of an IPoIB interface.
	ARPHRDInfiniBand = 32
)

// Packet types (sll_pkttype).
const (
	PacketHost      = 0
	PacketBroadcast = 1
	PacketMulticast = 2
	PacketOtherHost = 3
	PacketOutgoing  = 4
)

// SockaddrLL is a decoded struct sockaddr_ll.
type SockaddrLL struct {
	Family   uint16
	Protocol uint16 // host order (the field is big-endian)
	Ifindex  int32
	Hatype   uint16
	Pkttype  uint8
	Halen    uint8
	// Addr is the address: Halen bytes, which may run past the 8-byte
	// sll_addr when the name is long enough.
	Addr []byte
}

// PutSockaddrLL encodes a sockaddr_ll to send a SOCK_DGRAM packet of
// ethertype proto to dst through interface ifindex into b and returns
// the name length to pass, SockaddrLLIPoIBLen.
func PutSockaddrLL(b *[SockaddrLLIPoIBLen]byte, ifindex int, proto uint16, dst ipoib.HwAddr) int {
	binary.NativeEndian.PutUint16(b[0:2], unix.AF_PACKET)
	binary.BigEndian.PutUint16(b[2:4], proto)
	binary.NativeEndian.PutUint32(b[4:8], uint32(int32(ifindex)))
	binary.NativeEndian.PutUint16(b[8:10], ARPHRDInfiniBand)
	b[10] = 0 // sll_pkttype: unused on send
	b[11] = ipoib.HwAddrLen
	copy(b[sllAddrOff:], dst[:])
	return SockaddrLLIPoIBLen
}

// ErrSockaddr reports a socket address too short for what it claims.
var ErrSockaddr = errors.New("kernelfabric: malformed sockaddr_ll")

// ParseSockaddrLL decodes the first n bytes of b, a sockaddr_ll as
// recvmmsg returns it (n is the msg_namelen the kernel wrote) or as a
// caller passes it to sendmmsg. It refuses a name shorter than
// sizeof(struct sockaddr_ll), of another family, or whose sll_halen runs
// past n.
func ParseSockaddrLL(b []byte, n int) (SockaddrLL, error) {
	if n < SockaddrLLSize || n > len(b) {
		return SockaddrLL{}, ErrSockaddr
	}
	sa := SockaddrLL{
		Family:   binary.NativeEndian.Uint16(b[0:2]),
		Protocol: binary.BigEndian.Uint16(b[2:4]),
		Ifindex:  int32(binary.NativeEndian.Uint32(b[4:8])),
		Hatype:   binary.NativeEndian.Uint16(b[8:10]),
		Pkttype:  b[10],
		Halen:    b[11],
	}
	if sa.Family != unix.AF_PACKET || sllAddrOff+int(sa.Halen) > n {
		return SockaddrLL{}, ErrSockaddr
	}
	sa.Addr = b[sllAddrOff : sllAddrOff+int(sa.Halen)]
	return sa, nil
}

// struct packet_mreq_max (net/packet/af_packet.c) layout: int
// mr_ifindex, unsigned short mr_type, unsigned short mr_alen, unsigned
// char mr_address[MAX_ADDR_LEN = 32].
const (
	// MreqMaxSize is sizeof(struct packet_mreq_max).
	MreqMaxSize = 8 + 32
	// MreqSize is sizeof(struct packet_mreq), the least option length
	// packet_setsockopt takes.
	MreqSize = 8 + 8
	// PacketMRMulticast is mr_type PACKET_MR_MULTICAST.
	PacketMRMulticast = 0
)

// McastHwAddr is the 20-byte hardware address of multicast group mgid as
// the IPoIB driver keeps it in its multicast list: reserved byte 0, QPN
// 0xFFFFFF, then the MGID (ip_ib_mc_map, ipv6_ib_mc_map).
func McastHwAddr(mgid ipoib.GID) ipoib.HwAddr {
	return ipoib.MakeHwAddr(0, ipoib.MulticastQPN, mgid)
}

// PutMreq encodes a PACKET_ADD_MEMBERSHIP / PACKET_DROP_MEMBERSHIP request
// for group mgid on interface ifindex.
func PutMreq(b *[MreqMaxSize]byte, ifindex int, mgid ipoib.GID) {
	*b = [MreqMaxSize]byte{}
	binary.NativeEndian.PutUint32(b[0:4], uint32(int32(ifindex)))
	binary.NativeEndian.PutUint16(b[4:6], PacketMRMulticast)
	binary.NativeEndian.PutUint16(b[6:8], ipoib.HwAddrLen)
	a := McastHwAddr(mgid)
	copy(b[8:], a[:])
}

// Mreq is a decoded packet_mreq_max.
type Mreq struct {
	Ifindex int32
	Type    uint16
	Alen    uint16
	Addr    []byte // Alen bytes
}

// ErrMreq reports a membership request too short for what it claims.
var ErrMreq = errors.New("kernelfabric: malformed packet_mreq")

// ParseMreq decodes a membership option as packet_setsockopt does: at
// least sizeof(struct packet_mreq), at most packet_mreq_max is read, and
// the option must hold mr_alen address bytes.
func ParseMreq(b []byte) (Mreq, error) {
	if len(b) < MreqSize {
		return Mreq{}, ErrMreq
	}
	if len(b) > MreqMaxSize {
		b = b[:MreqMaxSize]
	}
	m := Mreq{
		Ifindex: int32(binary.NativeEndian.Uint32(b[0:4])),
		Type:    binary.NativeEndian.Uint16(b[4:6]),
		Alen:    binary.NativeEndian.Uint16(b[6:8]),
	}
	if 8+int(m.Alen) > len(b) {
		return Mreq{}, ErrMreq
	}
	m.Addr = b[8 : 8+int(m.Alen)]
	return m, nil
}

// struct virtio_net_hdr (linux/virtio_net.h), little-endian on a packet
// socket (vio_le()).
const (
	// VnetHdrLen is sizeof(struct virtio_net_hdr).
	VnetHdrLen = 10
	// VnetNeedsCsum is VIRTIO_NET_HDR_F_NEEDS_CSUM.
	VnetNeedsCsum = 1
	// VnetGSONone, VnetGSOTCPv4 and VnetGSOTCPv6 are gso_type values.
	VnetGSONone  = 0
	VnetGSOTCPv4 = 1
	VnetGSOTCPv6 = 4
	// IPoIBHardLen is what ipoib_hard_header pushes in front of the data
	// of a SOCK_DGRAM send (IPOIB_HARD_LEN: the 4-byte IPoIB header and
	// the 20-byte pseudo header); csum_start counts from there.
	IPoIBHardLen = ipoib.HeaderLen + ipoib.HwAddrLen
)

// VnetHdr is a decoded virtio_net_hdr.
type VnetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
}

// Put encodes h into b.
func (h VnetHdr) Put(b *[VnetHdrLen]byte) {
	b[0], b[1] = h.Flags, h.GSOType
	binary.LittleEndian.PutUint16(b[2:4], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:6], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:8], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:10], h.CsumOffset)
}

// ErrVnetHdr reports a datagram shorter than its virtio_net_hdr.
var ErrVnetHdr = errors.New("kernelfabric: short virtio_net_hdr")

// ParseVnetHdr decodes the virtio_net_hdr at the start of b.
func ParseVnetHdr(b []byte) (VnetHdr, error) {
	if len(b) < VnetHdrLen {
		return VnetHdr{}, ErrVnetHdr
	}
	return VnetHdr{Flags: b[0], GSOType: b[1],
		HdrLen:     binary.LittleEndian.Uint16(b[2:4]),
		GSOSize:    binary.LittleEndian.Uint16(b[4:6]),
		CsumStart:  binary.LittleEndian.Uint16(b[6:8]),
		CsumOffset: binary.LittleEndian.Uint16(b[8:10])}, nil
}

// GSOVnetHdr returns the virtio_net_hdr that hands the TCP super-packet
// g (ipoib.GSO, offsets from the IPoIB header), with TCP header length
// tcpLen, to a SOCK_DGRAM packet socket on an IPoIB interface. The
// checksum and segmentation offsets count from the start of the hard
// header ipoib_hard_header pushed, IPOIB_HARD_LEN bytes before the IP
// header: g.L4 - HeaderLen + IPoIBHardLen.
func GSOVnetHdr(g ipoib.GSO, tcpLen int) VnetHdr {
	if g.Type == ipoib.GSONone {
		return VnetHdr{}
	}
	start := int(g.L4) - ipoib.HeaderLen + IPoIBHardLen
	t := uint8(VnetGSOTCPv4)
	if g.Type == ipoib.GSOTCPv6 {
		t = VnetGSOTCPv6
	}
	return VnetHdr{Flags: VnetNeedsCsum, GSOType: t, HdrLen: uint16(start + tcpLen), GSOSize: g.Size,
		CsumStart: uint16(start), CsumOffset: 16} // offsetof(struct tcphdr, check)
}

// MaxNameLen is the longest interface name (IFNAMSIZ - 1):
// net/core/dev.c dev_valid_name refuses a longer one.
const MaxNameLen = unix.IFNAMSIZ - 1

// MaxChildIndex is the largest VIF child index ChildName takes. A port
// gives each VIF child the lowest index no live child of its holds, so
// the indexes stay below the number of live children (far below this:
// each child is a QP and a netdev).
const MaxChildIndex = 99999

// stemHashed is how a stem made from a hash starts.
const stemHashed = "ib"

// ChildStem is the prefix of the names of parent's children. It is
// parent itself when every child name fits IFNAMSIZ after it: "ib0"
// gives "ib0.e3", "ib0.m8001". Else it is "ib" and 6 hex digits of the
// FNV-1a hash of parent's name, 8 bytes, as long as the longest parent
// used as it is. So every legal parent name, up to 15 bytes, has
// children: "ibp129s0f0" gives "ib" + 6 hex digits, then ".e3".
func ChildStem(parent string) string {
	if len(parent)+len(".e")+len(strconv.Itoa(MaxChildIndex)) <= MaxNameLen {
		return parent
	}
	h := fnv.New32a()
	h.Write([]byte(parent))
	return fmt.Sprintf("%s%06x", stemHashed, h.Sum32()&0xffffff)
}

// ChildName is the name of VIF child n (1 to MaxChildIndex) of the
// parent whose ChildStem is stem: "ib0.e3".
func ChildName(stem string, n int) (string, error) {
	if n < 1 || n > MaxChildIndex {
		return "", fmt.Errorf("child index %d out of 1..%d", n, MaxChildIndex)
	}
	return stem + ".e" + strconv.Itoa(n), nil
}

// GroupChildName is the name of the child that carries partition pkey's
// multicast, under stem: "ib0.m8001".
func GroupChildName(stem string, pkey ipoib.PKey) string {
	return fmt.Sprintf("%s.m%04x", stem, uint16(pkey.Full()))
}

// IsChildName reports whether name is one ChildName or GroupChildName
// gives under stem: the name is parsed, and made again from what it
// says, which must give it back (no "e03", no upper-case hex, no P_Key
// without the full-membership bit).
func IsChildName(stem, name string) bool {
	rest, ok := strings.CutPrefix(name, stem+".")
	if !ok || len(rest) < 2 {
		return false
	}
	switch rest[0] {
	case 'e':
		_, ok := childIndex(stem, name)
		return ok
	case 'm':
		v, err := strconv.ParseUint(rest[1:], 16, 16)
		return err == nil && GroupChildName(stem, ipoib.PKey(v)) == name
	}
	return false
}

// childIndex is n of the name ChildName(stem, n), if name is one.
func childIndex(stem, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, stem+".e")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	again, err2 := ChildName(stem, n)
	return n, err == nil && err2 == nil && again == name
}

// IPoIB link attributes (linux/if_link.h IFLA_IPOIB_*) and modes.
const (
	iflaIPoIBPKey   = nl.IFLA_IPOIB_PKEY
	iflaIPoIBMode   = nl.IFLA_IPOIB_MODE
	iflaIPoIBUmcast = nl.IFLA_IPOIB_UMCAST
	ipoibModeDgram  = 0 // IPOIB_MODE_DATAGRAM
)

// newChildRequest builds the RTM_NEWLINK request that creates child c,
// as vishvananda/netlink's LinkAdd of a netlink.IPoIB{ParentIndex, Pkey,
// Mode: datagram, Umcast: 0} does. It holds ifinfomsg, IFLA_IFNAME,
// IFLA_LINK, then IFLA_LINKINFO with IFLA_INFO_KIND "ipoib" and
// IFLA_INFO_DATA. The data holds IFLA_IPOIB_PKEY, _MODE and _UMCAST as
// host-order u16s (the kernel reads them with nla_get_u16). User
// multicast stays off: with it the driver skips groups the port already
// joined through the SA (ipoib_mcast_restart_task), which every child
// but the first would hit.
func newChildRequest(c ChildSpec) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(c.Name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_LINK, nl.Uint32Attr(uint32(c.Parent))))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("ipoib"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(iflaIPoIBPKey, nl.Uint16Attr(uint16(c.PKey)))
	data.AddRtAttr(iflaIPoIBMode, nl.Uint16Attr(ipoibModeDgram))
	data.AddRtAttr(iflaIPoIBUmcast, nl.Uint16Attr(0))
	req.AddData(info)
	return req
}
