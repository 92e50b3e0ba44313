// Package ipoibhost is a native IPoIB host, as a Linux ib0 in datagram
// mode is one. It has a layer-3 device (a TUN) for the host's own IP
// stack and one UD QP. It is a member of the partition's broadcast group
// and of the groups the stack joins. It answers and resolves IPoIB ARP
// and NDP (20-byte hardware addresses, the 24-byte link-layer option),
// and keeps a neighbour table. It is eipoibd's "host" command: a native
// peer for the guests behind eipoibd, on any fabric port. It is written
// from the RFCs separately from the shim, so that the two check each
// other.
//
// Data path: IP packet from the device → destination to an MGID
// (multicast, broadcast) or to a neighbour's 20-byte address → the 4-byte
// IPoIB header in front → the port. Back: the port → IPoIB header →
// IPv4/IPv6 to the device; ARP and NS/NA to the control path here. A
// packet to an unresolved neighbour waits (three a destination) while
// ARP or NS goes out. Nothing on the data path allocates or logs.
package ipoibhost

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"

	"github.com/eipoib/eipoibd/internal/loops"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
)

// LinkState is what the host's IP stack has configured on the device.
type LinkState struct {
	Addrs  []netip.Prefix // its addresses, with their prefix lengths
	Groups []netip.Addr   // the multicast groups it joined there
}

// Config configures a Host. Zero fields take the defaults shown.
type Config struct {
	// Device carries bare IP packets (no link header), e.g. a TUN.
	Device tap.Device
	Port   ipoib.Port
	// Link reports the stack's addresses and groups; it is polled every
	// Poll, and new addresses are announced (gratuitous ARP, unsolicited
	// NA).
	Link          func() (LinkState, error)
	Name          string        // the device's name, for the neighbour dump
	PKey          ipoib.PKey    // 0xffff
	Scope         uint8         // MGID scope, link-local (2)
	Logger        *slog.Logger  // slog.Default()
	MaxNeighbours int           // 4096; a full table evicts the least recently confirmed entry
	NeighTTL      time.Duration // 10 min: entries not confirmed this long are forgotten
	Poll          time.Duration // 250 ms
	// NeighFile, when set, is rewritten (atomically) with the
	// neighbour table whenever it changes, one entry a line as
	// ip-neigh(8) prints it.
	NeighFile string
}

// Host is a native IPoIB host. Create it with New and start it with Run.
type Host struct {
	cfg   Config
	log   *slog.Logger
	dev   tap.Device
	port  ipoib.Port
	pkey  ipoib.PKey
	bcast ipoib.GID
	ipMTU int
	qpn   uint32
	hw    ipoib.HwAddr

	neigh  *neighTable
	own    atomic.Pointer[ownAddrs]
	joined map[ipoib.GID]bool // groups joined, true for the fixed ones; housekeeping's
	portMu sync.Mutex         // serialises writes to the port
	ctr    [numCounters]atomic.Uint64
}

