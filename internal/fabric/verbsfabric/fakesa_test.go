package verbsfabric

import (
	"fmt"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// The fake subnet administrator. fakeSM is the subnet: what its manager
// (OpenSM) is configured with and the SA's records. fakeSA is one host's
// kernel in front of it, the rdma_cm (drivers/infiniband/core/cma.c) and
// SA client (multicast.c, sa_query.c) as a user-space id sees them; its
// methods follow those functions one by one, each rule cited where it is
// modelled.

// rdmaUDPQKey is RDMA_UDP_QKEY, the Q_Key cma_set_qkey gives ids in the
// UDP and IB port spaces.
const rdmaUDPQKey = 0x01234567

// fakeSM is the subnet manager and its SA's records.
type fakeSM struct {
	mu   sync.Mutex
	qkey uint32 // Q_Key of the IPoIB broadcast groups it creates
	mtu  int    // their MTU
	// noPathMTU: the path record to an MGID fails, so a join reports
	// no MTU (ibvSA.join asks the group's MTU that way).
	noPathMTU bool
	sendOnly  bool   // ClassPortInfo CapabilityMask2: send-only full members
	lidBase   uint16 // port i of the subnet has LID lidBase+i
	sl        map[ipoib.PKey]uint8
	ports     []*fakeSA
	groups    map[ipoib.GID]*fakeGroup
	nextMLID  uint16
}

// fakeGroup is an SA MCMemberRecord and its members. multicast.c holds
// one SA membership per port and counts the port's members in it
// (adjust_membership): the kernel's IPoIB (kernel) and rdma_cm ids (ids:
// port GID → send-only) are separate members, and an id leaving does not
// end the kernel's membership.
type fakeGroup struct {
	mlid   uint16
	qkey   uint32
	mtu    int
	sl     uint8
	kernel map[ipoib.GID]bool
	ids    map[ipoib.GID]bool
}

func (g *fakeGroup) has(gid ipoib.GID) bool {
	_, id := g.ids[gid]
	return g.kernel[gid] || id
}

func newSM() *fakeSM {
	return &fakeSM{qkey: ipoib.QKey, mtu: 4096, sendOnly: true, lidBase: 1, sl: map[ipoib.PKey]uint8{},
		groups: map[ipoib.GID]*fakeGroup{}, nextMLID: 0xc000}
}

// fakeSA is one host's kernel as a verbs port's rdma_cm ids see it.
type fakeSA struct {
	sm    *fakeSM
	gid   ipoib.GID
	pkeys []ipoib.PKey
	// ifs are the host's IPoIB interfaces' IP addresses, by partition
	// (full P_Key); each interface's kernel IPoIB has joined its
	// broadcast group (ipoib_mcast_join_task joins it first).
	ifs  map[netip.Addr]ipoib.PKey
	woke <-chan struct{}
	// newKernel: cma_join_ib_multicast no longer checks
	// ib_sa_sendonly_fullmem_support (removed in 2021, "Remove racy
	// Subnet Manager sendonly join checks"): the SA gets the join.
	newKernel bool
	// qkeyFirst: cma_ib_mc_handler calls cma_set_qkey before making the
	// event and reports nothing when it fails (the upstream change that
	// moved it out of cma_make_mc_event); before, cma_make_mc_event's
	// cma_set_qkey failure is the id's MULTICAST_ERROR. With no event
	// the join times out, as ibvSA.join does after 4 s.
	qkeyFirst bool

	mu      sync.Mutex
	members map[ipoib.GID]bool // this port's rdma_cm memberships: MGID → send-only
	paths   []pathQuery        // path record queries asked
	joined  []joinReq          // joins asked
	errs    chan mcastError
	// joinHook, when set, runs as each join starts (tests hold joins
	// with it); refuse, when set, fails every join as it says.
	joinHook func(joinReq)
	// pathHook, when set, runs as each path record query starts.
	pathHook func(pathQuery)
	refuse   *refusal
	closed   bool // the device was closed (ibvSA.close)
	late     int  // joins and leaves after the close: ids used after free
}

// port adds a host with port GID gid and P_Key table pkeys to the subnet.
func (sm *fakeSM) port(gid ipoib.GID, pkeys ...ipoib.PKey) *fakeSA {
	sa := &fakeSA{sm: sm, gid: gid, pkeys: pkeys, ifs: map[netip.Addr]ipoib.PKey{},
		members: map[ipoib.GID]bool{}, errs: make(chan mcastError, 256)}
	sm.mu.Lock()
	sm.ports = append(sm.ports, sa)
	sm.mu.Unlock()
	return sa
}

// ipoibIf gives the host an IPoIB interface in partition pkey with
// address addr; its kernel joins the partition's broadcast group.
func (sa *fakeSA) ipoibIf(pkey ipoib.PKey, addr string) {
	sa.ifs[netip.MustParseAddr(addr)] = pkey.Full()
	sa.sm.mu.Lock()
	defer sa.sm.mu.Unlock()
	sa.sm.kernelJoin(sa.gid, pkey.Full())
}

// kernelJoin is the host's IPoIB joining its broadcast group: the SM
// creates it with its configured Q_Key and MTU. Called with sm.mu held.
func (sm *fakeSM) kernelJoin(gid ipoib.GID, pkey ipoib.PKey) {
	mgid := ipoib.BroadcastMGID(pkey, ipoib.ScopeLinkLocal)
	g := sm.groups[mgid]
	if g == nil {
		g = &fakeGroup{mlid: sm.nextMLID, qkey: sm.qkey, mtu: sm.mtu, sl: sm.sl[pkey], kernel: map[ipoib.GID]bool{}, ids: map[ipoib.GID]bool{}}
		sm.nextMLID++
		sm.groups[mgid] = g
	}
	g.kernel[gid] = true
}

// lid is the LID of port gid (0: not in the subnet).
func (sm *fakeSM) lid(gid ipoib.GID) uint16 {
	for i, p := range sm.ports {
		if p.gid == gid {
			return sm.lidBase + uint16(i)
		}
	}
	return 0
}

// restart is the SM restarting with another configuration. The ports get
// new LIDs and the SA forgets its groups. The hosts' IPoIB rejoin their
// broadcast groups, created again with the new Q_Key and MTU. Every
// rdma_cm membership gets a MULTICAST_ERROR (-ENETRESET), as
// multicast.c's mcast_event_handler makes mcast_groups_event report to
// each member on CLIENT_REREGISTER. The caller raises the devices'
// CLIENT_REREGISTER.
func (sm *fakeSM) restart(qkey uint32, mtu int) {
	sm.mu.Lock()
	sm.qkey, sm.mtu = qkey, mtu
	sm.lidBase += 100
	sm.groups = map[ipoib.GID]*fakeGroup{}
	ports := sm.ports
	for _, p := range ports {
		for _, pk := range p.ifs {
			sm.kernelJoin(p.gid, pk)
		}
	}
	sm.mu.Unlock()
	for _, p := range ports {
		p.mu.Lock()
		for mgid, so := range p.members {
			p.errs <- mcastError{mgid: mgid, sendOnly: so, err: unix.ENETRESET}
		}
		clear(p.members)
		p.mu.Unlock()
	}
}

// dropGroup is the SA deleting a group: its members' ids get a
// MULTICAST_ERROR.
func (sm *fakeSM) dropGroup(mgid ipoib.GID) {
	sm.mu.Lock()
	delete(sm.groups, mgid)
	ports := sm.ports
	sm.mu.Unlock()
	for _, p := range ports {
		p.mu.Lock()
		if so, ok := p.members[mgid]; ok {
			delete(p.members, mgid)
			p.errs <- mcastError{mgid: mgid, sendOnly: so, err: unix.ENETRESET}
		}
		p.mu.Unlock()
	}
}

// cmaSelectIBPS is cma.c cma_select_ib_ps for an AF_IB source whose
// sib_sid and sib_sid_mask are 0 (the mask makes every service ID match):
// RDMA_PS_IB, TCP and UDP are taken; any other, RDMA_PS_IPOIB among
// them, makes cma_get_port fail with -EPROTONOSUPPORT.
func cmaSelectIBPS(ps portSpace) error {
	switch ps {
	case psIB, 0x0106 /* RDMA_PS_TCP */, 0x0111 /* RDMA_PS_UDP */ :
		return nil
	}
	return fmt.Errorf("rdma_bind_addr (AF_IB, port space %#x): cma_select_ib_ps: %w", uint16(ps), unix.EPROTONOSUPPORT)
}

// pathRecord is rdma_resolve_addr then rdma_resolve_route on a fresh id
// with AF_IB addresses. rdma_bind_addr binds the source (cma_get_port →
// cma_select_ib_ps). Then cma_query_ib_route's path record query takes
// the SGID, the DGID and the P_Key from the source sockaddr_ib
// (cma_translate_ib → dev_addr), and the service ID from the destination
// (rdma_get_service_id). The SA answers as OpenSM's path record code
// does: both ports must be in the partition and one of them a full
// member (osm_physp_share_pkey).
func (sa *fakeSA) pathRecord(q pathQuery) (pathRec, error) {
	sa.mu.Lock()
	sa.paths = append(sa.paths, q)
	hook := sa.pathHook
	sa.mu.Unlock()
	if hook != nil {
		hook(q)
	}
	if err := cmaSelectIBPS(q.ps); err != nil {
		return pathRec{}, err
	}
	sm := sa.sm
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var dst *fakeSA
	for _, p := range sm.ports {
		if p.gid == q.dgid {
			dst = p
		}
	}
	if dst == nil || q.sgid != sa.gid {
		return pathRec{}, fmt.Errorf("ROUTE_ERROR: no path record to %s: %w", q.dgid, unix.EHOSTUNREACH)
	}
	if !sharesPKey(sa.pkeys, dst.pkeys, q.pkey) {
		return pathRec{}, fmt.Errorf("ROUTE_ERROR: no path record to %s in partition %s: %w", q.dgid, q.pkey, unix.EHOSTUNREACH)
	}
	return pathRec{dlid: sm.lid(q.dgid), sl: sm.sl[q.pkey.Full()]}, nil
}

// sharesPKey is OpenSM's rule: both tables hold pkey's base and at
// least one as a full member.
func sharesPKey(a, b []ipoib.PKey, pkey ipoib.PKey) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Base() == pkey.Base() && y.Base() == pkey.Base() && (x.IsFull() || y.IsFull()) {
				return true
			}
		}
	}
	return false
}

