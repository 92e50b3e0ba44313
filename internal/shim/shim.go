// Package shim is the eIPoIB engine: it moves frames between a guest-facing
// Ethernet device (a TAP) and an IB port speaking IPoIB. TX strips the
// Ethernet header and picks the sending VIF: one UD QP per guest MAC and
// VLAN, made on first sight by the control goroutine while the guest's
// frames wait (promiscuous-mode emulation; see control.go). It maps the
// destination MAC to a RIMAC or MGID and rewrites ARP/NDP/DHCP payloads.
// RX does the reverse, deriving a stable REMAC for every remote endpoint.
// Frames to an
// unknown REMAC wait in a bounded queue while the shim resolves their
// destination. Oversized IP packets are fragmented or answered with ICMP,
// never blackholed. Everything dropped is counted; nothing is logged or
// allocated per frame.
package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/loops"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/warnlimit"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
)

// Config configures a Shim. Zero fields take the defaults shown.
type Config struct {
	Device tap.Device
	Port   ipoib.Port
	Logger *slog.Logger // slog.Default()
	Clock  clock.Clock  // the wall clock

	MaxVIFs       int           // 1024
	MaxNeighbours int           // 65536
	VIFIdle       time.Duration // 300 s, the Linux bridge's FDB aging time
	NeighTTL      time.Duration // 600 s
	// Partitions maps VLAN IDs to P_Keys; untagged (VLAN 0) is always the
	// default partition 0xFFFF and cannot be remapped.
	Partitions map[uint16]ipoib.PKey
	Scope      uint8    // MGID scope, ipoib.ScopeLinkLocal
	DHCP       DHCPMode // DHCPBroadcast
	// DHCPClientID is the client-identifier that DHCPRFC4390 gives
	// guests' requests (arpndp.ClientIDMAC by default).
	DHCPClientID arpndp.ClientIDForm
	// Learn is which guest MACs get a VIF: LearnAuto (any) or
	// LearnDeclared (those declared with DeclareVIF).
	Learn LearnMode // LearnAuto
	// ClampMSS lowers the MSS of guests' TCP SYNs to fit the IPoIB MTU,
	// for guests that ignore path MTU discovery.
	ClampMSS bool
	// Multicast are the IGMP/MLD snooping and querier timers; zero
	// fields take the RFC 3376/3810 defaults (125 s queries, 260 s
	// membership, 2 s leave).
	Multicast snoop.Timers
	// Housekeeping is the period of aging and resolution retries (the
	// carrier and the partitions' MTUs follow the port's events, not
	// this); 0 means 250 ms.
	Housekeeping time.Duration
	// AnnounceWindow: the addresses a guest shows within this time of
	// its MAC appearing here (its VIF created, or its RARP announcement
	// after a migration) are announced on the fabric (announce.go); 0
	// announces nothing.
	AnnounceWindow time.Duration
	// FastPath, when not nil, is an in-kernel fast path the control
	// goroutine keeps in step with the tables (fastpath.go).
	FastPath FastPath
}

// partition is one VLAN ↔ P_Key pairing with its own groups and view.
type partition struct {
	vlan  uint16
	pkey  ipoib.PKey
	bcast ipoib.GID
	// anon is the source MAC of packets whose sender neither the port
	// nor ARP/NDP can name (srcip.go): the REMAC DeriveREMAC gives the
	// partition's broadcast address. It is one stable, locally
	// administered unicast MAC per partition, so the bridge learns it
	// once, on the TAP's port: net/bridge/br_fdb.c br_fdb_update adds an
	// entry for a new source MAC and moves one seen on another port. So
	// its FDB neither flaps nor gets an entry per routed source. It is
	// no neighbour: a frame a guest sends to it waits for a resolution
	// like any unknown REMAC, which never names it, and is dropped
	// (drop_unresolved).
	anon ether.MAC
	view *mactrans.View
	// ipMTU is the partition's IPoIB MTU, from the port's PartitionMTU:
	// on InfiniBand the SM may give a partition's broadcast group a
	// smaller MTU than the port's. Packets of the partition are cut,
	// fragmented or answered "too big" to it.
	ipMTU atomic.Int32
}

