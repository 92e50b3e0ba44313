// Package fakekernel is a fake, for tests, of the kernel boundary of the
// kernel IPoIB backend (kernelfabric.Kernel), which behaves as the
// kernel code does. It models:
//   - IPoIB children created over netlink (several may share a P_Key);
//   - packet sockets that check sockaddr_ll and packet_mreq_max bytes as
//     af_packet.c does, and receive with no source address (sll_halen
//     0);
//   - a multicast copy on every joined child of every host, except the
//     sender's own QP, as the driver drops what its QP sent;
//   - the driver's implicit memberships (broadcast, all-hosts,
//     all-nodes);
//   - P_Key checks, sysctls and carrier events;
//   - the fast path's maps and the programs' hit counts (FastMaps).
//
// Hosts on one Fabric reach each other.
package fakekernel

import (
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/ipoib"
)

// scope is the MGID scope of every fake broadcast group.
const scope = ipoib.ScopeLinkLocal

// Fabric connects fake hosts.
type Fabric struct {
	mu    sync.Mutex
	hosts []*Kernel
	ibFabric
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{} }

// SuperPacket records a GSO send (the fake does not cut it).
type SuperPacket struct {
	Hdr kf.VnetHdr
	Len int // bytes after the virtio_net_hdr
}

// Kernel is one fake host. Its exported fields are test knobs, set before
// use.
type Kernel struct {
	f   *Fabric
	gid ipoib.GID
	// TSOOn makes children advertise TSO.
	TSOOn bool
	// ModeOf is the parent's mode ("datagram"; SetConnected makes it
	// "connected").
	ModeOf string
	// NoIPv6 is a kernel booted with ipv6.disable=1: no
	// /proc/sys/net/ipv6 (inet6_init stops before ipv6_sysctl_register
	// and addrconf_init).
	NoIPv6 bool
	// NoQueueFix is a kernel without commit dbc94a0fb817 ("IB/IPoIB:
	// Fix queue count inconsistency for PKEY child interfaces", Linux
	// 6.2): ipoib_link_ops has no get_num_rx_queues, so rtnl_create_link
	// gives a netlink child one receive queue whatever its parent has.
	NoQueueFix bool
	// RefuseFewerQueues is mlx5's enhanced IPoIB from Linux 6.2:
	// mlx5i_pkey_dev_init refuses (EINVAL) a child with fewer receive
	// queues than its parent.
	RefuseFewerQueues bool
	// LinkQueue is how many link notifications a subscription holds
	// unread before it overruns (LinkQueueLen when 0).
	LinkQueue int
	IBKnobs

	mu sync.Mutex
	// udMTU is IPOIB_UD_MTU(max_ib_mtu), the port's: a child's MTU
	// before its join and the most its join gives it, whatever the
	// parent's mode (ipoib_child_init, ipoib_ndo_init).
	udMTU      int
	links      map[int]*link
	next       int
	nextQPN    uint32
	sysctls    map[string]string
	subs       []*sub
	overrun    bool // OverrunLinks: notifications are lost
	refuseSubs int  // RefuseSubscriptions
	filtered   uint64
	supers     []SuperPacket
}

type link struct {
	kf.Link
	pkey  ipoib.PKey
	noarp bool
	gro   bool
	mc    map[ipoib.HwAddr]int // the device multicast list (dev_mc_add refcounts)
	socks []*socket
	ib    ibLink
}

// sub is an RTNLGRP_LINK subscription: ch is its socket's receive
// queue.
type sub struct {
	ch    chan kf.Link
	onErr func(error)
	ended chan struct{} // closed when the subscription ends
}

var _ kf.Kernel = (*Kernel)(nil)

// NewHost adds a host with port GID gid and an IPoIB parent interface
// named parent with IPoIB MTU mtu, up, carrier on, datagram mode.
func (f *Fabric) NewHost(gid ipoib.GID, parent string, mtu int) *Kernel {
	k := &Kernel{f: f, gid: gid, ModeOf: "datagram", udMTU: mtu, links: make(map[int]*link), next: 1, nextQPN: 0x100, sysctls: make(map[string]string)}
	k.links[1] = &link{Link: kf.Link{Index: 1, Name: parent, Kind: "ipoib", MTU: mtu, HwAddr: ipoib.MakeHwAddr(0x80, 0x48, gid), Up: true, Carrier: true, RxQueues: 1, PKey: ipoib.DefaultPKey},
		pkey: ipoib.DefaultPKey, mc: make(map[ipoib.HwAddr]int)}
	k.next = 2
	f.mu.Lock()
	f.hosts = append(f.hosts, k)
	f.mu.Unlock()
	return k
}

