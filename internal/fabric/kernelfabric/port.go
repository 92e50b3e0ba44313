package kernelfabric

// TX: each packet's source VIF is an IPoIB child. Its socket sends the
// IP payload with a sockaddr_ll naming the child, the ethertype and the
// 20-byte destination; the driver pushes the IPoIB header itself.
// Multicast leaves from the partition's group child, the one child that
// joins groups. So no sibling child receives a copy of a guest's own
// multicast: the HCA replicates multicast to every attached QP of the
// port, and the driver drops only what its own QP sent. Consecutive
// packets of one child go in one sendmmsg.
//
// RX: one goroutine per child reads its socket with recvmmsg. The kernel
// says only the packet type (host, broadcast, multicast) and the
// ethertype. The port restores the IPoIB header, takes the destination
// QPN from the child, the MGID from the packet type and destination IP,
// and marks the source unknown. Broadcast and multicast are taken from
// the group child only, as each packet must reach the TAP once. Every
// child receives its partition's broadcast group (the driver joins it on
// open) and the all-hosts group (the IPv4 stack joins it). So a VIF
// child's socket has a filter that accepts PACKET_HOST only, and the
// kernel drops its copies before they are queued.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/rxq"
	"github.com/eipoib/eipoibd/ipoib"
)

// A Port counts its drops under ipoib.Drop's reasons. Its own is
// ipoib.DropNoCarrier: the sending child has no carrier (its partition's
// broadcast join is not done, or the port or its P_Key went away). The
// kernel's noop qdisc would drop the packet and report it sent.

// Stats counted by a Port beside its drops.
const (
	// StatMcastCopies counts broadcast/multicast copies that reached a
	// VIF child's socket despite its PACKET_HOST filter, dropped as
	// duplicates of the group child's copy (the copies the filter drops
	// are counted nowhere a socket sees).
	StatMcastCopies = "rx_mcast_copies"
	// StatSuperPackets counts super-packets handed to the kernel.
	StatSuperPackets = "tx_super_packets"
	// StatMTUChanges counts parent MTU changes seen after start-up.
	StatMTUChanges = "parent_mtu_changes"
	// StatReclaimed counts the children of a previous run deleted
	// unadopted: at start without Config.Persist, and under it those
	// that cannot be adopted (unadoptable) and those no VIF claimed
	// (EndAdoption). Only a deletion that succeeded counts. An
	// adoption that fails (refused, or the child's setup failed) is
	// counted as a new child's failure would be, not here.
	StatReclaimed = "children_reclaimed"
	// StatAdopted counts children of a previous run taken over, with
	// their ifindex and QPN, under Config.Persist: once each is in
	// use, so an adopted child that could not be put in place is not.
	StatAdopted = "children_adopted"
	// StatRefusedPKey, StatRefusedJoin and StatRefusedMTU count children
	// refused and deleted: their P_Key is not in the port's table, their
	// broadcast join did not complete in time, or their partition's MTU
	// is not one eipoibd runs. StatRefusedAgain counts AllocQP calls
	// answered with a recent refusal, no child made.
	StatRefusedPKey  = "child_refused_pkey"
	StatRefusedJoin  = "child_refused_join"
	StatRefusedMTU   = "child_refused_mtu"
	StatRefusedAgain = "child_refused_again"
	// StatCarrierLost counts children losing carrier after they were
	// ready.
	StatCarrierLost = "child_carrier_lost"
	// StatPartitionMTUChanges counts MTU changes of ready children (their
	// partition's broadcast group MTU changed).
	StatPartitionMTUChanges = "partition_mtu_changes"
	// StatResubscribed counts new link subscriptions made after one
	// ended (an overrun: notifications lost), each followed by a dump
	// of every link's carrier and MTU.
	StatResubscribed = "link_resubscriptions"
	// StatIPv6Absent counts children made without their IPv6
	// settings because the kernel runs no IPv6 (ipv6.disable=1): there
	// is nothing to keep off them.
	StatIPv6Absent = "child_ipv6_absent"
	// StatOutgoingNotIgnored is OutgoingNotIgnored: the packet sockets
	// of this process (of every Port) opened without
	// PACKET_IGNORE_OUTGOING because the kernel refused it.
	StatOutgoingNotIgnored = "sockets_outgoing_not_ignored"
)

// stat indexes the stats a Port counts itself, in an array of atomic
// counters: no lock, as drops are counted.
type stat uint8

const (
	statSuperPackets stat = iota
	statMTUChanges
	statReclaimed
	statAdopted
	statRefusedPKey
	statRefusedJoin
	statRefusedMTU
	statRefusedAgain
	statCarrierLost
	statPartitionMTUChanges
	statResubscribed
	statMcastCopies
	statIPv6Absent
	numStats
)

// statNames are the stats' names, by index.
var statNames = [numStats]string{
	statSuperPackets:        StatSuperPackets,
	statMTUChanges:          StatMTUChanges,
	statReclaimed:           StatReclaimed,
	statAdopted:             StatAdopted,
	statRefusedPKey:         StatRefusedPKey,
	statRefusedJoin:         StatRefusedJoin,
	statRefusedMTU:          StatRefusedMTU,
	statRefusedAgain:        StatRefusedAgain,
	statCarrierLost:         StatCarrierLost,
	statPartitionMTUChanges: StatPartitionMTUChanges,
	statResubscribed:        StatResubscribed,
	statMcastCopies:         StatMcastCopies,
	statIPv6Absent:          StatIPv6Absent,
}

const (
	batchSize = 64
	queueLen  = 1024
	// rxHead is the room kept in front of a received datagram for the
	// IPoIB header the port restores.
	rxHead = ipoib.HeaderLen
)

// Config configures a Port.
type Config struct {
	Kernel Kernel
	// Parent is the IPoIB interface the children hang from (ib0).
	Parent string
	// Scope is the MGID scope of the parent's broadcast group
	// (ipoib.ScopeLinkLocal by default); the driver joins only groups
	// of that scope and P_Key.
	Scope  uint8
	Logger *slog.Logger
	// ChildTimeout bounds the wait for a new child's carrier, that is
	// for its broadcast join (DefaultChildTimeout when zero).
	ChildTimeout time.Duration
	// FastPath: the fast path's RX program runs at the VIF children's
	// ingress (NewFastPath), so their packet sockets are bound to the
	// protocols the port reads rather than to every protocol (see
	// vifProtocols).
	FastPath bool
	// Persist (--persist): the children a previous run left are
	// adopted rather than deleted at start (see Port.EndAdoption), and
	// Keep leaves this run's in place for the next.
	Persist bool
}

// DefaultChildTimeout is Config.ChildTimeout's default: an SA join
// answers in milliseconds, and a failed one is retried by the driver
// after a 2 s backoff, which this leaves room for once.
const DefaultChildTimeout = 5 * time.Second

// refuseFor is how long a partition whose child was refused refuses new
// children at once with the same reason, unless one of its children is
// freed first (which may free an attachment to its broadcast group).
const refuseFor = 30 * time.Second

// carrierPoll is how often a child's carrier is read while waiting for
// it, besides the link notifications (which can be lost on overrun).
const carrierPoll = 100 * time.Millisecond

// Reasons a child is refused, for errors.Is.
var (
	ErrPKeyNotInTable = errors.New("P_Key not in the port's P_Key table")
	ErrJoinTimeout    = errors.New("the broadcast join did not complete")
	ErrPartitionMTU   = errors.New("partition MTU not supported")
	// ErrChildQueues: a child got fewer receive queues than its
	// parent (queueFixHint).
	ErrChildQueues = errors.New("fewer receive queues than the parent")
)