// mtu is the partition's IPoIB MTU.
func (p *partition) mtu() int { return int(p.ipMTU.Load()) }

// Shim is the engine. Create it with New and start it with Run.
type Shim struct {
	cfg    Config
	log    *slog.Logger
	clk    clock.Clock
	dev    tap.Device
	queues []tap.Device    // the device's queues (itself when it has one)
	port   ipoib.DataPort  // the port's data half; its control half is ctl.port
	rxq    []ipoib.RxQueue // the port's receive queues, each read by an RX worker
	ipMTU  int             // the port's IPoIB MTU, the largest of the partitions'
	vifs   *mactrans.VIFTable
	neigh  *mactrans.NeighTable
	byVLAN [4096]atomic.Pointer[partition] // by VLAN ID; nil: unmapped
	byPKey atomic.Pointer[map[ipoib.PKey]*partition]
	partMu sync.Mutex // serialises partition additions
	mtuMu  sync.Mutex // orders partitions' MTU changes (refreshMTU, port events)

	qmu    []sync.Mutex // by device queue: serialises writes to it (the RX workers', and queue 0 the shim's own)
	portMu sync.Mutex   // serialises writes to the port

	// ctl is the control plane, which alone holds the port's control
	// half; ep tracks the senders' epochs, so that a QP is freed only
	// when no sender can use it (control.go).
	ctl     control
	ep      epochs
	newVIFs newGuests // guests whose VIF is pending or refused (newvif.go)

	groups   groups   // multicast membership and the querier (groups.go)
	resolver resolver // frames to unknown REMACs and their resolution (resolve.go)
	mobility mobility // announcements and guests that moved here (announce.go, moved.go)
	srcs     srcTable // source IP → REMAC, for ports that cannot tell senders
	xids     dhcpXIDs
	ctr      counters

	capture   atomic.Pointer[Capture] // the running capture, nil for none
	vifIdle   atomic.Int64            // Config.VIFIdle, changed by SetVIFIdle
	lastRound atomic.Int64            // wall clock of the last housekeeping round

	vifWarn             warnlimit.Limit // limits warnings a guest can cause per frame
	fastWarn            warnlimit.Limit // limits the fast path's warnings (fastpath.go)
	carrier, carrierSet atomic.Bool
	stopping            atomic.Bool // set before Run frees the VIFs

	// local are the hypervisor's own MACs (SetLocalMACs, local.go).
	local atomic.Pointer[localMACs]
	// undeclared is what housekeeping logs of drop_undeclared (local.go).
	undeclared undeclaredLog
}

