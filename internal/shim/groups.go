package shim

// Multicast groups on the port. Each partition is a full member of its
// broadcast group, all-nodes (ff02::1) and all-hosts (224.0.0.1) for its
// lifetime ("static"); other groups are joined and left as the snooped
// IGMP/MLD memberships of guests come and go. A guest sending to a group
// no local guest listens to makes the port a send-only member, left after
// a membership interval without traffic.

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/warnlimit"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/snoop"
)

var (
	allNodes = netip.MustParseAddr("ff02::1")
	allHosts = netip.MustParseAddr("224.0.0.1")
)

// Bounds on the MGIDs one port joins. Send-only memberships have their
// own, smaller bound, and the least recently used one makes room for a
// new one. A full membership needing room evicts send-only ones too. So
// a guest sending to thousands of groups can never keep other guests
// from joining theirs.
const (
	maxGroups   = 4096 // full and send-only together
	maxSendOnly = 256  // of which send-only
)

// groupState is one joined MGID. sendOnly never changes: an upgrade to a
// full membership replaces the state.
type groupState struct {
	sendOnly bool
	refs     int          // full memberships using the MGID (static ones never released); control plane only
	lastUsed atomic.Int64 // unix ns of the last send (send-only groups)
}

// groupSet is the set of MGIDs the port has joined. Full memberships are
// reference-counted: several snooped groups can map to one MGID (IPv6
// groups that differ only in scope or flags share the low 80 bits), and
// the MGID is left when the last one goes. lookup is lock-free (a
// copy-on-write map); only the control plane changes it (control.go), so
// no lock is held across a port call and no worker waits on one. A join
// publishes the MGID through ready, which groups runs under its wait
// lock to send the frames held for the group first.
type groupSet struct {
	ready       publishFunc // nil: just add
	m           atomic.Pointer[map[ipoib.GID]*groupState]
	max, maxSO  int
	sendOnlyLen int // control plane only
	overflow    atomic.Uint64
	evicted     atomic.Uint64 // send-only memberships evicted for room
}

func (g *groupSet) init(max, maxSendOnly int) {
	g.max, g.maxSO = max, maxSendOnly
	g.m.Store(&map[ipoib.GID]*groupState{})
}

func (g *groupSet) lookup(mgid ipoib.GID) (*groupState, bool) {
	st, ok := (*g.m.Load())[mgid]
	return st, ok
}

