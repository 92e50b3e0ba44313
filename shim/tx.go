package shim

// TX: TAP → fabric. Per frame: Ethernet header checks → partition from the
// VLAN → the source MAC's VIF, looked up lock-free (a new guest's frames
// are held while the control goroutine makes its VIF: newvif.go; the
// rest, translate, takes the VIF) → destination MAC
// to RIMAC/MGID → ARP/NDP/DHCP rewrite in place → MSS clamp (optional) →
// MTU → the 4-byte IPoIB header written over the end of the Ethernet
// header. The batch goes to the port in one Write; nothing here allocates
// or logs per frame.

import (
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/iobuf"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
	"github.com/eipoib/eipoibd/tap"
)

const (
	// devHeadroom is reserved before each frame read from the device;
	// the IPoIB packet handed to the port starts ipoib.Headroom before its
	// header, which sits at devHeadroom+headerLen-4.
	devHeadroom = 64
	// devBufSize holds any frame the device can produce plus room for
	// payload growth and the port's tail.
	devBufSize = devHeadroom + 65536 + 256
	// maxFrags is enough fragments for the largest IPv4 packet at the
	// smallest IPoIB MTU.
	maxFrags = 65536/(ipoib.MTU2044-60) + 2
	// nsTarget and nsLen locate the target address of a neighbour
	// solicitation in its ICMPv6 message (RFC 4861 §4.3).
	nsTarget = 8
	nsLen    = nsTarget + 16
)

// txBatch collects the packets of one TX batch; each TX worker has its
// own.
type txBatch struct {
	bufs  [][]byte
	meta  []ipoib.TxMeta
	frags [][]byte // fragment buffers
	nfrag int
	icmp  []byte   // an ICMP too-big reply to a guest
	local [][]byte // a frame sent back to the bridge (deliverMoved)
	cut   gso.Segmenter
	dgram []byte // a datagram cut from a UDP super-frame, too big to send (made on first use)
}

// newTxBatch returns a batch for up to bs frames and their fragments.
func newTxBatch(bs int) *txBatch {
	b := &txBatch{
		bufs:  make([][]byte, 0, bs+maxFrags),
		meta:  make([]ipoib.TxMeta, 0, bs+maxFrags),
		frags: make([][]byte, maxFrags),
		icmp:  make([]byte, tap.Headroom+ether.VLANHeaderLen+ipv6MinMTU),
		local: make([][]byte, 1),
	}
	for i := range b.frags {
		b.frags[i] = make([]byte, ipoib.Headroom+ipoib.HeaderLen+ipoib.MTU4092+64)
	}
	return b
}

func (b *txBatch) add(pkt []byte, m ipoib.TxMeta) {
	b.bufs = append(b.bufs, pkt)
	b.meta = append(b.meta, m)
}

func (s *Shim) flushTx(b *txBatch) {
	if len(b.bufs) > 0 {
		s.writePort(b.bufs, b.meta)
	}
	b.bufs, b.meta, b.nfrag = b.bufs[:0], b.meta[:0], 0
}

// superReader returns dev when it hands over super-frames and the port
// cuts TCP super-packets itself, so that super-frames cross the shim
// whole; nil when the device cuts them. UDP super-frames then cross
// whole too, and are cut here for a port that does not take them.
func (s *Shim) superReader(dev tap.Device) tap.Device {
	if o := s.port.Offloads(); dev.Caps().SuperFrames && o.TSO && o.MaxSuper >= ipoib.MaxSuperPacket {
		return dev
	}
	return nil
}