// New validates cfg and builds a shim; it does not touch the port yet.
func New(cfg Config) (*Shim, error) {
	if cfg.Device == nil || cfg.Port == nil {
		return nil, errors.New("shim: Device and Port are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.MaxVIFs == 0 {
		cfg.MaxVIFs = 1024
	}
	if cfg.MaxVIFs < 1 || cfg.MaxVIFs > 1<<20 {
		return nil, fmt.Errorf("shim: max VIFs %d out of range 1..%d", cfg.MaxVIFs, 1<<20)
	}
	if cfg.MaxNeighbours == 0 {
		cfg.MaxNeighbours = 65536
	}
	if cfg.VIFIdle == 0 {
		cfg.VIFIdle = 300 * time.Second
	}
	if cfg.NeighTTL == 0 {
		cfg.NeighTTL = 600 * time.Second
	}
	if cfg.Scope == 0 {
		cfg.Scope = ipoib.ScopeLinkLocal
	}
	cfg.Multicast = cfg.Multicast.WithDefaults()
	if err := cfg.Multicast.Validate(); err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	if cfg.Housekeeping == 0 {
		cfg.Housekeeping = 250 * time.Millisecond
	}
	if !cfg.Learn.Valid() || !cfg.DHCP.Valid() {
		return nil, fmt.Errorf("shim: learning mode %s or DHCP mode %s unknown", cfg.Learn, cfg.DHCP)
	}
	ipMTU, err := ipoib.IPMTU(cfg.Port.MTU())
	if err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	gid := cfg.Port.LocalGID()
	s := &Shim{
		cfg: cfg, log: cfg.Logger, clk: cfg.Clock, dev: cfg.Device, port: cfg.Port, ipMTU: ipMTU,
		ctl:   control{port: cfg.Port},
		vifs:  mactrans.NewVIFTable(gid, cfg.MaxVIFs),
		neigh: mactrans.NewNeighTable(cfg.MaxNeighbours),
	}
	s.cfg.Port = nil // held as its two halves only: port and ctl.port
	s.byPKey.Store(&map[ipoib.PKey]*partition{})
	add := func(vlan uint16, pkey ipoib.PKey) error {
		p, err := s.newPartition(vlan, pkey)
		if err == nil {
			s.publish(p)
		}
		return err
	}
	if err := add(0, ipoib.DefaultPKey); err != nil {
		return nil, err
	}
	for vlan, pkey := range cfg.Partitions {
		if vlan == 0 {
			return nil, errors.New("shim: VLAN 0 (untagged) is always the default partition 0xffff")
		}
		if err := add(vlan, pkey); err != nil {
			return nil, err
		}
	}
	s.srcs.max = cfg.MaxNeighbours
	s.vifIdle.Store(int64(cfg.VIFIdle))
	s.lastRound.Store(time.Now().UnixNano())
	s.queues = s.dev.Queues() // each read by a TX worker, written by the RX workers (flowQueue)
	s.qmu = make([]sync.Mutex, len(s.queues))
	s.rxq = ipoib.RxQueuesOf(s.port)
	sh := shared{ctr: &s.ctr, log: s.log, clk: s.clk, vifs: s.vifs, toPort: s.writePort, toGuests: s.writeLocal}
	s.groups.init(sh, &s.cfg, &s.byVLAN, s.partitions, s.port.LocalGID, s.ctl.post)
	s.resolver.init(sh, s.neigh, &s.groups, cfg.Scope)
	s.mobility.init(sh, &s.srcs, s.neigh, &s.resolver, cfg.AnnounceWindow, s.port.LocalGID)
	s.newVIFs.init()
	s.watchFastPath()
	s.ctl.init(vifHoldPerGuest)
	s.ep.init(len(s.queues) + len(s.rxq) + 1) // the TX workers, the RX workers, housekeeping
	return s, nil
}

// newPartition checks and makes partition vlan → pkey; call with partMu
// held, as a control action or before Run (it reads the port's
// PartitionMTU).
func (s *Shim) newPartition(vlan uint16, pkey ipoib.PKey) (*partition, error) {
	if vlan > 4094 {
		return nil, fmt.Errorf("shim: VLAN %d out of range 1..4094", vlan)
	}
	if !pkey.IsValid() {
		return nil, fmt.Errorf("shim: VLAN %d: invalid P_Key %s", vlan, pkey)
	}
	full := pkey.Full()
	if s.byVLAN[vlan].Load() != nil {
		return nil, fmt.Errorf("shim: VLAN %d mapped twice", vlan)
	}
	if other, ok := (*s.byPKey.Load())[full]; ok {
		return nil, fmt.Errorf("shim: VLANs %d and %d both map to P_Key %s", other.vlan, vlan, full)
	}
	p := &partition{vlan: vlan, pkey: full, bcast: ipoib.BroadcastMGID(full, s.cfg.Scope)}
	p.anon = mactrans.DeriveREMAC(p.bcast, ipoib.MulticastQPN, 0)
	p.view = &mactrans.View{VIFs: s.vifs, Neigh: s.neigh, Clock: s.clk, GID: s.port.LocalGID(), VLAN: vlan, PKey: full}
	p.ipMTU.Store(int32(s.ipMTUOf(s.ctl.port.PartitionMTU(full))))
	return p, nil
}

// refreshMTU reads partition p's MTU from the port again (its group or
// first VIF was just made). Control plane only: never on a worker. The
// port's MTU events (carrier.go) set it too: mtuMu orders the two, so a
// value read before an event is never written after it.
func (s *Shim) refreshMTU(p *partition) {
	s.mtuMu.Lock()
	defer s.mtuMu.Unlock()
	s.setMTU(p, s.ctl.port.PartitionMTU(p.pkey))
}

// publish makes partition p visible to the data path (copy on write).
func (s *Shim) publish(p *partition) {
	m := maps.Clone(*s.byPKey.Load())
	m[p.pkey] = p
	s.byPKey.Store(&m)
	s.byVLAN[p.vlan].Store(p)
}

// partitions returns the partitions by P_Key (do not modify).
func (s *Shim) partitions() map[ipoib.PKey]*partition { return *s.byPKey.Load() }

// joinPartition joins a partition's broadcast, all-nodes and all-hosts
// groups for good. Then it reads its MTU again and publishes it (again,
// for one New published), both under mtuMu. A port MTU event that comes
// after the read waits for the partition to be visible (applyEvent), so
// it is applied, not lost. Control plane only.
func (s *Shim) joinPartition(p *partition) error {
	for _, mgid := range []ipoib.GID{p.bcast, s.groups.mgid(p, allNodes), s.groups.mgid(p, allHosts)} {
		if err := s.groups.set.join(s.ctl.port, mgid, true); err != nil {
			return err
		}
	}
	s.mtuMu.Lock()
	defer s.mtuMu.Unlock()
	s.setMTU(p, s.ctl.port.PartitionMTU(p.pkey))
	s.publish(p)
	return nil
}

// AddPartition maps a new VLAN to a P_Key in the running shim (as a
// configuration reload does): its groups are joined, then its traffic flows
// (joinPartition publishes it). Remapping or removing a VLAN needs a
// restart.
func (s *Shim) AddPartition(vlan uint16, pkey ipoib.PKey) error {
	if vlan == 0 {
		return errors.New("shim: VLAN 0 (untagged) is always the default partition 0xffff")
	}
	s.partMu.Lock()
	defer s.partMu.Unlock()
	return s.call(func() error {
		p, err := s.newPartition(vlan, pkey)
		if err != nil {
			return err
		}
		if err := s.joinPartition(p); err != nil {
			return fmt.Errorf("shim: join the groups of VLAN %d: %w", vlan, err)
		}
		s.log.Info("partition added", "vlan", vlan, "pkey", p.pkey)
		return nil
	})
}

// IPMTU is the port's IPoIB MTU: the largest IP packet carried
// unfragmented in any partition (the TAP's MTU).
func (s *Shim) IPMTU() int { return s.ipMTU }

// Run starts the control goroutine (control.go), joins each partition's
// broadcast, all-nodes and all-hosts groups through it, then moves
// traffic until ctx ends or the device or port fails. On return the
// device is closed (the in-flight batch finished), queued frames dropped
// and counted, QPs freed, groups left and the port closed; every
// goroutine Run started has ended, the control goroutine last. If a join
// fails at start-up, the groups already joined are left before Run
// returns the error.
func (s *Shim) Run(ctx context.Context) error {
	stopControl := s.startControl()
	for _, p := range s.partitions() {
		if err := s.call(func() error { return s.joinPartition(p) }); err != nil {
			s.call(func() error { s.groups.set.leaveAll(s.ctl.port, s.log); return nil })
			stopControl()
			s.ctl.port.Close()
			return err
		}
	}
	events := s.port.Events()
	select { // the first is the link state: the carrier is set before traffic flows
	case ev, ok := <-events:
		if ok {
			s.applyEvent(ev)
		}
	case <-ctx.Done():
	}
	loop := loops.New("shim", len(s.queues)+len(s.rxq)+2)
	var wg, rx sync.WaitGroup
	hctx, stopHouse := context.WithCancel(ctx)
	for i, q := range s.queues {
		loop.Go(fmt.Sprintf("tx queue %d", i), &wg, func() error { return s.txLoop(i, q) })
	}
	for i, q := range s.rxq {
		loop.Go(fmt.Sprintf("rx %d", i), &rx, func() error { return s.rxLoop(i, q) })
	}
	loop.Go("port events", &rx, func() error { return s.followEvents(events) })
	loop.Go("housekeeping", &wg, func() error { return s.housekeeping(hctx) })
	s.log.Info("shim running", "gid", s.port.LocalGID(), "ib_mtu", s.port.MTU(), "ipoib_mtu", s.ipMTU, "partitions", len(s.partitions()), "max_vifs", s.cfg.MaxVIFs, "tx_workers", len(s.queues), "rx_workers", len(s.rxq))
	var err error
	select {
	case <-ctx.Done():
	case err = <-loop.Done():
	}
	stopHouse()
	s.dev.Close() // the TX loop finishes its batch and leaves
	wg.Wait()
	s.call(s.stopPort)
	s.ctl.port.Close() // the RX workers leave
	rx.Wait()
	stopControl()
	return err
}

// stopPort drops the frames waiting for the control plane or a
// resolution, frees every QP once no sender can use it and leaves every
// group. A control action: the intents queued before it (a new guest's
// VIF, whose held frames may wait for a resolution) have run, and those
// after it see stopping, so no frame is held after the drop.
func (s *Shim) stopPort() error {
	s.stopping.Store(true)
	s.resolver.pending.dropAll(&s.ctr)
	s.newVIFs.dropAll(&s.ctr)
	s.groups.wait.dropAll(&s.ctr)
	var gone []*mactrans.VIF
	for _, v := range s.vifs.All() {
		if _, ok := s.vifs.Remove(v.Key, mactrans.OriginDeclared); ok {
			gone = append(gone, v)
		}
	}
	for _, d := range s.ctl.draining {
		gone = append(gone, d.vif)
	}
	s.ctl.draining = nil
	if err := s.freeQuiesced(gone); err != nil {
		s.log.Warn("free QPs", "err", err)
	}
	s.groups.set.leaveAll(s.ctl.port, s.log)
	s.log.Info("shim stopped", "counters_tx_frames", s.Get(TxFrames), "counters_rx_frames", s.Get(RxFrames))
	return nil
}

// housekeeping sends queries, ages the snooping and neighbour tables,
// retries and expires resolutions, sends announcements and follows the
// port state. It makes no port control call (VIF aging, send-only
// expiry and MTU reads are the control goroutine's).
func (s *Shim) housekeeping(ctx context.Context) error {
	t := time.NewTimer(s.cfg.Housekeeping)
	defer t.Stop()
	s.groups.startQueries(s.clk.Now())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := s.clk.Now()
		t.Reset(s.nextHousekeeping(now))
		s.groups.queryRound(now)
		s.neigh.Expire(now, s.cfg.NeighTTL)
		s.logUndeclared(now)
		s.ep.enter(s.houseSlot())
		s.resolver.tick(now)
		s.mobility.tick(now)
		s.ep.exit(s.houseSlot())
		s.groups.requeryRound(now, s.dev.OperUp)
		s.lastRound.Store(time.Now().UnixNano())
	}
}