// child is one IPoIB child interface and its packet socket.
type child struct {
	name  string
	index int
	slot  int // a VIF child's index in its name (ChildName), 0 for a group child
	qpn   uint32
	pkey  ipoib.PKey
	group bool   // the partition's multicast child
	gc    *child // a VIF child's partition's group child, which sends its multicast
	vnet  bool   // PACKET_VNET_HDR on its socket
	sock  Socket // what it sends on, and reads unless the fast path runs
	// rx are the sockets read, each by its own rxLoop: sock alone, or
	// a VIF child's under the fast path, one per vifProtocols (sock the
	// first).
	rx []Socket
	// carrier and mtu (its IB MTU, the IPoIB MTU + 4; 0 until its first
	// carrier) follow the link's notifications; up is closed at the
	// first carrier.
	carrier atomic.Bool
	mtu     atomic.Int32
	up      chan struct{}
	upOnce  sync.Once
	// linkMu serialises applying link states to the child; linkSeq
	// counts the states applied from notifications and dumps, so that
	// a poll's reading overtaken by one of them is dropped as stale.
	linkMu  sync.Mutex
	linkSeq uint64
}

// refusal is a partition's last refused child.
type refusal struct {
	err   error
	until time.Time
}

// Port is an ipoib.Port over the kernel's IPoIB driver.
type Port struct {
	k      Kernel
	log    *slog.Logger
	parent Link
	gid    ipoib.GID
	mtu    int
	scope  uint8
	// ipv6: the kernel runs IPv6, so children get its host-off settings.
	ipv6 bool
	// fastPath: Config.FastPath; fast, the FastPath made (NewFastPath)
	// whose counters Counters reports, until its Stop.
	fastPath bool
	fast     atomic.Pointer[FastPath]
	// tso: the children have TSO; decided on the first child, under
	// setup, before any Write.
	tso, tsoKnown bool

	// qps are the VIF children by QPN (ipoib.QPTable, Data *child),
	// looked up without a lock by Write; a child is destroyed only
	// after the batch that may have looked it up (under txMu) ends.
	qps    *ipoib.QPTable
	mu     sync.RWMutex // groupC, all and slots; the data path never takes it
	groupC map[ipoib.PKey]*child
	all    map[string]*child
	// slots are the VIF child indexes in use (their names'), each
	// reused once its child is gone, so that names stay short for ever.
	slots map[int]bool
	// stem prefixes every child's name (ChildStem).
	stem string
	// leftover are the children a previous run left, by name, under
	// Config.Persist: each waits for a VIF to claim it (adopt) until
	// EndAdoption deletes the rest. Their slots are taken meanwhile.
	leftover map[string]Link
	// kept: Keep was called; children outlive the port.
	kept  atomic.Bool
	setup sync.Mutex // serialises child creation
	// refused answers AllocQP at once for a partition whose child was
	// just refused.
	refMu   sync.Mutex
	refused map[ipoib.PKey]refusal
	timeout time.Duration
	// byIndex maps ifindex to *child for follow, which must not wait
	// for mu (a Write holding it may wait for the kernel, which may be
	// waiting to hand follow a notification).
	byIndex sync.Map
	pkeyErr atomic.Bool           // the P_Key table could not be read (logged once)
	linkErr atomic.Pointer[error] // the last error of the link subscription

	groups *ipoib.GroupTable
	down   atomic.Bool
	events *ipoib.EventQueue // events.go
	closed atomic.Bool
	done   chan struct{}
	rx     chan rxq.Packet
	pool   sync.Pool
	wg     sync.WaitGroup

	txMu   sync.Mutex
	names  [batchSize][SockaddrLLIPoIBLen]byte
	vhdrs  [batchSize][VnetHdrLen]byte
	msgs   [batchSize]Msg
	txSrcs [batchSize]*child

	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	rxCtr                                  rxq.Counters
	drops                                  ipoib.DropCounters
	stats                                  [numStats]atomic.Uint64
}

var _ ipoib.Port = (*Port)(nil)

