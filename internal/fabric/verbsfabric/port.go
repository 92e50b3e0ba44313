// Package verbsfabric is the ipoib.Port of real UD QPs through
// libibverbs (rdma-core): one UD QP per VIF, a QP per partition attached
// to the multicast groups, a shared receive queue and completion queues,
// registered send and receive buffers. It runs on any verbs device; it is
// tested on the kernel's soft-RoCE driver (rxe) against the simulated
// fabric, whose wire format is RoCE v2. The cgo part needs the build tag
// verbs (and libibverbs-dev); without it New says so.
package verbsfabric

// TX: Write copies each packet into a free slot of the registered send
// ring. It posts it on its VIF's QP to the destination's address handle,
// one ibv_post_send per run of packets of one QP. Completions are
// requested only for the last packet of each QP in a batch, and every
// signalEvery-th. A completion frees the QP's slots up to it, since a
// QP's sends complete in order. A packet to a GID without an address
// handle yet waits in a small pending pool while a resolver goroutine
// creates one; on RoCE that resolves the peer's MAC and can block.
//
// RX: receive buffers sit on a shared receive queue. A receiver
// goroutine polls the receive CQ, sleeping on the completion channel
// when empty. It reposts a spare buffer for each completion at once, so
// the queue stays full however slow the reader is (UD has no RNR). Read
// takes the waiting completions, the source GID from the 40-byte GRH and
// the source QPN from the completion. It drops what this port itself
// sent (multicast loops back to the attached QP), copies the packet out
// and gives the buffer back to the spares.

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

	"github.com/eipoib/eipoibd/internal/warnlimit"
	"github.com/eipoib/eipoibd/ipoib"
)

// A Port counts its drops under ipoib.Drop's reasons.

const (
	batchSize   = 64
	sendSlots   = 1024
	signalEvery = 64
	// pendingMax packets wait for address handles at once, pendingPerGID
	// for one destination.
	pendingMax    = 64
	pendingPerGID = 8
	// ahMax address handles are cached; beyond, a unicast one not used
	// lately is destroyed (CLOCK: see ahcache.go).
	ahMax = 16384
	// ahRetry is how long a destination whose address handle failed is
	// not tried again, and how often failed rejoins are retried.
	ahRetry = 2 * time.Second
	// resolvers address handles are made at once (each may wait seconds
	// for the SA); resolveQueue more destinations wait for one.
	resolvers    = 8
	resolveQueue = 256
)

// The receive queue's depth: the buffers posted on the shared receive
// queue (Config.RecvDepth, --verbs-recv-depth). As many again wait for
// the reader (see receiver), so the registered receive memory is
// (2 × depth + 64) × 4,160 bytes: 8.8 MB at the default.
const (
	DefaultRecvDepth = 1024
	MinRecvDepth     = batchSize
	MaxRecvDepth     = 16384
)

// Config configures a Port.
type Config struct {
	// Device is the verbs device and its port, NAME or NAME:PORT (see
	// ParseDevice): rxe0, mlx5_0, mlx5_0:2; port 1 when none is given.
	Device string
	// RecvDepth is the number of receive buffers posted on the shared
	// receive queue, MinRecvDepth to MaxRecvDepth (0: DefaultRecvDepth).
	RecvDepth int
	// Logger receives lifecycle events (nil: slog.Default()).
	Logger *slog.Logger

	open      func(name string, port int, lay layout) (device, error) // tests
	ipoibAddr func(gid ipoib.GID, pkey ipoib.PKey) (ipoibBind, error) // tests
}

// qpState is one QP of the port: a VIF's, or a partition's group QP.
// posted and done count its sends; done is written by the send
// completion reaper under txMu. wire is the P_Key table entry the QP
// sends with (its path records are asked in it), part its partition.
type qpState struct {
	pkey         ipoib.PKey
	wire         ipoib.PKey
	part         *partState
	posted, done uint64
	lastBatch    uint64
}

// partState is one partition of the port: its Q_Key and IB MTU, which on
// IB come from its broadcast group as ipoib_mcast_join_finish takes them
// (priv->qkey, priv->mcast_mtu); on RoCE the IPoIB Q_Key and the port's
// MTU. The data path reads them atomically.
type partState struct {
	qkey atomic.Uint32
	mtu  atomic.Int32
}

// ahKey names an address handle: the destination GID and the P_Key of
// the sending QP, since a path record (DLID, SL) is per partition.
type ahKey struct {
	gid  ipoib.GID
	pkey ipoib.PKey
}

// member is an SA multicast membership of the port: the join's event
// data, whether it is send-only, and the group QP attached with its MLID
// (0: none).
type member struct {
	mcMember
	sendOnly bool
	qp       uint32
	lost     bool // a rejoin failed: not held, retried
}

// deadAH is an address handle flushed while sends may still use it:
// destroyed once the send ring has freed every slot queued before mark.
type deadAH struct {
	h    handle
	mark uint64
}

// pendingPkt is a packet waiting for its destination's address handle.
type pendingPkt struct {
	buf  int
	n    int
	src  uint32
	dst  ipoib.HwAddr
	pkey ipoib.PKey
	key  ahKey
	e    *ahEntry // the resolution it waits for, which counts it
}