func (k *Kernel) byName(name string) *link {
	for _, l := range k.links {
		if l.Name == name {
			return l
		}
	}
	return nil
}

// LinkByName returns the named link (ENODEV when there is none).
func (k *Kernel) LinkByName(name string) (kf.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.byName(name); l != nil {
		return l.Link, nil
	}
	return kf.Link{}, unix.ENODEV
}

// Links lists every link.
func (k *Kernel) Links() ([]kf.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []kf.Link
	for _, l := range k.links {
		out = append(out, l.Link)
	}
	return out, nil
}

// ChildIndexes maps the names of the host's IPoIB children (the links
// with a parent) to their ifindexes.
func (k *Kernel) ChildIndexes() map[string]int {
	links, _ := k.Links()
	out := map[string]int{}
	for _, l := range links {
		if l.ParentIndex != 0 {
			out[l.Name] = l.Index
		}
	}
	return out
}

// AddChild creates a child as ipoib_new_child_link does. The parent must
// be an IPoIB interface that is no child (EINVAL). The P_Key gets the
// full-membership bit, and 0/0x8000 are refused. Children created this
// way may share a P_Key with the parent and each other: is_child_unique
// checks only legacy sysfs children. Names are unique (EEXIST) and valid
// (EINVAL: validName).
func (k *Kernel) AddChild(c kf.ChildSpec) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.links[c.Parent]
	if p == nil || p.Kind != "ipoib" {
		return unix.ENODEV
	}
	if p.ParentIndex != 0 {
		return unix.EINVAL
	}
	if k.byName(c.Name) != nil {
		return unix.EEXIST
	}
	if !validName(c.Name) {
		return unix.EINVAL
	}
	pkey := c.PKey | 0x8000
	if pkey == 0x8000 {
		return unix.EINVAL
	}
	rxq := p.RxQueues // ipoib_get_max_num_queues: the parent's, at least
	if k.NoQueueFix {
		rxq = 1
	}
	if k.RefuseFewerQueues && rxq < p.RxQueues {
		return unix.EINVAL
	}
	k.nextQPN++
	l := &link{Link: kf.Link{Index: k.next, ParentIndex: c.Parent, Name: c.Name, Kind: "ipoib", MTU: k.udMTU, RxQueues: rxq,
		HwAddr: ipoib.MakeHwAddr(0, k.nextQPN, k.gid), PKey: pkey}, pkey: pkey, gro: true, mc: make(map[ipoib.HwAddr]int)}
	k.links[k.next] = l
	k.next++
	return nil
}

// SetNextIndex makes i the interface index of the next link made, and
// the indexes after it follow: the emulated IPoIB wire (package
// kernelfabric/emuib/testbed) gives each child a real veth with the
// fake child's index, so that the fast path's maps name real devices.
// No link may have index i or above yet.
func (k *Kernel) SetNextIndex(i int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next = i
}

// validName is net/core/dev.c dev_valid_name: 1 to IFNAMSIZ - 1 bytes,
// not "." or "..", no '/', ':' or white space.
func validName(name string) bool {
	return name != "" && len(name) <= kf.MaxNameLen && name != "." && name != ".." && !strings.ContainsAny(name, "/: \t\n\v\f\r")
}

// DelLink deletes a link; sockets bound to it fail with ENETDOWN.
func (k *Kernel) DelLink(index int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.links[index]
	if l == nil {
		return unix.ENODEV
	}
	delete(k.links, index)
	for _, s := range l.socks {
		s.detach()
	}
	return nil
}

// SetUp brings a link up; a child gets carrier once it joined its
// broadcast group (ib.go). A link up already is left as it is:
// __dev_change_flags (net/core/dev.c) opens the device only when
// IFF_UP changes.
func (k *Kernel) SetUp(index int) error {
	return k.withLink(index, func(l *link) {
		if !l.Up {
			l.Up = true
			k.open(l)
		}
	})
}

// SetNoARP sets IFF_NOARP.
func (k *Kernel) SetNoARP(index int) error {
	return k.withLink(index, func(l *link) { l.noarp = true })
}

func (k *Kernel) withLink(index int, f func(*link)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.links[index]
	if l == nil {
		return unix.ENODEV
	}
	f(l)
	return nil
}

// SetRxQueues gives the parent n receive queues, as mlx5's enhanced
// IPoIB does (one per channel), for children made after.
func (k *Kernel) SetRxQueues(n int) {
	k.mu.Lock()
	k.links[1].RxQueues = n
	k.mu.Unlock()
}