// New opens the backend on cfg.Parent: it checks the parent is an IPoIB
// interface in datagram mode with an IPoIB MTU of 2044 or 4092, deletes
// children a previous run left behind, and follows the parent's carrier.
func New(cfg Config) (*Port, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Scope == 0 {
		cfg.Scope = ipoib.ScopeLinkLocal
	}
	if cfg.ChildTimeout <= 0 {
		cfg.ChildTimeout = DefaultChildTimeout
	}
	k := cfg.Kernel
	parent, err := k.LinkByName(cfg.Parent)
	if err != nil {
		return nil, fmt.Errorf("kernel: look up %s: %w", cfg.Parent, err)
	}
	if parent.Kind != "ipoib" {
		return nil, fmt.Errorf("kernel: %s is not an IPoIB interface (kind %q)", parent.Name, parent.Kind)
	}
	if parent.ParentIndex != 0 {
		return nil, fmt.Errorf("kernel: %s is an IPoIB child: the driver creates no children of children; use its parent", parent.Name)
	}
	mode, err := k.Mode(parent.Name)
	if err != nil {
		return nil, fmt.Errorf("kernel: read mode of %s: %w", parent.Name, err)
	}
	// A parent in connected mode is fine. Every child is made in
	// datagram mode, with its own UD QP (newChildRequest's
	// IFLA_IPOIB_MODE 0: ipoib_netlink.c ipoib_new_child_link →
	// ipoib_changelink → ipoib_main.c ipoib_set_mode). A child takes the
	// port's UD MTU, not the parent's: ipoib_child_init copies
	// max_ib_mtu, and ipoib_ndo_init sets the MTU to IPOIB_UD_MTU of it.
	// The parent's MTU is then its connected-mode one (up to 65520), so
	// the port's IB MTU is read from the first child instead.
	mtu := 0
	switch mode {
	case "datagram":
		mtu = parent.MTU + ipoib.HeaderLen
		if _, err := ipoib.IPMTU(mtu); err != nil {
			return nil, fmt.Errorf("kernel: %s MTU %d: want the datagram MTU 2044 or 4092 (IB MTU - 4)", parent.Name, parent.MTU)
		}
	case "connected":
		cfg.Logger.Info("kernel: the parent is in connected mode; its children are made in datagram mode, with the port's UD MTU", "dev", parent.Name)
	default:
		return nil, fmt.Errorf("kernel: %s is in mode %q: want datagram or connected", parent.Name, mode)
	}
	p := &Port{
		k: k, log: cfg.Logger, parent: parent, gid: parent.HwAddr.GID(), mtu: mtu, scope: cfg.Scope,
		qps: ipoib.NewQPTable(0), groupC: make(map[ipoib.PKey]*child), all: make(map[string]*child),
		slots: make(map[int]bool), stem: ChildStem(parent.Name),
		groups: ipoib.NewGroupTable(), done: make(chan struct{}), rx: make(chan rxq.Packet, queueLen),
		refused: make(map[ipoib.PKey]refusal), timeout: cfg.ChildTimeout, fastPath: cfg.FastPath,
	}
	if cfg.Persist {
		p.leftover = map[string]Link{}
	}
	// p.mtu is known by the time a child's reader needs a buffer.
	p.pool.New = func() any { b := make([]byte, VnetHdrLen+p.mtu+rxHead); return &b }
	p.rxCtr = rxq.Counters{Packets: &p.rxPackets, Bytes: &p.rxBytes, TooSmall: func() { p.drops.Add(ipoib.DropBufferSmall) }}
	if p.ipv6, err = k.HasIPv6(); err != nil {
		return nil, fmt.Errorf("kernel: find whether IPv6 runs: %w", err)
	}
	if !p.ipv6 {
		p.log.Info("kernel: IPv6 is disabled (ipv6.disable=1): children get the IPv4 settings only", "dev", parent.Name)
	}
	if p.stem != parent.Name {
		p.log.Info("kernel: the parent's name is too long to prefix its children's: they are named after a hash of it", "dev", parent.Name, "children", p.stem+".eN, "+p.stem+".mPPPP")
	}
	p.down.Store(!parent.Carrier)
	if err := p.reclaim(); err != nil {
		return nil, err
	}
	// Children's carrier is followed from the first.
	updates, err := k.SubscribeLinks(p.done, p.linkError)
	if err != nil {
		return nil, fmt.Errorf("kernel: subscribe to link changes of %s: %w", parent.Name, err)
	}
	p.events = ipoib.NewEventQueue(!p.down.Load())
	p.wg.Add(1)
	go p.follow(updates)
	// The default partition's group child, made now: the shim asks for
	// Offloads before it creates anything.
	if _, err := p.groupChild(ipoib.DefaultPKey); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// reclaim deletes the children named as ours (IsChildName under the
// stem, and children of our parent) that a previous run left: one that
// crashed, or one without Config.Persist. Under Config.Persist it keeps
// them in leftover instead, their slots taken, for AllocQP and
// groupChild to adopt.
func (p *Port) reclaim() error {
	links, err := p.k.Links()
	if err != nil {
		return fmt.Errorf("kernel: list links to reclaim children of %s: %w", p.parent.Name, err)
	}
	for _, l := range links {
		if l.ParentIndex != p.parent.Index || !IsChildName(p.stem, l.Name) {
			continue
		}
		if p.leftover != nil {
			p.leftover[l.Name] = l
			if n, ok := childIndex(p.stem, l.Name); ok {
				p.slots[n] = true
			}
			continue
		}
		if err := p.deleteLeftover(l); err != nil {
			return err
		}
	}
	return nil
}

// deleteLeftover deletes child l of a previous run, counted.
func (p *Port) deleteLeftover(l Link) error {
	if err := p.k.DelLink(l.Index); err != nil {
		return fmt.Errorf("kernel: delete leftover child %s: %w", l.Name, err)
	}
	p.stat(statReclaimed)
	p.log.Info("deleted a child left by a previous run", "child", l.Name)
	return nil
}

// takeLeftover takes out of leftover the child named name (a group
// child) or, for a VIF child (name ""), the one of partition pkey with
// QPN qpn, if there is one (setup held). One taken that cannot be
// adopted (unadoptable) is deleted, counted reclaimed, and its slot
// freed: the caller makes a new child, which may take its name. An
// error is a deletion that failed.
func (p *Port) takeLeftover(name string, pkey ipoib.PKey, qpn uint32) (Link, bool, error) {
	p.mu.Lock()
	if name == "" {
		for n, l := range p.leftover {
			if _, vif := childIndex(p.stem, n); vif && l.HwAddr.QPN() == qpn && l.PKey == pkey.Full() {
				name = n
				break
			}
		}
	}
	l, ok := p.leftover[name]
	delete(p.leftover, name)
	p.mu.Unlock()
	if !ok {
		return Link{}, false, nil
	}
	why := p.unadoptable(l, pkey)
	if why == "" {
		return l, true, nil
	}
	p.log.Info("a child left by a previous run cannot be adopted; deleting it", "child", l.Name, "why", why)
	if err := p.deleteLeftover(l); err != nil {
		return Link{}, false, err
	}
	if n, vif := childIndex(p.stem, l.Name); vif {
		p.freeSlot(n)
	}
	return Link{}, false, nil
}

// unadoptable says why leftover child l cannot serve as a child of
// partition pkey, or "". Real ipoib reports the P_Key with the
// full-membership bit set (ipoib_ndo_init sets priv->pkey |= 0x8000;
// ipoib_fill_info reports it), so it must be pkey's exactly. The child
// must be in datagram mode with user multicast off, as createChild
// makes one (ipoib_fill_info reports IPOIB_FLAG_ADMIN_CM and
// IPOIB_FLAG_UMCAST). And while the port's MTU is still to be read from
// a child (a parent in connected mode, see New), a leftover cannot give
// it: one that had carrier has its partition's MTU
// (ipoib_mcast_join_finish, then ipoib_mcast_carrier_on_task), which may
// be below the port's, while a new child starts with the port's UD MTU.
// Its QPN is no identity a peer holds (multicast leaves from it, with
// the group child's), so nothing is lost by making a new one.
func (p *Port) unadoptable(l Link, pkey ipoib.PKey) string {
	switch {
	case l.PKey != pkey.Full():
		return fmt.Sprintf("its P_Key is %s, not %s", l.PKey, pkey.Full())
	case l.Mode != ModeDatagram:
		return "it is in connected mode"
	case l.Umcast != 0:
		return "it has user multicast (umcast) on"
	case p.mtu == 0:
		return "the port's UD MTU is read from a new child (the parent is in connected mode)"
	}
	return ""
}

// adopt takes over child l that a previous run left (Config.Persist),
// configured and brought up again as createChild does a new one, with
// new packet sockets: same ifindex, same QP, so the peers' paths and
// the fast path's entries that name it stay valid. The driver keeps a
// child's QP while no socket is open on it: the netdev owns it from
// ndo_init (ipoib_main.c ipoib_dev_init_default → ipoib_verbs.c
// ipoib_transport_dev_init creates the UD QP and writes its QPN into
// dev_addr) to ndo_uninit (ipoib_dev_uninit_default), and
// ipoib_ib_dev_open/ipoib_ib_dev_stop only move it between RTS and reset
// as the link goes up and down. On mlx5's enhanced IPoIB the same holds:
// a child's underlay QP lives from the netdev's attach to its detach
// (ipoib_vlan.c mlx5i_pkey_init_tx → mlx5i_create_underlay_qp, to
// mlx5i_pkey_cleanup_tx → mlx5i_destroy_underlay_qp), and
// mlx5i_pkey_open/mlx5i_pkey_close only move it between states
// (mlx5i_init_underlay_qp, mlx5i_uninit_underlay_qp). The child stays
// up meanwhile, so its path records and neighbours stay too: they are
// flushed by link down and IB port events (__ipoib_ib_dev_flush calls
// ipoib_ib_dev_down on every normal and heavy flush: port error or
// active, LID or P_Key change), as with a running daemon. A child the
// port's P_Key table refuses is deleted, counted as refused; one whose
// setup fails is deleted by setupChild. The caller counts StatAdopted
// once the child is in place.
func (p *Port) adopt(l Link, pkey ipoib.PKey, group bool) (*child, error) {
	if err := p.checkPKey(l.Name, pkey); err != nil {
		if derr := p.k.DelLink(l.Index); derr != nil {
			p.log.Warn("delete refused leftover child", "child", l.Name, "err", derr)
		}
		return nil, err
	}
	return p.setupChild(l, pkey, group, true)
}

// adopted counts child c as adopted, now in place.
func (p *Port) adopted(c *child) {
	p.stat(statAdopted)
	p.log.Info("adopted a child left by a previous run", "child", c.name, "ifindex", c.index, "qpn", fmt.Sprintf("%#06x", c.qpn), "pkey", c.pkey)
}

// EndAdoption ends the adoption of the children a previous run left
// (Config.Persist): those no VIF claimed are deleted, counted as
// StatReclaimed, and their slots freed. The fast path's entries that
// name them are deleted first, so that the TX program never redirects
// to a device that is gone. The daemon calls it once the saved guests
// are restored (their AdoptQP adopted theirs), before the shim runs;
// without Config.Persist it does nothing.
func (p *Port) EndAdoption() error {
	p.setup.Lock()
	defer p.setup.Unlock()
	p.mu.Lock()
	left := p.leftover
	p.leftover = nil
	p.mu.Unlock()
	var errs []error
	if f := p.fast.Load(); f != nil {
		errs = append(errs, f.dropGone())
	}
	for _, l := range left {
		if err := p.deleteLeftover(l); err != nil {
			errs = append(errs, err)
			continue
		}
		if n, ok := childIndex(p.stem, l.Name); ok {
			p.freeSlot(n)
		}
	}
	return errors.Join(errs...)
}

// Keep makes the port leave its children in place when it frees a QP
// or closes (their sockets are closed all the same), and freezes its
// fast path's maps (FastPath.Commit changes nothing from now on). Under
// --persist the daemon calls it as it stops, before the shim frees its
// VIFs: the next run adopts the children, and meanwhile the fast path's
// programs carry the guests' unicast on their own.
func (p *Port) Keep() { p.kept.Store(true) }

// follow tracks the parent's carrier and MTU, and each child's carrier
// and MTU. It never waits for mu. It waits for the kernel only when the
// subscription has ended: it then subscribes again and applies every
// link's state from a dump. The dump is taken after the new subscription
// began, so that the notifications that follow are newer.
func (p *Port) follow(updates <-chan Link) {
	defer p.wg.Done()
	for updates != nil {
		for l := range updates {
			p.followLink(l)
		}
		updates = p.resubscribe()
	}
}

// linkError records an error of the link subscription, for the warning
// resubscribe logs (SubscribeLinks' onErr).
func (p *Port) linkError(err error) { p.linkErr.Store(&err) }

// resubscribeWait is how long resubscribe waits before trying again
// when the kernel refuses a subscription.
const resubscribeWait = 250 * time.Millisecond

// resubscribe subscribes to link changes again after the subscription
// ended; vishvananda/netlink ends it on any receive error, ENOBUFS from
// an overrun included (notifications were lost). It applies every link's
// state from a dump and returns the new subscription, or nil once the
// port is closed.
func (p *Port) resubscribe() <-chan Link {
	reason := "unknown"
	if e := p.linkErr.Swap(nil); e != nil {
		reason = (*e).Error()
	}
	for failed := false; ; failed = true {
		select {
		case <-p.done:
			return nil
		default:
		}
		updates, err := p.k.SubscribeLinks(p.done, p.linkError)
		if err != nil {
			if !failed {
				p.log.Warn("kernel: link notifications ended and cannot be resubscribed; carrier and MTU changes are not followed until they are (retrying)", "dev", p.parent.Name, "reason", reason, "err", err, "every", resubscribeWait)
			}
			select {
			case <-p.done:
				return nil
			case <-time.After(resubscribeWait):
			}
			continue
		}
		p.stat(statResubscribed)
		n, err := p.resync()
		p.log.Warn("kernel: link notifications ended (some may be lost); resubscribed and read every link's carrier and MTU again", "dev", p.parent.Name, "reason", reason, "links", n, "dump_err", err)
		return updates
	}
}

// resync applies every link's state from a dump (Links), retried once
// when it fails (an interrupted dump), and returns how many it applied.
func (p *Port) resync() (int, error) {
	links, err := p.k.Links()
	if err != nil {
		links, err = p.k.Links()
	}
	if err != nil {
		return 0, fmt.Errorf("kernel: list links of %s to resynchronise carriers: %w", p.parent.Name, err)
	}
	for _, l := range links {
		p.followLink(l)
	}
	return len(links), nil
}

// followLink applies a link's notification or dumped state: the
// parent's carrier and MTU, or a child's.
func (p *Port) followLink(l Link) {
	if l.Index != p.parent.Index {
		p.followChild(l)
		return
	}
	if down := !l.Carrier; p.down.Swap(down) != down {
		p.log.Info("parent carrier", "dev", l.Name, "up", !down)
	}
	p.events.Link(l.Carrier)
	if l.MTU != p.parent.MTU && l.MTU != 0 {
		p.stat(statMTUChanges)
		p.log.Warn("parent MTU changed; restart eipoibd to follow it", "dev", l.Name, "mtu", l.MTU, "in_use", p.parent.MTU)
	}
}

// followChild applies a child's link notification (or its state in a
// dump), in the order follow receives them.
func (p *Port) followChild(l Link) {
	v, ok := p.byIndex.Load(l.Index)
	if !ok {
		return
	}
	c := v.(*child)
	c.linkMu.Lock()
	defer c.linkMu.Unlock()
	c.linkSeq++
	p.applyLink(c, l)
}

// applyLink applies link state l to child c (c.linkMu held). A waiting
// createChild is woken by its carrier. A ready child's carrier and MTU
// are tracked: ipoib_mcast_carrier_on_task sets the MTU before the
// carrier, so an MTU seen with the carrier on is the partition's.
func (p *Port) applyLink(c *child, l Link) {
	ready := c.mtu.Load() != 0 // had carrier before
	// The MTU before the carrier: a Write that sees the carrier reads it.
	if l.Carrier {
		mtu, err := childMTU(l, p.mtu)
		switch {
		case err != nil && ready:
			p.log.Warn("partition MTU changed to one eipoibd does not run; keeping the last", "child", c.name, "err", err)
		case err != nil:
			p.log.Warn("child's partition MTU is one eipoibd does not run; its packets are dropped as oversize", "child", c.name, "err", err)
		case err == nil:
			if old := c.mtu.Swap(int32(mtu)); old != 0 && int(old) != mtu {
				p.stat(statPartitionMTUChanges)
				p.log.Warn("partition MTU changed", "child", c.name, "pkey", c.pkey, "ib_mtu", mtu, "was", old)
			}
		}
	}
	p.partitionMTU(c)
	if was := c.carrier.Swap(l.Carrier); was != l.Carrier && ready {
		if !l.Carrier {
			p.stat(statCarrierLost)
		}
		p.log.Info("child carrier", "child", c.name, "pkey", c.pkey, "up", l.Carrier)
	}
	if !l.Carrier {
		return
	}
	c.upOnce.Do(func() { close(c.up) })
}

// childMTU is the IB MTU of a ready child: its datagram MTU + 4, 2048 or
// 4096, and no more than the parent's.
func childMTU(l Link, parentIB int) (int, error) {
	ib := l.MTU + ipoib.HeaderLen
	if _, err := ipoib.IPMTU(ib); err != nil || ib > parentIB {
		return 0, fmt.Errorf("%w: %s has MTU %d (IB MTU %d), its partition's broadcast group's: eipoibd needs IB MTU 2048 or 4096, at most the port's %d (set the partition's mtu in the subnet manager's configuration, e.g. opensm partitions.conf)",
			ErrPartitionMTU, l.Name, l.MTU, ib, parentIB)
	}
	return ib, nil
}

func (p *Port) stat(s stat) { p.stats[s].Add(1) }

// IsDown reports the parent's carrier being off (Events reports each
// change).
func (p *Port) IsDown() bool { return p.down.Load() }

// BatchSize is the largest batch Read returns and Write moves per call.
func (p *Port) BatchSize() int { return batchSize }

// LocalGID is the parent's port GID, shared by every child.
func (p *Port) LocalGID() ipoib.GID { return p.gid }

// MTU is the IB MTU: the parent's datagram MTU plus the IPoIB header.
func (p *Port) MTU() int { return p.mtu }

// PartitionMTU is the IB MTU of partition pkey: that of its group child
// (ipoib_mcast_join_finish sets each child's MTU from its partition's
// broadcast group), or MTU for a partition without one yet.
func (p *Port) PartitionMTU(pkey ipoib.PKey) int {
	p.mu.RLock()
	c := p.groupC[pkey.Full()]
	p.mu.RUnlock()
	if c == nil || c.mtu.Load() == 0 {
		return p.mtu
	}
	return int(c.mtu.Load())
}

// Offloads reports TSO when the children have it (the HCA does UD LSO);
// super-packets then go to the kernel whole, with a virtio_net_hdr.
func (p *Port) Offloads() ipoib.Offloads {
	if !p.tso {
		return ipoib.Offloads{}
	}
	return ipoib.Offloads{TSO: true, MaxSuper: ipoib.MaxSuperPacket}
}

// Counters returns a snapshot of the counters, the children's sockets'
// receive-queue drops read first.
func (p *Port) Counters() ipoib.PortCounters {
	p.mu.RLock()
	for _, c := range p.all {
		p.socketDrops(c)
	}
	p.mu.RUnlock()
	c := ipoib.PortCounters{
		TxPackets: p.txPackets.Load(), TxBytes: p.txBytes.Load(),
		RxPackets: p.rxPackets.Load(), RxBytes: p.rxBytes.Load(),
		Drops: p.drops.Snapshot(), Stats: make(map[string]uint64),
	}
	for i := range p.stats {
		if n := p.stats[i].Load(); n > 0 {
			c.Stats[statNames[i]] = n
		}
	}
	if n := OutgoingNotIgnored(); n > 0 {
		c.Stats[StatOutgoingNotIgnored] = n
	}
	if f := p.fast.Load(); f != nil {
		f.counts(c.Stats)
	}
	return c
}

// socketDrops adds what the kernel dropped for a full receive queue on
// c's sockets since they were last asked to DropRxOverflow: these drops
// happen in the kernel (packet_rcv), before the port sees anything.
func (p *Port) socketDrops(c *child) {
	for _, s := range c.rx {
		if n, err := s.Drops(); err == nil {
			p.drops.AddN(ipoib.DropRxOverflow, n)
		}
	}
}

// createChild creates, configures and brings up a child, waits for its
// carrier, opens its socket and returns it, its carrier and MTU followed
// from then on. On failure nothing is left behind.
//
// The wait is bounded by Config.ChildTimeout (plus one carrierPoll): the
// shim calls AllocQP on its data path, so a guest's first frame may wait
// this long. A child made while the port is down is not waited for: it
// gets its carrier when the port returns (ipoib_event → flush →
// ipoib_ib_dev_up joins again), and its packets are dropped as
// DropNoCarrier until then.
func (p *Port) createChild(name string, pkey ipoib.PKey, group bool) (*child, error) {
	k := p.k
	if err := p.checkPKey(name, pkey); err != nil {
		return nil, err
	}
	spec := ChildSpec{Name: name, Parent: p.parent.Index, PKey: pkey.Full()}
	if err := k.AddChild(spec); err != nil {
		if errors.Is(err, unix.EINVAL) && p.parent.RxQueues > 1 {
			return nil, fmt.Errorf("kernel: create child %s (pkey %s): %w: %s", name, pkey.Full(), err, p.queueFixHint(0))
		}
		return nil, fmt.Errorf("kernel: create child %s (pkey %s): %w", name, pkey.Full(), err)
	}
	l, err := k.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("kernel: look up new child %s: %w", name, err)
	}
	return p.setupChild(l, pkey, group, false)
}