// txLoop is TX worker slot (its epoch slot): it reads batches from dev,
// translates them and hands them to the port. Workers share the tables
// (read lock-free) and nothing else; each batch runs within the worker's
// epoch, so no QP it sends from is freed under it.
func (s *Shim) txLoop(slot int, dev tap.Device) error {
	bs := dev.BatchSize()
	// Outside the Go heap (iobuf): a batch of 64 KB buffers, most of
	// whose pages an ordinary frame never writes, would otherwise count
	// toward the collector's goal in full.
	mem, err := iobuf.New(bs, devBufSize)
	if err != nil {
		return err
	}
	defer mem.Free()
	bufs := mem.Bufs
	sizes := make([]int, bs)
	sr := s.superReader(dev)
	super := make([]tap.Super, bs) // all zero unless sr fills them
	b := newTxBatch(bs)
	for {
		var n int
		if sr != nil {
			n, err = sr.ReadSuper(bufs, sizes, super, devHeadroom)
		} else {
			n, err = dev.Read(bufs, sizes, devHeadroom)
		}
		if err != nil {
			return err
		}
		now := s.clk.Now()
		if s.capture.Load() != nil {
			for i := range n {
				s.capTAP(bufs[i][devHeadroom : devHeadroom+sizes[i]])
			}
		}
		s.ep.enter(slot)
		for i := 0; i < n; i++ {
			s.ctr.inc(TxFrames)
			s.ctr.add(TxBytes, uint64(sizes[i]))
			s.tx(b, bufs[i], sizes[i], super[i], now)
		}
		s.flushTx(b)
		s.ep.exit(slot)
	}
}

// ipBounds checks the IP header against the Ethernet payload and returns
// the packet without Ethernet padding; ok is false when inconsistent.
func ipBounds(et uint16, pay []byte) ([]byte, bool) {
	switch et {
	case ether.TypeIPv4:
		return header.ParseIPv4(pay)
	case ether.TypeIPv6:
		return header.ParseIPv6(pay)
	case ether.TypeARP, ether.TypeRARP:
		return pay, true
	}
	return nil, false
}

// ipAddrs returns the source and destination IP of an IP packet checked by
// ipBounds, or the sender and target of an ARP packet (either link layer).
func ipAddrs(et uint16, pay []byte) (src, dst netip.Addr) {
	switch et {
	case ether.TypeIPv4:
		h := header.IPv4(pay)
		return h.Src(), h.Dst()
	case ether.TypeIPv6:
		h := header.IPv6(pay)
		return h.Src(), h.Dst()
	}
	a := arpndp.ARP(pay)
	if a.Validate() != nil {
		return
	}
	return netip.AddrFrom4(a.SenderIP()), netip.AddrFrom4(a.TargetIP())
}

// multicastMGID maps a multicast frame to its MGID from the IP destination.
func (s *Shim) multicastMGID(p *partition, et uint16, pay []byte) (ipoib.GID, bool) {
	switch et {
	case ether.TypeIPv4:
		if d := header.IPv4(pay).Dst(); d.IsMulticast() {
			return ipoib.IPv4MGID(d, p.pkey, s.cfg.Scope), true
		}
	case ether.TypeIPv6:
		if d := header.IPv6(pay).Dst(); d.IsMulticast() {
			return ipoib.IPv6MGID(d, p.pkey, s.cfg.Scope), true
		}
	}
	return ipoib.GID{}, false
}

// tx takes one frame at buf[devHeadroom:devHeadroom+n]; sup describes a
// TCP or UDP super-frame to hand to the port whole. It checks the frame, finds
// the sending VIF and translates the frame, or holds it while the
// guest's VIF is made.
func (s *Shim) tx(b *txBatch, buf []byte, n int, sup tap.Super, now time.Time) {
	p, pay, ok := s.txCheck(buf, n)
	if !ok {
		return
	}
	k := mactrans.VIFKey{MAC: ether.Frame(buf[devHeadroom:]).Src(), VLAN: p.vlan}
	vif, ok := s.vifs.Lookup(k)
	if !ok || !vif.Ready() {
		if !ok && s.cfg.Learn == LearnDeclared {
			s.dropUndeclared(k)
			return
		}
		if vif = s.holdNew(k, buf, n, sup, now); vif == nil {
			return
		}
	}
	s.translate(b, p, vif, buf, n, pay, sup, now)
}

// txCheck checks the headers of the frame at buf[devHeadroom:devHeadroom+n]
// and returns its partition and its payload without Ethernet padding; ok
// is false for a frame dropped (counted).
func (s *Shim) txCheck(buf []byte, n int) (p *partition, pay []byte, ok bool) {
	f := ether.Frame(buf[devHeadroom : devHeadroom+n])
	if !f.IsValid() {
		s.ctr.inc(DropRunt)
		return nil, nil, false
	}
	if p = s.byVLAN[f.VLAN()].Load(); p == nil {
		s.ctr.inc(DropVLANUnmapped)
		return nil, nil, false
	}
	if src := f.Src(); src.IsMulticast() || src.IsZero() {
		s.ctr.inc(DropBadSrcMAC)
		return nil, nil, false
	}
	et := f.EtherType()
	if pay, ok = ipBounds(et, buf[devHeadroom+f.HeaderLen():devHeadroom+n]); !ok {
		if et == ether.TypeIPv4 || et == ether.TypeIPv6 {
			s.ctr.inc(DropBadIP)
		} else {
			s.ctr.inc(DropEtherType)
		}
	}
	return p, pay, ok
}