// edit replaces the map with an edited copy.
func (g *groupSet) edit(fn func(m map[ipoib.GID]*groupState)) {
	old := *g.m.Load()
	m := make(map[ipoib.GID]*groupState, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	fn(m)
	g.m.Store(&m)
}

// errGroupsFull is returned when no room can be made for a membership.
var errGroupsFull = errors.New("shim: multicast group table full")

// makeRoom evicts least recently used send-only memberships until a new
// membership fits: under the total bound, and for a send-only one under
// the send-only bound too.
func (g *groupSet) makeRoom(port ipoib.ControlPort, sendOnly bool) error {
	m := *g.m.Load()
	need := len(m) - g.max + 1 // entries to evict for the total bound
	if sendOnly {
		need = max(need, g.sendOnlyLen-g.maxSO+1)
	}
	if need <= 0 {
		return nil
	}
	if need > g.sendOnlyLen {
		g.overflow.Add(1)
		return fmt.Errorf("%w: %d groups, %d of them full memberships", errGroupsFull, len(m), len(m)-g.sendOnlyLen)
	}
	for ; need > 0; need-- {
		var lru ipoib.GID
		oldest := int64(math.MaxInt64)
		for mgid, st := range *g.m.Load() {
			if st.sendOnly && st.lastUsed.Load() < oldest {
				lru, oldest = mgid, st.lastUsed.Load()
			}
		}
		if err := g.remove(port, lru); err != nil {
			return err
		}
		g.evicted.Add(1)
	}
	return nil
}

// remove forgets mgid and leaves it on the port.
func (g *groupSet) remove(port ipoib.ControlPort, mgid ipoib.GID) error {
	st, ok := g.lookup(mgid)
	if !ok {
		return nil
	}
	if st.sendOnly {
		g.sendOnlyLen--
	}
	g.edit(func(m map[ipoib.GID]*groupState) { delete(m, mgid) })
	if err := port.Leave(mgid); err != nil {
		return fmt.Errorf("shim: leave %s: %w", mgid, err)
	}
	return nil
}

// publishFunc publishes a joined MGID: it runs add, which puts it in the
// set, and whatever must happen with it.
type publishFunc func(mgid ipoib.GID, add func())

// publish runs add through ready.
func (g *groupSet) publish(mgid ipoib.GID, add func()) {
	if g.ready == nil {
		add()
		return
	}
	g.ready(mgid, add)
}

// join adds a full membership of mgid (upgrading a send-only one); a
// static one is never released.
func (g *groupSet) join(port ipoib.ControlPort, mgid ipoib.GID, static bool) error {
	refs := 1
	if static {
		refs = math.MaxInt32 // never released
	}
	st, ok := g.lookup(mgid)
	switch {
	case ok && !st.sendOnly:
		st.refs = min(st.refs+refs, math.MaxInt32)
		return nil
	case !ok:
		if err := g.makeRoom(port, false); err != nil {
			return err
		}
	}
	if err := port.Join(mgid); err != nil {
		return fmt.Errorf("shim: join %s: %w", mgid, err)
	}
	if ok {
		g.sendOnlyLen--
	}
	g.publish(mgid, func() { g.edit(func(m map[ipoib.GID]*groupState) { m[mgid] = &groupState{refs: refs} }) })
	return nil
}

// joinSendOnly makes the port a send-only member of mgid, unless it is a
// member already.
func (g *groupSet) joinSendOnly(port ipoib.ControlPort, mgid ipoib.GID, now time.Time) error {
	if _, ok := g.lookup(mgid); ok {
		g.publish(mgid, func() {})
		return nil
	}
	if err := g.makeRoom(port, true); err != nil {
		return err
	}
	if err := port.JoinSendOnly(mgid); err != nil {
		return fmt.Errorf("shim: send-only join %s: %w", mgid, err)
	}
	st := &groupState{sendOnly: true}
	st.lastUsed.Store(now.UnixNano())
	g.sendOnlyLen++
	g.publish(mgid, func() { g.edit(func(m map[ipoib.GID]*groupState) { m[mgid] = st }) })
	return nil
}

// leave releases one full membership of mgid, leaving the MGID with the
// last.
func (g *groupSet) leave(port ipoib.ControlPort, mgid ipoib.GID) error {
	st, ok := g.lookup(mgid)
	if !ok || st.sendOnly {
		return nil
	}
	if st.refs--; st.refs > 0 {
		return nil
	}
	return g.remove(port, mgid)
}

// expireSendOnly leaves the send-only groups unused for idle and returns
// how many.
func (g *groupSet) expireSendOnly(port ipoib.ControlPort, now time.Time, idle time.Duration) (int, error) {
	cut := now.Add(-idle).UnixNano()
	n := 0
	var first error
	for mgid, st := range *g.m.Load() {
		if st.sendOnly && st.lastUsed.Load() <= cut {
			if err := g.remove(port, mgid); err != nil && first == nil {
				first = err
			}
			n++
		}
	}
	return n, first
}

// leaveAll leaves every group.
func (g *groupSet) leaveAll(port ipoib.ControlPort, log *slog.Logger) {
	for mgid := range *g.m.Load() {
		if err := port.Leave(mgid); err != nil {
			log.Warn("leave group", "mgid", mgid, "err", err)
		}
	}
	g.m.Store(&map[ipoib.GID]*groupState{})
	g.sendOnlyLen = 0
}

// counts returns the full and send-only memberships (lock-free).
func (g *groupSet) counts() (full, sendOnly int) {
	m := *g.m.Load()
	for _, st := range m {
		if st.sendOnly {
			sendOnly++
		}
	}
	return len(m) - sendOnly, sendOnly
}

// mcastQueue bounds the frames held per group while the port joins it,
// as the kernel's IPoIB does during a send-only join
// (drivers/infiniband/ulp/ipoib/ipoib_multicast.c ipoib_mcast_send).
// There, while the group has no address handle, skbs wait on
// mcast->pkt_queue while skb_queue_len < IPOIB_MAX_MCAST_QUEUE. The rest
// are dropped and counted in tx_dropped; ipoib.h sets
// IPOIB_MAX_MCAST_QUEUE = 64.
const mcastQueue = 64

// groups is the port's multicast membership and the guests' querier: the
// MGIDs joined (set), the frames waiting for a send-only join (wait) and
// the guests' snooped memberships (snoop). Workers read set lock-free and
// wait and snoop under their locks, and post joins and leaves as intents.
// The methods that join or leave take the control plane explicitly: only
// the control goroutine calls them. querier.go has the queries.
type groups struct {
	shared
	set   groupSet
	wait  groupWaits
	snoop *snoop.Table
	warn  warnlimit.Limit // limits the warnings a guest can cause per frame
	q     querier         // the query rounds' state (querier.go)
	scope uint8           // Config.Scope
	// byVLAN and parts are the shim's partitions; gid its port's GID.
	byVLAN *[4096]atomic.Pointer[partition]
	parts  func() map[ipoib.PKey]*partition
	gid    func() ipoib.GID
	post   func(it intent, must bool) bool // the control queue's
}

// init readies g; the shim's partitions are byVLAN and parts.
func (g *groups) init(sh shared, cfg *Config, byVLAN *[4096]atomic.Pointer[partition], parts func() map[ipoib.PKey]*partition, gid func() ipoib.GID, post func(intent, bool) bool) {
	g.shared, g.scope, g.byVLAN, g.parts, g.gid, g.post = sh, cfg.Scope, byVLAN, parts, gid, post
	g.set.init(maxGroups, maxSendOnly)
	g.set.ready = g.ready
	g.wait.m = make(map[ipoib.GID]*heldFrames)
	g.snoop = snoop.NewTable(cfg.Multicast, maxGroups, snoop.Actions{Join: g.snoopJoin, Leave: g.snoopLeave, Query: g.query})
}

// groupWaits holds the frames to groups the port is joining.
type groupWaits struct {
	mu sync.Mutex
	m  map[ipoib.GID]*heldFrames
}

// The answers of sendTo.
const (
	groupReady   = iota // joined: send
	groupJoining        // a join is under way: hold the frame (holdForGroup)
	groupRefused        // the port cannot join: drop
)

// sendTo says whether the port may send to mgid: a member already, or a
// send-only join asked of the control goroutine (once per group) and
// under way. It never waits.
func (g *groups) sendTo(mgid ipoib.GID, now time.Time) int {
	if st, ok := g.set.lookup(mgid); ok {
		if n := now.UnixNano(); st.sendOnly && n-st.lastUsed.Load() >= int64(time.Second) {
			st.lastUsed.Store(n)
		}
		return groupReady
	}
	w := &g.wait
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := g.set.lookup(mgid); ok {
		return groupReady
	}
	if _, ok := w.m[mgid]; ok {
		return groupJoining
	}
	if len(w.m) >= maxSendOnly || !g.post(intent{kind: intentSendOnly, mgid: mgid}, false) {
		return groupRefused
	}
	w.m[mgid] = &heldFrames{}
	return groupJoining
}

// holdForGroup holds a copy of f (f.buf an IPoIB packet with
// ipoib.Headroom before its header) until the port joined mgid; it
// returns pass when the group was joined meanwhile (the caller sends
// it). A frame over the bound or to a group whose join failed meanwhile
// is dropped: a guest's frame counts the drop verdict, the shim's own
// (f.own) nothing.
func (g *groups) holdForGroup(mgid ipoib.GID, f heldFrame) verdict {
	w := &g.wait
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.m[mgid]
	switch {
	case !ok:
		if _, joined := g.set.lookup(mgid); joined {
			return pass
		}
		return verdict(DropNoGroup)
	case len(*h) >= mcastQueue:
		return verdict(DropGroupPendingFull)
	}
	h.hold(f.buf, portTailRoom, f)
	if !f.own {
		g.ctr.inc(TxQueuedGroup)
	}
	return held
}

// ready sends the frames held for a joined mgid, then publishes it
// (add), under the groupWaits lock. A TX worker that sees the group
// sends after them. One that does not holds its frame under that lock
// (sendTo, holdForGroup) and finds the group by then. So no newer frame
// overtakes a held one, as readyVIF sends first, then marks the VIF
// ready. Control plane only.
func (g *groups) ready(mgid ipoib.GID, add func()) {
	w := &g.wait
	w.mu.Lock()
	defer w.mu.Unlock()
	defer add()
	h, ok := w.m[mgid]
	if !ok {
		return
	}
	delete(w.m, mgid)
	var bufs [][]byte
	var meta []ipoib.TxMeta
	for _, f := range *h {
		if !g.vifLive(f.vif) {
			if !f.own {
				g.ctr.inc(DropVIFGone)
			}
			continue
		}
		bufs = append(bufs, f.buf)
		meta = append(meta, f.meta)
		if !f.own {
			g.ctr.inc(TxForwarded)
			g.ctr.inc(TxMulticast)
		}
		if f.segs > 0 {
			// A UDP super-packet the port cuts, counted as txEmit
			// counts one it sends at once.
			g.ctr.inc(TxSuper)
			g.ctr.add(TxSuperSegments, uint64(f.segs))
		}
	}
	if len(bufs) > 0 {
		g.toPort(bufs, meta)
	}
}

// failed drops the frames held for mgid, which the port did not join,
// counted.
func (g *groups) failed(mgid ipoib.GID) {
	w := &g.wait
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropLocked(mgid, g.ctr)
}

// dropAll drops every held frame (the shim is stopping), counted.
func (w *groupWaits) dropAll(c *counters) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for mgid := range w.m {
		w.dropLocked(mgid, c)
	}
}