// setupChild configures child l, new or adopted, of partition pkey,
// brings it up, waits for its carrier and opens its sockets, as
// createChild says; on failure it deletes it. An adopted child has its
// carrier already, and IFF_UP on it sends no notification, so its
// carrier is read at once rather than at the first poll.
func (p *Port) setupChild(l Link, pkey ipoib.PKey, group, adopted bool) (c *child, err error) {
	k, name := p.k, l.Name
	if p.mtu == 0 { // a parent in connected mode: see New
		if _, err := ipoib.IPMTU(l.MTU + ipoib.HeaderLen); err != nil {
			k.DelLink(l.Index)
			return nil, fmt.Errorf("kernel: the port's UD MTU, read from new child %s, is %d: want 2044 or 4092 (IB MTU - 4)", name, l.MTU)
		}
		p.mtu = l.MTU + ipoib.HeaderLen
	}
	c = &child{name: name, index: l.Index, pkey: pkey.Full(), group: group, up: make(chan struct{})}
	p.byIndex.Store(l.Index, c)
	defer func() {
		if err != nil {
			p.byIndex.Delete(l.Index)
			if derr := k.DelLink(l.Index); derr != nil {
				p.log.Warn("delete half-made child", "child", name, "err", derr)
			}
		}
	}()
	if p.parent.RxQueues > 1 && l.RxQueues < p.parent.RxQueues {
		return nil, fmt.Errorf("kernel: child %s: %w: %s", name, ErrChildQueues, p.queueFixHint(l.RxQueues))
	}
	// Before the link comes up, so that IPv6 never gives it an address.
	if !p.ipv6 {
		p.stat(statIPv6Absent)
	}
	for _, s := range hostOffSysctls(name, p.ipv6) {
		if err := k.WriteSysctl(s[0], s[1]); err != nil {
			return nil, fmt.Errorf("kernel: set %s=%s on %s: %w", s[0], s[1], name, err)
		}
	}
	if err := k.SetNoARP(l.Index); err != nil {
		return nil, fmt.Errorf("kernel: set NOARP on %s: %w", name, err)
	}
	if err := k.DisableGRO(name); err != nil {
		return nil, fmt.Errorf("kernel: turn GRO off on %s: %w", name, err)
	}
	if err := k.SetUp(l.Index); err != nil {
		return nil, fmt.Errorf("kernel: bring up %s: %w", name, err)
	}
	if adopted {
		p.pollCarrier(c)
	}
	if err := p.waitCarrier(c); err != nil {
		return nil, err
	}
	if l, err = k.LinkByName(name); err != nil {
		return nil, fmt.Errorf("kernel: read address of %s: %w", name, err)
	}
	if l.HwAddr.GID() != p.gid || l.HwAddr.QPN() == 0 || l.HwAddr.QPN() == ipoib.MulticastQPN {
		return nil, fmt.Errorf("kernel: read address of %s: %s is no QP of port GID %s", name, l.HwAddr, p.gid)
	}
	c.qpn = l.HwAddr.QPN()
	if l.Carrier {
		mtu, err := childMTU(l, p.mtu)
		if err != nil {
			return nil, p.refuse(pkey, statRefusedMTU, fmt.Errorf("kernel: child %s (pkey %s): %w", name, pkey.Full(), err))
		}
		c.mtu.Store(int32(mtu))
	}
	if !p.tsoKnown { // one HCA: the first child speaks for all
		if p.tso, err = k.TSO(name); err != nil {
			return nil, fmt.Errorf("kernel: read offloads of %s: %w", name, err)
		}
		p.tsoKnown = true
	}
	c.vnet = p.tso
	// A VIF child's socket takes PACKET_HOST only: the kernel drops its
	// broadcast and multicast copies (the group child's are the ones
	// read) instead of waking its reader for each.
	protos := []uint16{0} // every protocol
	if p.fastPath && !group {
		protos = vifProtocols[:]
	}
	for _, proto := range protos {
		sock, err := k.OpenPacketWith(l.Index, PacketOptions{Protocol: proto, Vnet: c.vnet, HostOnly: !group})
		if err != nil {
			closeAll(c.rx)
			return nil, fmt.Errorf("kernel: open packet socket on %s: %w", name, err)
		}
		c.rx = append(c.rx, sock)
	}
	c.sock = c.rx[0]
	return c, nil
}