// Healthy reports whether a housekeeping round finished within the last
// d; the daemon's systemd watchdog asks this. The rounds share the data
// path's tables and locks, so a stuck pipeline stops them. They make no
// port control call: the control goroutine does.
func (s *Shim) Healthy(d time.Duration) bool {
	return time.Since(time.Unix(0, s.lastRound.Load())) < d
}

// nextHousekeeping returns the wait until the next pass: the period, or
// less when a membership expires or a group-specific query is due
// sooner, so that leaves take effect within the leave time and not one
// period later.
func (s *Shim) nextHousekeeping(now time.Time) time.Duration {
	wait := s.cfg.Housekeeping
	if d, ok := s.groups.snoop.NextDeadline(); ok {
		wait = min(wait, max(d.Sub(now), time.Millisecond))
	}
	return wait
}

// SetLimits changes the most VIFs and neighbours (a configuration
// reload); see mactrans' SetMax for what lowering them does.
func (s *Shim) SetLimits(maxVIFs, maxNeighbours int) {
	s.vifs.SetMax(maxVIFs)
	s.neigh.SetMax(maxNeighbours)
	s.srcs.mu.Lock()
	s.srcs.max = maxNeighbours
	s.srcs.mu.Unlock()
}

// SetMulticastTimers changes the IGMP/MLD snooping and querier timers
// (a configuration reload): groups keep their expiry, reports, leaves
// and queries from now on use t, and the next general query comes
// within the new query interval. Invalid timers change nothing.
func (s *Shim) SetMulticastTimers(t snoop.Timers) error { return s.groups.snoop.SetTimers(t) }