// join is rdma_create_id, rdma_bind_addr and rdma_join_multicast_ex,
// then the id's MULTICAST_JOIN event.
func (sa *fakeSA) join(r joinReq) (mcMember, error) {
	sa.mu.Lock()
	hook := sa.joinHook
	sa.mu.Unlock()
	if hook != nil {
		hook(r)
	}
	sa.mu.Lock()
	sa.joined = append(sa.joined, r)
	if sa.closed {
		sa.late++
	}
	refuse := sa.refuse
	sa.mu.Unlock()
	if refuse != nil {
		return refuse.answer(r.mgid)
	}
	// rdma_bind_addr of an IP address: rdma_translate_ip finds the
	// interface holding it and copies its hardware and broadcast
	// addresses into the id (cma_translate_addr); an address no IPoIB
	// interface holds fails (cma_acquire_dev_by_src_ip: -ENODEV).
	pkey, ok := sa.ifs[r.bind.addr.WithZone("")]
	if !ok {
		return mcMember{}, fmt.Errorf("rdma_bind_addr %s: no IPoIB interface holds it: %w", r.bind.addr, unix.ENODEV)
	}
	sm := sa.sm
	sm.mu.Lock()
	defer sm.mu.Unlock()
	// cma_join_ib_multicast: ib_sa_get_mcmember_rec with the id's
	// broadcast MGID (ib_addr_get_mgid: the bound interface's broadcast
	// address) finds the group only if this port joined it (the kernel's
	// IPoIB did), else -EADDRNOTAVAIL.
	bc := sm.groups[ipoib.BroadcastMGID(pkey, ipoib.ScopeLinkLocal)]
	if bc == nil {
		return mcMember{}, fmt.Errorf("cma_join_ib_multicast: ib_sa_get_mcmember_rec: %w", unix.EADDRNOTAVAIL)
	}
	if !bc.has(sa.gid) {
		return mcMember{}, fmt.Errorf("cma_join_ib_multicast: ib_sa_get_mcmember_rec: %w", unix.EADDRNOTAVAIL)
	}
	// cma_set_qkey(id, 0): RDMA_PS_IPOIB takes the broadcast group's
	// Q_Key; RDMA_PS_UDP and RDMA_PS_IB take RDMA_UDP_QKEY.
	qkey := uint32(rdmaUDPQKey)
	if r.ps == psIPoIB {
		qkey = bc.qkey
	}
	// cma_join_ib_multicast (kernels 4.9 to 5.11): a send-only join when
	// the SA lacks send-only full members (ib_sa_sendonly_fullmem_support)
	// fails with -EOPNOTSUPP.
	// Since then the SA gets the join and an SM without them refuses it:
	// the id's MULTICAST_ERROR.
	if r.sendOnly && !sm.sendOnly {
		if sa.newKernel {
			return saRefusal.answer(r.mgid)
		}
		return mcMember{}, fmt.Errorf("cma_join_ib_multicast: SM doesn't support Send Only Full Member option: %w", unix.EOPNOTSUPP)
	}
	// The SA joins the port (rec.pkey and the MTU, rate and hop limit
	// of the broadcast group for RDMA_PS_IPOIB), making the group when
	// it does not exist.
	g := sm.groups[r.mgid]
	if g == nil {
		g = &fakeGroup{mlid: sm.nextMLID, qkey: qkey, mtu: bc.mtu, sl: sm.sl[pkey], kernel: map[ipoib.GID]bool{}, ids: map[ipoib.GID]bool{}}
		sm.nextMLID++
		sm.groups[r.mgid] = g
	}
	// cma_make_mc_event: cma_set_qkey(id, rec.qkey) refuses a group
	// whose Q_Key is not the id's (-EINVAL): a MULTICAST_ERROR.
	if g.qkey != qkey {
		if sa.qkeyFirst { // cma_ib_mc_handler: cma_set_qkey failed, no event sent
			return saSilence.answer(r.mgid)
		}
		return saRefusal.answer(r.mgid)
	}
	g.ids[sa.gid] = r.sendOnly
	sa.mu.Lock()
	sa.members[r.mgid] = r.sendOnly
	sa.mu.Unlock()
	// The MULTICAST_JOIN event: ah_attr.dlid is the MLID, ah_attr.sl
	// the SL, param.ud.qkey the Q_Key (cma_make_mc_event); the MTU is
	// what a path record to the MGID gives (OpenSM pr_process_multicast
	// copies the group's).
	m, err := joinAnswer(r.mgid, cmEvent{kind: cmJoined, typ: rdmaCMEventMulticastJoin, dlid: g.mlid, sl: g.sl, qkey: g.qkey}, "RDMA_CM_EVENT_MULTICAST_JOIN")
	m.mtu = g.mtu
	if sm.noPathMTU {
		m.mtu = 0
	}
	return m, err
}