// vifProtocols are the protocols a VIF child's packet sockets are bound
// to under the fast path, one socket each, rather than one socket for
// every protocol: all that IPoIB carries to a guest (DESIGN.md). A
// socket bound to every protocol sits on the device's ptype_all list,
// which __netif_receive_skb_core (net/core/dev.c) delivers to before tc
// ingress (sch_handle_ingress, where the RX program runs); one bound to
// a protocol sits on its ptype_specific list (dev_add_pack, ptype_head),
// delivered after it, so a packet the RX program redirects to the TAP
// reaches none of them and the guest gets it once.
var vifProtocols = [...]uint16{unix.ETH_P_IP, unix.ETH_P_IPV6, unix.ETH_P_ARP, unix.ETH_P_RARP}

// closeAll closes every socket of socks.
func closeAll(socks []Socket) {
	for _, s := range socks {
		s.Close()
	}
}

// queueFixHint explains a child of a parent with several receive queues
// that got only got of them, or (got 0) that the kernel refused with
// EINVAL. mlx5's enhanced IPoIB has one receive queue per channel
// (mlx5_rdma_rn_get_params). A kernel without commit dbc94a0fb817 gives
// a netlink child one receive queue: ipoib_link_ops has no
// get_num_rx_queues, so rtnl_create_link takes its default of 1. The
// child receives through its parent's queues (mlx5i_pkey_init_rx leaves
// them to the parent) and cannot run so. From Linux 6.2
// mlx5i_pkey_dev_init refuses it with EINVAL.
func (p *Port) queueFixHint(got int) string {
	s := fmt.Sprintf("%s has %d receive queues", p.parent.Name, p.parent.RxQueues)
	if got > 0 {
		s += fmt.Sprintf(" and its new child %d: this kernel lacks", got)
	} else {
		s += ", and mlx5 refuses (EINVAL) a child with fewer: this kernel most likely lacks"
	}
	return s + " commit dbc94a0fb817 (\"IB/IPoIB: Fix queue count inconsistency for PKEY child interfaces\", Linux 6.2, and its stable backports), without which mlx5's enhanced IPoIB cannot run netlink children: upgrade the kernel, or run --fabric verbs"
}