// SetParentUp sets the parent administratively up or down (ip link set
// ib0 up/down). Down, it loses IFF_LOWER_UP (dev_get_flags: not running)
// and takes every child down with it (ipoib_stop: "Bring down any child
// interfaces too"). Up, it brings every child up again (ipoib_open),
// each joining again.
func (k *Kernel) SetParentUp(up bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !up {
		k.portState(false)
	}
	var changed []kf.Link
	for _, l := range k.links {
		l.Up = up
		changed = append(changed, l.Link)
	}
	k.notify(changed)
	if up {
		k.portState(true)
	}
}

// SetConnected puts the parent in connected mode as ipoib_set_mode
// does: IPOIB_FLAG_ADMIN_CM set and the MTU raised to IPOIB_CM_MTU
// (65520; the admin MTU being the largest). Children made after keep
// the datagram mode their request asks for (IFLA_IPOIB_MODE 0:
// ipoib_changelink) and the port's UD MTU (ipoib_child_init copies
// max_ib_mtu, not the parent's MTU).
func (k *Kernel) SetConnected() {
	k.mu.Lock()
	k.ModeOf = "connected"
	p := k.links[1]
	p.MTU = 65520
	k.notify([]kf.Link{p.Link})
	k.mu.Unlock()
}

// Mode returns ModeOf for the parent and a child's mode (SetChildMode)
// for a child.
func (k *Kernel) Mode(name string) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.byName(name)
	if l == nil {
		return "", unix.ENODEV
	}
	if l.ParentIndex == 0 {
		return k.ModeOf, nil
	}
	if l.Mode == kf.ModeConnected {
		return "connected", nil
	}
	return "datagram", nil
}

// SetChildMode sets a child's IFLA_IPOIB_MODE and IFLA_IPOIB_UMCAST, as
// ipoib_changelink does (AddChild makes it datagram, umcast 0, as the
// backend asks), for a test of a child that someone changed.
func (k *Kernel) SetChildMode(name string, mode, umcast uint16) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.byName(name)
	if l == nil || l.ParentIndex == 0 {
		return unix.ENODEV
	}
	l.Mode, l.Umcast = mode, umcast
	return nil
}

// WriteSysctl records a write to an entry of /proc/sys/net/ipv4/conf/DEV
// or /proc/sys/net/ipv6/conf/DEV (DEV a link, "all" or "default"). Any
// other path is ENOENT, as proc_sys_lookup finds no entry; so is any
// IPv6 path under NoIPv6, a missing device or a key the kernel does not
// have there. devinet_sysctl_register and addrconf_sysctl_register make
// one directory a device.
func (k *Kernel) WriteSysctl(path, value string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	rest, ok := strings.CutPrefix(path, "net/")
	fam, rest, _ := strings.Cut(rest, "/")
	rest, ok2 := strings.CutPrefix(rest, "conf/")
	dev, key, _ := strings.Cut(rest, "/")
	if !ok || !ok2 || !confKeys[fam][key] || dev != "all" && dev != "default" && k.byName(dev) == nil || fam == "ipv6" && k.NoIPv6 {
		return unix.ENOENT
	}
	k.sysctls[path] = value
	return nil
}

// HasIPv6 is !NoIPv6.
func (k *Kernel) HasIPv6() (bool, error) { return !k.NoIPv6, nil }

// confKeys are the per-device entries the fake knows, a part of
// net/ipv4/devinet.c devinet_sysctl and net/ipv6/addrconf.c
// addrconf_sysctl.
var confKeys = map[string]map[string]bool{
	"ipv4": {"forwarding": true, "rp_filter": true, "arp_ignore": true, "arp_announce": true, "arp_filter": true,
		"accept_redirects": true, "send_redirects": true, "accept_local": true, "proxy_arp": true, "mc_forwarding": true},
	"ipv6": {"addr_gen_mode": true, "disable_ipv6": true, "forwarding": true, "accept_ra": true, "accept_dad": true,
		"autoconf": true, "mtu": true, "accept_redirects": true, "hop_limit": true},
}

// Sysctl returns what was written to /proc/sys/path.
func (k *Kernel) Sysctl(path string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sysctls[path]
}

// TSO reports TSOOn.
func (k *Kernel) TSO(name string) (bool, error) {
	if _, err := k.LinkByName(name); err != nil {
		return false, err
	}
	return k.TSOOn, nil
}

// DisableGRO turns GRO off.
func (k *Kernel) DisableGRO(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.byName(name)
	if l == nil {
		return unix.ENODEV
	}
	l.gro = false
	return nil
}

// State is a test's view of a link's host-facing settings.
type State struct {
	kf.Link
	PKey  ipoib.PKey
	NoARP bool
	GRO   bool
}

