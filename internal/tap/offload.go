package tap

// Offloads (IFF_VNET_HDR): every frame crossing the TAP carries a
// virtio_net_hdr.
//
// Reading, the kernel hands over TCP super-frames of up to 64 KB (TSO)
// and frames whose checksum is only partial (checksum offload). The
// segmenter cuts a super-frame into segments that fit the IPoIB MTU,
// with their own IP lengths, IDs, sequence numbers, flags and checksums.
// Partial checksums are completed.
//
// Writing, consecutive segments of one TCP flow are coalesced into one
// super-frame with a GSO header (GRO), after their checksums are
// verified. So a corrupted segment is never laundered into a valid one.
//
// The shape follows wireguard-go's tun offload, which does the same for
// IP packets; this is the Ethernet frame version (802.1Q tags included).
//
// UDP works likewise where the kernel takes UDP segmentation offload on
// the TAP (TUN_F_USO4|TUN_F_USO6, Linux 6.2 and later). A guest's run of
// same-size datagrams (a UDP_SEGMENT send) comes as one
// VIRTIO_NET_HDR_GSO_UDP_L4 super-frame. It is cut here (or by the port)
// into its datagrams as __udp_gso_segment does. Consecutive same-size
// datagrams of one flow are written back as one, as udp_gro_receive
// merges them for a UDP_GRO socket. Where the kernel refuses the flags,
// UDP crosses the TAP datagram by datagram.

import (
	"encoding/binary"
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/internal/header"
)

// Headroom is what Write needs before offset in every buffer: room for
// the virtio_net_hdr a TAP with offloads puts in front of a frame.
const Headroom = vnetHdrLen

// TUNSETOFFLOAD flags (include/uapi/linux/if_tun.h).
const (
	tunFCsum   = 0x01
	tunFTSO4   = 0x02
	tunFTSO6   = 0x04
	tunFTSOECN = 0x08
	// UDP segmentation offload (Linux 6.2, drivers/net/tun.c
	// set_offload): both or neither, or the kernel refuses with EINVAL.
	tunFUSO = unix.TUN_F_USO4 | unix.TUN_F_USO6
)

// vnetHdrLen is sizeof(struct virtio_net_hdr) (include/uapi/linux/
// virtio_net.h), the TUN default (TUNSETVNETHDRSZ).
const vnetHdrLen = 10

// maxSuperFrame bounds a super-frame: 64 KB of IP plus the Ethernet
// header with a VLAN tag.
const maxSuperFrame = 65535 + ether.VLANHeaderLen

// maxCoalesce bounds the segments merged into one super-frame.
const maxCoalesce = 64

// vnetHdr is struct virtio_net_hdr. TUN uses the legacy layout in the
// host's byte order unless told otherwise (TUNSETVNETLE/BE).
type vnetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

func decodeVnet(b []byte) vnetHdr {
	return vnetHdr{
		flags: b[0], gsoType: b[1],
		hdrLen:     binary.NativeEndian.Uint16(b[2:]),
		gsoSize:    binary.NativeEndian.Uint16(b[4:]),
		csumStart:  binary.NativeEndian.Uint16(b[6:]),
		csumOffset: binary.NativeEndian.Uint16(b[8:]),
	}
}

func (h vnetHdr) encode(b []byte) {
	b[0], b[1] = h.flags, h.gsoType
	binary.NativeEndian.PutUint16(b[2:], h.hdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.gsoSize)
	binary.NativeEndian.PutUint16(b[6:], h.csumStart)
	binary.NativeEndian.PutUint16(b[8:], h.csumOffset)
}

// Offload drop reasons, counted by the TAP.
var (
	errBadVnet = errors.New("bad_vnet_header") // a header the kernel would not send
	errBadGSO  = gso.ErrBad                    // a super-frame that is not one TCP or UDP flow's
)

// usoState is a TAP's UDP offload: whether the kernel took the flags,
// and the UDP super-frames read from the TAP and written to it (the
// datagrams merged into them), apart from the TCP ones.
type usoState struct {
	on                    bool
	read, written, merged atomic.Uint64
}