// checkPKey refuses a child whose P_Key is not in the port's table: the
// driver would keep it up without carrier for ever
// (ipoib_pkey_dev_check_presence). A table that cannot be read checks
// nothing (logged once): the join's timeout then says it.
func (p *Port) checkPKey(name string, pkey ipoib.PKey) error {
	t, err := p.k.PKeys(p.parent.Name)
	if err != nil {
		if !p.pkeyErr.Swap(true) {
			p.log.Warn("cannot read the port's P_Key table; a child of a P_Key not in it is refused only after the join timeout", "dev", p.parent.Name, "err", err)
		}
		return nil
	}
	if t.Has(pkey) {
		return nil
	}
	return p.refuse(pkey, statRefusedPKey, fmt.Errorf("kernel: child %s: %w: P_Key %s is not in the P_Key table of %s port %d (%s), so the driver would keep the child without carrier: add this port to the partition in the subnet manager's configuration (e.g. opensm partitions.conf)",
		name, ErrPKeyNotInTable, pkey.Full(), t.Device, t.Port, t.Path))
}

// waitCarrier waits, bounded, for child c's first carrier, that is for
// its broadcast join (ipoib_mcast_join_finish, then
// ipoib_mcast_carrier_on_task's netif_carrier_on).
func (p *Port) waitCarrier(c *child) error {
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	tick := time.NewTicker(carrierPoll)
	defer tick.Stop()
	for {
		if p.down.Load() {
			return nil // joined when the port is back; followed meanwhile
		}
		select {
		case <-c.up:
			return nil
		case <-p.done:
			return net.ErrClosed
		case <-tick.C:
			p.pollCarrier(c)
		case <-timer.C:
			return p.notReady(c)
		}
	}
}

// pollCarrier reads child c's link, in case its carrier-on notification
// was lost. It applies a carrier on, never off, and only if no
// notification was applied since the read began. A reading overtaken by
// one is stale: read "off", then the notification "on" applied, then
// "off" applied again would leave a ready child without carrier, and no
// notification would come to correct it.
func (p *Port) pollCarrier(c *child) {
	c.linkMu.Lock()
	seq := c.linkSeq
	c.linkMu.Unlock()
	l, err := p.k.LinkByName(c.name)
	if err != nil || !l.Carrier {
		return
	}
	c.linkMu.Lock()
	defer c.linkMu.Unlock()
	if c.linkSeq == seq {
		p.applyLink(c, l)
	}
}

// notReady says why child c got no carrier in time.
func (p *Port) notReady(c *child) error {
	if err := p.checkPKey(c.name, c.pkey); err != nil {
		return err // the P_Key left the table meanwhile
	}
	p.mu.RLock()
	n := 0
	for _, o := range p.all {
		if o.pkey == c.pkey {
			n++
		}
	}
	p.mu.RUnlock()
	return p.refuse(c.pkey, statRefusedJoin, fmt.Errorf("kernel: child %s (pkey %s): %w within %s: check the SM's partition configuration and the kernel log (\"couldn't attach QP to multicast group\" there means the HCA's max_mcast_qp_attach, ibv_devinfo -v, is reached: this port has %d other children in the partition, and its parent may be attached too)",
		c.name, c.pkey, ErrJoinTimeout, p.timeout, n))
}

// refuse counts a refused child under stat, remembers err for the
// partition (AllocQP answers with it for refuseFor) and returns it.
func (p *Port) refuse(pkey ipoib.PKey, st stat, err error) error {
	p.stat(st)
	// The shim counts the refusal by this name (vifs_refused_<reason>):
	// the stat's name without its "child_refused_" prefix.
	err = &ipoib.RefusedError{Reason: strings.TrimPrefix(statNames[st], "child_refused_"), Err: err}
	p.refMu.Lock()
	p.refused[pkey.Full()] = refusal{err: err, until: time.Now().Add(refuseFor)}
	p.refMu.Unlock()
	return err
}

// refusedRecently returns the partition's last refusal while it holds.
func (p *Port) refusedRecently(pkey ipoib.PKey) error {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	r, ok := p.refused[pkey.Full()]
	if !ok || time.Now().After(r.until) {
		return nil
	}
	p.stat(statRefusedAgain)
	return fmt.Errorf("%w (refused again for %s unless one of its children is freed)", r.err, time.Until(r.until).Round(time.Second))
}

// hostOffSysctls are the settings that keep the host's own stack off a
// child. They turn off IPv6 entirely (no address, no ND answers), IPv4
// ARP answers and forwarding. Strict reverse-path filtering keeps IPv4
// addressed to one of the host's own addresses from being accepted on
// it. Without ipv6 (a kernel booted with ipv6.disable=1) the IPv6 ones
// are left out: their /proc/sys/net/ipv6/conf/DEV does not exist, and
// there is no IPv6 stack to keep off.
func hostOffSysctls(dev string, ipv6 bool) [][2]string {
	v4, v6 := "net/ipv4/conf/"+dev+"/", "net/ipv6/conf/"+dev+"/"
	s := [][2]string{
		{v6 + "addr_gen_mode", "1"}, // IN6_ADDR_GEN_MODE_NONE
		{v6 + "disable_ipv6", "1"},
		{v6 + "forwarding", "0"},
		{v4 + "arp_ignore", "8"},
		{v4 + "forwarding", "0"},
		{v4 + "rp_filter", "1"},
	}
	if !ipv6 {
		s = s[3:]
	}
	return s
}

func (p *Port) startRx(c *child) {
	for _, sock := range c.rx {
		p.wg.Add(1)
		go p.rxLoop(c, sock)
	}
}

// groupChild returns partition pkey's multicast child, creating it.
func (p *Port) groupChild(pkey ipoib.PKey) (*child, error) {
	pkey = pkey.Full()
	p.mu.RLock()
	c := p.groupC[pkey]
	p.mu.RUnlock()
	if c != nil {
		return c, nil
	}
	p.setup.Lock()
	defer p.setup.Unlock()
	p.mu.RLock()
	c = p.groupC[pkey]
	p.mu.RUnlock()
	if c != nil {
		return c, nil
	}
	if err := p.refusedRecently(pkey); err != nil {
		return nil, err
	}
	name := GroupChildName(p.stem, pkey)
	l, adopt, err := p.takeLeftover(name, pkey, 0)
	switch {
	case err != nil:
		return nil, err // its name stays taken
	case adopt:
		c, err = p.adopt(l, pkey, true)
	default:
		c, err = p.createChild(name, pkey, true)
	}
	if err != nil {
		return nil, err
	}
	if adopt {
		p.adopted(c)
	}
	p.mu.Lock()
	p.groupC[pkey] = c
	p.all[name] = c
	p.mu.Unlock()
	p.partitionMTU(c)
	p.startRx(c)
	return c, nil
}

// AllocQP creates a child in partition pkey and returns its QPN. The HCA
// chooses QPNs, so hint is ignored: a new guest's hint (a hash of its
// MAC) must never take over a child a previous run left for a restored
// guest (AdoptQP).
func (p *Port) AllocQP(pkey ipoib.PKey, _ uint32) (uint32, error) {
	return p.allocQP(pkey, 0)
}

var _ ipoib.QPAdopter = (*Port)(nil)

// AdoptQP is AllocQP for a guest restored with the QPN qpn it had
// (ipoib.QPAdopter): the child of partition pkey with that QPN a
// previous run left (Config.Persist, until EndAdoption) is adopted
// rather than a new child made, if there is one.
func (p *Port) AdoptQP(pkey ipoib.PKey, qpn uint32) (uint32, error) {
	return p.allocQP(pkey, qpn)
}