// Link returns the state of the named link.
func (k *Kernel) Link(name string) (State, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.byName(name)
	if l == nil {
		return State{}, false
	}
	return State{Link: l.Link, PKey: l.pkey, NoARP: l.noarp, GRO: l.gro}, true
}

// SuperPackets returns the GSO sends recorded.
func (k *Kernel) SuperPackets() []SuperPacket {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]SuperPacket(nil), k.supers...)
}

// LinkQueueLen is the default of Kernel.LinkQueue.
const LinkQueueLen = 1024

// SubscribeLinks sends link changes until done is closed or the
// subscription's queue (LinkQueue notifications) overflows. On overflow
// netlink_overrun reports ENOBUFS and vishvananda/netlink's reader ends
// on it. So onErr is told ENOBUFS, and the channel is closed once what
// was queued has been read.
func (k *Kernel) SubscribeLinks(done <-chan struct{}, onErr func(error)) (<-chan kf.Link, error) {
	k.mu.Lock()
	if k.refuseSubs > 0 {
		k.refuseSubs--
		k.mu.Unlock()
		return nil, unix.ENOMEM // netlink_insert, netlink_alloc_groups
	}
	n := k.LinkQueue
	if n <= 0 {
		n = LinkQueueLen
	}
	s := &sub{ch: make(chan kf.Link, n), onErr: onErr, ended: make(chan struct{})}
	k.subs = append(k.subs, s)
	k.mu.Unlock()
	go func() {
		select {
		case <-done:
			k.mu.Lock()
			k.endSub(s, nil)
			k.mu.Unlock()
		case <-s.ended:
		}
	}()
	return s.ch, nil
}

// RefuseSubscriptions makes the next n SubscribeLinks calls fail
// (ENOMEM, as a netlink socket's creation or group allocation may).
func (k *Kernel) RefuseSubscriptions(n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refuseSubs = n
}

// OverrunLinks runs change with every link subscription overrun: its
// notifications are lost (netlink_overrun drops what does not fit the
// receive buffer), then each subscriber is told ENOBUFS and its channel
// closed once what was queued before has been read.
func (k *Kernel) OverrunLinks(change func()) {
	k.mu.Lock()
	k.overrun = true
	k.mu.Unlock()
	change()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.overrun = false
	for len(k.subs) > 0 {
		k.endSub(k.subs[0], unix.ENOBUFS)
	}
}

// endSub ends subscription s (k.mu held), telling its onErr err if not
// nil.
func (k *Kernel) endSub(s *sub, err error) {
	for i, x := range k.subs {
		if x == s {
			k.subs = append(k.subs[:i], k.subs[i+1:]...)
			close(s.ch)
			close(s.ended)
			if err != nil && s.onErr != nil {
				s.onErr(err)
			}
			return
		}
	}
}

// SetCarrier switches the parent's carrier (the port's physical state)
// and its children's with it, and notifies subscribers.
func (k *Kernel) SetCarrier(up bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.portState(up)
}

// broadcast returns the 20-byte broadcast address of a link (the
// parent's with the link's P_Key, ipoib_dev_init).
func (l *link) broadcast() ipoib.HwAddr {
	return kf.McastHwAddr(ipoib.BroadcastMGID(l.pkey, scope))
}

// member reports whether the link's QP is attached to group a. That is
// the driver's broadcast group, the all-hosts and all-nodes groups the
// IPv4 and IPv6 stacks join on every interface, and the device multicast
// list entries the driver accepts. ipoib_mcast_addr_is_valid accepts the
// same reserved bytes, scope, signature low byte and P_Key as the
// broadcast address.
func (l *link) member(a ipoib.HwAddr) bool {
	if !l.attached() {
		return false
	}
	bc := l.broadcast()
	if a == bc || a == kf.McastHwAddr(ipoib.IPv4MGID(allHosts, l.pkey, scope)) || a == kf.McastHwAddr(ipoib.IPv6MGID(allNodes, l.pkey, scope)) {
		return true
	}
	if l.mc[a] == 0 {
		return false
	}
	return [6]byte(a[:6]) == [6]byte(bc[:6]) && [3]byte(a[7:10]) == [3]byte(bc[7:10])
}

// OpenPacketWith opens a SOCK_DGRAM socket with options o bound to
// ifindex (ENODEV when there is none: packet_do_bind). It receives only
// o.Protocol (every protocol when 0), as packet_do_bind hooks it.
func (k *Kernel) OpenPacketWith(ifindex int, o kf.PacketOptions) (kf.Socket, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.links[ifindex]
	if l == nil {
		return nil, unix.ENODEV
	}
	s := &socket{k: k, l: l, vnet: o.Vnet, proto: o.Protocol, seeOut: o.SeeOutgoing, hostOnly: o.HostOnly, ready: make(chan struct{}, 1), mc: make(map[mcKey]int)}
	l.socks = append(l.socks, s)
	return s, nil
}