// New checks cfg and builds a host; it touches neither device nor port.
func New(cfg Config) (*Host, error) {
	if cfg.Device == nil || cfg.Port == nil || cfg.Link == nil {
		return nil, errors.New("ipoibhost: Device, Port and Link are required")
	}
	if cfg.PKey == 0 {
		cfg.PKey = ipoib.DefaultPKey
	}
	if !cfg.PKey.IsValid() {
		return nil, fmt.Errorf("ipoibhost: invalid P_Key %s", cfg.PKey)
	}
	if cfg.Scope == 0 {
		cfg.Scope = ipoib.ScopeLinkLocal
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxNeighbours == 0 {
		cfg.MaxNeighbours = 4096
	}
	if cfg.MaxNeighbours < 1 {
		return nil, fmt.Errorf("ipoibhost: max neighbours %d: want at least 1", cfg.MaxNeighbours)
	}
	if cfg.NeighTTL == 0 {
		cfg.NeighTTL = 10 * time.Minute
	}
	if cfg.Poll == 0 {
		cfg.Poll = 250 * time.Millisecond
	}
	ipMTU, err := ipoib.IPMTU(cfg.Port.MTU())
	if err != nil {
		return nil, fmt.Errorf("ipoibhost: %w", err)
	}
	pkey := cfg.PKey.Full()
	h := &Host{cfg: cfg, log: cfg.Logger, dev: cfg.Device, port: cfg.Port, pkey: pkey, ipMTU: ipMTU,
		bcast: broadcastMGID(pkey, cfg.Scope), neigh: newNeighTable(cfg.MaxNeighbours), joined: make(map[ipoib.GID]bool)}
	h.own.Store(&ownAddrs{})
	return h, nil
}

// HwAddr is the host's 20-byte IPoIB address. Run sets it before it
// moves any packet; read it after traffic has flowed.
func (h *Host) HwAddr() ipoib.HwAddr { return h.hw }

// IPMTU is the IPoIB MTU, the device's MTU.
func (h *Host) IPMTU() int { return h.ipMTU }

// Run allocates the QP, joins the broadcast and all-nodes groups and
// moves traffic until ctx ends or the device or port fails. On return
// the device is closed, the groups left, the QP freed and the port
// closed, and every goroutine Run started has ended.
func (h *Host) Run(ctx context.Context) error {
	qpn, err := h.port.AllocQP(h.pkey, 0)
	if err != nil {
		h.port.Close()
		return fmt.Errorf("ipoibhost: %w", err)
	}
	h.qpn, h.hw = qpn, ipoib.MakeHwAddr(0, qpn, h.port.LocalGID())
	// The fixed memberships: the broadcast group and IPv6's all-nodes;
	// the rest follow the stack (224.0.0.1 among them).
	for _, mgid := range []ipoib.GID{h.bcast, groupMGID(allNodes, h.pkey, h.cfg.Scope)} {
		if err := h.port.Join(mgid); err != nil {
			h.shutdown()
			return fmt.Errorf("ipoibhost: %w", err)
		}
		h.joined[mgid] = true
	}
	loop := loops.New("ipoibhost", 3)
	var wg, rx sync.WaitGroup
	hctx, stopHouse := context.WithCancel(ctx)
	loop.Go("tx", &wg, h.txLoop)
	loop.Go("rx", &rx, h.rxLoop)
	loop.Go("housekeeping", &wg, func() error { return h.housekeeping(hctx) })
	h.log.Info("host running", "dev", h.cfg.Name, "hwaddr", h.hw, "qpn", fmt.Sprintf("%#06x", qpn), "pkey", h.pkey, "ipoib_mtu", h.ipMTU)
	select {
	case <-ctx.Done():
		err = nil
	case err = <-loop.Done():
	}
	stopHouse()
	h.dev.Close()
	wg.Wait()
	h.shutdown()
	rx.Wait()
	return err
}

// shutdown leaves every group, frees the QP and closes the port.
func (h *Host) shutdown() {
	for mgid := range h.joined {
		if err := h.port.Leave(mgid); err != nil {
			h.log.Warn("leave group", "mgid", mgid, "err", err)
		}
		delete(h.joined, mgid)
	}
	if h.qpn != 0 {
		if err := h.port.FreeQP(h.qpn); err != nil {
			h.log.Warn("free QP", "qpn", fmt.Sprintf("%#06x", h.qpn), "err", err)
		}
	}
	h.port.Close()
}

// allNodes is IPv6's all-nodes group.
var allNodes = netip.MustParseAddr("ff02::1")

// Offsets in the data path's buffers: the port's headroom, then the
// IPoIB header, then the IP packet.
const (
	hdrOff   = ipoib.Headroom
	ipOff    = hdrOff + ipoib.HeaderLen
	tailRoom = 64 // the port's pad and ICRC after the payload
	batch    = 64
)

// txLoop moves IP packets from the device to the port.
func (h *Host) txLoop() error {
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, ipOff+h.ipMTU+tailRoom)
	}
	sizes := make([]int, batch)
	out := make([][]byte, 0, batch)
	meta := make([]ipoib.TxMeta, 0, batch)
	for {
		n, err := h.dev.Read(bufs, sizes, ipOff)
		if err != nil {
			return err
		}
		now := time.Now()
		out, meta = out[:0], meta[:0]
		for i := range n {
			h.ctr[TxPackets].Add(1)
			pkt := bufs[i][ipOff : ipOff+sizes[i]]
			dst, et, ok := h.destination(pkt, now)
			if !ok {
				continue
			}
			putHeader(bufs[i][hdrOff:], et)
			out = append(out, bufs[i][:ipOff+sizes[i]])
			meta = append(meta, ipoib.TxMeta{Dst: dst, SrcQPN: h.qpn, PKey: h.pkey})
		}
		if err := h.send(out, meta); err != nil {
			return err
		}
	}
}

// putHeader writes the IPoIB encapsulation header (RFC 4391 §6): the
// ethertype and 16 reserved bits of zero.
func putHeader(b []byte, et uint16) {
	binary.BigEndian.PutUint16(b, et)
	b[2], b[3] = 0, 0
}

