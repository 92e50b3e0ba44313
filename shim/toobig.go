package shim

// Oversized IP packets are never blackholed (DESIGN.md): IPv4 with DF and
// IPv6 get ICMP "fragmentation needed" / "packet too big" back to the
// guest with the IPoIB MTU, so path MTU discovery converges; IPv4 without
// DF is fragmented to the IPoIB MTU here (RFC 791 §3.2, options copied to
// every fragment).

import (
	"encoding/binary"
	"net/netip"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

const (
	ipv6MinMTU   = 1280
	icmpv6Header = 8
)

// fragmentable reports whether an oversized packet may be fragmented
// here: IPv4 without DF.
func fragmentable(et uint16, pay []byte) bool {
	return et == ether.TypeIPv4 && pay[6]&0x40 == 0
}

// tooBig handles an IP packet longer than the IPoIB MTU.
func (s *Shim) tooBig(b *txBatch, f ether.Frame, et uint16, pay []byte, m ipoib.TxMeta) {
	switch {
	case fragmentable(et, pay):
		s.fragment(b, pay, m)
	case et == ether.TypeIPv4 || et == ether.TypeIPv6:
		s.icmpTooBig(f, et, pay)
	default:
		s.ctr.inc(DropTooBig)
	}
}

// fragment splits an IPv4 packet into fragments that fit the IPoIB MTU.
func (s *Shim) fragment(b *txBatch, pay []byte, m ipoib.TxMeta) {
	hl := int(pay[0]&0x0f) * 4
	data := pay[hl:]
	per := (s.ipMTU - hl) &^ 7
	fo := binary.BigEndian.Uint16(pay[6:8])
	origOff, origMF := int(fo&0x1fff), fo&0x2000 != 0
	for off := 0; off < len(data); off += per {
		end := min(off+per, len(data))
		if b.nfrag == len(b.frags) {
			s.flushTx(b)
		}
		fb := b.frags[b.nfrag]
		b.nfrag++
		ipoib.PutHeader(fb[ipoib.Headroom:], ether.TypeIPv4)
		ip := fb[ipoib.Headroom+ipoib.HeaderLen:]
		copy(ip, pay[:hl])
		n := copy(ip[hl:], data[off:end])
		binary.BigEndian.PutUint16(ip[2:4], uint16(hl+n))
		flags := uint16(origOff + off/8)
		if end < len(data) || origMF {
			flags |= 0x2000
		}
		binary.BigEndian.PutUint16(ip[6:8], flags)
		csum.IPv4Header(ip[:hl])
		b.add(fb[:ipoib.Headroom+ipoib.HeaderLen+hl+n], m)
		s.ctr.inc(TxFragments)
	}
	s.ctr.inc(TxFragmented)
}

// icmpTooBig answers the guest with ICMP fragmentation-needed (IPv4, RFC
// 1191) or ICMPv6 packet-too-big (RFC 4443 §3.2) carrying the IPoIB MTU,
// sent from the packet's destination as a router on the path would.
func (s *Shim) icmpTooBig(f ether.Frame, et uint16, pay []byte) {
	var src, dst netip.Addr
	if et == ether.TypeIPv4 {
		src, dst = netip.AddrFrom4([4]byte(pay[16:20])), netip.AddrFrom4([4]byte(pay[12:16]))
	} else {
		src, dst = netip.AddrFrom16([16]byte(pay[24:40])), netip.AddrFrom16([16]byte(pay[8:24]))
	}
	if src.IsMulticast() || dst.IsMulticast() || dst.IsUnspecified() || f.Dst().IsMulticast() {
		s.ctr.inc(DropTooBig)
		return
	}
	buf := s.icmpBuf // owned by the TX loop
	clear(buf)
	hl := ether.PutHeader(buf, f.Src(), f.Dst(), f.VLAN(), et)
	ip := buf[hl:]
	var n int
	if et == ether.TypeIPv4 {
		ihl := int(pay[0]&0x0f) * 4
		quote := pay[:ihl+8]
		n = 20 + 8 + len(quote)
		ip[0], ip[1] = 0x45, 0
		binary.BigEndian.PutUint16(ip[2:4], uint16(n))
		ip[8], ip[9] = 64, 1 // TTL, ICMP
		s4, d4 := src.As4(), dst.As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		csum.IPv4Header(ip[:20])
		icmp := ip[20:n]
		icmp[0], icmp[1] = 3, 4 // destination unreachable, fragmentation needed
		binary.BigEndian.PutUint16(icmp[6:8], uint16(s.ipMTU))
		copy(icmp[8:], quote)
		binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(0, icmp)))
	} else {
		quote := pay[:min(len(pay), ipv6MinMTU-40-icmpv6Header)]
		plen := icmpv6Header + len(quote)
		n = 40 + plen
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:6], uint16(plen))
		ip[6], ip[7] = 58, 64
		s16, d16 := src.As16(), dst.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
		icmp := ip[40:n]
		icmp[0], icmp[1] = 2, 0 // packet too big
		binary.BigEndian.PutUint32(icmp[4:8], uint32(s.ipMTU))
		copy(icmp[8:], quote)
		binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(csum.Pseudo(s16[:], d16[:], 58, plen), icmp)))
	}
	s.ctr.inc(TxICMPTooBig)
	s.writeLocal([][]byte{buf[:hl+n]})
}
