// Package verbsfabric is the ipoib.Port of real UD QPs through
// libibverbs (rdma-core): one UD QP per VIF, a QP per partition attached
// to the multicast groups, a shared receive queue and completion queues,
// registered send and receive buffers. It runs on any verbs device; it is
// tested on the kernel's soft-RoCE driver (rxe) against the simulated
// fabric, whose wire format is RoCE v2. The cgo part needs the build tag
// verbs (and libibverbs-dev); without it New says so.
package verbsfabric

// TX: Write copies each packet into a free slot of the registered send
// ring and posts it on its VIF's QP to the destination's address handle,
// one ibv_post_send per run of packets of one QP. Completions are
// requested for the last packet of each QP in a batch (and every
// signalEvery-th) only; a completion frees the QP's slots up to it, since
// a QP's sends complete in order. A packet to a GID without an address
// handle yet waits in a small pending pool while the resolver goroutine
// creates one (on RoCE that resolves the peer's MAC and can block).
//
// RX: receive buffers sit on a shared receive queue; Read polls the
// receive CQ (sleeping on the completion channel when empty), takes the
// source GID from the 40-byte GRH, the source QPN from the completion,
// drops what this port itself sent (multicast loops back to the attached
// QP), copies the packet out and re-posts the buffers in one call.

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// Drop reasons counted by a Port.
const (
	DropBadMeta = iota
	DropOversize
	DropRingFull
	DropSendError
	DropNoAH
	DropPendingFull
	DropRecvError
	DropNoGRH
	DropBadGRH
	DropTruncated
	DropOwn
	DropNotJoined
	DropUnknownQPN
	DropBufferSmall
	DropPortDown
	numDrops
)

// DropNames are the counter names of the drop reasons, by index.
var DropNames = [numDrops]string{
	DropBadMeta:     "bad_meta",
	DropOversize:    "oversize",
	DropRingFull:    "tx_ring_full",
	DropSendError:   "send_error",
	DropNoAH:        "no_address_handle",
	DropPendingFull: "ah_pending_full",
	DropRecvError:   "recv_error",
	DropNoGRH:       "no_grh",
	DropBadGRH:      "bad_grh",
	DropTruncated:   "truncated",
	DropOwn:         "own_packet",
	DropNotJoined:   "not_joined",
	DropUnknownQPN:  "unknown_qpn",
	DropBufferSmall: "rx_buffer_small",
	DropPortDown:    "port_down",
}

const (
	batchSize   = 64
	sendSlots   = 1024
	recvBufs    = 1024
	signalEvery = 64
	// pendingMax packets wait for address handles at once, pendingPerGID
	// for one destination.
	pendingMax    = 64
	pendingPerGID = 8
	// ahMax address handles are cached; beyond, the least recently used
	// unicast one is destroyed.
	ahMax = 16384
	// ahRetry is how long a destination whose address handle failed is
	// not tried again.
	ahRetry = 2 * time.Second
)

// Config configures a Port.
type Config struct {
	// Device is the verbs device, e.g. rxe0 or mlx5_0 (port 1 is used).
	Device string
	// Logger receives lifecycle events (nil: slog.Default()).
	Logger *slog.Logger

	open func(name string, lay layout) (device, error) // tests
}

// qpState is one QP of the port: a VIF's, or a partition's group QP.
// posted and done count its sends; done is written by the send
// completion reaper under txMu.
type qpState struct {
	pkey         ipoib.PKey
	posted, done uint64
	lastBatch    uint64
}

// ahEntry is a cached address handle, or a pending or failed resolution.
type ahEntry struct {
	h        handle
	ready    bool
	failedAt time.Time
	pending  int
	lastUsed time.Time
}

// pendingPkt is a packet waiting for its destination's address handle.
type pendingPkt struct {
	buf  int
	n    int
	src  uint32
	dst  ipoib.HwAddr
	pkey ipoib.PKey
}