// destination returns where an IP packet from the stack goes: an MGID
// for multicast and broadcast, the neighbour's address for unicast. A
// packet to an unresolved neighbour is queued (ok false), as is one that
// is no IP packet or too big (dropped, counted).
func (h *Host) destination(pkt []byte, now time.Time) (ipoib.HwAddr, uint16, bool) {
	var dst netip.Addr
	var et uint16
	switch {
	case len(pkt) > h.ipMTU:
		h.ctr[DropTooBig].Add(1)
		return ipoib.HwAddr{}, 0, false
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		dst, et = netip.AddrFrom4([4]byte(pkt[16:20])), etherIPv4
	case len(pkt) >= ipv6HdrLen && pkt[0]>>4 == 6:
		dst, et = netip.AddrFrom16([16]byte(pkt[24:40])), etherIPv6
	default:
		h.ctr[DropNotIP].Add(1)
		return ipoib.HwAddr{}, 0, false
	}
	if dst.IsMulticast() {
		h.ctr[TxMulticast].Add(1)
		return ipoib.MakeHwAddr(0, ipoib.MulticastQPN, groupMGID(dst, h.pkey, h.cfg.Scope)), et, true
	}
	if et == etherIPv4 && h.own.Load().isBroadcast(dst) {
		h.ctr[TxBroadcast].Add(1)
		return ipoib.MakeHwAddr(0, ipoib.MulticastQPN, h.bcast), et, true
	}
	if hw, ok := h.neigh.lookup(dst); ok {
		return hw, et, true
	}
	queued, solicit := h.neigh.enqueue(dst, pkt, now)
	if queued {
		h.ctr[TxQueued].Add(1)
	} else {
		h.ctr[DropUnresolved].Add(1)
	}
	if solicit {
		h.solicit(dst)
	}
	return ipoib.HwAddr{}, 0, false
}

// send writes a batch to the port (each packet hdrOff into its buffer),
// counting what it refused.
func (h *Host) send(bufs [][]byte, meta []ipoib.TxMeta) error {
	if len(bufs) == 0 {
		return nil
	}
	h.portMu.Lock()
	n, err := h.port.Write(bufs, meta, hdrOff)
	h.portMu.Unlock()
	h.ctr[TxSent].Add(uint64(n))
	h.ctr[TxPortRefused].Add(uint64(len(bufs) - n))
	return err
}

// sendControl sends a packet the host built itself (ARP, NDP, or one
// that waited for a resolution) to dst; c counts it.
func (h *Host) sendControl(et uint16, payload []byte, dst ipoib.HwAddr, c Counter) {
	b := make([]byte, ipOff+len(payload), ipOff+len(payload)+tailRoom)
	putHeader(b[hdrOff:], et)
	copy(b[ipOff:], payload)
	if c >= 0 {
		h.ctr[c].Add(1)
	}
	h.send([][]byte{b}, []ipoib.TxMeta{{Dst: dst, SrcQPN: h.qpn, PKey: h.pkey}})
}

// multicastTo returns the destination address of group's MGID.
func (h *Host) multicastTo(group netip.Addr) ipoib.HwAddr {
	return ipoib.MakeHwAddr(0, ipoib.MulticastQPN, groupMGID(group, h.pkey, h.cfg.Scope))
}

// solicit asks the fabric for dst's address: ARP to the broadcast group,
// or NS to dst's solicited-node group, from the host's address closest
// to dst.
func (h *Host) solicit(dst netip.Addr) {
	src := h.own.Load().source(dst)
	if !src.IsValid() {
		return // no address of that family yet: the queued packets time out
	}
	if dst.Is4() {
		h.sendControl(etherARP, encodeARP(arp.OperationRequest, h.hw, src, ipoib.HwAddr{}, dst),
			ipoib.MakeHwAddr(0, ipoib.MulticastQPN, h.bcast), ARPRequests)
		return
	}
	sn := solicitedNode(dst)
	h.sendControl(etherIPv6, encodeNDP(ndpNeighborSolict, 0, src, sn, dst, h.hw), h.multicastTo(sn), NSSent)
}

// learn records ip at hw and sends the packets that waited for it.
func (h *Host) learn(ip netip.Addr, hw ipoib.HwAddr, now time.Time) {
	waiting, evicted := h.neigh.learn(ip, hw, now)
	if evicted {
		h.ctr[NeighEvicted].Add(1)
	}
	et := uint16(etherIPv4)
	if ip.Is6() {
		et = etherIPv6
	}
	for _, p := range waiting {
		h.sendControl(et, p, hw.WithoutFlags(), -1)
	}
}