// allocQP is AllocQP, adopting the leftover child with QPN adopt (0:
// none).
func (p *Port) allocQP(pkey ipoib.PKey, adopt uint32) (uint32, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if !pkey.IsValid() {
		return 0, fmt.Errorf("kernel: invalid P_Key %s", pkey)
	}
	gc, err := p.groupChild(pkey)
	if err != nil {
		return 0, err
	}
	p.setup.Lock()
	defer p.setup.Unlock()
	if err := p.refusedRecently(pkey); err != nil {
		return 0, err
	}
	var c *child
	slot := 0
	l, adopted := Link{}, false
	if adopt != 0 {
		if l, adopted, err = p.takeLeftover("", pkey, adopt); err != nil {
			return 0, err
		}
	}
	if adopted {
		slot, _ = childIndex(p.stem, l.Name) // taken by reclaim
		c, err = p.adopt(l, pkey, false)
	} else {
		slot = p.takeSlot()
		var name string
		if name, err = ChildName(p.stem, slot); err != nil {
			p.freeSlot(slot)
			return 0, fmt.Errorf("kernel: name child of %s: %w", p.parent.Name, err)
		}
		c, err = p.createChild(name, pkey, false)
	}
	if err != nil {
		// A half-made child whose deletion failed keeps its name.
		if name, _ := ChildName(p.stem, slot); !p.exists(name) {
			p.freeSlot(slot)
		}
		return 0, err
	}
	c.slot, c.gc = slot, gc
	if err := p.qps.Add(c.qpn, pkey, c); err != nil {
		p.destroy(c)
		return 0, fmt.Errorf("kernel: create child %s: %w", c.name, err)
	}
	if adopted {
		p.adopted(c)
	}
	p.mu.Lock()
	p.all[c.name] = c
	p.mu.Unlock()
	p.startRx(c)
	return c.qpn, nil
}

// FreeQP deletes the child of qpn, once no batch can still send from it.
func (p *Port) FreeQP(qpn uint32) error {
	q, err := p.qps.Remove(qpn)
	if err != nil {
		return fmt.Errorf("kernel: free QP %#06x: no such child", qpn)
	}
	c := q.Data.(*child)
	p.mu.Lock()
	delete(p.all, c.name)
	p.mu.Unlock()
	p.waitBatch()
	p.refMu.Lock()
	delete(p.refused, c.pkey) // its attachment to the broadcast group goes
	p.refMu.Unlock()
	if err := p.destroy(c); err != nil {
		return err // its name stays taken
	}
	p.freeSlot(c.slot)
	return nil
}

// exists reports whether the kernel has a link named name.
func (p *Port) exists(name string) bool {
	_, err := p.k.LinkByName(name)
	return err == nil
}

// takeSlot reserves the lowest free VIF child index.
func (p *Port) takeSlot() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 1
	for p.slots[n] {
		n++
	}
	p.slots[n] = true
	return n
}

// freeSlot releases VIF child index n.
func (p *Port) freeSlot(n int) {
	p.mu.Lock()
	delete(p.slots, n)
	p.mu.Unlock()
}

// waitBatch returns once the Write under way, if any, has ended: a
// child taken out of qps before it is then used by no batch.
func (p *Port) waitBatch() {
	p.txMu.Lock()
	//lint:ignore SA2001 the empty critical section is the barrier
	p.txMu.Unlock()
}

// destroy closes c's sockets and deletes the interface, unless the
// port keeps its children (Keep).
func (p *Port) destroy(c *child) error {
	p.byIndex.Delete(c.index)
	p.socketDrops(c) // its last
	closeAll(c.rx)
	if p.kept.Load() {
		return nil
	}
	if err := p.k.DelLink(c.index); err != nil {
		return fmt.Errorf("kernel: delete child %s: %w", c.name, err)
	}
	return nil
}

// checkMGID refuses a group the driver would silently ignore: its multicast
// list takes only addresses whose scope, signature low byte and P_Key match
// the child's broadcast address (ipoib_mcast_addr_is_valid).
func (p *Port) checkMGID(mgid ipoib.GID) error {
	if mgid[0] != 0xff || mgid[1] != 0x10|p.scope || mgid[3] != 0x1b || !ipoib.MGIDPKey(mgid).IsValid() {
		return fmt.Errorf("kernel: MGID %s is not an IPoIB group of scope %d", mgid, p.scope)
	}
	return nil
}

// Join makes the partition's group child a full member of mgid
// (PACKET_ADD_MEMBERSHIP; the driver joins through the SA).
func (p *Port) Join(mgid ipoib.GID) error {
	if err := p.checkMGID(mgid); err != nil {
		return err
	}
	c, err := p.groupChild(ipoib.MGIDPKey(mgid))
	if err != nil {
		return err
	}
	return p.groups.Join(mgid, func() error {
		var b [MreqMaxSize]byte
		PutMreq(&b, c.index, mgid)
		if err := c.sock.AddMembership(b[:]); err != nil {
			return fmt.Errorf("kernel: join %s on %s: %w", mgid, c.name, err)
		}
		return nil
	})
}

// JoinSendOnly records a send-only membership: the driver makes the
// send-only join itself on the first packet to the group
// (ipoib_mcast_send).
func (p *Port) JoinSendOnly(mgid ipoib.GID) error {
	if err := p.checkMGID(mgid); err != nil {
		return err
	}
	if _, err := p.groupChild(ipoib.MGIDPKey(mgid)); err != nil {
		return err
	}
	return p.groups.JoinSendOnly(mgid)
}

// Leave ends a membership (PACKET_DROP_MEMBERSHIP for a full one).
func (p *Port) Leave(mgid ipoib.GID) error {
	p.mu.RLock()
	c := p.groupC[ipoib.MGIDPKey(mgid).Full()]
	p.mu.RUnlock()
	return p.groups.Leave(mgid, func() error {
		if c == nil {
			return nil
		}
		var b [MreqMaxSize]byte
		PutMreq(&b, c.index, mgid)
		if err := c.sock.DropMembership(b[:]); err != nil {
			return fmt.Errorf("kernel: leave %s on %s: %w", mgid, c.name, err)
		}
		return nil
	})
}

// Joined reports whether the port is a full member of mgid.
func (p *Port) Joined(mgid ipoib.GID) bool { return p.groups.Full(mgid) }

// SendOnly reports whether the port is a send-only member of mgid.
func (p *Port) SendOnly(mgid ipoib.GID) bool { return p.groups.SendOnly(mgid) }

// Close deletes every child (unless Keep was called) and stops; later
// calls return net.ErrClosed.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	close(p.done)
	p.events.Close()
	p.qps.Clear()
	p.mu.Lock()
	all := p.all
	p.all, p.groupC = map[string]*child{}, map[ipoib.PKey]*child{}
	p.mu.Unlock()
	p.waitBatch()
	var errs []error
	for _, c := range all {
		if err := p.destroy(c); err != nil {
			errs = append(errs, err)
		}
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// Write sends a batch. It counts and skips a packet that is oversized or
// that the kernel refuses. It does the same for a super-packet on a port
// without TSO, and for a packet whose source QP is no child of this port
// or whose P_Key is not the child's.
func (p *Port) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(meta) < len(bufs) {
		return 0, fmt.Errorf("kernel: write of %d packets with %d metadata", len(bufs), len(meta))
	}
	p.txMu.Lock()
	defer p.txMu.Unlock()
	sent, k := 0, 0
	for i, b := range bufs {
		c, ok := p.validate(b, meta[i], offset)
		if !ok {
			continue
		}
		if k == batchSize || k > 0 && c != p.txSrcs[0] {
			sent += p.flush(k)
			k = 0
		}
		p.build(k, c, b[offset:], meta[i])
		p.txSrcs[k] = c
		k++
	}
	sent += p.flush(k)
	return sent, nil
}

// validate returns the child that sends packet b (ipoib.CheckTx's
// checks, then the child's carrier and MTU), or counts why none.
func (p *Port) validate(b []byte, m ipoib.TxMeta, offset int) (*child, bool) {
	if len(b) < offset+ipoib.HeaderLen {
		p.drops.Add(ipoib.DropBadMeta) // no ethertype to name
		return nil, false
	}
	pay := b[offset:]
	q, d := ipoib.CheckTx(&m, len(pay), p.qps, p.tso)
	if d != ipoib.DropNone {
		p.drops.Add(d)
		return nil, false
	}
	// Multicast leaves from the partition's group child, which AllocQP
	// made before the VIF's.
	c := q.Data.(*child)
	if m.Dst.QPN() == ipoib.MulticastQPN {
		c = c.gc
	}
	switch {
	case !c.carrier.Load():
		p.drops.Add(ipoib.DropNoCarrier)
	case m.GSO.Type == ipoib.GSONone && len(pay) > int(c.mtu.Load()) || len(pay) > ipoib.MaxSuperPacket:
		p.drops.Add(ipoib.DropOversize)
	default:
		return c, true
	}
	return nil, false
}