// counters adds the UDP offload's counters to m: "uso" is 1 when the
// kernel took the flags, 0 when it refused them (Linux before 6.2).
func (u *usoState) counters(m map[string]uint64) {
	m["uso"] = 0
	if u.on {
		m["uso"] = 1
	}
	m["uso_frames_read"] = u.read.Load()
	m["uso_frames_written"] = u.written.Load()
	m["uso_datagrams_merged"] = u.merged.Load()
}

// completeChecksum finishes a partial checksum (VIRTIO_NET_HDR_F_NEEDS_CSUM):
// the field at csumStart+csumOffset holds the pseudo-header sum, and the
// one's complement of the sum from csumStart to the end goes there.
func completeChecksum(frame []byte, h vnetHdr) error {
	start, at := int(h.csumStart), int(h.csumStart)+int(h.csumOffset)
	if at+2 > len(frame) || start > at {
		return errBadVnet
	}
	initial := binary.BigEndian.Uint16(frame[at:])
	frame[at], frame[at+1] = 0, 0
	binary.BigEndian.PutUint16(frame[at:], nonZero(csum.Fold(csum.Sum(uint32(initial), frame[start:]))))
	return nil
}

// nonZero maps a computed checksum of 0 to its other form, 0xFFFF: for
// UDP, 0 means "no checksum" (and is invalid over IPv6, RFC 8200 §8.1),
// as the kernel's skb_checksum_help does (CSUM_MANGLED_0).
func nonZero(c uint16) uint16 {
	if c == 0 {
		return 0xffff
	}
	return c
}

// segmenter cuts the TCP and UDP super-frames read from the TAP into
// segments.
type segmenter struct{ gso.Segmenter }

// start checks a super-frame against its vnet header and prepares to cut
// it. A TCP one is cut into segments whose IP packets fit mtu. A UDP one
// is cut into its datagrams of gso_size bytes, however large: one longer
// than the IPoIB MTU goes on as any such datagram does, to be fragmented
// or answered "too big". start returns how the frame is cut, as
// ReadSuper describes it. frame must stay untouched until Done.
func (s *segmenter) start(frame []byte, h vnetHdr, mtu int) (Super, error) {
	l3, v6, udp, err := checkSuper(frame, h)
	if err != nil {
		return Super{}, err
	}
	if udp {
		mtu = maxSuperFrame // a datagram is not cut smaller: the caller checks its size
	}
	if err := s.StartL4(udp, frame, l3, int(h.csumStart), v6, int(h.gsoSize), mtu); err != nil {
		return Super{}, err
	}
	return Super{L4: h.csumStart, Size: uint16(s.MSS()), V6: v6, UDP: udp}, nil
}

// checkSuper checks what a vnet header says of a super-frame against its
// Ethernet header. It returns the IP header's offset, its version and
// whether the frame is UDP rather than TCP. UDP is
// VIRTIO_NET_HDR_GSO_UDP_L4: the checksum at the UDP header's offset, no
// ECN bit (include/linux/virtio_net.h virtio_net_hdr_to_skb).
func checkSuper(frame []byte, h vnetHdr) (l3 int, v6, udp bool, err error) {
	f := ether.Frame(frame)
	if !f.IsValid() || h.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 {
		return 0, false, false, errBadGSO
	}
	et, off := f.EtherType(), int(h.csumOffset)
	switch {
	case h.gsoType&^unix.VIRTIO_NET_HDR_GSO_ECN == unix.VIRTIO_NET_HDR_GSO_TCPV4 && et == ether.TypeIPv4 && off == header.TCPChecksumOff:
	case h.gsoType&^unix.VIRTIO_NET_HDR_GSO_ECN == unix.VIRTIO_NET_HDR_GSO_TCPV6 && et == ether.TypeIPv6 && off == header.TCPChecksumOff:
		v6 = true
	case h.gsoType == unix.VIRTIO_NET_HDR_GSO_UDP_L4 && (et == ether.TypeIPv4 || et == ether.TypeIPv6) && off == gso.UDPChecksumOff:
		v6, udp = et == ether.TypeIPv6, true
	default:
		return 0, false, false, errBadGSO
	}
	return f.HeaderLen(), v6, udp, nil
}