// The rdma_cm events of a join's id (enum rdma_cm_event_type, librdmacm
// rdma_cma.h).
const (
	rdmaCMEventMulticastJoin  = 12
	rdmaCMEventMulticastError = 13
)

// refusal is how the fake SA fails a join, as the kernel tells the
// join's id: an event with its status, or no event at all (silent).
// Production's mapping (joinAnswer, errNoJoinAnswer) makes the error.
type refusal struct {
	ev     cmEvent
	silent bool
}

var (
	// saRefusal is an SA that answers with a MAD status, or a group
	// whose Q_Key is not the id's: RDMA_CM_EVENT_MULTICAST_ERROR with
	// -EINVAL (sa_query.c recv_handler; cma_set_qkey).
	saRefusal = refusal{ev: cmEvent{kind: cmError, typ: rdmaCMEventMulticastError, status: -int(unix.EINVAL)}}
	// saSilence is an SA that never answers (or a kernel that sends no
	// event): the join's time runs out.
	saSilence = refusal{silent: true}
)

// answer is what the join of mgid returns for the refusal.
func (r refusal) answer(mgid ipoib.GID) (mcMember, error) {
	if r.silent {
		return mcMember{}, errNoJoinAnswer(mgid)
	}
	return joinAnswer(mgid, r.ev, "RDMA_CM_EVENT_MULTICAST_ERROR")
}

