package shim

// Oversized IP packets are never blackholed (docs/architecture.md). IPv4
// with DF and IPv6 get ICMP "fragmentation needed" / "packet too big"
// back to the guest with the IPoIB MTU of the packet's partition, so
// path MTU discovery converges. IPv4 without DF is fragmented to it here
// (RFC 791 §3.2). Options are copied to non-first fragments only when
// their copied flag is set.

import (
	"encoding/binary"
	"net/netip"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
)

const (
	ipv6MinMTU = 1280
	icmpHeader = 8 // ICMP and ICMPv6 alike
)

// fragmentable reports whether an oversized packet may be fragmented
// here: IPv4 without DF.
func fragmentable(et uint16, pay []byte) bool {
	return et == ether.TypeIPv4 && !header.IPv4(pay).DontFragment()
}

// tooBig handles an IP packet longer than mtu, its partition's IPoIB MTU.
func (s *Shim) tooBig(b *txBatch, f ether.Frame, et uint16, pay []byte, m ipoib.TxMeta, mtu int) verdict {
	switch {
	case fragmentable(et, pay):
		s.fragment(b, header.IPv4(pay), m, mtu)
		return verdict(TxFragmented)
	case et == ether.TypeIPv4 || et == ether.TypeIPv6:
		return s.icmpTooBig(b, f, et, pay, mtu)
	}
	return verdict(DropTooBig)
}

// fragment splits an IPv4 packet into fragments that fit mtu (RFC 791
// §3.2): the first carries the whole header, the others only the
// options whose copied flag is set. A packet that is itself a fragment
// keeps its offset and MF flag in the pieces.
func (s *Shim) fragment(b *txBatch, ip header.IPv4, m ipoib.TxMeta, mtu int) {
	data := ip.Payload()
	origOff, origMF := ip.FragmentOffset(), ip.MoreFragments()
	var later [header.IPv4MaxLen]byte // the header of non-first fragments
	copy(later[:], ip[:header.IPv4MinLen])
	laterLen := header.IPv4MinLen + ip.CopiedOptions(later[header.IPv4MinLen:])
	later[0] = 0x40 | byte(laterLen/4)
	hdr := ip[:ip.HeaderLen()]
	for off := 0; off < len(data); {
		per := (mtu - len(hdr)) &^ 7
		end := min(off+per, len(data))
		if b.nfrag == len(b.frags) {
			s.flushTx(b)
		}
		fb := b.frags[b.nfrag]
		b.nfrag++
		ipoib.PutHeader(fb[ipoib.Headroom:], ether.TypeIPv4)
		frag := header.IPv4(fb[ipoib.Headroom+ipoib.HeaderLen:])
		hl := copy(frag, hdr)
		n := copy(frag[hl:], data[off:end])
		frag.SetTotalLen(hl + n)
		frag.SetFragment(origOff+off, end < len(data) || origMF)
		frag.SetChecksum()
		b.add(fb[:ipoib.Headroom+ipoib.HeaderLen+hl+n], m)
		s.ctr.inc(TxFragments)
		off = end
		hdr = later[:laterLen]
	}
}

// icmpTooBig answers the guest with ICMP fragmentation-needed (IPv4, RFC
// 1191) or ICMPv6 packet-too-big (RFC 4443 §3.2) carrying mtu, sent from
// the packet's destination as a router on the path would. The reply is
// left in b for txEnd to write.
func (s *Shim) icmpTooBig(b *txBatch, f ether.Frame, et uint16, pay []byte, mtu int) verdict {
	var src, dst netip.Addr
	if et == ether.TypeIPv4 {
		src, dst = header.IPv4(pay).Dst(), header.IPv4(pay).Src()
	} else {
		src, dst = header.IPv6(pay).Dst(), header.IPv6(pay).Src()
	}
	if src.IsMulticast() || dst.IsMulticast() || dst.IsUnspecified() || f.Dst().IsMulticast() {
		return verdict(DropTooBig)
	}
	buf := b.icmp[tap.Headroom:]
	clear(buf)
	hl := ether.PutHeader(buf, f.Src(), f.Dst(), f.VLAN(), et)
	var n int
	if et == ether.TypeIPv4 {
		quote := pay[:header.IPv4(pay).HeaderLen()+8]
		n = header.IPv4MinLen + icmpHeader + len(quote)
		header.EncodeIPv4(buf[hl:], header.IPv4Fields{TotalLen: n, TTL: 64, Protocol: header.ProtoICMP, Src: src, Dst: dst})
		icmp := buf[hl+header.IPv4MinLen : hl+n]
		icmp[0], icmp[1] = 3, 4 // destination unreachable, fragmentation needed
		binary.BigEndian.PutUint16(icmp[6:8], uint16(mtu))
		copy(icmp[icmpHeader:], quote)
		binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(0, icmp)))
	} else {
		quote := pay[:min(len(pay), ipv6MinMTU-header.IPv6Len-icmpHeader)]
		plen := icmpHeader + len(quote)
		n = header.IPv6Len + plen
		ip := header.EncodeIPv6(buf[hl:], header.IPv6Fields{PayloadLen: plen, NextHeader: header.ProtoICMPv6, HopLimit: 64, Src: src, Dst: dst})
		icmp := buf[hl+header.IPv6Len : hl+n]
		icmp[0], icmp[1] = 2, 0 // packet too big
		binary.BigEndian.PutUint32(icmp[4:8], uint32(mtu))
		copy(icmp[icmpHeader:], quote)
		binary.BigEndian.PutUint16(icmp[2:4], csum.Fold(csum.Sum(csum.Pseudo(ip.SrcBytes(), ip.DstBytes(), header.ProtoICMPv6, plen), icmp)))
	}
	b.local[0], b.nlocal = b.icmp[:tap.Headroom+hl+n], 1
	return verdict(TxICMPTooBig)
}