// translate translates one frame of vif's guest in partition p, checked
// by txCheck (pay its payload), and adds it to the batch (or queues it,
// or answers it).
func (s *Shim) translate(b *txBatch, p *partition, vif *mactrans.VIF, buf []byte, n int, pay []byte, sup tap.Super, now time.Time) {
	f := ether.Frame(buf[devHeadroom : devHeadroom+n])
	src, dst := f.Src(), f.Dst()
	et := f.EtherType()
	payStart := devHeadroom + f.HeaderLen()
	mtu := p.mtu()
	if s.cfg.ClampMSS && (et == ether.TypeIPv4 || et == ether.TypeIPv6) && s.clampMSS(pay, et == ether.TypeIPv6, mtu) {
		s.ctr.inc(TxMSSClamped)
	}
	var err error
	vif.Touch(now)
	vif.CountTx(n)
	if s.cfg.AnnounceWindow > 0 {
		s.learnGuest(p, vif, et, pay, now)
	}
	m := ipoib.TxMeta{SrcQPN: vif.QPN, PKey: p.pkey}
	unknown := false
	kind := Counter(-1) // TxBroadcast or TxMulticast, counted when sent on
	waits := false      // m.Dst is a group being joined: the frame waits for it
	var source, target netip.Addr
	switch {
	case dst.IsBroadcast():
		m.Dst = ipoib.MakeHwAddr(0, ipoib.MulticastQPN, p.bcast)
		kind = TxBroadcast
	case dst.IsMulticast():
		mgid, ok := s.multicastMGID(p, et, pay)
		if !ok {
			s.ctr.inc(DropBadIP)
			return
		}
		switch s.sendTo(mgid, now) {
		case groupRefused:
			s.ctr.inc(DropNoGroup)
			return
		case groupJoining:
			waits = true
		}
		m.Dst = ipoib.MakeHwAddr(0, ipoib.MulticastQPN, mgid)
		kind = TxMulticast
	default:
		if nb, ok := s.neigh.LookupREMAC(p.pkey, dst); ok {
			// For a guest that moved here (moved.go). A super-frame
			// is not sent back, as the bridge would refuse it whole:
			// it goes on and is lost, and TCP resends it once the
			// guests know the moved guest's MAC.
			if to := nb.MovedTo(); to != nil && sup.L4 == 0 && s.deliverMoved(b, buf, n, et, pay, nb, to, vif) {
				return
			}
			nb.Use(now)
			m.Dst = nb.RIMAC.WithoutFlags()
		} else if _, local := s.vifs.Lookup(mactrans.VIFKey{MAC: dst, VLAN: p.vlan}); local {
			s.ctr.inc(DropDstLocal)
			return
		} else if w, own := s.vifs.LookupREMAC(dst); own && w.Key.VLAN == p.vlan && sup.L4 == 0 {
			// A guest that moved here, to a local guest by the REMAC
			// it had for it elsewhere (moved.go).
			s.sendBack(b, buf, n, w.Key.MAC, dst)
			return
		} else if source, target = ipAddrs(et, pay); sup.L4 == 0 && vif.MovedIn() {
			if nb := s.remoteOwner(p, vif, target, now); nb != nil {
				nb.Use(now)
				m.Dst = nb.RIMAC.WithoutFlags()
			} else {
				unknown = true
			}
		} else {
			unknown = true
		}
	}
	switch et {
	case ether.TypeARP, ether.TypeRARP:
		pay, err = arpndp.ARPToIB(pay, p.view)
	case ether.TypeIPv6:
		if !s.snoopIPv6(p, pay, now) {
			return
		}
		if arpndp.IsNDP(pay) {
			pay, err = arpndp.NDPToIB(pay, p.view)
		}
	case ether.TypeIPv4:
		if snoop.IsIGMP(pay) && !s.snoopRecords(p, snoop.ParseIGMP, pay, header.IPv4(pay).Src(), now) {
			return
		}
		if arpndp.IsDHCPClient(pay) {
			if s.cfg.DHCP == DHCPRFC4390 {
				if xid, ok := arpndp.DHCPXID(pay); ok {
					s.xids.remember(xid, src, now)
				}
				pay, err = arpndp.DHCPToIB(pay, s.cfg.DHCPClientID)
			} else {
				err = arpndp.SetBroadcastFlag(pay)
			}
		}
	}
	if err != nil {
		s.ctr.txRewrite.Count(err)
		s.ctr.inc(DropTxRewrite)
		return
	}
	segs := 0 // of a super-frame
	if sup.L4 != 0 {
		if segs = s.superMeta(&m, f, pay, sup, kind, mtu); segs == 0 {
			return
		}
		if unknown {
			// Not queued, as fragments are not: resolve, and let TCP's
			// retransmission (or the UDP application) find the
			// destination known.
			s.ctr.inc(DropUnresolved)
			s.enqueue(p, vif, dst, nil, m, source, target, now)
			return
		}
		if sup.UDP && m.GSO.Type == ipoib.GSONone {
			if waits {
				s.ctr.inc(DropNoGroup) // not held, as fragments are not
				return
			}
			s.cutUDP(b, f, et, pay, sup, m, kind, mtu)
			return
		}
	} else if len(pay) > mtu {
		if waits {
			// Not held, as fragments are not: the group is being
			// joined.
			s.ctr.inc(DropNoGroup)
			return
		}
		if unknown && fragmentable(et, pay) {
			// Fragments are not queued: resolve, and let the guest's
			// retransmission find the destination known.
			s.ctr.inc(DropUnresolved)
			s.enqueue(p, vif, dst, nil, m, source, target, now)
			return
		}
		s.tooBig(b, f, et, pay, m, mtu)
		return
	}
	hdr := payStart - ipoib.HeaderLen
	ipoib.PutHeader(buf[hdr:], et)
	pkt := buf[hdr-ipoib.Headroom : payStart+len(pay)]
	if unknown {
		if !s.enqueue(p, vif, dst, pkt, m, source, target, now) {
			s.ctr.inc(DropUnresolved)
		}
		return
	}
	if waits && s.holdForGroup(m.Dst.GID(), heldFrame{buf: pkt, meta: m, vif: vif}) {
		return
	}
	s.ctr.inc(TxForwarded)
	if kind >= 0 {
		s.ctr.inc(kind)
	}
	if sup.L4 != 0 {
		s.ctr.inc(TxSuper)
		s.ctr.add(TxSuperSegments, uint64(segs))
	}
	b.add(pkt, m)
}