// dropLocked drops the frames held for mgid, counting the guests' ones
// (not the shim's own) as drop_no_group; call with mu held.
func (w *groupWaits) dropLocked(mgid ipoib.GID, c *counters) {
	if h, ok := w.m[mgid]; ok {
		for _, f := range *h {
			if !f.own {
				c.inc(DropNoGroup)
			}
		}
		delete(w.m, mgid)
	}
}

// joinSendOnly is the control goroutine's (c's) send-only join of mgid,
// for frames a guest sends to it.
func (g *groups) joinSendOnly(c *control, mgid ipoib.GID, now time.Time) {
	if err := g.set.joinSendOnly(c.port, mgid, now); err != nil {
		g.failed(mgid)
		reason := c.refused("groups", err)
		if g.warn.Allow(now) {
			g.log.Warn("send-only join refused", "mgid", mgid, "reason", reason, "err", err, "suppressed", g.warn.Suppressed())
		}
	}
}

// solicitedNode returns ff02::1:ffXX:XXXX for a unicast IPv6 address
// (RFC 4291 §2.7.1).
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// mgid maps a snooped group of partition p to its MGID.
func (g *groups) mgid(p *partition, group netip.Addr) ipoib.GID {
	if group.Is4() {
		return ipoib.IPv4MGID(group, p.pkey, g.scope)
	}
	return ipoib.IPv6MGID(group, p.pkey, g.scope)
}