// leave is rdma_leave_multicast and rdma_destroy_id.
func (sa *fakeSA) leave(mgid ipoib.GID, sendOnly bool) {
	sa.mu.Lock()
	if sa.closed {
		sa.late++
	}
	if so, ok := sa.members[mgid]; ok && so == sendOnly {
		delete(sa.members, mgid)
	}
	sa.mu.Unlock()
	sa.sm.mu.Lock()
	if g := sa.sm.groups[mgid]; g != nil {
		delete(g.ids, sa.gid)
	}
	sa.sm.mu.Unlock()
}

// portErr is the port going down: multicast.c's mcast_event_handler
// reports IB_EVENT_PORT_ERR to every member of every group of the port
// (mcast_groups_event: -ENETRESET). The caller raises the device's
// PORT_ERR.
func (sa *fakeSA) portErr() {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	for mgid, so := range sa.members {
		sa.errs <- mcastError{mgid: mgid, sendOnly: so, err: unix.ENETRESET}
	}
	clear(sa.members)
}

// close is ibvSA.close: every membership is left, and the ids are freed.
func (sa *fakeSA) close() {
	sa.mu.Lock()
	clear(sa.members)
	sa.closed = true
	sa.mu.Unlock()
}

func (sa *fakeSA) waitEvent() (mcastError, bool, error) {
	select {
	case e := <-sa.errs:
		return e, true, nil
	case <-sa.woke:
		return mcastError{}, false, nil
	}
}