// superMeta describes a super-frame (checked by the device) to the
// port and returns how many segments it is cut into: a TCP one with
// segments cut to the partition's IPoIB MTU mtu, 0 (counted) when it
// goes to a group, where TCP never goes; a UDP one, to any destination,
// when the port takes UDP super-packets and its datagrams fit mtu (else
// m.GSO stays zero, for cutUDP).
func (s *Shim) superMeta(m *ipoib.TxMeta, f ether.Frame, pay []byte, sup tap.Super, kind Counter, mtu int) int {
	l4 := int(sup.L4) - f.HeaderLen() // from the IP header
	if sup.UDP {
		hdrs := l4 + gso.UDPHeaderLen
		if s.port.Offloads().USO && hdrs+int(sup.Size) <= mtu {
			m.GSO = ipoib.GSO{Type: ipoib.GSOUDPv4, L4: uint16(ipoib.HeaderLen + l4), Size: sup.Size}
			if sup.V6 {
				m.GSO.Type = ipoib.GSOUDPv6
			}
		}
		return gso.Segments(len(pay), hdrs, int(sup.Size))
	}
	if kind >= 0 {
		s.ctr.inc(DropSuperGroup)
		return 0
	}
	hdrs := l4 + header.TCP(pay[l4:]).HeaderLen()
	size := min(int(sup.Size), mtu-hdrs)
	m.GSO = ipoib.GSO{Type: ipoib.GSOTCPv4, L4: uint16(ipoib.HeaderLen + l4), Size: uint16(size)}
	if sup.V6 {
		m.GSO.Type = ipoib.GSOTCPv6
	}
	return gso.Segments(len(pay), hdrs, size)
}