// SetVIFIdle changes the idle time after which a VIF is removed (as a
// configuration reload does); the next aging round uses it.
func (s *Shim) SetVIFIdle(d time.Duration) { s.vifIdle.Store(int64(d)) }

// DeclareVIF creates the VIF of a guest MAC ahead of its first frame, e.g.
// from the bridge's forwarding database at start-up, so that traffic to
// it is received before it speaks. origin says who declared it (a VIF
// that exists already takes it).
func (s *Shim) DeclareVIF(mac ether.MAC, vlan uint16, origin mactrans.Origin) error {
	if int(vlan) >= len(s.byVLAN) || s.byVLAN[vlan].Load() == nil {
		return fmt.Errorf("shim: VLAN %d has no P_Key", vlan)
	}
	p := s.byVLAN[vlan].Load()
	if mac.IsMulticast() || mac.IsZero() {
		return fmt.Errorf("shim: %s is not a unicast MAC", mac)
	}
	return s.call(func() error {
		v, err := s.vif(p, mac, origin, s.clk.Now())
		// A declaration wins over learning, never the reverse: the
		// auto-mode preload of the bridge's learned entries must not make
		// a declared (e.g. restored) VIF age.
		if err == nil && (origin != mactrans.OriginLearned || v.Origin() == mactrans.OriginLearned) {
			v.SetOrigin(origin)
		}
		return err
	})
}

// RemoveVIF frees the VIF of a guest MAC at once when source by
// undeclares it, instead of waiting for it to age. That happens e.g.
// when the bridge's forwarding database forgets it (the guest's port
// went). mactrans.Origin.Frees says who may: the control socket frees
// any, a switch what it declared or what was learned. It reports whether
// a VIF went: a MAC without a VIF, or whose VIF another source declared,
// is no error.
func (s *Shim) RemoveVIF(mac ether.MAC, vlan uint16, by mactrans.Origin) (removed bool, err error) {
	err = s.call(func() error {
		v, ok := s.vifs.Remove(mactrans.VIFKey{MAC: mac, VLAN: vlan}, by)
		if !ok {
			return nil
		}
		removed = true
		s.ctr.inc(VIFsRemoved)
		s.log.Info("VIF removed", "mac", mac, "vlan", vlan, "qpn", fmt.Sprintf("%#06x", v.QPN), "by", by)
		return s.freeQuiesced([]*mactrans.VIF{v})
	})
	return removed, err
}