// Filtered counts the packets the sockets' HostOnly filters dropped
// (the kernel counts them nowhere a socket sees; the fake does, for
// tests).
func (k *Kernel) Filtered() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.filtered
}

// DevMcast returns the multicast list of link ifindex as
// /proc/net/dev_mcast shows it: each address in hex and its user count
// (dev_mc_add references).
func (k *Kernel) DevMcast(ifindex int) map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]int)
	if l := k.links[ifindex]; l != nil {
		for a, n := range l.mc {
			out[hex.EncodeToString(a[:])] = n
		}
	}
	return out
}

func (f *Fabric) host(gid ipoib.GID) *Kernel {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.hosts {
		if h.gid == gid {
			return h
		}
	}
	return nil
}

func (f *Fabric) all() []*Kernel {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Kernel(nil), f.hosts...)
}

// datagram is one queued received packet.
type datagram struct {
	pkttype uint8
	proto   uint16
	ifindex int
	data    []byte
}

// rxQueueLen bounds a socket's receive queue (sk_rcvbuf).
const rxQueueLen = 4096

type socket struct {
	k      *Kernel
	vnet   bool
	proto  uint16 // bound protocol, 0 for all
	seeOut bool   // PACKET_IGNORE_OUTGOING off
	// hostOnly: the PACKET_HOST socket filter (run_filter in
	// packet_rcv, before anything is queued)
	hostOnly bool
	ready    chan struct{}

	mu     sync.Mutex
	l      *link // nil once the device is gone
	q      []datagram
	drops  uint64 // datagrams dropped for a full q since Drops last read it
	closed bool
	err    error
	mc     map[mcKey]int // struct packet_mclist entries and their counts
}

// mcKey is what packet_mc_add and packet_mc_drop match a struct
// packet_mclist entry on: ifindex, type, alen and alen address bytes.
type mcKey struct {
	ifindex   int32
	typ, alen uint16
	addr      [32]byte // MAX_ADDR_LEN, zero past alen
}

// wants reports whether the socket takes d: packet_do_bind hooked it to
// its protocol only (ETH_P_ALL: all of them).
func (s *socket) wants(proto uint16) bool { return s.proto == 0 || s.proto == proto }

func (s *socket) detach() {
	s.mu.Lock()
	s.l, s.err = nil, unix.ENETDOWN
	s.mu.Unlock()
	s.wake()
}

func (s *socket) wake() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Close closes the socket and drops its memberships (packet_release,
// packet_flush_mclist).
func (s *socket) Close() error {
	s.k.mu.Lock()
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		if s.l != nil {
			for i, x := range s.l.socks {
				if x == s {
					s.l.socks = append(s.l.socks[:i], s.l.socks[i+1:]...)
					break
				}
			}
		}
		for key := range s.mc {
			s.k.devMc(key, -1)
		}
		clear(s.mc)
	}
	s.mu.Unlock()
	s.k.mu.Unlock()
	s.wake()
	return nil
}

// devMc is packet_dev_mc on the device of key, if it still exists. A
// multicast entry adds to or takes from the device's multicast list
// (dev_mc_add / dev_mc_del) and must have the device's address length
// (EINVAL). Promiscuous, all-multicast and unknown types change nothing
// the fake models. A unicast entry is checked as a multicast one is.
// k.mu is held.
func (k *Kernel) devMc(key mcKey, what int) error {
	l := k.links[int(key.ifindex)]
	if l == nil {
		return nil
	}
	switch key.typ {
	case kf.PacketMRMulticast, packetMRUnicast:
		if int(key.alen) != ipoib.HwAddrLen {
			return unix.EINVAL
		}
	}
	if key.typ != kf.PacketMRMulticast {
		return nil
	}
	a := ipoib.HwAddr(key.addr[:ipoib.HwAddrLen])
	if l.mc[a] += what; l.mc[a] <= 0 {
		delete(l.mc, a)
	}
	return nil
}

// packetMRUnicast is PACKET_MR_UNICAST.
const packetMRUnicast = 3