// cutUDP cuts a UDP super-frame (pay its IP packet, checked by the
// device) that the port is not given whole into its datagrams, each sent
// as an ordinary packet in a fragment buffer; kind is the group counter
// as translate has it. Datagrams longer than mtu are fragmented one by
// one (IPv4 without DF; each counted as any packet fragmented), else the
// guest gets one ICMP too-big for the frame, as the kernel's
// ip_finish_output_gso and ip6_finish_output_gso do for a GSO skb whose
// segments do not fit. The frame counts once as forwarded or answered,
// or each of its datagrams as fragmented.
func (s *Shim) cutUDP(b *txBatch, f ether.Frame, et uint16, pay []byte, sup tap.Super, m ipoib.TxMeta, kind Counter, mtu int) {
	l4 := int(sup.L4) - f.HeaderLen()
	big := l4+gso.UDPHeaderLen+int(sup.Size) > mtu
	if big && !fragmentable(et, pay) {
		s.tooBig(b, f, et, pay, m, mtu)
		return
	}
	if b.cut.StartUDP(pay, 0, l4, sup.V6, int(sup.Size), 65535) != nil {
		s.ctr.inc(DropBadIP)
		return
	}
	s.ctr.inc(TxSuperCut)
	for !b.cut.Done() {
		if big {
			if b.dgram == nil {
				b.dgram = make([]byte, 65535)
			}
			n := b.cut.Cut(b.dgram)
			s.fragment(b, header.IPv4(b.dgram[:n]), m, mtu)
			continue
		}
		if b.nfrag == len(b.frags) {
			s.flushTx(b)
		}
		fb := b.frags[b.nfrag]
		b.nfrag++
		ipoib.PutHeader(fb[ipoib.Headroom:], et)
		n := b.cut.Cut(fb[ipoib.Headroom+ipoib.HeaderLen:])
		b.add(fb[:ipoib.Headroom+ipoib.HeaderLen+n], m)
	}
	if !big {
		s.ctr.inc(TxForwarded)
	}
	if kind >= 0 {
		s.ctr.inc(kind)
	}
}

// snoopIPv6 records the memberships an IPv6 packet from a guest shows:
// those its MLD reports and dones state, the solicited-node group of its
// source address, and that of the target of its duplicate address
// detection. It reports false for a malformed MLD message (dropped).
func (s *Shim) snoopIPv6(p *partition, pay []byte, now time.Time) bool {
	ip := header.IPv6(pay)
	src := ip.Src()
	if snoop.IsMLD(pay) && !s.snoopRecords(p, snoop.ParseMLD, pay, src, now) {
		return false
	}
	if !src.IsUnspecified() {
		// Per frame, so only when the group is not joined yet: once it
		// is, the guest's MLD answers to the queries keep it alive.
		if sn := solicitedNode(src); !src.IsMulticast() && !s.fullMember(p, sn) {
			s.member(p, sn, src, false, now)
		}
		return true
	}
	if icmp := ip.Payload(); ip.NextHeader() == header.ProtoICMPv6 && len(icmp) >= nsLen && icmp[0] == arpndp.TypeNeighborSolicitation {
		s.member(p, solicitedNode(netip.AddrFrom16([16]byte(icmp[nsTarget:nsLen]))), src, false, now)
	}
	return true
}

// snoopRecords feeds the records of a guest's IGMP or MLD message, sent
// from the address from, to the snooping table; it reports false
// (counted) for a malformed one or one with a wrong checksum.
func (s *Shim) snoopRecords(p *partition, parse func([]byte) (snoop.Records, error), pay []byte, from netip.Addr, now time.Time) bool {
	recs, err := parse(pay)
	if err != nil {
		s.ctr.inc(DropBadMcastReport)
		return false
	}
	for r, ok := recs.Next(); ok; r, ok = recs.Next() {
		if r.Group != allNodes && r.Group != allHosts {
			s.member(p, r.Group, from, r.Leave, now)
		}
	}
	return true
}
