// Package fakekernel is a fake of the kernel boundary of the kernel IPoIB
// backend (kernelfabric.Kernel) that behaves as the kernel code does, for
// tests: IPoIB children created over netlink (several may share a P_Key),
// packet sockets that check sockaddr_ll and packet_mreq_max bytes as
// af_packet.c does, receive with no source address (sll_halen 0), a
// multicast copy on every joined child of every host (the sender's own QP
// excepted, as the driver drops what its QP sent), the driver's implicit
// memberships (broadcast, all-hosts, all-nodes), P_Key checks, sysctls
// and carrier events. Hosts on one Fabric reach each other.
package fakekernel

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
	kf "github.com/eipoib/eipoibd/ipoib/kernelfabric"
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
	// ModeOf is the parent's mode ("datagram").
	ModeOf string
	IBKnobs

	mu      sync.Mutex
	links   map[int]*link
	next    int
	nextQPN uint32
	sysctls map[string]string
	subs    []*sub
	supers  []SuperPacket
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

type sub struct {
	ch   chan kf.Link
	done <-chan struct{}
}

var _ kf.Kernel = (*Kernel)(nil)

// NewHost adds a host with port GID gid and an IPoIB parent interface
// named parent with IPoIB MTU mtu, up, carrier on, datagram mode.
func (f *Fabric) NewHost(gid ipoib.GID, parent string, mtu int) *Kernel {
	k := &Kernel{f: f, gid: gid, ModeOf: "datagram", links: make(map[int]*link), next: 1, nextQPN: 0x100, sysctls: make(map[string]string)}
	k.links[1] = &link{Link: kf.Link{Index: 1, Name: parent, Kind: "ipoib", MTU: mtu, HwAddr: ipoib.MakeHwAddr(0x80, 0x48, gid), Up: true, Carrier: true},
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

// AddChild creates a child as ipoib_new_child_link does: the parent must
// be an IPoIB interface that is no child (EINVAL), the P_Key gets the
// full-membership bit and 0/0x8000 are refused; children created this way
// may share a P_Key with the parent and each other (is_child_unique
// checks only legacy sysfs children). Names are unique (EEXIST).
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
	if len(c.Name) > kf.MaxNameLen || c.Name == "" {
		return unix.EINVAL
	}
	pkey := c.PKey | 0x8000
	if pkey == 0x8000 {
		return unix.EINVAL
	}
	k.nextQPN++
	l := &link{Link: kf.Link{Index: k.next, ParentIndex: c.Parent, Name: c.Name, Kind: "ipoib", MTU: p.MTU,
		HwAddr: ipoib.MakeHwAddr(0, k.nextQPN, k.gid)}, pkey: pkey, gro: true, mc: make(map[ipoib.HwAddr]int)}
	k.links[k.next] = l
	k.next++
	return nil
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
// broadcast group (ib.go).
func (k *Kernel) SetUp(index int) error {
	return k.withLink(index, func(l *link) { l.Up = true; k.open(l) })
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

// Mode returns ModeOf for the parent and "datagram" for children.
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
	return "datagram", nil
}

// WriteSysctl records a write to an existing interface's conf entry.
func (k *Kernel) WriteSysctl(path, value string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var fam, dev, key string
	if n, _ := fmt.Sscanf(path, "net/%4s", &fam); n != 1 {
		return unix.ENOENT
	}
	rest := path[len("net/"+fam+"/conf/"):]
	for i := range rest {
		if rest[i] == '/' {
			dev, key = rest[:i], rest[i+1:]
		}
	}
	if k.byName(dev) == nil || key == "" {
		return unix.ENOENT
	}
	k.sysctls[path] = value
	return nil
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

// SubscribeLinks sends link changes until done is closed.
func (k *Kernel) SubscribeLinks(done <-chan struct{}) (<-chan kf.Link, error) {
	s := &sub{ch: make(chan kf.Link), done: done}
	k.mu.Lock()
	k.subs = append(k.subs, s)
	k.mu.Unlock()
	go func() {
		<-done
		k.mu.Lock()
		for i, x := range k.subs {
			if x == s {
				k.subs = append(k.subs[:i], k.subs[i+1:]...)
				break
			}
		}
		close(s.ch)
		k.mu.Unlock()
	}()
	return s.ch, nil
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

// member reports whether the link's QP is attached to group a: the
// driver's broadcast group, the all-hosts and all-nodes groups the IPv4
// and IPv6 stacks join on every interface, and the device multicast list
// entries the driver accepts (ipoib_mcast_addr_is_valid: same reserved
// bytes, scope, signature low byte and P_Key as the broadcast address).
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

// OpenPacket opens a SOCK_DGRAM ETH_P_ALL socket bound to ifindex.
func (k *Kernel) OpenPacket(ifindex int, vnet bool) (kf.Socket, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.links[ifindex]
	if l == nil {
		return nil, unix.ENODEV
	}
	s := &socket{k: k, l: l, vnet: vnet, ready: make(chan struct{}, 1), mc: make(map[[kf.MreqMaxSize]byte]int)}
	l.socks = append(l.socks, s)
	return s, nil
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
	k     *Kernel
	vnet  bool
	ready chan struct{}

	mu     sync.Mutex
	l      *link // nil once the device is gone
	q      []datagram
	closed bool
	err    error
	mc     map[[kf.MreqMaxSize]byte]int
}

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
			for req, n := range s.mc {
				a := ipoib.HwAddr(req[8 : 8+ipoib.HwAddrLen])
				s.l.mc[a] -= n
			}
		}
	}
	s.mu.Unlock()
	s.k.mu.Unlock()
	s.wake()
	return nil
}

// membership applies PACKET_ADD/DROP_MEMBERSHIP as packet_setsockopt,
// packet_mc_add/packet_mc_drop and packet_dev_mc do.
func (s *socket) membership(b []byte, add bool) error {
	m, err := kf.ParseMreq(b)
	if err != nil {
		return unix.EINVAL
	}
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	l := s.k.links[int(m.Ifindex)]
	if l == nil {
		return unix.ENODEV
	}
	if int(m.Alen) > ipoib.HwAddrLen { // mr_alen > dev->addr_len
		return unix.EINVAL
	}
	if m.Type != kf.PacketMRMulticast || int(m.Alen) != ipoib.HwAddrLen { // packet_dev_mc
		return unix.EINVAL
	}
	var key [kf.MreqMaxSize]byte
	copy(key[:], b)
	a := ipoib.HwAddr(m.Addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		s.mc[key]++
		l.mc[a]++
		return nil
	}
	if s.mc[key] == 0 {
		return unix.EADDRNOTAVAIL
	}
	s.mc[key]--
	l.mc[a]--
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
	if m.NameLen < kf.SockaddrLLSize || m.NameLen > len(m.Name) {
		return nil, unix.EINVAL
	}
	halen := int(m.Name[11])
	if m.NameLen < halen+12 {
		return nil, unix.EINVAL
	}
	sa, err := kf.ParseSockaddrLL(m.Name, m.NameLen)
	if err != nil {
		return nil, unix.EINVAL
	}
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	dev := k.links[int(sa.Ifindex)]
	if dev == nil {
		return nil, unix.ENXIO
	}
	if m.NameLen < ipoib.HwAddrLen+12 { // SOCK_DGRAM: dev->addr_len + offsetof(sll_addr)
		return nil, unix.EINVAL
	}
	if !dev.Up {
		return nil, unix.ENETDOWN
	}
	if k.dropNoCarrier(dev) {
		return nil, nil
	}
	payload := m.Buf
	if s.vnet {
		if len(m.Hdr) != kf.VnetHdrLen {
			return nil, unix.EINVAL
		}
		h, _ := kf.ParseVnetHdr(m.Hdr)
		if int(h.HdrLen) > len(payload)+kf.IPoIBHardLen {
			return nil, unix.EINVAL
		}
		if h.GSOType != kf.VnetGSONone {
			k.supers = append(k.supers, SuperPacket{Hdr: h, Len: len(payload)})
			return nil, nil
		}
	}
	if len(payload) > dev.MTU {
		return nil, unix.EMSGSIZE
	}
	switch sa.Protocol {
	case 0x0800, 0x86dd, 0x0806, 0x8035:
	default:
		return nil, nil // ipoib_start_xmit: tx_dropped, the send still succeeds
	}
	dst := ipoib.HwAddr(sa.Addr)
	data := append([]byte(nil), payload...)
	if dst[4] == 0xff {
		// Multicast: the driver puts its own P_Key in the MGID.
		dst[8], dst[9] = byte(dev.pkey>>8), byte(dev.pkey)
		qpn, pkey := dev.HwAddr.QPN(), dev.pkey
		return func() { k.f.multicast(k, qpn, pkey, dst, sa.Protocol, data) }, nil
	}
	pkey := dev.pkey
	return func() { k.f.unicast(pkey, dst, sa.Protocol, data) }, nil
}

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

func (l *link) deliver(d datagram) {
	for _, s := range l.socks {
		s.mu.Lock()
		if len(s.q) < rxQueueLen && !s.closed {
			s.q = append(s.q, d)
		}
		s.mu.Unlock()
		s.wake()
	}
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
	m.N = copy(m.Buf, pkt)
	m.Trunc = len(pkt) > len(m.Buf)
}

var (
	allHosts = netip.MustParseAddr("224.0.0.1")
	allNodes = netip.MustParseAddr("ff02::1")
)