// membership applies PACKET_ADD/DROP_MEMBERSHIP as packet_setsockopt
// (the option length: EINVAL), packet_mc_add and packet_mc_drop do. On
// add, an unknown device is ENODEV and an address longer than the
// device's is EINVAL. A request the socket already made is counted, not
// passed to the device again. A drop of what the socket never added
// succeeds and does nothing.
func (s *socket) membership(b []byte, add bool) error {
	m, err := kf.ParseMreq(b)
	if err != nil {
		return unix.EINVAL
	}
	key := mcKey{ifindex: m.Ifindex, typ: m.Type, alen: m.Alen}
	copy(key.addr[:], m.Addr)
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		if s.mc[key] > 0 {
			if s.mc[key]--; s.mc[key] == 0 {
				delete(s.mc, key)
				return s.k.devMc(key, -1)
			}
		}
		return nil
	}
	if s.k.links[int(m.Ifindex)] == nil {
		return unix.ENODEV
	}
	if int(m.Alen) > ipoib.HwAddrLen { // mr_alen > dev->addr_len
		return unix.EINVAL
	}
	if s.mc[key] > 0 {
		s.mc[key]++
		return nil
	}
	if err := s.k.devMc(key, 1); err != nil {
		return err
	}
	s.mc[key] = 1
	return nil
}

func (s *socket) AddMembership(b []byte) error  { return s.membership(b, true) }
func (s *socket) DropMembership(b []byte) error { return s.membership(b, false) }

// Send is sendmmsg over packet_snd: the checks of the name, the device
// and the length, then ipoib_start_xmit's routing.
func (s *socket) Send(msgs []kf.Msg) (int, error) {
	for i := range msgs {
		deliver, err := s.send(&msgs[i])
		if deliver != nil {
			deliver() // in order, after the sender's host is unlocked
		}
		if err != nil {
			if i == 0 {
				return 0, err
			}
			return i, nil
		}
		msgs[i].N = len(msgs[i].Hdr) + len(msgs[i].Buf)
	}
	return len(msgs), nil
}

func (s *socket) send(m *kf.Msg) (func(), error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, net.ErrClosed
	}
	// packet_snd: the name must hold a whole sockaddr_ll and sll_halen
	// address bytes; a SOCK_DGRAM send takes dev->addr_len bytes of
	// sll_addr whatever sll_halen says, so the name must hold those too
	// (checked only when the device exists: ENXIO otherwise). sll_family
	// is not checked.
	if m.NameLen < kf.SockaddrLLSize || m.NameLen > len(m.Name) {
		return nil, unix.EINVAL
	}
	if m.NameLen < int(m.Name[11])+12 {
		return nil, unix.EINVAL
	}
	proto := binary.BigEndian.Uint16(m.Name[2:4])
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	dev := k.links[int(int32(binary.NativeEndian.Uint32(m.Name[4:8])))]
	if dev != nil && m.NameLen < ipoib.HwAddrLen+12 { // SOCK_DGRAM: dev->addr_len + offsetof(sll_addr)
		return nil, unix.EINVAL
	}
	if dev == nil {
		return nil, unix.ENXIO
	}
	if !dev.Up {
		return nil, unix.ENETDOWN
	}
	dst := ipoib.HwAddr(m.Name[12 : 12+ipoib.HwAddrLen])
	pkt := append(append(make([]byte, 0, len(m.Hdr)+len(m.Buf)), m.Hdr...), m.Buf...)
	var h kf.VnetHdr
	if s.vnet {
		var err error
		if h, err = vnetParse(pkt); err != nil {
			return nil, err
		}
		pkt = pkt[kf.VnetHdrLen:]
	}
	if h.GSOType == kf.VnetGSONone && len(pkt) > dev.MTU {
		return nil, unix.EMSGSIZE // packet_extra_vlan_len_allowed holds only for Ethernet
	}
	var segs [][]byte
	if s.vnet {
		var err error
		if segs, err = vnetToSkb(h, pkt, dev.MTU); err != nil {
			return nil, err
		}
		if h.GSOType != kf.VnetGSONone {
			k.supers = append(k.supers, SuperPacket{Hdr: h, Len: len(pkt)})
		}
	}
	if segs == nil {
		segs = [][]byte{pkt}
	}
	if k.dropNoCarrier(dev) {
		return nil, nil // the noop qdisc drops before dev_queue_xmit_nit
	}
	// dev_queue_xmit_nit: a copy to every other socket of the device
	// bound to every protocol and not ignoring outgoing packets, before
	// the driver sees it (skb_loop_sk spares the sender).
	for _, o := range dev.socks {
		if o != s && o.proto == 0 && o.seeOut {
			for _, seg := range segs {
				o.push(datagram{pkttype: kf.PacketOutgoing, proto: proto, ifindex: dev.Index, data: seg})
			}
		}
	}
	switch proto {
	case 0x0800, 0x86dd, 0x0806, 0x8035:
	default:
		return nil, nil // ipoib_start_xmit: tx_dropped, the send still succeeds
	}
	pkey := dev.pkey
	if dst[4] == 0xff {
		// Multicast: the driver puts its own P_Key in the MGID.
		dst[8], dst[9] = byte(pkey>>8), byte(pkey)
		qpn := dev.HwAddr.QPN()
		return func() {
			for _, seg := range segs {
				k.f.multicast(k, qpn, pkey, dst, proto, seg)
			}
		}, nil
	}
	return func() {
		for _, seg := range segs {
			k.f.unicast(pkey, dst, proto, seg)
		}
	}, nil
}

