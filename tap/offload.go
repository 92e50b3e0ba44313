package tap

// Offloads (IFF_VNET_HDR): every frame crossing the TAP carries a
// virtio_net_hdr. Reading, the kernel hands over TCP super-frames of up to
// 64 KB (TSO) and frames whose checksum is only partial (checksum
// offload); the segmenter cuts a super-frame into segments that fit the
// IPoIB MTU, with their own IP lengths, IDs, sequence numbers, flags and
// checksums, and partial checksums are completed. Writing, consecutive
// segments of one TCP flow are coalesced into one super-frame with a GSO
// header (GRO), after their checksums are verified, so a corrupted segment
// is never laundered into a valid one. The shape follows wireguard-go's
// tun offload, which does the same for IP packets; this is the Ethernet
// frame version (802.1Q tags included).

import (
	"encoding/binary"
	"errors"

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
	errBadGSO  = gso.ErrBad                    // a super-frame that is not one TCP flow's
)

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

// segmenter cuts the TCP super-frames read from the TAP into segments.
type segmenter struct{ gso.Segmenter }

// start checks a super-frame against its vnet header and prepares to cut
// it into segments whose IP packets fit mtu. frame must stay untouched
// until Done.
func (s *segmenter) start(frame []byte, h vnetHdr, mtu int) error {
	l3, v6, err := checkSuper(frame, h)
	if err != nil {
		return err
	}
	return s.Start(frame, l3, int(h.csumStart), v6, int(h.gsoSize), mtu)
}

// checkSuper checks what a vnet header says of a super-frame against its
// Ethernet header and returns the IP header's offset and version.
func checkSuper(frame []byte, h vnetHdr) (l3 int, v6 bool, err error) {
	f := ether.Frame(frame)
	if !f.IsValid() || h.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 || int(h.csumOffset) != header.TCPChecksumOff {
		return 0, false, errBadGSO
	}
	switch {
	case h.gsoType&^unix.VIRTIO_NET_HDR_GSO_ECN == unix.VIRTIO_NET_HDR_GSO_TCPV4 && f.EtherType() == ether.TypeIPv4:
	case h.gsoType&^unix.VIRTIO_NET_HDR_GSO_ECN == unix.VIRTIO_NET_HDR_GSO_TCPV6 && f.EtherType() == ether.TypeIPv6:
		v6 = true
	default:
		return 0, false, errBadGSO
	}
	return f.HeaderLen(), v6, nil
}

// tcpSeg is a frame carrying one TCP segment that may be coalesced: plain
// IPv4 (no options, not a fragment) or IPv6 (TCP right after the fixed
// header), ACK with at most PSH besides, some payload and a valid
// checksum.
type tcpSeg struct {
	f      []byte
	l3, l4 int
	hl     int // all headers
	v6     bool
	seq    uint32
	flags  uint8
}

func (s *tcpSeg) payload() int { return len(s.f) - s.hl }

// parseTCPSeg reports whether f is a frame that may be coalesced.
func parseTCPSeg(f []byte) (tcpSeg, bool) {
	ef := ether.Frame(f)
	if !ef.IsValid() {
		return tcpSeg{}, false
	}
	s := tcpSeg{f: f, l3: ef.HeaderLen()}
	var sum uint32
	switch ef.EtherType() {
	case ether.TypeIPv4:
		ip, ok := header.ParseIPv4(f[s.l3:])
		if !ok || len(ip) != len(f)-s.l3 || ip.HeaderLen() != header.IPv4MinLen || ip.Protocol() != header.ProtoTCP || ip.MoreFragments() || ip.FragmentOffset() != 0 ||
			csum.Fold(csum.Sum(0, ip[:header.IPv4MinLen])) != 0 { // merging rewrites the header: verify it first
			return tcpSeg{}, false
		}
		s.l4 = s.l3 + header.IPv4MinLen
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(f)-s.l4)
	case ether.TypeIPv6:
		ip, ok := header.ParseIPv6(f[s.l3:])
		if !ok || len(ip) != len(f)-s.l3 || ip.NextHeader() != header.ProtoTCP {
			return tcpSeg{}, false
		}
		s.l4, s.v6 = s.l3+header.IPv6Len, true
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, len(f)-s.l4)
	default:
		return tcpSeg{}, false
	}
	tcp, ok := header.ParseTCP(f[s.l4:])
	if !ok {
		return tcpSeg{}, false
	}
	s.hl, s.seq, s.flags = s.l4+tcp.HeaderLen(), tcp.Seq(), tcp.Flags()
	if s.flags&^header.TCPFlagPSH != header.TCPFlagACK || s.payload() == 0 || csum.Fold(csum.Sum(sum, f[s.l4:])) != 0 {
		return tcpSeg{}, false
	}
	return s, true
}

