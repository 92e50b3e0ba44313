package shim

// RX: fabric → TAP. Per packet: IPoIB header → partition from the P_Key →
// source QPN+GID to its REMAC (learned on first sight) → destination from
// the receiving VIF's QP, or the MGID's multicast MAC → ARP/NDP/DHCP
// rewrite in place → the Ethernet header pushed over the IPoIB header. That
// header is tagged with the partition's VLAN. Each stage returns a verdict
// (counters.go), counted once by rx. The batch goes to the device in one
// Write.

import (
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
)

// rxOffset is where the port puts the IPoIB header: room for its own
// headers before, and for the Ethernet header that replaces it and the
// device's headroom before that.
const rxOffset = 64

// rxLoop is RX worker w, which reads the port's receive queue rq. Each
// worker translates its batches and writes them through the device
// queues their flows hash to, in parallel with the others. A flow
// arrives on one receive queue, so its frames stay in order.
func (s *Shim) rxLoop(w int, rq ipoib.RxQueue) error {
	bs := s.port.BatchSize()
	bufs := make([][]byte, bs)
	for i := range bufs {
		bufs[i] = make([]byte, rxOffset+s.port.MTU()+64)
	}
	sizes := make([]int, bs)
	meta := make([]ipoib.RxMeta, bs)
	out := make([][][]byte, len(s.queues)) // by TAP queue
	for q := range out {
		out[q] = make([][]byte, 0, bs)
	}
	for {
		n, err := rq.Read(bufs, sizes, meta, rxOffset)
		if err != nil {
			return err
		}
		now := s.clk.Now()
		slot := s.rxSlot(w)
		s.ep.enter(slot) // the batch may flush held frames from VIFs' QPs
		if s.capture.Load() != nil {
			for i := range n {
				s.capFabricRx(bufs[i][rxOffset:rxOffset+sizes[i]], &meta[i])
			}
		}
		s.ctr.add(RxPackets, uint64(n)) // once a batch: RX workers share the counter
		for i := 0; i < n; i++ {
			if f := s.rx(bufs[i], sizes[i], &meta[i], now); f != nil {
				// The frame with the device's headroom in front of it.
				start := cap(bufs[i]) - cap(f)
				q := flowQueue(ether.Frame(f), len(out))
				out[q] = append(out[q], bufs[i][start-tap.Headroom:start+len(f)])
			}
		}
		s.writeQueues(out)
		if s.resolver.pending.count.Load() > 0 {
			s.resolver.flush()
		}
		s.ep.exit(slot)
	}
}

// writeDev writes frames, each tap.Headroom bytes into its buffer, to the
// device (its first queue) and returns how many it took (with an error
// too: those written before it, as tap.Queue.Write reports them).
func (s *Shim) writeDev(frames [][]byte) int {
	s.capFrames(frames)
	s.qmu[0].Lock()
	n, _ := s.dev.Write(frames, tap.Headroom)
	s.qmu[0].Unlock()
	return min(max(n, 0), len(frames))
}

// capFrames captures frames about to be written to the TAP (each
// tap.Headroom bytes into its buffer).
func (s *Shim) capFrames(frames [][]byte) {
	if s.capture.Load() != nil {
		for _, f := range frames {
			s.capTAP(f[tap.Headroom:])
		}
	}
}

// writeQueues writes received frames, each tap.Headroom bytes into its
// buffer, through the device queue they are listed under, and counts
// them; it empties the lists.
func (s *Shim) writeQueues(byQueue [][][]byte) {
	for q, frames := range byQueue {
		if len(frames) == 0 {
			continue
		}
		s.capFrames(frames)
		s.qmu[q].Lock()
		// With an error too, n is the frames written before it
		// (tap.Queue.Write): those are delivered, the rest refused.
		n, _ := s.queues[q].Write(frames, tap.Headroom)
		s.qmu[q].Unlock()
		n = min(max(n, 0), len(frames))
		s.ctr.c[RxFrames].Add(uint64(n))
		var bytes int
		for _, f := range frames[:n] {
			bytes += len(f) - tap.Headroom
		}
		s.ctr.c[RxBytes].Add(uint64(bytes))
		s.ctr.c[DropTAPWrite].Add(uint64(len(frames) - n))
		byQueue[q] = frames[:0]
	}
}

// writeLocal writes the shim's own frames to guests (queries, ICMP; each
// tap.Headroom bytes into its buffer), counting those the device refused.
func (s *Shim) writeLocal(frames [][]byte) {
	if n := s.writeDev(frames); n < len(frames) {
		s.ctr.c[DropLocalTAPWrite].Add(uint64(len(frames) - n))
	}
}

func rxEtherType(et uint16) bool {
	switch et {
	case ether.TypeIPv4, ether.TypeIPv6, ether.TypeARP, ether.TypeRARP:
		return true
	}
	return false
}

// rx translates one packet at buf[rxOffset:rxOffset+n] into a frame, or
// returns nil for a packet dropped (counted).
func (s *Shim) rx(buf []byte, n int, m *ipoib.RxMeta, now time.Time) []byte {
	f, v := s.rxPacket(buf, n, m, now)
	s.ctr.end(v)
	return f
}