// seg is a frame carrying one TCP segment or UDP datagram that may be
// coalesced. It is plain IPv4 (no options, not a fragment) or IPv6 (TCP
// or UDP right after the fixed header), with some payload and a valid
// checksum. TCP has ACK and at most PSH besides. UDP has a checksum (not
// the "none" of IPv4's 0) and a UDP length that is the packet's.
type seg struct {
	f       []byte
	l3, l4  int
	hl      int // all headers
	v6, udp bool
	seq     uint32
	flags   uint8
}

func (s *seg) payload() int { return len(s.f) - s.hl }

// parseSeg reports whether f is a frame that may be coalesced; UDP only
// when uso (the kernel takes UDP super-frames).
func parseSeg(f []byte, uso bool) (seg, bool) {
	ef := ether.Frame(f)
	if !ef.IsValid() {
		return seg{}, false
	}
	s := seg{f: f, l3: ef.HeaderLen()}
	var src, dst []byte
	var proto uint8
	switch ef.EtherType() {
	case ether.TypeIPv4:
		ip, ok := header.ParseIPv4(f[s.l3:])
		if !ok || len(ip) != len(f)-s.l3 || ip.HeaderLen() != header.IPv4MinLen || ip.MoreFragments() || ip.FragmentOffset() != 0 ||
			csum.Fold(csum.Sum(0, ip[:header.IPv4MinLen])) != 0 { // merging rewrites the header: verify it first
			return seg{}, false
		}
		s.l4, proto, src, dst = s.l3+header.IPv4MinLen, ip.Protocol(), ip.SrcBytes(), ip.DstBytes()
	case ether.TypeIPv6:
		ip, ok := header.ParseIPv6(f[s.l3:])
		if !ok || len(ip) != len(f)-s.l3 {
			return seg{}, false
		}
		s.l4, s.v6, proto, src, dst = s.l3+header.IPv6Len, true, ip.NextHeader(), ip.SrcBytes(), ip.DstBytes()
	default:
		return seg{}, false
	}
	switch {
	case proto == header.ProtoTCP:
		tcp, ok := header.ParseTCP(f[s.l4:])
		if !ok {
			return seg{}, false
		}
		s.hl, s.seq, s.flags = s.l4+tcp.HeaderLen(), tcp.Seq(), tcp.Flags()
		if s.flags&^header.TCPFlagPSH != header.TCPFlagACK {
			return seg{}, false
		}
	case proto == header.ProtoUDP && uso:
		// udp_gro_receive merges only datagrams whose checksum
		// verifies (the "none" of 0 is not merged: the super-frame's
		// datagrams would get one).
		s.hl, s.udp = s.l4+gso.UDPHeaderLen, true
		if s.hl > len(f) || int(binary.BigEndian.Uint16(f[s.l4+4:])) != len(f)-s.l4 || binary.BigEndian.Uint16(f[s.l4+gso.UDPChecksumOff:]) == 0 {
			return seg{}, false
		}
	default:
		return seg{}, false
	}
	if s.payload() <= 0 || csum.Fold(csum.Sum(csum.Pseudo(src, dst, proto, len(f)-s.l4), f[s.l4:])) != 0 {
		return seg{}, false
	}
	return s, true
}

// follows reports whether b continues a's flow right after a, so that
// a run of segments (datagrams) of size bytes can take it.
func follows(a, b *seg, size int) bool {
	if a.hl != b.hl || a.l4 != b.l4 || a.v6 != b.v6 || a.udp != b.udp || a.payload() != size || b.payload() > size {
		return false
	}
	x, y := a.f, b.f
	// Ethernet header, then IP without its lengths, ID and checksum.
	if string(x[:a.l3]) != string(y[:a.l3]) {
		return false
	}
	ipx, ipy := x[a.l3:a.l4], y[a.l3:a.l4]
	if a.v6 {
		if string(ipx[:4]) != string(ipy[:4]) || string(ipx[6:]) != string(ipy[6:]) {
			return false
		}
	} else if string(ipx[:2]) != string(ipy[:2]) || string(ipx[6:10]) != string(ipy[6:10]) || string(ipx[12:]) != string(ipy[12:]) {
		return false
	}
	tx, ty := x[a.l4:a.hl], y[a.l4:a.hl]
	if a.udp {
		return string(tx[:4]) == string(ty[:4]) // the ports: one flow
	}
	// TCP without sequence number, PSH and checksum: ports, ACK, window,
	// options all equal.
	return a.flags&header.TCPFlagPSH == 0 && b.seq == a.seq+uint32(a.payload()) &&
		string(tx[:4]) == string(ty[:4]) && string(tx[8:13]) == string(ty[8:13]) &&
		tx[13]&^header.TCPFlagPSH == ty[13]&^header.TCPFlagPSH &&
		string(tx[14:16]) == string(ty[14:16]) && string(tx[18:]) == string(ty[18:])
}