// Port is a verbs device's port 1 as an ipoib.Port.
type Port struct {
	dev  device
	a    devAttr
	log  *slog.Logger
	down atomic.Bool

	qpMu   sync.RWMutex
	qps    map[uint32]*qpState
	gqps   map[ipoib.PKey]uint32 // partition → its group QP
	groups *ipoib.GroupTable
	mcSock int // IPv6 socket joining MGIDs on the RoCE netdev
	// mlids are the groups' MLIDs and SLs from SA joins (IB only).
	mlids map[ipoib.GID]lidSL

	ahMu    sync.Mutex
	ahs     map[ipoib.GID]*ahEntry
	resolve chan ipoib.GID

	txMu     sync.Mutex
	slots    []slotInfo
	head     int
	used     int
	descs    []sendDesc
	dones    []sendDone
	batchNo  uint64
	pendBufs [][]byte
	pendFree []int
	pending  []pendingPkt

	rxMu   sync.Mutex
	rdone  []recvDone
	repost []uint32

	lastWarn atomic.Int64 // unix nanoseconds of the last data-path warning

	closed atomic.Bool
	wg     sync.WaitGroup
	done   chan struct{}

	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	drops                                  [numDrops]atomic.Uint64
	ahCreated, ahFailed, signalled         atomic.Uint64
}

// lidSL is an IB destination's LID and service level.
type lidSL struct {
	lid uint16
	sl  uint8
}

// slotInfo is a send slot in use: the QP it was posted on and its
// sequence number there.
type slotInfo struct {
	qpn uint32
	seq uint64
}

var _ ipoib.Port = (*Port)(nil)

// New opens the device, posts the receive buffers and starts the address
// resolver and the port event watcher.
func New(c Config) (*Port, error) {
	if c.Device == "" {
		return nil, errors.New("verbsfabric: no device given")
	}
	open := c.open
	if open == nil {
		open = openDevice
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	lay := layout{sendSlots: sendSlots, slotSize: 4096, recvBufs: recvBufs, recvSize: grhLen + 4096 + 24, batch: batchSize}
	dev, err := open(c.Device, lay)
	if err != nil {
		return nil, err
	}
	p := &Port{
		dev: dev, a: dev.attr(), log: log.With("device", c.Device),
		qps: make(map[uint32]*qpState), gqps: make(map[ipoib.PKey]uint32), groups: ipoib.NewGroupTable(), mcSock: -1, mlids: make(map[ipoib.GID]lidSL),
		ahs: make(map[ipoib.GID]*ahEntry), resolve: make(chan ipoib.GID, 256),
		slots: make([]slotInfo, sendSlots), descs: make([]sendDesc, 0, batchSize), dones: make([]sendDone, sendSlots),
		rdone: make([]recvDone, batchSize), repost: make([]uint32, 0, batchSize), done: make(chan struct{}),
	}
	if p.a.mtu != 2048 && p.a.mtu != 4096 {
		dev.close()
		return nil, fmt.Errorf("verbsfabric: %s has active MTU %d; IPoIB needs 2048 or 4096 (on RoCE, a netdev MTU of at least 4096+80 for 4096)", c.Device, p.a.mtu)
	}
	p.down.Store(!p.a.active)
	for i := range pendingMax {
		p.pendBufs = append(p.pendBufs, make([]byte, p.a.mtu))
		p.pendFree = append(p.pendFree, i)
	}
	all := make([]uint32, recvBufs)
	for i := range all {
		all[i] = uint32(i)
	}
	if err := dev.postRecv(all); err != nil {
		dev.close()
		return nil, err
	}
	if !p.a.ib {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			dev.close()
			return nil, fmt.Errorf("verbsfabric: multicast socket: %w", err)
		}
		p.mcSock = fd
	}
	p.wg.Add(2)
	go p.resolver()
	go p.events()
	link := "RoCE"
	if p.a.ib {
		link = "InfiniBand"
	}
	p.log.Info("verbs port open", "gid", p.a.gid, "gid_index", p.a.gidIndex, "link_layer", link, "mtu", p.a.mtu, "active", p.a.active)
	return p, nil
}

// BatchSize is the most packets one Read returns.
func (p *Port) BatchSize() int { return batchSize }

// LocalGID is the port GID.
func (p *Port) LocalGID() ipoib.GID { return p.a.gid }

// MTU is the port's active IB MTU.
func (p *Port) MTU() int { return p.a.mtu }

// PartitionMTU is MTU: every partition of this port has the port's MTU.
func (p *Port) PartitionMTU(ipoib.PKey) int { return p.a.mtu }