// vnetParse is packet_snd_vnet_parse on the SOCK_RAW socket System opens
// for PACKET_VNET_HDR (packet_setsockopt takes it on no other type). The
// link header System puts in front of the data is part of pkt. The
// datagram must hold the virtio_net_hdr (EINVAL). With NEEDS_CSUM,
// hdr_len is raised to cover the checksum field. hdr_len longer than the
// link header and data is EINVAL.
func vnetParse(pkt []byte) (kf.VnetHdr, error) {
	h, err := kf.ParseVnetHdr(pkt)
	if err != nil {
		return h, unix.EINVAL
	}
	hdrLen := int(h.HdrLen)
	if h.Flags&kf.VnetNeedsCsum != 0 {
		hdrLen = max(hdrLen, int(h.CsumStart)+int(h.CsumOffset)+2)
	}
	if hdrLen > kf.IPoIBHardLen+len(pkt)-kf.VnetHdrLen {
		return h, unix.EINVAL
	}
	return h, nil
}

// vnetToSkb applies virtio_net_hdr_to_skb's checks
// (include/linux/virtio_net.h, Linux 6.12 and later) to data, what
// follows the virtio_net_hdr. Its offsets count from the IPoIB hard
// header in front of it (IPOIB_HARD_LEN). For a super-packet it returns
// the segments the receiver gets: the HCA's UD LSO (ipoib_send) or the
// kernel's software GSO (skb_gso_segment in validate_xmit_skb) cut it to
// gso_size, within the device MTU. The fake cuts TCP only. A
// super-packet it cannot cut is dropped on the way out, as GSO drops one
// it cannot (the send has succeeded): no segments.
func vnetToSkb(h kf.VnetHdr, data []byte, mtu int) ([][]byte, error) {
	gsoType := h.GSOType &^ vnetGSOECN
	thlen, nhMin := 0, 20 // sizeof(struct iphdr)
	if h.GSOType != kf.VnetGSONone {
		switch gsoType {
		case kf.VnetGSOTCPv4:
			thlen = 20 // sizeof(struct tcphdr)
		case kf.VnetGSOTCPv6:
			thlen, nhMin = 20, 40 // sizeof(struct ipv6hdr)
		case vnetGSOUDP, vnetGSOUDPL4:
			thlen = 8
		default:
			return nil, unix.EINVAL
		}
		if h.GSOSize == 0 {
			return nil, unix.EINVAL
		}
	}
	skbLen := kf.IPoIBHardLen + len(data)
	start, off := int(h.CsumStart), int(h.CsumOffset)
	csum := h.Flags&kf.VnetNeedsCsum != 0
	pOff := thlen
	if csum {
		// pskb_may_pull(start + max(thlen, off + 2)), skb_partial_csum_set
		// (the checksum field inside the packet), a transport header no
		// nearer than an IP header's length, and the whole of it.
		if start+max(thlen, off+2) > skbLen || start < nhMin {
			return nil, unix.EINVAL
		}
		pOff = start + thlen
	} else if h.GSOType != kf.VnetGSONone {
		return nil, unix.EINVAL // the fake does not dissect: the backend always sets NEEDS_CSUM
	}
	if h.GSOType == kf.VnetGSONone {
		return nil, nil
	}
	switch {
	case gsoType == vnetGSOUDPL4 && (!csum || off != 6 || h.GSOType != gsoType): // offsetof(struct udphdr, check)
		return nil, unix.EINVAL
	case (gsoType == kf.VnetGSOTCPv4 || gsoType == kf.VnetGSOTCPv6) && csum && off != 16: // offsetof(struct tcphdr, check)
		return nil, unix.EINVAL
	case h.GSOSize == 0xffff: // GSO_BY_FRAGS
		return nil, unix.EINVAL
	}
	nhOff := pOff
	if gsoType == vnetGSOUDP {
		nhOff -= thlen
	}
	if skbLen-nhOff <= int(h.GSOSize) {
		return nil, nil // "too small packets are not really GSO ones": sent as one
	}
	var sg gso.Segmenter
	if thlen != 20 || sg.Start(data, 0, start-kf.IPoIBHardLen, gsoType == kf.VnetGSOTCPv6, int(h.GSOSize), mtu) != nil {
		return [][]byte{}, nil
	}
	var segs [][]byte
	for !sg.Done() {
		b := make([]byte, sg.HdrLen()+sg.MSS())
		segs = append(segs, b[:sg.Cut(b)])
	}
	return segs, nil
}