// build makes message k of packet pay (IPoIB header first) from child c.
func (p *Port) build(k int, c *child, pay []byte, m ipoib.TxMeta) {
	msg := &p.msgs[k]
	msg.Hdr = nil
	if c.vnet {
		h := VnetHdr{}
		if m.GSO.Type != ipoib.GSONone {
			h = GSOVnetHdr(m.GSO, int(pay[m.GSO.L4+12]>>4)*4) // the TCP data offset
		}
		h.Put(&p.vhdrs[k])
		msg.Hdr = p.vhdrs[k][:]
	}
	msg.NameLen = PutSockaddrLL(&p.names[k], c.index, ipoib.Header(pay).EtherType(), m.Dst)
	msg.Name = p.names[k][:]
	msg.Buf = pay[ipoib.HeaderLen:]
}

// flush sends messages [0, k), all from txSrcs[0], and returns how many the
// kernel took; each refused one is counted and skipped.
func (p *Port) flush(k int) int {
	sent := 0
	for at := 0; at < k; {
		n, err := p.txSrcs[0].sock.Send(p.msgs[at:k])
		for _, m := range p.msgs[at : at+n] {
			p.txBytes.Add(uint64(len(m.Buf) + ipoib.HeaderLen))
			if len(m.Hdr) > 0 && m.Hdr[1] != VnetGSONone {
				p.stat(statSuperPackets)
			}
		}
		p.txPackets.Add(uint64(n))
		sent += n
		at += n
		if err != nil || n == 0 {
			p.drops.Add(sendDrop(err))
			at++
		}
	}
	return sent
}

// sendDrop is the reason a packet the kernel refused with err is dropped
// for. ENETDOWN is the child down: packet_snd (net/packet/af_packet.c)
// refuses a device without IFF_UP so, as when ipoib_stop takes the
// children down with their parent between the carrier check and the
// send. That is the child without carrier, not a failed send.
func sendDrop(err error) ipoib.Drop {
	if errors.Is(err, unix.ENETDOWN) {
		return ipoib.DropNoCarrier
	}
	return ipoib.DropSendError
}

// Read blocks for at least one packet and returns up to len(bufs). A
// packet larger than its buffer is dropped and counted.
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	return rxq.Read(p.rx, p.done, &p.pool, p.rxCtr, bufs, sizes, meta, offset)
}

// rxLoop reads sock, one of c's, until it is closed.
func (p *Port) rxLoop(c *child, sock Socket) {
	defer p.wg.Done()
	var names [batchSize][SockaddrLLIPoIBLen]byte
	var msgs [batchSize]Msg
	var bufs [batchSize]*[]byte
	for i := range msgs {
		bufs[i] = p.pool.Get().(*[]byte)
		msgs[i].Name = names[i][:]
		msgs[i].Buf = (*bufs[i])[rxHead:] // the vnet header, if any, lands in Buf too
	}
	defer func() {
		for _, b := range bufs {
			p.pool.Put(b)
		}
	}()
	for {
		// Only the buffers handed to Read are replaced: a child that
		// only receives copies (one a wake-up) touches one message.
		n, err := sock.Recv(msgs[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.closed.Load() {
				return
			}
			p.drops.Add(ipoib.DropRecvError)
			time.Sleep(10 * time.Millisecond) // e.g. ENETDOWN while the link is down
			continue
		}
		for i := range n {
			if pk, ok := p.accept(c, &msgs[i], bufs[i]); ok {
				select {
				case p.rx <- pk:
					bufs[i] = p.pool.Get().(*[]byte)
					msgs[i].Buf = (*bufs[i])[rxHead:]
				default:
					p.drops.Add(ipoib.DropQueueFull)
				}
			}
		}
	}
}

// accept turns datagram m received on c (in buf, rxHead bytes in) into a
// packet for Read, or counts why not.
func (p *Port) accept(c *child, m *Msg, buf *[]byte) (rxq.Packet, bool) {
	pk, d := p.parse(c, m, buf)
	if d == ipoib.DropNone && pk.Buf != nil {
		d = ipoib.CheckRx(&pk.Meta, p.qps, p.groups)
	}
	if d != ipoib.DropNone {
		p.drops.Add(d)
		return rxq.Packet{}, false
	}
	return pk, pk.Buf != nil
}

// parse reads datagram m received on c (in buf, rxHead bytes in): the
// packet with its metadata for ipoib.CheckRx, or why it is dropped. A
// broadcast or multicast copy on a VIF child is counted as
// StatMcastCopies and comes back without a buffer and without a reason.
func (p *Port) parse(c *child, m *Msg, buf *[]byte) (rxq.Packet, ipoib.Drop) {
	sa, err := ParseSockaddrLL(m.Name, m.NameLen)
	if err != nil {
		return rxq.Packet{}, ipoib.DropBadSockaddr
	}
	if m.Trunc {
		return rxq.Packet{}, ipoib.DropTruncated
	}
	start, end := rxHead, rxHead+m.N
	if c.vnet {
		h, err := ParseVnetHdr((*buf)[start:end])
		if err != nil {
			return rxq.Packet{}, ipoib.DropBadVnetHdr
		}
		if h.GSOType != VnetGSONone {
			return rxq.Packet{}, ipoib.DropRxSuper
		}
		start += VnetHdrLen
	}
	if start == end {
		return rxq.Packet{}, ipoib.DropEmpty
	}
	meta := ipoib.RxMeta{SrcUnknown: true, PKey: c.pkey}
	switch sa.Pkttype {
	case PacketHost:
		if c.group {
			return rxq.Packet{}, ipoib.DropPktType // the group child has no VIF behind it
		}
		meta.DstQPN = c.qpn
	case PacketBroadcast, PacketMulticast:
		if !c.group {
			p.stat(statMcastCopies)
			return rxq.Packet{}, ipoib.DropNone
		}
		mgid, ok := p.mgidOf(sa, (*buf)[start:end], c.pkey)
		if !ok {
			return rxq.Packet{}, ipoib.DropBadMcast
		}
		meta.DstQPN, meta.MGID = ipoib.MulticastQPN, mgid
	default:
		return rxq.Packet{}, ipoib.DropPktType
	}
	start -= ipoib.HeaderLen
	ipoib.PutHeader((*buf)[start:], sa.Protocol)
	return rxq.Packet{Buf: buf, Start: start, N: end - start, Meta: meta}, ipoib.DropNone
}

// mgidOf finds the group a broadcast or multicast packet was sent to: the
// partition's broadcast group, or the group of its destination IP address
// (the kernel keeps the GRH's destination GID to itself).
func (p *Port) mgidOf(sa SockaddrLL, pkt []byte, pkey ipoib.PKey) (ipoib.GID, bool) {
	if sa.Pkttype == PacketBroadcast {
		return ipoib.BroadcastMGID(pkey, p.scope), true
	}
	switch {
	case sa.Protocol == 0x0800 && len(pkt) >= 20 && pkt[0]>>4 == 4:
		dst := netip.AddrFrom4([4]byte(pkt[16:20]))
		if dst.IsMulticast() {
			return ipoib.IPv4MGID(dst, pkey, p.scope), true
		}
	case sa.Protocol == 0x86dd && len(pkt) >= 40 && pkt[0]>>4 == 6:
		dst := netip.AddrFrom16([16]byte(pkt[24:40]))
		if dst.IsMulticast() {
			return ipoib.IPv6MGID(dst, pkey, p.scope), true
		}
	}
	return ipoib.GID{}, false
}