// rxLoop moves packets from the port to the device, and ARP and NDP to
// the control path.
func (h *Host) rxLoop() error {
	bs := h.port.BatchSize()
	bufs := make([][]byte, bs)
	for i := range bufs {
		bufs[i] = make([]byte, hdrOff+h.port.MTU()+tailRoom)
	}
	sizes := make([]int, bs)
	meta := make([]ipoib.RxMeta, bs)
	out := make([][]byte, 0, bs)
	for {
		n, err := h.port.Read(bufs, sizes, meta, hdrOff)
		if err != nil {
			return err
		}
		now := time.Now()
		out = out[:0]
		for i := range n {
			h.ctr[RxPackets].Add(1)
			p := bufs[i][hdrOff : hdrOff+sizes[i]]
			if len(p) < ipoib.HeaderLen || p[2] != 0 || p[3] != 0 {
				h.ctr[DropRxBadHeader].Add(1)
				continue
			}
			body := p[ipoib.HeaderLen:]
			switch binary.BigEndian.Uint16(p) {
			case etherIPv4:
				out = append(out, bufs[i][:hdrOff+sizes[i]])
			case etherIPv6:
				if isNDP(body) {
					h.handleNDP(body, now)
					continue
				}
				out = append(out, bufs[i][:hdrOff+sizes[i]])
			case etherARP:
				h.handleARP(body, now)
			default:
				h.ctr[DropRxEtherType].Add(1)
			}
		}
		if len(out) > 0 {
			k, err := h.dev.Write(out, ipOff)
			h.ctr[RxDelivered].Add(uint64(k))
			h.ctr[DropDevWrite].Add(uint64(len(out) - k))
			if err != nil {
				return err
			}
		}
	}
}

// handleARP answers requests for the host's addresses and learns senders
// as Linux does: when the request is for us, from a reply, or when the
// sender is already known (a gratuitous ARP updates it).
func (h *Host) handleARP(b []byte, now time.Time) {
	m, err := decodeARP(b)
	if err != nil {
		h.ctr[DropRxBadARP].Add(1)
		return
	}
	h.ctr[RxARP].Add(1)
	own := h.own.Load()
	forUs := own.has(m.tpa)
	if m.spa.IsValid() && !m.spa.IsUnspecified() && !own.has(m.spa) && !m.sha.WithoutFlags().IsZero() &&
		(forUs || m.op == arp.OperationReply || h.neigh.has(m.spa)) {
		h.learn(m.spa, m.sha, now)
	}
	if m.op == arp.OperationRequest && forUs && m.spa != m.tpa {
		h.sendControl(etherARP, encodeARP(arp.OperationReply, h.hw, m.tpa, m.sha, m.spa), m.sha.WithoutFlags(), ARPReplies)
	}
}

// handleNDP answers neighbour solicitations for the host's addresses and
// learns from solicitations and advertisements as handleARP does. Router
// and redirect messages are counted and ignored: the host has no router
// on this link.
func (h *Host) handleNDP(ip []byte, now time.Time) {
	if t := ip[ipv6HdrLen]; t != ndpNeighborSolict && t != ndpNeighborAdvert {
		h.ctr[RxNDPIgnored].Add(1)
		return
	}
	m, err := decodeNDP(ip)
	if err != nil {
		h.ctr[DropRxBadNDP].Add(1)
		return
	}
	h.ctr[RxNDP].Add(1)
	own := h.own.Load()
	forUs := own.has(m.target)
	if m.typ == ndpNeighborAdvert {
		if m.hasLL && !forUs && h.neigh.has(m.target) {
			h.learn(m.target, m.ll, now)
		}
		return
	}
	if m.src.IsUnspecified() { // duplicate address detection
		if forUs {
			h.sendControl(etherIPv6, encodeNDP(ndpNeighborAdvert, naOverride, m.target, allNodes, m.target, h.hw), h.multicastTo(allNodes), NASent)
		}
		return
	}
	if m.hasLL && (forUs || h.neigh.has(m.src)) {
		h.learn(m.src, m.ll, now)
	}
	if !forUs {
		return
	}
	to, ok := h.neigh.lookup(m.src)
	if !ok {
		h.ctr[DropRxBadNDP].Add(1) // a solicitation with no way back
		return
	}
	h.sendControl(etherIPv6, encodeNDP(ndpNeighborAdvert, naSolicited|naOverride, m.target, m.src, m.target, h.hw), to, NASent)
}