// Port is one port of a verbs device as an ipoib.Port.
type Port struct {
	dev  device
	a    devAttr
	log  *slog.Logger
	down atomic.Bool
	// events reports the port state and partition MTUs (events.go).
	events *ipoib.EventQueue

	// qps are the QPs (Data *qpState), looked up without a lock; qpMu
	// guards the rest.
	qps    *ipoib.QPTable
	qpMu   sync.RWMutex
	gqps   map[ipoib.PKey]uint32     // partition → its group QP
	parts  map[ipoib.PKey]*partState // by full P_Key
	pkeyT  []ipoib.PKey              // the P_Key table
	groups *ipoib.GroupTable
	mcSock int // IPv6 socket joining MGIDs on the RoCE netdev

	// The IB link layer (sa nil on RoCE). ctlMu serialises the SA work:
	// joins, leaves, rejoins and flushes; members and rejoin are under it.
	sa        subnetAdmin
	ipoibAddr func(ipoib.GID, ipoib.PKey) (ipoibBind, error)
	ctlMu     sync.Mutex
	members   map[ipoib.GID]*member
	rejoin    map[ipoib.GID]bool
	mtuWarned map[ipoib.PKey]bool // partitions whose MTU fallback was logged

	// ahs is the address handle cache, read without a lock; ahMu
	// serialises its changes and guards evicted: the handles evictAH
	// dropped, for reap to bury; nEvicted is their number, read without
	// ahMu on the send path.
	ahMu     sync.Mutex
	ahs      *ahCache
	evicted  []handle
	nEvicted atomic.Int32
	resolve  chan ahKey

	txMu  sync.Mutex
	slots []slotInfo
	// dying are the QPs FreeQP took out of qps and has not destroyed
	// yet: their slots stay in use (reap) until then.
	dying    map[uint32]*qpState
	head     int
	used     int
	descs    []sendDesc
	dones    []sendDone
	batchNo  uint64
	pendBufs [][]byte
	pendFree []int
	pending  []pendingPkt
	// queued and freed count send slots ever taken and given back (in
	// ring order); dead address handles wait for freed to pass their mark.
	queued, freed uint64
	dead          []deadAH

	// The receive side: receiver takes completions into polled and
	// reposts (repost) a spare buffer for each. The packet waits in the
	// ready ring (readyN from readyAt) for Read, which copies it out
	// into rdone's order and gives its buffer back to spare. rqMu guards
	// spare and the ring; rxMu serialises Read.
	depth   int
	rxMu    sync.Mutex
	rdone   []recvDone
	rqMu    sync.Mutex
	polled  []recvDone
	repost  []uint32
	spare   []uint32
	ready   []recvDone
	readyAt int
	readyN  int
	rxReady chan struct{}
	rxErr   atomic.Pointer[error]

	dataWarn warnlimit.Limit // data-path warnings

	closed atomic.Bool
	// qpCalls holds Close back while AllocQP or FreeQP is in the device:
	// they run outside ctlMu (a new VIF must not wait behind a slow SA
	// join), and Close must not free the device under them.
	qpCalls inflight
	wg      sync.WaitGroup
	done    chan struct{}

	// lids names senders without a GRH (lids.go); rxByLID counts the
	// packets it named, rxSrcUnknown those it could not.
	lids                  lidTable
	rxByLID, rxSrcUnknown atomic.Uint64

	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	drops                                  ipoib.DropCounters
	ahCreated, ahFailed, signalled         atomic.Uint64
	resolving                              atomic.Int64  // address handles being made now
	resolveFull                            atomic.Uint64 // destinations not queued: every resolver busy, the queue full
	joins, rejoins, flushes, mtuFallbacks  atomic.Uint64
	pkeyMoves                              atomic.Uint64 // partitions in use whose P_Key index moved (their QPs keep the old)
	otherPortEvents                        atomic.Uint64 // async events of the HCA's other ports, ignored
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
	name, port, err := ParseDevice(c.Device)
	if err != nil {
		return nil, fmt.Errorf("verbsfabric: device %q: %w", c.Device, err)
	}
	open := c.open
	if open == nil {
		open = openDevice
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	depth := c.RecvDepth
	if depth == 0 {
		depth = DefaultRecvDepth
	}
	if depth < MinRecvDepth || depth > MaxRecvDepth {
		return nil, fmt.Errorf("verbsfabric: receive queue depth %d: want %d to %d", depth, MinRecvDepth, MaxRecvDepth)
	}
	// depth buffers on the SRQ, depth spares for the ready queue, and a
	// batch in Read's hands.
	lay := layout{sendSlots: sendSlots, slotSize: 4096, recvBufs: 2*depth + batchSize, srqDepth: depth, recvSize: grhLen + 4096 + 24, batch: batchSize}
	dev, err := open(name, port, lay)
	if err != nil {
		return nil, err
	}
	p := &Port{
		dev: dev, a: dev.attr(), log: log.With("device", c.Device),
		qps: ipoib.NewQPTable(0), gqps: make(map[ipoib.PKey]uint32), parts: make(map[ipoib.PKey]*partState),
		groups: ipoib.NewGroupTable(), mcSock: -1, sa: dev.sa(), ipoibAddr: c.ipoibAddr,
		members: make(map[ipoib.GID]*member), rejoin: make(map[ipoib.GID]bool), mtuWarned: make(map[ipoib.PKey]bool),
		ahs: newAHCache(), resolve: make(chan ahKey, resolveQueue),
		slots: make([]slotInfo, sendSlots), dying: make(map[uint32]*qpState), descs: make([]sendDesc, 0, batchSize), dones: make([]sendDone, sendSlots),
		depth: depth, rdone: make([]recvDone, batchSize), polled: make([]recvDone, batchSize), repost: make([]uint32, 0, batchSize),
		ready: make([]recvDone, lay.recvBufs), rxReady: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if p.a.mtu != 2048 && p.a.mtu != 4096 {
		dev.close()
		return nil, fmt.Errorf("verbsfabric: %s has active MTU %d; IPoIB needs 2048 or 4096 (on RoCE, a netdev MTU of at least 4096+80 for 4096)", c.Device, p.a.mtu)
	}
	p.down.Store(!p.a.active)
	p.pkeyT = p.a.pkeys
	if p.ipoibAddr == nil {
		p.ipoibAddr = hostIPoIB
	}
	for i := range pendingMax {
		p.pendBufs = append(p.pendBufs, make([]byte, p.a.mtu))
		p.pendFree = append(p.pendFree, i)
	}
	all := make([]uint32, lay.recvBufs)
	for i := range all {
		all[i] = uint32(i)
	}
	p.spare = all[depth:]
	if err := dev.postRecv(all[:depth]); err != nil {
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
	p.events = ipoib.NewEventQueue(p.a.active)
	p.wg.Add(2 + resolvers)
	go p.receiver()
	for range resolvers {
		go p.resolver()
	}
	go follow(p, "verbs async events", p.dev.waitEvent, p.asyncEvent)
	if p.sa != nil {
		p.wg.Add(2)
		go p.rejoiner()
		go follow(p, "rdma_cm events", p.sa.waitEvent, p.mcastError)
	}
	link := "RoCE"
	if p.a.ib {
		link = "InfiniBand"
	}
	p.log.Info("verbs port open", "port", p.a.port, "gid", p.a.gid, "gid_index", p.a.gidIndex, "link_layer", link, "mtu", p.a.mtu, "active", p.a.active)
	return p, nil
}

// BatchSize is the most packets one Read returns.
func (p *Port) BatchSize() int { return batchSize }

// LocalGID is the port GID.
func (p *Port) LocalGID() ipoib.GID { return p.a.gid }

// MTU is the port's active IB MTU.
func (p *Port) MTU() int { return p.a.mtu }

// PartitionMTU is the IB MTU of partition pkey: on IB its broadcast
// group's (ipoib_mcast_join_finish sets the interface MTU from
// broadcast->mcmember.mtu), never more than the port's; the port's for a
// partition not used yet, and on RoCE.
func (p *Port) PartitionMTU(pkey ipoib.PKey) int {
	p.qpMu.RLock()
	s := p.parts[pkey.Full()]
	p.qpMu.RUnlock()
	if s == nil {
		return p.a.mtu
	}
	return int(s.mtu.Load())
}

// Offloads: none. The UD QPs take no super-packets and no checksum
// offload. rdma-core's mlx5 provider builds IBV_WR_TSO only for raw
// packet QPs (providers/mlx5/qp.c _mlx5_post_send; max_tso is set only
// for them, verbs.c mlx5_modify_qp). It builds IBV_SEND_IP_CSUM on UD
// only for underlay QPs (IBV_QP_CREATE_SOURCE_QPN:
// mlx5_post_send_underlay), which send with another QP's number and
// cannot be attached to groups. rxe has neither. The shim cuts and sums
// for this port.
func (p *Port) Offloads() ipoib.Offloads { return ipoib.Offloads{} }

// IsDown reports the port not ACTIVE, from the device's async events
// (Events reports each change, PORT_ACTIVE once its flush is done).
func (p *Port) IsDown() bool { return p.down.Load() }

// pkeyIndex finds pkey in the port's P_Key table (full and limited
// members match each other's base; a full-member entry is preferred).
func (p *Port) pkeyIndex(pkey ipoib.PKey) (int, ipoib.PKey, error) {
	p.qpMu.RLock()
	defer p.qpMu.RUnlock()
	return pkeyIndexIn(p.pkeyT, pkey)
}

// pkeyIndexIn is pkeyIndex in table t: the index and the entry.
func pkeyIndexIn(t []ipoib.PKey, pkey ipoib.PKey) (int, ipoib.PKey, error) {
	best := -1
	for i, k := range t {
		if k.Base() == pkey.Base() && (best < 0 || k.IsFull() && !t[best].IsFull()) {
			best = i
		}
	}
	if best < 0 {
		return 0, 0, fmt.Errorf("verbsfabric: P_Key %s is not in the port's P_Key table %v", pkey, t)
	}
	return best, t[best], nil
}

// partition returns pkey's partition state, making it: on IB the port
// first joins the partition's broadcast group, whose MULTICAST_JOIN
// event gives the Q_Key its QPs use and its MTU (as IPoIB joins the
// broadcast group before anything else: ipoib_mcast_join_task).
func (p *Port) partition(pkey ipoib.PKey) (*partState, error) {
	pk := pkey.Full()
	p.qpMu.RLock()
	s := p.parts[pk]
	p.qpMu.RUnlock()
	if s != nil {
		return s, nil
	}
	s = &partState{}
	s.qkey.Store(ipoib.QKey)
	s.mtu.Store(int32(p.a.mtu))
	if p.sa != nil {
		p.ctlMu.Lock()
		m, err := p.saJoin(ipoib.BroadcastMGID(pk, ipoib.ScopeLinkLocal), false)
		if err == nil {
			p.setPart(s, m.mcMember, pk)
		}
		p.ctlMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("verbsfabric: partition %s: joining its broadcast group: %w", pk, err)
		}
	}
	p.qpMu.Lock()
	if old := p.parts[pk]; old != nil {
		s = old
	} else {
		p.parts[pk] = s
	}
	p.qpMu.Unlock()
	return s, nil
}

// setPart takes a partition's Q_Key and MTU from its broadcast group's
// join (ipoib_mcast_join_finish: priv->qkey = mcmember.qkey, mcast_mtu
// from mcmember.mtu) and sets a changed Q_Key on the partition's QPs
// (ipoib_mcast_attach with set_qkey). Called with ctlMu held.
func (p *Port) setPart(s *partState, m mcMember, pk ipoib.PKey) {
	mtu := m.mtu
	if mtu == 0 {
		// ibvSA takes the group's MTU from a path record to the MGID;
		// when that query fails it has none. The partition's IPoIB
		// interface shows the MTU the kernel took from its own join of
		// the group (ifaceGroupMTU). When it shows none either, take
		// 2048, the smaller IPoIB MTU. Never take the port's, which may
		// be larger than the partition's: 4K sends into a 2K partition
		// are lost.
		mtu = m.ifaceMTU
		from := "its IPoIB interface's"
		if mtu == 0 {
			mtu, from = 2048, "2048 (the IPoIB interface is in connected mode or its MTU is below 2044)"
		}
		p.mtuFallbacks.Add(1)
		if !p.mtuWarned[pk] {
			p.mtuWarned[pk] = true
			p.log.Warn("no MTU for the partition's broadcast group from the SA (the path record query to its MGID failed); using "+from+" (logged once; counted in group_mtu_fallbacks)", "pkey", pk, "mtu", min(mtu, p.a.mtu))
		}
	}
	mtu = min(mtu, p.a.mtu)
	s.mtu.Store(int32(mtu))
	p.events.PartitionMTU(pk, mtu)
	if s.qkey.Swap(m.qkey) == m.qkey {
		return
	}
	var qpns []uint32
	for qpn, q := range p.qps.All() {
		if q.Data.(*qpState).part == s {
			qpns = append(qpns, qpn)
		}
	}
	for _, qpn := range qpns {
		if err := p.dev.setQKey(qpn, m.qkey); err != nil {
			p.log.Error("setting the broadcast group's Q_Key on a QP", "qpn", qpn, "qkey", m.qkey, "err", err)
		}
	}
}

// AllocQP creates a UD QP in partition pkey. The device numbers QPs; hint
// is ignored.
func (p *Port) AllocQP(pkey ipoib.PKey, _ uint32) (uint32, error) {
	if !p.qpCalls.enter() {
		return 0, net.ErrClosed
	}
	defer p.qpCalls.leave()
	idx, wire, err := p.pkeyIndex(pkey)
	if err != nil {
		return 0, err
	}
	part, err := p.partition(pkey)
	if err != nil {
		return 0, err
	}
	qkey := part.qkey.Load()
	qpn, err := p.dev.createQP(idx, qkey, rand.Uint32())
	if err != nil {
		return 0, &ipoib.RefusedError{Reason: "no_qp", Err: err} // the shim counts vifs_refused_no_qp
	}
	if err := p.qps.Add(qpn, pkey, &qpState{pkey: pkey, wire: wire, part: part}); err != nil {
		p.dev.destroyQP(qpn)
		return 0, fmt.Errorf("verbsfabric: %w", err)
	}
	if now := part.qkey.Load(); now != qkey { // a rejoin changed it meanwhile
		if err := p.dev.setQKey(qpn, now); err != nil {
			p.log.Error("setting the broadcast group's Q_Key on a QP", "qpn", qpn, "qkey", now, "err", err)
		}
	}
	return qpn, nil
}

// FreeQP destroys a QP made by AllocQP.
func (p *Port) FreeQP(qpn uint32) error {
	if !p.qpCalls.enter() {
		return net.ErrClosed
	}
	defer p.qpCalls.leave()
	p.qpMu.Lock()
	q := p.qp(qpn)
	ok := q != nil
	for _, g := range p.gqps {
		ok = ok && g != qpn
	}
	if ok {
		p.unlist(qpn, q)
	}
	p.qpMu.Unlock()
	if !ok {
		return fmt.Errorf("verbsfabric: QPN %#x not allocated", qpn)
	}
	// Destroyed outside txMu (a device call must not hold the data path
	// up). Once ibv_destroy_qp returns the device reads none of its send
	// buffers (rxe_qp.c: the QP's requester and completer tasks are
	// cleaned up, rxe_cleanup_task, before the QP goes): its slots are
	// free. A failed destroy frees them too: the ring must not stall on
	// a QP that will never complete.
	err := p.dev.destroyQP(qpn)
	p.txMu.Lock()
	delete(p.dying, qpn)
	p.txMu.Unlock()
	return err
}

// unlist takes QP qpn out of the table between batches (txMu), so that
// no batch under way still posts on it; a send on a destroyed QP would
// fail the whole batch. It marks the QP dying: the slots of its sends
// stay in use until it is destroyed or they complete. Called with qpMu
// held.
func (p *Port) unlist(qpn uint32, q *qpState) {
	p.txMu.Lock()
	p.qps.Free(qpn)
	p.dying[qpn] = q
	p.txMu.Unlock()
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
// through the subnet administrator, which gives the group's MLID. On
// RoCE it joins mgid as an IPv6 group on the netdev: rxe only programs
// the MAC filter, and without the IPv6 membership the stack drops the
// group's packets. This also sends the MLD reports snooping switches
// need.
func (p *Port) Join(mgid ipoib.GID) error {
	if p.closed.Load() {
		return net.ErrClosed
	}
	pkey := ipoib.MGIDPKey(mgid)
	if _, err := p.partition(pkey); err != nil {
		return err
	}
	q, err := p.groupQP(pkey)
	if err != nil {
		return err
	}
	if p.sa != nil {
		// The SA join and the attach run under ctlMu only: take() reads
		// the group table for every multicast packet, so the table's lock
		// is held just to record the membership, never across an SA call
		// (seconds).
		p.ctlMu.Lock()
		err := p.saAttach(mgid, q)
		if err == nil {
			err = p.groups.Join(mgid, nil)
		}
		p.ctlMu.Unlock()
		if err != nil {
			return err
		}
		p.wantAH(ahKey{mgid, p.wireOf(q)})
		return nil
	}
	if err := p.groups.Join(mgid, func() error {
		if err := p.dev.attach(q, mgid, 0); err != nil {
			return err
		}
		if err := p.ipv6Group(mgid, unix.IPV6_JOIN_GROUP); err != nil {
			p.dev.detach(q, mgid, 0)
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	p.wantAH(ahKey{mgid, p.wireOf(q)})
	return nil
}

// wireOf is the P_Key QP qpn sends with.
func (p *Port) wireOf(qpn uint32) ipoib.PKey {
	if q := p.qp(qpn); q != nil {
		return q.wire
	}
	return 0
}

// qp returns QP qpn's state (nil: no such QP). It takes no lock.
func (p *Port) qp(qpn uint32) *qpState {
	q, _ := p.qps.Lookup(qpn)
	s, _ := q.Data.(*qpState)
	return s
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
	pkey := ipoib.MGIDPKey(mgid)
	if _, wire, err := p.pkeyIndex(pkey); err == nil {
		p.wantAH(ahKey{mgid, wire})
	}
	return nil
}

// Leave detaches the group QP from mgid and leaves the IPv6 group (RoCE)
// or the SA membership (IB; a partition's broadcast group stays joined
// while the port is open, as IPoIB's does).
func (p *Port) Leave(mgid ipoib.GID) error {
	if p.sa != nil {
		p.ctlMu.Lock()
		err := errors.Join(p.groups.Leave(mgid, nil), p.saLeave(mgid))
		p.ctlMu.Unlock()
		p.flushAHs(func(k ahKey) bool { return k.gid == mgid })
		return err
	}
	p.qpMu.RLock()
	q, ok := p.gqps[ipoib.MGIDPKey(mgid).Full()]
	p.qpMu.RUnlock()
	return p.groups.Leave(mgid, func() error {
		if !ok {
			return nil
		}
		return errors.Join(p.dev.detach(q, mgid, 0), p.ipv6Group(mgid, unix.IPV6_LEAVE_GROUP))
	})
}

// saAttach makes the port a full SA member of mgid and attaches group QP
// q with the group's MLID. Called with ctlMu held.
func (p *Port) saAttach(mgid ipoib.GID, q uint32) error {
	m, err := p.saJoin(mgid, false)
	if err != nil {
		return err
	}
	if m.qp == q {
		return nil
	}
	if err := p.dev.attach(q, mgid, m.mlid); err != nil {
		return err
	}
	m.qp = q
	return nil
}

// saJoin makes the port an SA member of mgid (a full one unless
// sendOnly), keeping a membership that already suffices; a full join
// replaces a send-only one. Called with ctlMu held.
//
// The join's id is bound with RDMA_PS_IPOIB to the address of the host's
// IPoIB interface in the group's partition. cma_join_ib_multicast looks
// the id's broadcast group up first (ib_sa_get_mcmember_rec with the
// interface's broadcast MGID), which an AF_IB bind never sets
// (cma_translate_ib).
//
// A send-only join refused because the SM lacks send-only full members
// becomes a full-member join, as ipoib_mcast_join falls back. Kernels up
// to 5.11 refuse it with EOPNOTSUPP (cma_join_ib_multicast checks
// ib_sa_sendonly_fullmem_support). Later ones send it, and the SA's
// refusal comes as the id's MULTICAST_ERROR.
//
// A membership whose rejoin failed (lost) is joined again as what it
// was: a full member when either it or this call wants one. Its group QP
// is attached again with the new MLID. A send-only join must not replace
// a lost full membership and its QP.
//
// While the port is down a lost membership is not joined: it waits for
// PORT_ACTIVE's flush, as retryRejoins and mcastError make it. Otherwise
// the resolver's makeAH, which a guest's packet or a flush's requeue
// runs at any time, would join it, and the join could only time out
// while no MAD reaches the SA.
func (p *Port) saJoin(mgid ipoib.GID, sendOnly bool) (*member, error) {
	if p.closed.Load() {
		return nil, net.ErrClosed
	}
	old := p.members[mgid]
	if old != nil && !old.lost && (!old.sendOnly || sendOnly) {
		return old, nil
	}
	if old != nil && old.lost {
		if p.down.Load() {
			return nil, &ipoib.RefusedError{Reason: "port_down", Err: fmt.Errorf("verbsfabric: joining %s: the port is down; the membership is rejoined when the port is active again (check the cable and the subnet manager: `ibstat`)", mgid)}
		}
		sendOnly = sendOnly && old.sendOnly
	}
	bind, err := p.ipoibAddr(p.a.gid, ipoib.MGIDPKey(mgid))
	if err != nil {
		return nil, err
	}
	r := joinReq{mgid: mgid, sendOnly: sendOnly, ps: psIPoIB, bind: bind}
	mc, err := p.sa.join(r)
	if sendOnly && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, errJoinRefused)) {
		p.log.Info("the subnet manager has no send-only full members; joining as a full member", "mgid", mgid)
		r.sendOnly = false
		mc, err = p.sa.join(r)
	}
	if err != nil {
		return nil, joinError(mgid, err)
	}
	mc.ifaceMTU = ifaceGroupMTU(bind)
	p.joins.Add(1)
	m := &member{mcMember: mc, sendOnly: r.sendOnly}
	if old != nil {
		m.qp = old.qp
		if !old.lost {
			p.sa.leave(mgid, old.sendOnly)
		} else if m.qp != 0 {
			if err := p.dev.attach(m.qp, mgid, mc.mlid); err != nil {
				p.sa.leave(mgid, r.sendOnly)
				return nil, fmt.Errorf("verbsfabric: attaching the group QP to %s again: %w", mgid, err)
			}
		}
	}
	p.members[mgid] = m
	delete(p.rejoin, mgid)
	return m, nil
}

// joinError wraps a failed join of mgid. A join the kernel never answers
// is one of two things an operator can check. Either the SA did not
// answer, or the group's Q_Key is not the one the id took from the
// partition's broadcast group. (Some kernels' cma_ib_mc_handler calls
// cma_set_qkey before making the event, and sends none when it fails.)
// The error is an ipoib.RefusedError, which the shim counts by its
// reason (groups_refused_<reason>, vifs_refused_<reason>): sa_timeout,
// sa_refused (the SA's MULTICAST_ERROR) or join_failed.
func joinError(mgid ipoib.GID, err error) error {
	if errors.Is(err, unix.ETIMEDOUT) {
		return &ipoib.RefusedError{Reason: "sa_timeout", Err: fmt.Errorf("verbsfabric: joining %s: no MULTICAST_JOIN event: the subnet manager did not answer, or the group's Q_Key differs from the partition's broadcast group's (newer kernels then send no event; compare the two with `saquery -g`): %w", mgid, err)}
	}
	reason := "join_failed"
	if errors.Is(err, errJoinRefused) {
		reason = "sa_refused"
	}
	return &ipoib.RefusedError{Reason: reason, Err: fmt.Errorf("verbsfabric: joining %s: %w", mgid, err)}
}

// saLeave ends the port's SA membership of mgid, detaching its group QP,
// unless mgid is a partition's broadcast group or the port is closed
// (Close left every membership). Called with ctlMu held.
func (p *Port) saLeave(mgid ipoib.GID) error {
	m := p.members[mgid]
	if m == nil || p.isBroadcast(mgid) || p.closed.Load() {
		return nil
	}
	var err error
	if !m.lost {
		if m.qp != 0 {
			err = p.dev.detach(m.qp, mgid, m.mlid)
		}
		p.sa.leave(mgid, m.sendOnly)
	}
	delete(p.members, mgid)
	delete(p.rejoin, mgid)
	return err
}

// isBroadcast reports mgid as the broadcast group of a partition in use.
func (p *Port) isBroadcast(mgid ipoib.GID) bool {
	pk := ipoib.MGIDPKey(mgid).Full()
	p.qpMu.RLock()
	_, ok := p.parts[pk]
	p.qpMu.RUnlock()
	return ok && mgid == ipoib.BroadcastMGID(pk, ipoib.ScopeLinkLocal)
}

// rejoinGroup leaves and joins mgid again, as ipoib_mcast_dev_flush and
// ipoib_mcast_restart_task do, moving its group QP to the new MLID and,
// for a broadcast group, taking its Q_Key and MTU again. A failed rejoin
// is retried every ahRetry. Called with ctlMu held.
func (p *Port) rejoinGroup(mgid ipoib.GID) {
	m := p.members[mgid]
	if m == nil {
		return
	}
	p.loseMember(mgid, m)
	bind, err := p.ipoibAddr(p.a.gid, ipoib.MGIDPKey(mgid))
	var mc mcMember
	if err == nil {
		mc, err = p.sa.join(joinReq{mgid: mgid, sendOnly: m.sendOnly, ps: psIPoIB, bind: bind})
		mc.ifaceMTU = ifaceGroupMTU(bind)
	}
	if err == nil && m.qp != 0 {
		err = p.dev.attach(m.qp, mgid, mc.mlid)
	}
	if err != nil {
		p.log.Warn("rejoining a multicast group failed; retrying", "mgid", mgid, "err", err)
		return
	}
	p.rejoins.Add(1)
	p.members[mgid] = &member{mcMember: mc, sendOnly: m.sendOnly, qp: m.qp}
	delete(p.rejoin, mgid)
	if p.isBroadcast(mgid) {
		pk := ipoib.MGIDPKey(mgid).Full()
		p.qpMu.RLock()
		s := p.parts[pk]
		p.qpMu.RUnlock()
		p.setPart(s, mc, pk)
	}
}

// loseMember ends membership m of mgid (the SA's id left, the group QP
// detached from the old MLID) but keeps its intent for a rejoin: lost,
// send-only or not, with the QP to attach once it is back. Called with
// ctlMu held.
func (p *Port) loseMember(mgid ipoib.GID, m *member) {
	if !m.lost {
		p.sa.leave(mgid, m.sendOnly)
		if m.qp != 0 {
			p.dev.detach(m.qp, mgid, m.mlid)
		}
	}
	p.members[mgid] = &member{sendOnly: m.sendOnly, qp: m.qp, lost: true}
	p.rejoin[mgid] = true
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
		Drops: p.drops.Snapshot(),
	}
	n := p.ahs.n.Load()
	c.Stats = map[string]uint64{
		"address_handles_made":      p.ahCreated.Load(),
		"address_handle_errors":     p.ahFailed.Load(),
		"tx_signalled":              p.signalled.Load(),
		"sa_joins":                  p.joins.Load(),
		"sa_rejoins":                p.rejoins.Load(),
		"flushes":                   p.flushes.Load(),
		"group_mtu_fallbacks":       p.mtuFallbacks.Load(),
		"pkey_index_moves":          p.pkeyMoves.Load(),
		"async_events_other_port":   p.otherPortEvents.Load(),
		"address_handle_queue_full": p.resolveFull.Load(),
		"rx_src_by_lid":             p.rxByLID.Load(),
		"rx_src_unknown":            p.rxSrcUnknown.Load(),
	}
	c.Levels = map[string]uint64{
		"address_handles":           uint64(n),
		"address_handles_resolving": uint64(p.resolving.Load()),
		"tx_ring_slots_in_use":      uint64(p.slotsInUse()),
		"receive_buffers_posted":    uint64(p.depth),
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
	p.events.Close()
	p.qpCalls.close() // before ctlMu: an AllocQP may be waiting for it
	// A control call under way (a join past its event, a leave) ends
	// before the device and its rdma_cm ids are freed; later ones see
	// closed (saJoin) and do nothing.
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
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

// portEvent follows the port state and, on IB, the subnet manager's
// events, flushing as ipoib_event has IPoIB flush: CLIENT_REREGISTER and
// SM_CHANGE a light flush, LID_CHANGE and PORT_ACTIVE a normal one,
// PKEY_CHANGE a heavy one (ipoib_ib.c __ipoib_ib_dev_flush). Each drops
// the address handles (paths and groups are resolved again on next use)
// and rejoins every group; the heavy one first reads the P_Key table
// again.
func (p *Port) portEvent(ev portEvent) {
	switch ev {
	case eventPortActive:
		p.down.Store(false)
		p.log.Info("verbs port active")
		p.flush("port active", false)
	case eventPortDown:
		p.down.Store(true)
		p.log.Warn("verbs port down")
	case eventGIDChange:
		p.log.Warn("verbs port GID table changed; the port GID stays as at start", "gid", p.a.gid)
	case eventClientReregister:
		p.flush("client reregister", false)
	case eventSMChange:
		p.flush("SM change", false)
	case eventLIDChange:
		p.flush("LID change", false)
	case eventPKeyChange:
		p.flush("P_Key change", true)
	}
}

// follow hands each event wait returns to handle until wait reports the
// device's wake.
func follow[T any](p *Port, what string, wait func() (T, bool, error), handle func(T)) {
	defer p.wg.Done()
	for {
		ev, ok, err := wait()
		if err != nil {
			p.log.Error(what+" stopped", "err", err)
			return
		}
		if !ok {
			return
		}
		handle(ev)
	}
}

// flush rejoins every group and then drops every address handle (IB
// only); heavy first reads the P_Key table again.
func (p *Port) flush(why string, heavy bool) {
	if p.sa == nil {
		return
	}
	p.log.Info("flushing address handles and rejoining groups", "reason", why)
	if heavy {
		p.reloadPKeys()
	}
	// Rejoin first, then drop the handles, as mcastError does: a handle
	// the resolver makes before the rejoin (a group's with its old MLID)
	// is dropped with the rest, and one it is making is stale.
	p.ctlMu.Lock()
	for mgid := range p.members {
		p.rejoinGroup(mgid)
	}
	p.ctlMu.Unlock()
	p.flushAHs(func(ahKey) bool { return true })
	p.lids.clear()   // the SM may have given the LIDs to other ports
	p.flushes.Add(1) // done: what a flush changes is in place
}

// reloadPKeys reads the P_Key table after a PKEY_CHANGE: new QPs use the
// new indices. A QP stays on the index it was made with (a UD QP's P_Key
// index changes only through SQD); a partition whose entry moved or
// left is logged.
func (p *Port) reloadPKeys() {
	t, err := p.dev.pkeys()
	if err != nil {
		p.log.Error("reading the P_Key table after a P_Key change", "err", err)
		return
	}
	p.qpMu.Lock()
	old := p.pkeyT
	p.pkeyT = t
	p.qpMu.Unlock()
	p.qpMu.RLock()
	defer p.qpMu.RUnlock()
	for pk := range p.parts {
		oi, _, _ := pkeyIndexIn(old, pk)
		ni, _, err := pkeyIndexIn(t, pk)
		switch {
		case err != nil:
			p.log.Error("a partition in use left the port's P_Key table; its QPs cannot send", "pkey", pk)
		case ni != oi:
			p.pkeyMoves.Add(1)
			p.log.Warn("a partition in use moved in the P_Key table; its existing QPs keep the old index until they are made again", "pkey", pk, "from", oi, "to", ni)
		}
	}
}

// mcastError rejoins a group whose id reports a MULTICAST_ERROR, and
// drops the group's address handle, made with the old MLID. Every
// membership gets one when multicast.c's mcast_event_handler sees the
// port's LID, SM or registration change, or its P_Key go.
//
// While the port is down (PORT_ERR: mcast_event_handler reports it to
// every member too) no join can succeed. The membership is marked lost
// and rejoined by the flush of PORT_ACTIVE. Likewise IPoIB's
// ipoib_mcast_join_task suspends itself while the port is not ACTIVE
// ("port state is not ACTIVE ... suspending join task").
func (p *Port) mcastError(ev mcastError) {
	p.ctlMu.Lock()
	if m := p.members[ev.mgid]; m != nil && !m.lost && m.sendOnly == ev.sendOnly {
		if p.down.Load() {
			p.log.Warn("multicast error while the port is down; rejoining when it is active", "mgid", ev.mgid, "err", ev.err)
			p.loseMember(ev.mgid, m)
		} else {
			p.log.Warn("multicast error; rejoining", "mgid", ev.mgid, "err", ev.err)
			p.rejoinGroup(ev.mgid)
		}
	}
	p.ctlMu.Unlock()
	p.flushAHs(func(k ahKey) bool { return k.gid == ev.mgid })
}

// retryRejoins rejoins the groups whose rejoin failed, unless the port
// is down (PORT_ACTIVE's flush rejoins them).
func (p *Port) retryRejoins() {
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	if p.down.Load() {
		return
	}
	for mgid := range p.rejoin {
		p.rejoinGroup(mgid)
	}
}

// warnLimited logs a data-path error at most once a minute, with how
// many were held back (the counters have every occurrence).
func (p *Port) warnLimited(err error) {
	if p.dataWarn.Allow(time.Now()) {
		p.log.Warn("verbs data path error (at most once a minute; see the drop counters)", "err", err, "suppressed", p.dataWarn.Suppressed())
	}
}

// inflight counts calls under way and, once closed, lets none start:
// close returns when the last one has left. Unlike a sync.RWMutex it lets
// a call that is in start another (Join makes a group QP with AllocQP)
// while close waits.
type inflight struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   sync.Cond
}

// enter starts a call; false once closed.
func (f *inflight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.n++
	return true
}

// leave ends a call.
func (f *inflight) leave() {
	f.mu.Lock()
	if f.n--; f.n == 0 && f.idle.L != nil {
		f.idle.Broadcast()
	}
	f.mu.Unlock()
}

// close refuses new calls and waits for those under way.
func (f *inflight) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.idle.L = &f.mu
	for f.n > 0 {
		f.idle.Wait()
	}
}