// coalescer merges runs of segments into super-frames.
type coalescer struct {
	buf []byte // vnet header and super-frame
}

// run returns how many frames at the start of frames form one run that
// can be coalesced (1 if the first cannot be), and the first one parsed;
// UDP datagrams only when uso.
func run(frames [][]byte, off int, uso bool) (int, seg) {
	first, ok := parseSeg(frames[0][off:], uso)
	if !ok {
		return 1, first
	}
	size, total := first.payload(), len(first.f)-first.l3
	prev := first
	k := 1
	for ; k < len(frames) && k < maxCoalesce; k++ {
		next, ok := parseSeg(frames[k][off:], uso)
		if !ok || !follows(&prev, &next, size) || total+next.payload() > 65535 {
			break
		}
		total += next.payload()
		prev = next
	}
	return k, first
}

// merge builds the super-frame of frames (a run from run, at least two,
// whose first run parsed) behind its GSO header and returns it. A TCP
// one is left as the kernel's tcp_gro_complete leaves it. A UDP one is
// left as udp_gro_complete does: UDP length the whole, SKB_GSO_UDP_L4
// with the first datagram's size.
//
// The run is copied into c.buf, its headers once and each payload: the
// TAP takes a frame as one write(2) from one buffer. A writev(2) of the
// payloads where they lie would spare this copy, for an iovec list a
// run; the copy is 0.8 % of a TCP stream's samples in the data path's
// profiles. The checksums parseSeg verified are not carried over: the
// super-frame leaves with a partial checksum, which the kernel
// completes.
func (c *coalescer) merge(first seg, frames [][]byte, off int) []byte {
	if c.buf == nil {
		c.buf = make([]byte, vnetHdrLen+maxSuperFrame)
	}
	n := vnetHdrLen + copy(c.buf[vnetHdrLen:], first.f)
	flags := first.flags
	for _, f := range frames[1:] {
		f = f[off:]
		n += copy(c.buf[n:], f[first.hl:])
		if !first.udp {
			flags |= f[first.l4+13] & header.TCPFlagPSH
		}
	}
	sf := c.buf[vnetHdrLen:n]
	l4Len := len(sf) - first.l4
	h := vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, hdrLen: uint16(first.hl), gsoSize: uint16(first.payload()),
		csumStart: uint16(first.l4), csumOffset: header.TCPChecksumOff}
	proto := uint8(header.ProtoTCP)
	var src, dst []byte
	if first.v6 {
		ip := header.IPv6(sf[first.l3:])
		ip.SetPayloadLen(len(sf) - first.l3 - header.IPv6Len)
		src, dst = ip.SrcBytes(), ip.DstBytes()
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV6
	} else {
		ip := header.IPv4(sf[first.l3:])
		ip.SetTotalLen(len(sf) - first.l3)
		ip.SetChecksum()
		src, dst = ip.SrcBytes(), ip.DstBytes()
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV4
	}
	at := first.l4 + header.TCPChecksumOff
	if first.udp {
		proto, h.gsoType, h.csumOffset = header.ProtoUDP, unix.VIRTIO_NET_HDR_GSO_UDP_L4, gso.UDPChecksumOff
		binary.BigEndian.PutUint16(sf[first.l4+4:], uint16(l4Len))
		at = first.l4 + gso.UDPChecksumOff
	} else {
		header.TCP(sf[first.l4:]).SetFlags(flags)
	}
	// A partial checksum: the folded pseudo-header sum, not complemented;
	// whoever segments or delivers the frame completes it.
	binary.BigEndian.PutUint16(sf[at:], ^csum.Fold(csum.Pseudo(src, dst, proto, l4Len)))
	h.encode(c.buf)
	return c.buf[:n]
}