// snoopJoin is the snooping table's Join: the first guest of a group. It
// only queues the join (the table's lock is held, by a worker maybe); it
// fails when the queue is full, and the next report tries again.
func (g *groups) snoopJoin(k snoop.Key, gen uint64) error {
	if !g.post(intent{kind: intentJoin, group: k, gen: gen}, false) {
		return errControlFull
	}
	return nil
}

// snoopLeave is the snooping table's Leave: the last guest left. Never
// dropped, so that the port never stays in a group the table forgot.
func (g *groups) snoopLeave(k snoop.Key) { g.post(intent{kind: intentLeave, group: k}, true) }

// errControlFull is the refusal of an intent for a full queue.
var errControlFull = errors.New("shim: control queue full")

// join is the control goroutine's (c's) join of a snooped group, for the
// table's entry of generation gen. The table forgets a join the port
// refuses (snoop.Table.Forget), which drops that entry only. The group
// may have expired and been reported again while this join waited in
// the queue: the later entry stays, with its own join queued behind.
// Counted by reason.
func (g *groups) join(c *control, k snoop.Key, gen uint64) {
	p := g.byVLAN[k.VLAN].Load()
	mgid := g.mgid(p, k.Group)
	if err := g.set.join(c.port, mgid, false); err != nil {
		g.snoop.Forget(k, gen)
		reason := c.refused("groups", err)
		if g.warn.Allow(g.clk.Now()) {
			g.log.Warn("join of a snooped group refused", "group", k.Group, "vlan", k.VLAN, "reason", reason, "err", err, "suppressed", g.warn.Suppressed())
		}
		return
	}
	g.ctr.inc(McastJoins)
	g.log.Debug("joined group", "group", k.Group, "vlan", p.vlan, "pkey", p.pkey, "mgid", mgid)
}