// rxPacket is rx's stages: check the header, find the partition and the
// destination, rewrite, name the source, deliver (the frame, with the
// verdict held: writeQueues counts it).
func (s *Shim) rxPacket(buf []byte, n int, m *ipoib.RxMeta, now time.Time) ([]byte, verdict) {
	pay := buf[rxOffset : rxOffset+n]
	et, v := s.rxCheck(pay)
	if v != pass {
		return nil, v
	}
	p, dst, v := s.rxDestination(m, n, now)
	if v != pass {
		return nil, v
	}
	ip, v := s.rxRewrite(p, et, pay[ipoib.HeaderLen:], dst, now)
	if v != pass {
		return nil, v
	}
	// Only an accepted packet teaches the table its sender: dropped ones
	// must not insert or evict entries. (The ARP/NDP rewrite above has
	// already learned the addresses in its payload, which are the
	// sender's own in every valid message; a rewrite that fails after
	// that is the one case left.)
	src, v := s.rxSource(p, et, ip, m, now)
	if v != pass {
		return nil, v
	}
	hl := ether.HeaderLen
	if p.vlan != 0 {
		hl = ether.VLANHeaderLen
	}
	start := rxOffset + ipoib.HeaderLen - hl
	ether.PutHeader(buf[start:], dst, src, p.vlan, et)
	return buf[start : rxOffset+ipoib.HeaderLen+len(ip)], held
}

// rxCheck checks the IPoIB header at the start of pay and returns its
// ethertype.
func (s *Shim) rxCheck(pay []byte) (uint16, verdict) {
	h := ipoib.Header(pay)
	if !h.IsValid() {
		return 0, verdict(DropRxBadHeader)
	}
	et := h.EtherType()
	if !rxEtherType(et) {
		return 0, verdict(DropRxEtherType)
	}
	return et, pass
}

// rxDestination finds the partition of the P_Key and the destination
// MAC: the multicast MAC of the MGID, or the guest of the receiving VIF
// (its n bytes counted to it).
func (s *Shim) rxDestination(m *ipoib.RxMeta, n int, now time.Time) (*partition, ether.MAC, verdict) {
	p := s.partitions()[m.PKey.Full()]
	if p == nil {
		return nil, ether.MAC{}, verdict(DropRxUnknownPKey)
	}
	if m.DstQPN == ipoib.MulticastQPN {
		mac, ok := ipoib.MGIDToMAC(m.MGID)
		if !ok {
			return nil, ether.MAC{}, verdict(DropRxMulticast)
		}
		return p, mac, pass
	}
	vif, ok := s.vifs.LookupQPN(m.DstQPN)
	if !ok || vif.Key.VLAN != p.vlan {
		return nil, ether.MAC{}, verdict(DropRxUnknownVIF)
	}
	vif.Touch(now)
	vif.CountRx(n)
	return p, vif.Key.MAC, pass
}

// rxRewrite rewrites the ARP, NDP and DHCP payloads of ip, the packet
// after the IPoIB header, for Ethernet in place and returns it.
func (s *Shim) rxRewrite(p *partition, et uint16, ip []byte, dst ether.MAC, now time.Time) ([]byte, verdict) {
	var err error
	switch et {
	case ether.TypeARP, ether.TypeRARP:
		ip, err = arpndp.ARPToEth(ip, p.view)
	case ether.TypeIPv6:
		if arpndp.IsNDP(ip) {
			ip, err = arpndp.NDPToEth(ip, p.view)
		}
	case ether.TypeIPv4:
		if s.cfg.DHCP == DHCPRFC4390 && arpndp.IsDHCPServer(ip) {
			err = s.dhcpReplyToEth(ip, dst, now)
		}
	}
	if err != nil {
		s.ctr.rxRewrite.Count(err)
		return nil, verdict(DropRxRewrite)
	}
	return ip, pass
}

// rxSource names the sender by its REMAC, learned on first sight, or by
// its IP when the port cannot tell (srcip.go).
func (s *Shim) rxSource(p *partition, et uint16, ip []byte, m *ipoib.RxMeta, now time.Time) (ether.MAC, verdict) {
	if m.SrcUnknown {
		return s.sourceOf(p, et, ip, now), pass
	}
	nb, err := s.neigh.Learn(p.pkey, m.Src, now)
	if err != nil {
		return ether.MAC{}, verdict(DropRxNeighbour)
	}
	s.noteIPs(p, et, ip) // the IPs a neighbour speaks for, for the CLI
	return nb.REMAC, pass
}

// dhcpReplyToEth restores an RFC 4390 reply for the Ethernet guest that
// asked: the MAC remembered for its transaction ID, else the one in a
// type-1 client-identifier, else the frame's unicast destination. A reply
// for nobody known is refused.
func (s *Shim) dhcpReplyToEth(ip []byte, dst ether.MAC, now time.Time) error {
	mac, ok := ether.MAC{}, false
	if xid, xok := arpndp.DHCPXID(ip); xok {
		mac, ok = s.xids.lookup(xid, now)
	}
	if !ok {
		mac, ok = arpndp.DHCPClientID(ip)
	}
	if !ok && !dst.IsMulticast() {
		mac, ok = dst, true
	}
	if !ok {
		return arpndp.ErrUnknownAddr
	}
	return arpndp.DHCPToEth(ip, mac)
}