// housekeeping follows the stack's addresses and groups, retries and
// expires resolutions, forgets old neighbours and writes the dump.
func (h *Host) housekeeping(ctx context.Context) error {
	t := time.NewTicker(h.cfg.Poll)
	defer t.Stop()
	var dumped uint64
	var linkErr string
	for {
		now := time.Now()
		if st, err := h.cfg.Link(); err != nil {
			if err.Error() != linkErr { // once per distinct failure
				h.log.Warn("read the device's addresses and groups", "err", err)
				linkErr = err.Error()
			}
		} else {
			linkErr = ""
			h.follow(st)
		}
		again, dropped := h.neigh.tick(now)
		h.ctr[DropUnresolved].Add(uint64(dropped))
		for _, dst := range again {
			h.solicit(dst)
		}
		h.ctr[NeighAged].Add(uint64(h.neigh.forget(now, h.cfg.NeighTTL)))
		if v := h.neigh.version.Load(); h.cfg.NeighFile != "" && v != dumped {
			if err := writeAtomic(h.cfg.NeighFile, h.neigh.dump(h.cfg.Name, now)); err != nil {
				h.log.Warn("write neighbour table", "file", h.cfg.NeighFile, "err", err)
			}
			dumped = v
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// follow takes the stack's new addresses and groups: new addresses are
// announced, groups (and the solicited-node groups of the IPv6
// addresses) joined or left.
func (h *Host) follow(st LinkState) {
	old := h.own.Load()
	h.own.Store(&ownAddrs{prefixes: st.Addrs})
	want := make(map[ipoib.GID]bool)
	for _, a := range st.Groups {
		want[groupMGID(a, h.pkey, h.cfg.Scope)] = true
	}
	for _, p := range st.Addrs {
		a := p.Addr()
		if a.Is6() {
			want[groupMGID(solicitedNode(a), h.pkey, h.cfg.Scope)] = true
		}
		if old.has(a) {
			continue
		}
		h.log.Info("address added, announcing it", "addr", p)
		if a.Is4() {
			h.sendControl(etherARP, encodeARP(arp.OperationRequest, h.hw, a, ipoib.HwAddr{}, a), ipoib.MakeHwAddr(0, ipoib.MulticastQPN, h.bcast), Gratuitous)
		} else {
			h.sendControl(etherIPv6, encodeNDP(ndpNeighborAdvert, naOverride, a, allNodes, a, h.hw), h.multicastTo(allNodes), Gratuitous)
		}
	}
	for mgid := range want {
		if _, ok := h.joined[mgid]; ok {
			continue
		}
		if err := h.port.Join(mgid); err != nil {
			h.log.Warn("join group", "mgid", mgid, "err", err)
			continue
		}
		h.joined[mgid] = false
		h.log.Debug("joined group", "mgid", mgid)
	}
	for mgid, fixed := range h.joined {
		if fixed || want[mgid] {
			continue
		}
		if err := h.port.Leave(mgid); err != nil {
			h.log.Warn("leave group", "mgid", mgid, "err", err)
		}
		delete(h.joined, mgid)
		h.log.Debug("left group", "mgid", mgid)
	}
}

// writeAtomic replaces file with data, so a reader never sees half.
func writeAtomic(file, data string) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".neigh-*")
	if err != nil {
		return err
	}
	if _, err := tmp.WriteString(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// Neighbours returns the neighbour table as NeighFile holds it.
func (h *Host) Neighbours() string { return h.neigh.dump(h.cfg.Name, time.Now()) }

// ownAddrs are the host's addresses on the device.
type ownAddrs struct{ prefixes []netip.Prefix }

// has reports whether a is one of them.
func (o *ownAddrs) has(a netip.Addr) bool {
	for _, p := range o.prefixes {
		if p.Addr() == a {
			return true
		}
	}
	return false
}

// isBroadcast reports whether a is the limited broadcast or the
// directed broadcast of one of the host's IPv4 subnets.
func (o *ownAddrs) isBroadcast(a netip.Addr) bool {
	if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return true
	}
	for _, p := range o.prefixes {
		if p.Addr().Is4() && p.Bits() < 31 && p.Contains(a) {
			v := p.Addr().As4()
			host := ^uint32(0) >> p.Bits()
			if w := a.As4(); binary.BigEndian.Uint32(v[:])|host == binary.BigEndian.Uint32(w[:]) {
				return true
			}
		}
	}
	return false
}

// source returns the host's address to solicit dst from: one on dst's
// subnet, else the first of dst's family.
func (o *ownAddrs) source(dst netip.Addr) netip.Addr {
	var first netip.Addr
	for _, p := range o.prefixes {
		if p.Addr().Is4() != dst.Is4() {
			continue
		}
		if p.Contains(dst) {
			return p.Addr()
		}
		if !first.IsValid() {
			first = p.Addr()
		}
	}
	return first
}