// follows reports whether b continues a's flow right after a, so that
// a run of segments of size mss can take it.
func follows(a, b *tcpSeg, mss int) bool {
	if a.hl != b.hl || a.l4 != b.l4 || a.v6 != b.v6 || a.flags&header.TCPFlagPSH != 0 ||
		b.seq != a.seq+uint32(a.payload()) || a.payload() != mss || b.payload() > mss {
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
	// TCP without sequence number, PSH and checksum: ports, ACK, window,
	// options all equal.
	tx, ty := x[a.l4:a.hl], y[a.l4:a.hl]
	return string(tx[:4]) == string(ty[:4]) && string(tx[8:13]) == string(ty[8:13]) &&
		tx[13]&^header.TCPFlagPSH == ty[13]&^header.TCPFlagPSH &&
		string(tx[14:16]) == string(ty[14:16]) && string(tx[18:]) == string(ty[18:])
}

// coalescer merges runs of segments into super-frames.
type coalescer struct {
	buf []byte // vnet header and super-frame
}

// run returns how many frames at the start of frames form one run that
// can be coalesced (1 if the first cannot be), and the first one parsed.
func run(frames [][]byte, off int) (int, tcpSeg) {
	first, ok := parseTCPSeg(frames[0][off:])
	if !ok {
		return 1, first
	}
	mss, total := first.payload(), len(first.f)-first.l3
	prev := first
	k := 1
	for ; k < len(frames) && k < maxCoalesce; k++ {
		next, ok := parseTCPSeg(frames[k][off:])
		if !ok || !follows(&prev, &next, mss) || total+next.payload() > 65535 {
			break
		}
		total += next.payload()
		prev = next
	}
	return k, first
}

// merge builds the super-frame of frames (a run from run, at least two,
// whose first run parsed) behind its GSO header and returns it.
func (c *coalescer) merge(first tcpSeg, frames [][]byte, off int) []byte {
	if c.buf == nil {
		c.buf = make([]byte, vnetHdrLen+maxSuperFrame)
	}
	n := vnetHdrLen + copy(c.buf[vnetHdrLen:], first.f)
	flags := first.flags
	for _, f := range frames[1:] {
		f = f[off:]
		n += copy(c.buf[n:], f[first.hl:])
		flags |= f[first.l4+13] & header.TCPFlagPSH
	}
	sf := c.buf[vnetHdrLen:n]
	tcpLen := len(sf) - first.l4
	h := vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, hdrLen: uint16(first.hl), gsoSize: uint16(first.payload()),
		csumStart: uint16(first.l4), csumOffset: header.TCPChecksumOff}
	var sum uint32
	if first.v6 {
		ip := header.IPv6(sf[first.l3:])
		ip.SetPayloadLen(len(sf) - first.l3 - header.IPv6Len)
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, tcpLen)
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV6
	} else {
		ip := header.IPv4(sf[first.l3:])
		ip.SetTotalLen(len(sf) - first.l3)
		ip.SetChecksum()
		sum = csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoTCP, tcpLen)
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV4
	}
	tcp := header.TCP(sf[first.l4:])
	tcp.SetFlags(flags)
	// A partial checksum: the folded pseudo-header sum, not complemented;
	// whoever segments or delivers the frame completes it.
	tcp.SetChecksum(^csum.Fold(sum))
	h.encode(c.buf)
	return c.buf[:n]
}