// member reports the port's membership of mgid: joined, send-only.
func (sa *fakeSA) member(mgid ipoib.GID) (bool, bool) {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	so, ok := sa.members[mgid]
	return ok, so
}

// lookup is the Port's ipoibAddr hook over the host's fake IPoIB
// interfaces: pickIPoIB over one interface per address, with the port
// GID in its hardware address and the partition in its broadcast one,
// up, in datagram mode. Its carrier is on (joined) while its kernel
// IPoIB is a member of the broadcast group, and then its MTU is the
// group's IPoIB MTU, as ipoib_mcast_join_finish (mcast_mtu =
// IPOIB_UD_MTU of the group's) and ipoib_mcast_carrier_on_task
// (dev_set_mtu, netif_carrier_on) leave it.
func (sa *fakeSA) lookup(gid ipoib.GID, pkey ipoib.PKey) (ipoibBind, error) {
	var ifs []ipoibIf
	sa.sm.mu.Lock()
	for a, pk := range sa.ifs {
		hw := make([]byte, ipoib.HwAddrLen)
		copy(hw[4:], sa.gid[:])
		bc := ipoib.BroadcastMGID(pk, ipoib.ScopeLinkLocal)
		f := ipoibIf{name: fmt.Sprintf("ib0.%04x", uint16(pk)), index: 5 + len(ifs), hw: hw,
			bcast: append([]byte{0, 0xff, 0xff, 0xff}, bc[:]...), addrs: []netip.Addr{a}, up: true}
		if g := sa.sm.groups[bc]; g != nil && g.kernel[sa.gid] {
			f.joined, f.mtu = true, g.mtu-4
		}
		ifs = append(ifs, f)
	}
	sa.sm.mu.Unlock()
	return pickIPoIB(ifs, gid, pkey)
}