// Offloads: UD QPs take no super-packets (LSO is for RC/UD on some HCAs
// only, and rxe has none).
func (p *Port) Offloads() ipoib.Offloads { return ipoib.Offloads{} }

// IsDown reports the port not ACTIVE, from the device's async events; the
// shim sets the TAP's carrier from it.
func (p *Port) IsDown() bool { return p.down.Load() }

// pkeyIndex finds pkey in the port's P_Key table (full and limited
// members match each other's base; a full-member entry is preferred).
func (p *Port) pkeyIndex(pkey ipoib.PKey) (int, error) {
	best := -1
	for i, k := range p.a.pkeys {
		if k.Base() == pkey.Base() && (best < 0 || k.IsFull()) {
			best = i
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("verbsfabric: P_Key %s is not in the port's P_Key table %v", pkey, p.a.pkeys)
	}
	return best, nil
}

// AllocQP creates a UD QP in partition pkey. The device numbers QPs; hint
// is ignored.
func (p *Port) AllocQP(pkey ipoib.PKey, _ uint32) (uint32, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	idx, err := p.pkeyIndex(pkey)
	if err != nil {
		return 0, err
	}
	qpn, err := p.dev.createQP(idx, rand.Uint32())
	if err != nil {
		return 0, err
	}
	p.qpMu.Lock()
	p.qps[qpn] = &qpState{pkey: pkey}
	p.qpMu.Unlock()
	return qpn, nil
}

// FreeQP destroys a QP made by AllocQP.
func (p *Port) FreeQP(qpn uint32) error {
	p.qpMu.Lock()
	_, ok := p.qps[qpn]
	if ok {
		for _, g := range p.gqps {
			ok = ok && g != qpn
		}
	}
	if ok {
		delete(p.qps, qpn)
	}
	p.qpMu.Unlock()
	if !ok {
		return fmt.Errorf("verbsfabric: QPN %#x not allocated", qpn)
	}
	// The slots still holding its sends are free once it is gone.
	return p.dev.destroyQP(qpn)
}

// groupQP returns the QP of pkey's partition that multicast groups attach
// to, creating it: one QP per partition receives each group's packets
// once, however many VIFs the port has.
func (p *Port) groupQP(pkey ipoib.PKey) (uint32, error) {
	p.qpMu.RLock()
	q, ok := p.gqps[pkey.Full()]
	p.qpMu.RUnlock()
	if ok {
		return q, nil
	}
	q, err := p.AllocQP(pkey.Full(), 0)
	if err != nil {
		return 0, err
	}
	p.qpMu.Lock()
	p.gqps[pkey.Full()] = q
	p.qpMu.Unlock()
	return q, nil
}

// Join attaches the partition's group QP to mgid. On IB it first joins
// through the subnet administrator (which gives the group's MLID); on
// RoCE it joins mgid as an IPv6 group on the netdev: rxe only programs
// the MAC filter, and without the IPv6 membership the stack drops the
// group's packets (this also sends the MLD reports snooping switches
// need).
func (p *Port) Join(mgid ipoib.GID) error {
	if p.closed.Load() {
		return net.ErrClosed
	}
	pkey := ipoib.MGIDPKey(mgid)
	q, err := p.groupQP(pkey)
	if err != nil {
		return err
	}
	if err := p.groups.Join(mgid, func() error {
		var mlid uint16
		if p.a.ib {
			l, sl, err := p.dev.saJoin(mgid, pkey, false)
			if err != nil {
				return err
			}
			p.setMLID(mgid, lidSL{l, sl})
			mlid = l
		}
		if err := p.dev.attach(q, mgid, mlid); err != nil {
			return err
		}
		if err := p.ipv6Group(mgid, unix.IPV6_JOIN_GROUP); err != nil {
			p.dev.detach(q, mgid, mlid)
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	p.wantAH(mgid)
	return nil
}

// JoinSendOnly makes the port a send-only member. On RoCE there is no
// subnet administrator to tell, so it only has the group's address
// handle made; on IB the resolver joins through the SA first (off the
// caller's path: it can take seconds).
func (p *Port) JoinSendOnly(mgid ipoib.GID) error {
	if p.closed.Load() {
		return net.ErrClosed
	}
	if err := p.groups.JoinSendOnly(mgid); err != nil {
		return err
	}
	p.wantAH(mgid)
	return nil
}

// Leave detaches the group QP from mgid and leaves the IPv6 group.
func (p *Port) Leave(mgid ipoib.GID) error {
	p.qpMu.RLock()
	q, ok := p.gqps[ipoib.MGIDPKey(mgid).Full()]
	p.qpMu.RUnlock()
	err := p.groups.Leave(mgid, func() error {
		if !ok {
			return nil
		}
		l, _ := p.mlid(mgid)
		err := p.dev.detach(q, mgid, l.lid)
		if p.a.ib {
			p.dev.saLeave(mgid, false)
		}
		return errors.Join(err, p.ipv6Group(mgid, unix.IPV6_LEAVE_GROUP))
	})
	if p.a.ib {
		p.dev.saLeave(mgid, true)
	}
	return err
}

func (p *Port) setMLID(mgid ipoib.GID, l lidSL) {
	p.qpMu.Lock()
	p.mlids[mgid] = l
	p.qpMu.Unlock()
}

func (p *Port) mlid(mgid ipoib.GID) (lidSL, bool) {
	p.qpMu.RLock()
	defer p.qpMu.RUnlock()
	l, ok := p.mlids[mgid]
	return l, ok
}

func (p *Port) ipv6Group(mgid ipoib.GID, op int) error {
	if p.mcSock < 0 {
		return nil
	}
	mr := unix.IPv6Mreq{Multiaddr: mgid, Interface: uint32(p.a.ifindex)}
	if err := unix.SetsockoptIPv6Mreq(p.mcSock, unix.IPPROTO_IPV6, op, &mr); err != nil {
		return fmt.Errorf("verbsfabric: IPv6 membership of %s on the RoCE netdev: %w", mgid, err)
	}
	return nil
}

// Counters returns a snapshot of the port's counters.
func (p *Port) Counters() ipoib.PortCounters {
	c := ipoib.PortCounters{
		TxPackets: p.txPackets.Load(), TxBytes: p.txBytes.Load(),
		RxPackets: p.rxPackets.Load(), RxBytes: p.rxBytes.Load(),
		Drops: make(map[string]uint64),
	}
	for i := range p.drops {
		if v := p.drops[i].Load(); v != 0 {
			c.Drops[DropNames[i]] = v
		}
	}
	p.ahMu.Lock()
	n := len(p.ahs)
	p.ahMu.Unlock()
	c.Stats = map[string]uint64{
		"address_handles_made":  p.ahCreated.Load(),
		"address_handle_errors": p.ahFailed.Load(),
		"tx_signalled":          p.signalled.Load(),
	}
	c.Levels = map[string]uint64{
		"address_handles":        uint64(n),
		"tx_ring_slots_in_use":   uint64(p.slotsInUse()),
		"receive_buffers_posted": recvBufs,
	}
	return c
}

func (p *Port) slotsInUse() int {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	return p.used
}

// Close stops the goroutines, frees every QP and address handle and
// closes the device; Read and Write then return net.ErrClosed.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	close(p.done)
	p.dev.wake()
	p.wg.Wait()
	p.rxMu.Lock()
	p.txMu.Lock()
	p.dev.close()
	p.txMu.Unlock()
	p.rxMu.Unlock()
	if p.mcSock >= 0 {
		unix.Close(p.mcSock)
	}
	return nil
}

// events follows the port state.
func (p *Port) events() {
	defer p.wg.Done()
	for {
		ev, ok, err := p.dev.waitEvent()
		if err != nil {
			p.log.Error("verbs async events stopped", "err", err)
			return
		}
		if !ok {
			return
		}
		switch ev {
		case eventPortActive:
			p.down.Store(false)
			p.log.Info("verbs port active")
		case eventPortDown:
			p.down.Store(true)
			p.log.Warn("verbs port down")
		case eventGIDChange:
			p.log.Warn("verbs port GID table changed; the port GID stays as at start", "gid", p.a.gid)
		}
	}
}

// warnOnce logs a data-path error at most once a minute (the counters
// have every occurrence).
func (p *Port) warnOnce(err error) {
	now := time.Now().UnixNano()
	last := p.lastWarn.Load()
	if now-last < int64(time.Minute) || !p.lastWarn.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn("verbs data path error (logged once a minute; see the drop counters)", "err", err)
}
