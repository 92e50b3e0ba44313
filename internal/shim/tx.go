package shim

// TX: TAP → fabric. Per frame: Ethernet header checks → partition from the
// VLAN → the source MAC's VIF, looked up lock-free → translate's stages.
// A new guest's frames are held while the control goroutine makes its
// VIF (newvif.go). The stages are: the destination MAC to RIMAC/MGID,
// the ARP/NDP/DHCP rewrite in place, the MTU, and the 4-byte IPoIB
// header written over the end of the Ethernet header. Each stage returns
// a verdict (counters.go), counted once by tx. The batch goes to the
// port in one Write; nothing here allocates or logs per frame.

import (
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/iobuf"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
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
)

// txBatch collects the packets of one TX batch; each TX worker has its
// own.
type txBatch struct {
	bufs  [][]byte
	meta  []ipoib.TxMeta
	frags [][]byte // fragment buffers
	nfrag int
	icmp  []byte   // an ICMP too-big reply to a guest
	local [][]byte // a frame to a guest (ICMP, sendBack), written by txEnd
	// nlocal is 1 while local holds a frame to write.
	nlocal int
	cut    gso.Segmenter
	dgram  []byte // a datagram cut from a UDP super-frame, too big to send (made on first use)
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

// writePort sends packets laid out with ipoib.Headroom before the header
// and counts what the port accepted and refused.
func (s *Shim) writePort(bufs [][]byte, meta []ipoib.TxMeta) {
	if s.capture.Load() != nil {
		for i := range bufs {
			s.capFabricTx(bufs[i][ipoib.Headroom:], meta[i].Dst)
		}
	}
	s.portMu.Lock()
	n, _ := s.port.Write(bufs, meta, ipoib.Headroom)
	s.portMu.Unlock()
	s.ctr.c[TxPackets].Add(uint64(n))
	s.ctr.c[TxPortRefused].Add(uint64(len(bufs) - n))
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
// TCP or UDP super-frame to hand to the port whole. It checks the frame,
// finds the sending VIF and translates the frame, or holds it while the
// guest's VIF is made, and counts its verdict.
func (s *Shim) tx(b *txBatch, buf []byte, n int, sup tap.Super, now time.Time) {
	s.txEnd(b, s.txFrame(b, buf, n, sup, now))
}

// txEnd counts the verdict of a frame, then writes to the TAP the frame
// the stages left there for a guest (an ICMP too-big, a frame sent back
// to the bridge): counted before the guest can see it.
func (s *Shim) txEnd(b *txBatch, v verdict) {
	s.ctr.end(v)
	if b.nlocal > 0 {
		s.writeLocal(b.local[:b.nlocal])
		b.nlocal = 0
	}
}

// txFrame is the first stages of tx: the headers, then the sending VIF.
func (s *Shim) txFrame(b *txBatch, buf []byte, n int, sup tap.Super, now time.Time) verdict {
	p, pay, v := s.txCheck(buf, n)
	if v != pass {
		return v
	}
	k := mactrans.VIFKey{MAC: ether.Frame(buf[devHeadroom:]).Src(), VLAN: p.vlan}
	vif, ok := s.vifs.Lookup(k)
	if !ok || !vif.Ready() {
		if !ok && s.cfg.Learn == LearnDeclared {
			return s.dropUndeclared(k)
		}
		if vif, v = s.holdNew(k, buf, n, sup, now); vif == nil {
			return v
		}
	}
	return s.translate(b, p, vif, buf, n, pay, sup, now)
}

// txCheck checks the headers of the frame at buf[devHeadroom:devHeadroom+n]
// and returns its partition and its payload without Ethernet padding, or
// the verdict that drops it.
func (s *Shim) txCheck(buf []byte, n int) (p *partition, pay []byte, v verdict) {
	f := ether.Frame(buf[devHeadroom : devHeadroom+n])
	if !f.IsValid() {
		return nil, nil, verdict(DropRunt)
	}
	if p = s.byVLAN[f.VLAN()].Load(); p == nil {
		return nil, nil, verdict(DropVLANUnmapped)
	}
	if src := f.Src(); src.IsMulticast() || src.IsZero() {
		return nil, nil, verdict(DropBadSrcMAC)
	}
	et := f.EtherType()
	pay, ok := ipBounds(et, buf[devHeadroom+f.HeaderLen():devHeadroom+n])
	switch {
	case ok:
		return p, pay, pass
	case et == ether.TypeIPv4 || et == ether.TypeIPv6:
		return nil, nil, verdict(DropBadIP)
	}
	return nil, nil, verdict(DropEtherType)
}

// txPacket is one frame of a guest crossing the stages of translate,
// with what they learn of it. It lives on the TX worker's stack.
type txPacket struct {
	p   *partition
	vif *mactrans.VIF
	buf []byte // the frame at buf[devHeadroom:devHeadroom+n]
	n   int
	f   ether.Frame
	et  uint16
	pay []byte // the IP or ARP packet, without Ethernet padding
	sup tap.Super
	now time.Time
	mtu int
	m   ipoib.TxMeta
	// kind is TxBroadcast or TxMulticast, counted when sent on; -1 for
	// unicast.
	kind Counter
	// waits: m.Dst is a group being joined, and the frame waits for it.
	waits bool
	// unknown: the destination is not known yet; source and target are
	// the addresses to resolve it with.
	unknown        bool
	source, target netip.Addr
	segs           int // of a super-frame
}

// translate translates one frame of vif's guest in partition p, checked
// by txCheck (pay its payload): resolve the destination, rewrite, fit
// the MTU, emit (to the batch, the resolution queue or a group's held
// frames). It returns the frame's verdict.
func (s *Shim) translate(b *txBatch, p *partition, vif *mactrans.VIF, buf []byte, n int, pay []byte, sup tap.Super, now time.Time) verdict {
	f := ether.Frame(buf[devHeadroom : devHeadroom+n])
	t := txPacket{p: p, vif: vif, buf: buf, n: n, f: f, et: f.EtherType(), pay: pay, sup: sup, now: now, mtu: p.mtu(), kind: -1}
	if s.cfg.ClampMSS && (t.et == ether.TypeIPv4 || t.et == ether.TypeIPv6) && s.clampMSS(pay, t.et == ether.TypeIPv6, t.mtu) {
		s.ctr.inc(TxMSSClamped)
	}
	vif.Touch(now)
	vif.CountTx(n)
	if s.cfg.AnnounceWindow > 0 {
		s.mobility.learnGuest(p, vif, t.et, pay, now)
	}
	t.m = ipoib.TxMeta{SrcQPN: vif.QPN, PKey: p.pkey}
	if v := s.txDestination(b, &t); v != pass {
		return v
	}
	if v := s.txRewrite(&t); v != pass {
		return v
	}
	if v := s.txFit(b, &t); v != pass {
		return v
	}
	return s.txEmit(b, &t)
}

// txDestination resolves t's destination MAC to t.m.Dst: the broadcast
// group, a multicast group (joined, or being joined: t.waits), a known
// remote endpoint, or none yet (t.unknown). Frames for local guests are
// dropped, or sent back to the bridge for a guest that moved here.
func (s *Shim) txDestination(b *txBatch, t *txPacket) verdict {
	dst := t.f.Dst()
	p := t.p
	switch {
	case dst.IsBroadcast():
		t.m.Dst = ipoib.MakeHwAddr(0, ipoib.MulticastQPN, p.bcast)
		t.kind = TxBroadcast
		return pass
	case dst.IsMulticast():
		mgid, ok := s.multicastMGID(p, t.et, t.pay)
		if !ok {
			return verdict(DropBadIP)
		}
		switch s.groups.sendTo(mgid, t.now) {
		case groupRefused:
			return verdict(DropNoGroup)
		case groupJoining:
			t.waits = true
		}
		t.m.Dst = ipoib.MakeHwAddr(0, ipoib.MulticastQPN, mgid)
		t.kind = TxMulticast
		return pass
	}
	if nb, ok := s.neigh.LookupREMAC(p.pkey, dst); ok {
		// For a guest that moved here (moved.go). A super-frame is not
		// sent back, as the bridge would refuse it whole: it goes on
		// and is lost, and TCP resends it once the guests know the
		// moved guest's MAC.
		if to := nb.MovedTo(); to != nil && t.sup.L4 == 0 {
			if v := s.mobility.deliverMoved(b, t.buf, t.n, t.et, t.pay, nb, to, t.vif); v != pass {
				return v
			}
		}
		nb.Use(t.now)
		t.m.Dst = nb.RIMAC.WithoutFlags()
		return pass
	}
	if _, local := s.vifs.Lookup(mactrans.VIFKey{MAC: dst, VLAN: p.vlan}); local {
		return verdict(DropDstLocal)
	}
	if w, own := s.vifs.LookupREMAC(dst); own && w.Key.VLAN == p.vlan && t.sup.L4 == 0 {
		// A guest that moved here, to a local guest by the REMAC it had
		// for it elsewhere (moved.go).
		return b.sendBack(t.buf, t.n, w.Key.MAC, dst)
	}
	t.source, t.target = ipAddrs(t.et, t.pay)
	if t.sup.L4 == 0 && t.vif.MovedIn() {
		if nb := s.mobility.remoteOwner(p, t.vif, t.target, t.now); nb != nil {
			nb.Use(t.now)
			t.m.Dst = nb.RIMAC.WithoutFlags()
			return pass
		}
	}
	t.unknown = true
	return pass
}

// txRewrite snoops t's IGMP/MLD and rewrites its ARP, NDP and DHCP
// payloads for IPoIB in place.
func (s *Shim) txRewrite(t *txPacket) verdict {
	var err error
	switch t.et {
	case ether.TypeARP, ether.TypeRARP:
		t.pay, err = arpndp.ARPToIB(t.pay, t.p.view)
	case ether.TypeIPv6:
		if v := s.groups.snoopIPv6(t.p, t.pay, t.now); v != pass {
			return v
		}
		if arpndp.IsNDP(t.pay) {
			t.pay, err = arpndp.NDPToIB(t.pay, t.p.view)
		}
	case ether.TypeIPv4:
		if snoop.IsIGMP(t.pay) {
			if v := s.groups.snoopRecords(t.p, snoop.ParseIGMP, t.pay, header.IPv4(t.pay).Src(), t.now); v != pass {
				return v
			}
		}
		if arpndp.IsDHCPClient(t.pay) {
			if s.cfg.DHCP == DHCPRFC4390 {
				if xid, ok := arpndp.DHCPXID(t.pay); ok {
					s.xids.remember(xid, t.f.Src(), t.now)
				}
				t.pay, err = arpndp.DHCPToIB(t.pay, s.cfg.DHCPClientID)
			} else {
				err = arpndp.SetBroadcastFlag(t.pay)
			}
		}
	}
	if err != nil {
		s.ctr.txRewrite.Count(err)
		return verdict(DropTxRewrite)
	}
	return pass
}

// txFit fits t to its partition's IPoIB MTU: a super-frame is described
// to the port (or cut here), a packet too long fragmented or answered
// (tooBig). Frames that would have to be queued or held in pieces are
// dropped instead (a resolution started for them).
func (s *Shim) txFit(b *txBatch, t *txPacket) verdict {
	if t.sup.L4 == 0 {
		if len(t.pay) <= t.mtu {
			return pass
		}
		if t.waits {
			// Not held, as fragments are not: the group is being
			// joined.
			return verdict(DropNoGroup)
		}
		if t.unknown && fragmentable(t.et, t.pay) {
			// Fragments are not queued: resolve, and let the guest's
			// retransmission find the destination known.
			s.resolver.enqueue(t.p, t.vif, t.f.Dst(), nil, t.m, t.source, t.target, t.now)
			return verdict(DropUnresolved)
		}
		return s.tooBig(b, t.f, t.et, t.pay, t.m, t.mtu)
	}
	if v := s.superMeta(t); v != pass {
		return v
	}
	if t.unknown {
		// Not queued, as fragments are not: resolve, and let TCP's
		// retransmission (or the UDP application) find the destination
		// known.
		s.resolver.enqueue(t.p, t.vif, t.f.Dst(), nil, t.m, t.source, t.target, t.now)
		return verdict(DropUnresolved)
	}
	if t.sup.UDP && t.m.GSO.Type == ipoib.GSONone {
		if t.waits {
			return verdict(DropNoGroup) // not held, as fragments are not
		}
		return s.cutUDP(b, t)
	}
	return pass
}

// txEmit writes the IPoIB header over the end of t's Ethernet header and
// adds the packet to the batch, or queues it for its destination's
// resolution, or holds it for its group's join.
func (s *Shim) txEmit(b *txBatch, t *txPacket) verdict {
	payStart := devHeadroom + t.f.HeaderLen()
	hdr := payStart - ipoib.HeaderLen
	ipoib.PutHeader(t.buf[hdr:], t.et)
	pkt := t.buf[hdr-ipoib.Headroom : payStart+len(t.pay)]
	if t.unknown {
		if !s.resolver.enqueue(t.p, t.vif, t.f.Dst(), pkt, t.m, t.source, t.target, t.now) {
			return verdict(DropUnresolved)
		}
		return held
	}
	if t.waits {
		if v := s.groups.holdForGroup(t.m.Dst.GID(), heldFrame{buf: pkt, meta: t.m, vif: t.vif, segs: t.segs}); v != pass {
			return v
		}
	}
	if t.kind >= 0 {
		s.ctr.inc(t.kind)
	}
	if t.sup.L4 != 0 {
		s.ctr.inc(TxSuper)
		s.ctr.add(TxSuperSegments, uint64(t.segs))
	}
	b.add(pkt, t.m)
	return verdict(TxForwarded)
}

// superMeta describes t, a super-frame (checked by the device), to the
// port in t.m.GSO, and sets t.segs to how many segments it is cut into.
// A TCP one gets segments cut to the partition's IPoIB MTU; it is
// dropped when it goes to a group, where TCP never goes. A UDP one, to
// any destination, is described when the port takes UDP super-packets
// and its datagrams fit the MTU. Else t.m.GSO stays zero, for cutUDP.
func (s *Shim) superMeta(t *txPacket) verdict {
	sup, pay := t.sup, t.pay
	l4 := int(sup.L4) - t.f.HeaderLen() // from the IP header
	if sup.UDP {
		hdrs := l4 + gso.UDPHeaderLen
		if s.port.Offloads().USO && hdrs+int(sup.Size) <= t.mtu {
			t.m.GSO = ipoib.GSO{Type: ipoib.GSOUDPv4, L4: uint16(ipoib.HeaderLen + l4), Size: sup.Size}
			if sup.V6 {
				t.m.GSO.Type = ipoib.GSOUDPv6
			}
		}
		t.segs = gso.Segments(len(pay), hdrs, int(sup.Size))
		return pass
	}
	if t.kind >= 0 {
		return verdict(DropSuperGroup)
	}
	hdrs := l4 + header.TCP(pay[l4:]).HeaderLen()
	size := min(int(sup.Size), t.mtu-hdrs)
	t.m.GSO = ipoib.GSO{Type: ipoib.GSOTCPv4, L4: uint16(ipoib.HeaderLen + l4), Size: uint16(size)}
	if sup.V6 {
		t.m.GSO.Type = ipoib.GSOTCPv6
	}
	t.segs = gso.Segments(len(pay), hdrs, size)
	return pass
}

// cutUDP cuts t, a UDP super-frame (checked by the device) that the port
// is not given whole, into its datagrams, each sent as an ordinary
// packet in a fragment buffer. Datagrams longer than the MTU are
// fragmented one by one (IPv4 without DF), else the guest gets one ICMP
// too-big for the frame, as the kernel's ip_finish_output_gso and
// ip6_finish_output_gso do for a GSO skb whose segments do not fit. The
// frame ends forwarded, answered or fragmented, once.
func (s *Shim) cutUDP(b *txBatch, t *txPacket) verdict {
	sup, m, mtu := t.sup, t.m, t.mtu
	l4 := int(sup.L4) - t.f.HeaderLen()
	big := l4+gso.UDPHeaderLen+int(sup.Size) > mtu
	if big && !fragmentable(t.et, t.pay) {
		return s.tooBig(b, t.f, t.et, t.pay, m, mtu)
	}
	if b.cut.StartUDP(t.pay, 0, l4, sup.V6, int(sup.Size), 65535) != nil {
		return verdict(DropBadIP)
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
		ipoib.PutHeader(fb[ipoib.Headroom:], t.et)
		n := b.cut.Cut(fb[ipoib.Headroom+ipoib.HeaderLen:])
		b.add(fb[:ipoib.Headroom+ipoib.HeaderLen+n], m)
	}
	if t.kind >= 0 {
		s.ctr.inc(t.kind)
	}
	if !big {
		return verdict(TxForwarded)
	}
	// One frame, one outcome, however many datagrams were fragmented
	// (tx_fragments counts their pieces).
	return verdict(TxFragmented)
}