// leave is the control goroutine's leave of a snooped group, through
// port.
func (g *groups) leave(port ipoib.ControlPort, k snoop.Key) {
	p := g.byVLAN[k.VLAN].Load()
	mgid := g.mgid(p, k.Group)
	if err := g.set.leave(port, mgid); err != nil {
		g.log.Warn("leave group", "group", k.Group, "vlan", k.VLAN, "err", err)
		return
	}
	g.ctr.inc(McastLeaves)
	g.log.Debug("left group", "group", k.Group, "vlan", p.vlan, "pkey", p.pkey, "mgid", mgid)
}

// member records a guest's membership of group (from a report, or the
// solicited-node group of an address it uses), shown by a packet from
// the address from.
func (g *groups) member(p *partition, group, from netip.Addr, leave bool, now time.Time) {
	k := snoop.Key{VLAN: p.vlan, Group: group}
	if leave {
		g.snoop.Leave(k, now)
	} else {
		g.snoop.Report(k, from, now)
	}
}

// nsTarget and nsLen locate the target address of a neighbour
// solicitation in its ICMPv6 message (RFC 4861 §4.3).
const (
	nsTarget = 8
	nsLen    = nsTarget + 16
)

// snoopIPv6 records the memberships an IPv6 packet from a guest shows:
// those its MLD reports and dones state, the solicited-node group of its
// source address, and that of the target of its duplicate address
// detection. A malformed MLD message is dropped.
func (g *groups) snoopIPv6(p *partition, pay []byte, now time.Time) verdict {
	ip := header.IPv6(pay)
	src := ip.Src()
	if snoop.IsMLD(pay) {
		if v := g.snoopRecords(p, snoop.ParseMLD, pay, src, now); v != pass {
			return v
		}
	}
	if !src.IsUnspecified() {
		// Per frame, so only when the group is not joined yet: once it
		// is, the guest's MLD answers to the queries keep it alive.
		if sn := solicitedNode(src); !src.IsMulticast() && !g.fullMember(p, sn) {
			g.member(p, sn, src, false, now)
		}
		return pass
	}
	if icmp := ip.Payload(); ip.NextHeader() == header.ProtoICMPv6 && len(icmp) >= nsLen && icmp[0] == arpndp.TypeNeighborSolicitation {
		g.member(p, solicitedNode(netip.AddrFrom16([16]byte(icmp[nsTarget:nsLen]))), src, false, now)
	}
	return pass
}

// snoopRecords feeds the records of a guest's IGMP or MLD message, sent
// from the address from, to the snooping table; a malformed one or one
// with a wrong checksum is dropped.
func (g *groups) snoopRecords(p *partition, parse func([]byte) (snoop.Records, error), pay []byte, from netip.Addr, now time.Time) verdict {
	recs, err := parse(pay)
	if err != nil {
		return verdict(DropBadMcastReport)
	}
	for r, ok := recs.Next(); ok; r, ok = recs.Next() {
		if r.Group != allNodes && r.Group != allHosts {
			g.member(p, r.Group, from, r.Leave, now)
		}
	}
	return pass
}

// fullMember reports, without locking, whether the port is a full member
// of group's MGID in partition p.
func (g *groups) fullMember(p *partition, group netip.Addr) bool {
	st, ok := g.set.lookup(g.mgid(p, group))
	return ok && !st.sendOnly
}