// gso_type values beside the kernelfabric ones (linux/virtio_net.h).
const (
	vnetGSOUDP   = 3
	vnetGSOUDPL4 = 5
	vnetGSOECN   = 0x80
)

// multicast delivers to every attached QP of every host but the sender's.
func (f *Fabric) multicast(from *Kernel, qpn uint32, pkey ipoib.PKey, dst ipoib.HwAddr, proto uint16, data []byte) {
	for _, h := range f.all() {
		h.mu.Lock()
		for _, l := range h.links {
			if h == from && l.HwAddr.QPN() == qpn || !l.member(dst) || !ipoib.CanTalk(pkey, l.pkey) {
				continue
			}
			t := uint8(kf.PacketMulticast)
			if dst == l.broadcast() {
				t = kf.PacketBroadcast
			}
			l.deliver(datagram{pkttype: t, proto: proto, ifindex: l.Index, data: data})
		}
		h.mu.Unlock()
	}
}

// unicast delivers to the QP dst names if the P_Keys match (the HCA drops
// the rest silently).
func (f *Fabric) unicast(pkey ipoib.PKey, dst ipoib.HwAddr, proto uint16, data []byte) {
	h := f.host(dst.GID())
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.links {
		if l.HwAddr.QPN() == dst.QPN() && h.receives(l) && ipoib.CanTalk(pkey, l.pkey) {
			l.deliver(datagram{pkttype: kf.PacketHost, proto: proto, ifindex: l.Index, data: data})
		}
	}
}

// deliver queues d on every socket of the link bound to its protocol.
func (l *link) deliver(d datagram) {
	for _, s := range l.socks {
		if s.wants(d.proto) {
			s.push(d)
		}
	}
}

// push queues d (dropped when the queue is full, as sk_rcvbuf does),
// unless the socket's filter drops it first (counted in the host's
// Filtered; s.k.mu is held).
func (s *socket) push(d datagram) {
	if s.hostOnly && d.pkttype != kf.PacketHost {
		s.k.filtered++
		return
	}
	s.mu.Lock()
	switch {
	case s.closed:
	case len(s.q) < rxQueueLen:
		s.q = append(s.q, d)
	default:
		s.drops++ // packet_rcv's drop_n_acct: po->tp_drops
	}
	s.mu.Unlock()
	s.wake()
}

// Drops is PACKET_STATISTICS' tp_drops, reset as it is read
// (packet_getsockopt).
func (s *socket) Drops() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.drops
	s.drops = 0
	return n, nil
}

// Recv is recvmmsg over packet_recvmsg: the name says the packet type,
// protocol and interface, and no address (sll_halen 0: IPoIB has no
// header_ops->parse), padded to sizeof(struct sockaddr_ll).
func (s *socket) Recv(msgs []kf.Msg) (int, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, net.ErrClosed
		}
		if len(s.q) > 0 {
			n := min(len(s.q), len(msgs))
			for i := range n {
				s.fill(&msgs[i], s.q[i])
			}
			s.q = append(s.q[:0], s.q[n:]...)
			s.mu.Unlock()
			return n, nil
		}
		if err := s.err; err != nil {
			s.err = nil
			s.mu.Unlock()
			return 0, err
		}
		s.mu.Unlock()
		<-s.ready
	}
}

func (s *socket) fill(m *kf.Msg, d datagram) {
	var name [kf.SockaddrLLSize]byte
	binary.NativeEndian.PutUint16(name[0:2], unix.AF_PACKET)
	binary.BigEndian.PutUint16(name[2:4], d.proto)
	binary.NativeEndian.PutUint32(name[4:8], uint32(d.ifindex))
	binary.NativeEndian.PutUint16(name[8:10], kf.ARPHRDInfiniBand)
	name[10] = d.pkttype
	m.NameLen = copy(m.Name, name[:])
	pkt := d.data
	if s.vnet {
		pkt = append(make([]byte, kf.VnetHdrLen), d.data...)
	}
	m.N = copy(m.Hdr, pkt)
	m.N += copy(m.Buf, pkt[m.N:])
	m.Trunc = len(pkt) > len(m.Hdr)+len(m.Buf)
}

var (
	allHosts = netip.MustParseAddr("224.0.0.1")
	allNodes = netip.MustParseAddr("ff02::1")
)
