// Package emukernel is an EMULATION of the kernel under eipoibd's
// kernel backend: Kernel is a kernelfabric.Kernel over package emuib's
// emulated IPoIB wire, which eipoibd built with the emuib tag runs
// with --fabric kernel (test/netns TestKernelBackendEmulated). The
// wire, the harness and the multicast program are loaded once and
// pinned in a bpffs directory (emuib.Fabric), so that the eipoibd of
// every hypervisor, each a process in a namespace of its own, shares
// them. A release of eipoibd never uses it.
//
// Real, from the running kernel (kernelfabric.System on veths): netlink
// (the link dump, lookups, the RTNLGRP_LINK subscription, up, NOARP,
// delete), carrier (IFF_LOWER_UP of a veth whose peer is up), the
// sysctls, ETHTOOL_SGRO, the packet sockets (bind, the PACKET_HOST
// filter, PACKET_IGNORE_OUTGOING, sendmmsg/recvmmsg, the ETH_P_ALL
// sockets before tc and the per-protocol ones after it), and the fast
// path's programs, maps and attachments as eipoibd makes them.
//
// Emulated, because only IPoIB has it:
//   - The parent (Config.Parent, a veth whose peer is in the fabric
//     namespace: there are no dummy devices here) is reported as an
//     IPoIB interface: kind ipoib, a 20-byte address (QPN 0x48 and
//     Config.GID), datagram mode, the IPoIB MTU Config.MTU, one
//     receive queue; its P_Key table is Config.PKeys.
//   - AddChild makes a veth pair, the child here and its fabric end in
//     the fabric namespace, puts the child's address in the wire's
//     Ends, attaches the multicast program and the wire at the fabric
//     end and the harness at the child, and makes the fabric end a member of the
//     partition's broadcast group, as the driver joins it on open
//     (ipoib_mcast_join_task). A child (named as the backend names
//     them) is reported as an IPoIB child of the parent: its address is
//     a QPN made of its ifindex and Config.GID, its MTU the parent's
//     (its veth's is ChildLinkMTU). DelLink undoes all of it. P_Key,
//     mode and umcast are not applied to anything: the veth has none.
//   - TSO is off on the parent and the children (see Kernel.TSO), so
//     the backend's PACKET_VNET_HDR sockets are not exercised here.
//   - A child's packet socket (Socket) is a SOCK_RAW one whose Send
//     writes ipoib_hard_header's 24-byte link header and whose Recv
//     takes the 24 bytes in front of L3 off, with ipoib's sockaddr_ll
//     (ARPHRD_INFINIBAND, no source address); a veth's SOCK_DGRAM
//     socket would build an Ethernet header from the first 6 bytes of
//     the 20-byte address (eth_header) and receive from the network
//     header, 10 bytes early before the harness ran.
//   - Multicast: a veth's multicast list takes no 20-byte address
//     (packet_mc_add), so a socket's PACKET_ADD_MEMBERSHIP and
//     PACKET_DROP_MEMBERSHIP make the child's fabric end a member of
//     the group on the wire (emuib.Multicast's Groups map), and the
//     multicast program replicates a frame to the multicast QPN to
//     every member but the sender, with a broadcast or multicast
//     Ethernet destination so that the child's pkt_type is
//     PACKET_BROADCAST or PACKET_MULTICAST, as ipoib sets it from the
//     GRH. There is no SA: every join succeeds at once, up to
//     emuib.MaxMembers children of each of emuib.MaxHosts hypervisors
//     a group.
//   - Carrier is the veth's: a child has it when it is up, at once; no
//     broadcast join delays it, and no P_Key outside the table or
//     failed join keeps it off.
//   - A child outlives the process, as an IPoIB child outlives eipoibd
//     (--persist adopts it): its attachments are pinned in the bpffs
//     directory (childPin) and its P_Key and fabric end are written in
//     the veth's alias (IFLA_IFALIAS, childAlias), where the next
//     process's NewKernel finds them (adoptChildren).
package emukernel

// Kernel: an emulated kernelfabric.Kernel, so that eipoibd's kernel
// backend (kernelfabric.Port, and the fast path over it) runs over the
// emulated wire. What a veth answers for real goes to the real kernel
// (kernelfabric.System); what only IPoIB has is emulated here. See the
// package comment for the list.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/nsenter"
	"github.com/eipoib/eipoibd/ipoib"
)

// Config configures an emulated Kernel. eipoibd built with the emuib
// tag reads it, as JSON, from $EIPOIB_EMUIB.
type Config struct {
	// Fabric is the namespace of the fabric ends.
	Fabric string
	// Pins is the bpffs directory emuib.NewFabric pinned the wire in.
	Pins string
	// Host numbers this hypervisor among those on the wire, 0 to
	// emuib.MaxHosts-1: its groups' members are its own entries.
	Host int
	// GID is this hypervisor's port GID, in every address it reports.
	GID netip.Addr
	// Parent is the device reported as the IPoIB parent (a veth: this
	// machine has no dummy devices), in the namespace the Kernel runs in.
	Parent string
	// MTU is the IPoIB MTU reported for the parent and the children:
	// 2044 or 4092 (0: 4092).
	MTU int
	// PKeys is the port's P_Key table (none: 0xffff alone).
	PKeys []uint16
}

// ChildLinkMTU is a child veth's real MTU: more than any IPoIB MTU plus
// the 10 bytes the IPoIB link header has over Ethernet's, which
// is_skb_forwardable (in __dev_forward_skb) counts against a frame.
const ChildLinkMTU = 9000

// parentQPN is the QPN in the parent's reported address.
const parentQPN = 0x48

// Kernel is the emulated kernelfabric.Kernel. Its methods may be called
// from any goroutine.
type Kernel struct {
	sys    kf.System
	cfg    Config
	gid    ipoib.GID
	stem   string
	parent int // the parent's ifindex
	fab    *emuib.Fabric
	fabNS  netns.NsHandle

	mu       sync.Mutex
	children map[int]*emuChild // by the child's ifindex
	// members counts each group's memberships by fabric end: the
	// broadcast group's of every child (the driver joins it on open),
	// and one per socket that joined (packet_mc_add).
	members map[ipoib.GID]map[int]int
	seq     int // names the fabric ends
}

// emuChild is a child AddChild made, or one an earlier process made
// that NewKernel found.
type emuChild struct {
	fabricEnd int
	pkey      ipoib.PKey
	bcast     ipoib.GID
	links     []link.Link // the programs at its fabric end, the harness at the child
}

var _ kf.Kernel = (*Kernel)(nil)

// NewKernel opens the emulated kernel of cfg, in the calling process's
// namespace: the parent must exist there, the fabric namespace and the
// pinned Fabric too.
func NewKernel(cfg Config) (*Kernel, error) {
	if cfg.MTU == 0 {
		cfg.MTU = 4092
	}
	if len(cfg.PKeys) == 0 {
		cfg.PKeys = []uint16{uint16(ipoib.DefaultPKey)}
	}
	if cfg.Host < 0 || cfg.Host >= emuib.MaxHosts || !cfg.GID.Is6() {
		return nil, fmt.Errorf("emuib: host %d (want 0 to %d), GID %v (want IPv6)", cfg.Host, emuib.MaxHosts-1, cfg.GID)
	}
	k := &Kernel{cfg: cfg, gid: ipoib.GID(cfg.GID.As16()), stem: kf.ChildStem(cfg.Parent),
		children: map[int]*emuChild{}, members: map[ipoib.GID]map[int]int{}}
	p, err := k.sys.LinkByName(cfg.Parent)
	if err != nil {
		return nil, fmt.Errorf("emuib: the parent: %w", err)
	}
	k.parent = p.Index
	if k.fabNS, err = netns.GetFromName(cfg.Fabric); err != nil {
		return nil, fmt.Errorf("emuib: the fabric namespace %s: %w", cfg.Fabric, err)
	}
	if k.fab, err = emuib.OpenFabric(cfg.Pins); err != nil {
		k.fabNS.Close()
		return nil, err
	}
	k.adoptChildren()
	return k, nil
}

// childPin is the bpffs directory where the attachments of child
// ifindex of this hypervisor are pinned.
func (k *Kernel) childPin(ifindex int) string {
	return filepath.Join(k.cfg.Pins, fmt.Sprintf("child-h%d-%d", k.cfg.Host, ifindex))
}

// childAlias is the alias of a child veth: its P_Key and the ifindex of
// its fabric end, which the veth does not hold.
const childAlias = "emuib pkey=%d end=%d"

// adoptChildren takes over the children an earlier process left: each
// child veth whose alias and pinned attachments are there is made known
// again, with the P_Key its alias holds, and its fabric end a member of
// its broadcast group. The others stay unknown, for the backend to
// delete. The fabric ends' names (h<host>q<seq>) go on past the highest
// one this hypervisor has, so that the next AddChild's does not collide.
func (k *Kernel) adoptChildren() {
	links, err := netlink.LinkList()
	if err != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seq = k.lastEnd()
	for _, l := range links {
		a := l.Attrs()
		var pkey uint16
		var end int
		if l.Type() != "veth" || !kf.IsChildName(k.stem, a.Name) {
			continue
		}
		if n, err := fmt.Sscanf(a.Alias, childAlias, &pkey, &end); n != 2 || err != nil {
			continue
		}
		ec := &emuChild{fabricEnd: end, pkey: ipoib.PKey(pkey).Full(), bcast: ipoib.BroadcastMGID(ipoib.PKey(pkey), ipoib.ScopeLinkLocal)}
		ok := true
		for i := range 3 {
			pl, err := link.LoadPinnedLink(filepath.Join(k.childPin(a.Index), strconv.Itoa(i)), nil)
			if err != nil {
				ok = false
				break
			}
			ec.links = append(ec.links, pl)
		}
		if !ok || k.join(ec.bcast, end) != nil {
			for _, pl := range ec.links {
				pl.Close()
			}
			continue
		}
		k.children[a.Index] = ec
	}
}

// endName names a child's fabric end: h<host>q<seq>.
const endName = "h%dq%d"

// lastEnd is the highest seq of this hypervisor's fabric ends
// (h<host>q<seq>) in the fabric namespace, 0 for none or when they
// cannot be listed.
func (k *Kernel) lastEnd() int {
	last := 0
	nsenter.Do(k.cfg.Fabric, func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			var host, seq int
			if n, _ := fmt.Sscanf(l.Attrs().Name, endName, &host, &seq); n == 2 && host == k.cfg.Host && seq > last {
				last = seq
			}
		}
		return err
	})
	return last
}

// addr is the reported address of the device with ifindex i: the
// parent's QPN for the parent, a QPN made of the ifindex for a child
// (unique in this hypervisor, whose GID tells it from the others').
func (k *Kernel) addr(ifindex int) ipoib.HwAddr {
	qpn := uint32(parentQPN)
	if ifindex != k.parent {
		qpn = 0x100000 | uint32(ifindex)&0xfffff
	}
	return ipoib.MakeHwAddr(0, qpn, k.gid)
}

// isChild reports whether l is one of the parent's children, by its
// name, as the backend names them: children left by an earlier run are
// reported so too, for the backend to reclaim.
func (k *Kernel) isChild(l kf.Link) bool {
	return l.Kind == "veth" && kf.IsChildName(k.stem, l.Name)
}

// report turns a real link into what ipoib would report: the parent and
// its children as IPoIB interfaces (kind ipoib, a 20-byte address, the
// IPoIB MTU, one receive queue), the rest as they are.
func (k *Kernel) report(l kf.Link) kf.Link {
	switch {
	case l.Index == k.parent:
		l.ParentIndex = 0
	case k.isChild(l):
		l.ParentIndex = k.parent
	default:
		return l
	}
	l.Kind, l.HwAddr, l.MTU, l.RxQueues, l.PKey = "ipoib", k.addr(l.Index), k.cfg.MTU, 1, ipoib.DefaultPKey
	if l.Index != k.parent {
		k.mu.Lock()
		l.PKey = 0 // a child not known (its alias or pins lost) has none
		if c := k.children[l.Index]; c != nil {
			l.PKey = c.pkey
		}
		k.mu.Unlock()
	}
	return l
}

// LinkByName is the real link, as ipoib would report it.
func (k *Kernel) LinkByName(name string) (kf.Link, error) {
	l, err := k.sys.LinkByName(name)
	return k.report(l), err
}

// Links is the real dump, as ipoib would report it.
func (k *Kernel) Links() ([]kf.Link, error) {
	ls, err := k.sys.Links()
	for i := range ls {
		ls[i] = k.report(ls[i])
	}
	return ls, err
}

// SubscribeLinks is the real subscription, each link as ipoib would
// report it.
func (k *Kernel) SubscribeLinks(done <-chan struct{}, onErr func(error)) (<-chan kf.Link, error) {
	in, err := k.sys.SubscribeLinks(done, onErr)
	if err != nil {
		return nil, err
	}
	out := make(chan kf.Link)
	go func() {
		defer close(out)
		for l := range in {
			select {
			case out <- k.report(l):
			case <-done:
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

// Mode is "datagram" for the parent and its children.
func (k *Kernel) Mode(name string) (string, error) {
	l, err := k.LinkByName(name)
	if err != nil {
		return "", err
	}
	if l.Kind != "ipoib" {
		return "", fmt.Errorf("emuib: %s is no IPoIB interface: %w", name, os.ErrNotExist)
	}
	return "datagram", nil
}

// PKeys is Config.PKeys.
func (k *Kernel) PKeys(parent string) (kf.PKeyTable, error) {
	t := kf.PKeyTable{Device: "emuib", Port: 1, Path: "(emulated)"}
	for _, p := range k.cfg.PKeys {
		t.PKeys = append(t.PKeys, ipoib.PKey(p))
	}
	return t, nil
}

// TSO is off for the parent and its children. With it on the backend
// would open SOCK_RAW sockets with PACKET_VNET_HDR and hand super-packets
// to a veth: packet_snd (net/packet/af_packet.c) sets the network
// header dev->hard_header_len (14 on a veth) into the data, not 24, so
// the software GSO of any device without TSO would cut them from the
// wrong offset; and, whole on a veth, they would reach the peer's
// user-space path as super-packets, where an HCA's LSO would have cut
// them (the backend drops them: DropRxSuper). Off, the shim segments
// what the user-space path sends. The fast path is not concerned: its
// TX program hands super-frames to the child veth, which takes TSO, and
// its RX program passes them whole to the TAP.
func (k *Kernel) TSO(name string) (bool, error) {
	l, err := k.LinkByName(name)
	if err != nil {
		return false, err
	}
	if l.Kind == "ipoib" {
		return false, nil
	}
	return k.sys.TSO(name)
}

// DisableGRO is the real ETHTOOL_SGRO.
func (k *Kernel) DisableGRO(name string) error { return k.sys.DisableGRO(name) }

// SetUp is the real IFF_UP; a child's fabric end is up already, so the
// child gets carrier.
func (k *Kernel) SetUp(index int) error { return k.sys.SetUp(index) }

// SetNoARP is the real IFF_NOARP.
func (k *Kernel) SetNoARP(index int) error { return k.sys.SetNoARP(index) }

// WriteSysctl is the real sysctl.
func (k *Kernel) WriteSysctl(path, value string) error { return k.sys.WriteSysctl(path, value) }

// HasIPv6 is the real kernel's.
func (k *Kernel) HasIPv6() (bool, error) { return k.sys.HasIPv6() }

// AddChild makes the child c names: a veth pair, c.Name here and its
// fabric end in the fabric namespace (up, no IPv6), the wire's programs
// at the fabric end's ingress and the harness at the child's, the
// child's address in the wire's Ends, and the fabric end a member of
// the partition's broadcast group (ipoib_mcast_join_task joins it on
// open). As ipoib_new_child_link, it refuses a parent other than the
// emulated one (ENODEV) and the P_Keys 0 and 0x8000 (EINVAL).
func (k *Kernel) AddChild(c kf.ChildSpec) (err error) {
	if c.Parent != k.parent {
		return fmt.Errorf("emuib: ifindex %d is not the IPoIB parent: %w", c.Parent, unix.ENODEV)
	}
	if !c.PKey.IsValid() {
		return fmt.Errorf("emuib: P_Key %s: %w", c.PKey, unix.EINVAL)
	}
	k.mu.Lock()
	k.seq++
	end := fmt.Sprintf(endName, k.cfg.Host, k.seq)
	k.mu.Unlock()
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = c.Name, ChildLinkMTU
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: end, PeerMTU: ChildLinkMTU, PeerNamespace: netlink.NsFd(k.fabNS), PeerTxQLen: -1}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("emuib: add child %s: %w", c.Name, err)
	}
	l, err := k.sys.LinkByName(c.Name)
	if err != nil {
		netlink.LinkDel(veth)
		return err
	}
	ec := &emuChild{pkey: c.PKey.Full(), bcast: ipoib.BroadcastMGID(c.PKey, ipoib.ScopeLinkLocal)}
	defer func() {
		if err != nil {
			k.forget(l.Index, ec)
			netlink.LinkDel(veth)
		}
	}()
	ifc, err := net.InterfaceByIndex(l.Index)
	if err != nil {
		return err
	}
	if err := nsenter.Do(k.cfg.Fabric, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+end+"/disable_ipv6", []byte("1"), 0); err != nil {
			return err
		}
		fe, err := netlink.LinkByName(end)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(fe); err != nil {
			return err
		}
		ec.fabricEnd = fe.Attrs().Index
		// The multicast program first: it leaves unicast to the wire.
		for _, prog := range []*ebpf.Program{k.fab.Prog, k.fab.Wire} {
			if err := ec.attach(ec.fabricEnd, prog); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("emuib: fabric end %s of %s: %w", end, c.Name, err)
	}
	// The harness first: the fast path's RX program, attached later,
	// comes after it (tcx appends).
	if err := ec.attach(l.Index, k.fab.Harness); err != nil {
		return fmt.Errorf("emuib: the harness at %s: %w", c.Name, err)
	}
	if err := k.fab.PutEnd(k.addr(l.Index), ec.fabricEnd, ifc.HardwareAddr); err != nil {
		return err
	}
	if err := ec.pin(k.childPin(l.Index)); err != nil {
		return fmt.Errorf("emuib: pin the attachments of %s: %w", c.Name, err)
	}
	if err := netlink.LinkSetAlias(veth, fmt.Sprintf(childAlias, uint16(ec.pkey), ec.fabricEnd)); err != nil {
		return fmt.Errorf("emuib: alias of %s: %w", c.Name, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.children[l.Index] = ec
	return k.join(ec.bcast, ec.fabricEnd)
}

// attach attaches prog at tcx ingress of ifindex in the calling
// thread's namespace, for as long as c lives.
func (c *emuChild) attach(ifindex int, prog *ebpf.Program) error {
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return err
	}
	c.links = append(c.links, l)
	return nil
}

// pin pins c's attachments in dir, so that they outlive the process.
func (c *emuChild) pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for i, l := range c.links {
		if err := l.Pin(filepath.Join(dir, strconv.Itoa(i))); err != nil {
			return err
		}
	}
	return nil
}

// forget undoes what AddChild did for the child with ifindex index but
// the veth: its address in Ends, its memberships, its attachments and
// their pins.
func (k *Kernel) forget(index int, c *emuChild) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	errs := []error{}
	a := k.addr(index).WithoutFlags()
	if err := k.fab.Ends.Delete(a[:]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	if c != nil && c.fabricEnd != 0 {
		for mgid, m := range k.members {
			if m[c.fabricEnd] > 0 {
				delete(m, c.fabricEnd)
				errs = append(errs, k.putMembers(mgid))
			}
		}
	}
	if c != nil {
		for _, l := range c.links {
			errs = append(errs, l.Unpin(), l.Close())
		}
	}
	errs = append(errs, os.RemoveAll(k.childPin(index)))
	delete(k.children, index)
	return errors.Join(errs...)
}

// DelLink deletes a link; for a child, first what AddChild did besides
// the veth (deleting it deletes its fabric end too).
func (k *Kernel) DelLink(index int) error {
	k.mu.Lock()
	c := k.children[index]
	k.mu.Unlock()
	if c != nil || k.isChild(k.linkByIndex(index)) {
		if err := k.forget(index, c); err != nil {
			return err
		}
	}
	return k.sys.DelLink(index)
}

// linkByIndex is the real link with ifindex index, or none.
func (k *Kernel) linkByIndex(index int) kf.Link {
	ifc, err := net.InterfaceByIndex(index)
	if err != nil {
		return kf.Link{}
	}
	l, _ := k.sys.LinkByName(ifc.Name)
	return l
}

// join adds a membership of the fabric end to group mgid (k.mu held).
func (k *Kernel) join(mgid ipoib.GID, end int) error {
	m := k.members[mgid]
	if m == nil {
		m = map[int]int{}
		k.members[mgid] = m
	}
	m[end]++
	if m[end] > 1 {
		return nil
	}
	if err := k.putMembers(mgid); err != nil {
		if m[end]--; m[end] == 0 {
			delete(m, end)
		}
		return err
	}
	return nil
}

// leave drops a membership of the fabric end (k.mu held).
func (k *Kernel) leave(mgid ipoib.GID, end int) error {
	m := k.members[mgid]
	if m[end] == 0 {
		return nil
	}
	if m[end]--; m[end] > 0 {
		return nil
	}
	delete(m, end)
	return k.putMembers(mgid)
}

// putMembers writes this host's members of mgid to the wire (k.mu
// held).
func (k *Kernel) putMembers(mgid ipoib.GID) error {
	var ends []int
	for e := range k.members[mgid] {
		ends = append(ends, e)
	}
	if len(ends) > emuib.MaxMembers {
		return fmt.Errorf("emuib: group %s: more than %d members: %w", mgid, emuib.MaxMembers, unix.ENOSPC)
	}
	if len(ends) == 0 {
		delete(k.members, mgid)
	}
	return k.fab.PutMembers(mgid, k.cfg.Host, ends)
}

// OpenPacketWith opens a child's socket as a Socket that speaks ipoib's
// layout over a veth (see Socket); any other device's is the real one.
// There is no PACKET_VNET_HDR socket: TSO is off.
func (k *Kernel) OpenPacketWith(ifindex int, o kf.PacketOptions) (kf.Socket, error) {
	k.mu.Lock()
	c := k.children[ifindex]
	k.mu.Unlock()
	if c == nil {
		return k.sys.OpenPacketWith(ifindex, o)
	}
	if o.Vnet {
		return nil, fmt.Errorf("emuib: PACKET_VNET_HDR: the emulated children have no TSO: %w", unix.EINVAL)
	}
	o.Raw = true
	in, err := k.sys.OpenPacketWith(ifindex, o)
	if err != nil {
		return nil, err
	}
	return &Socket{k: k, in: in, joined: map[membership]bool{}}, nil
}

// Socket is a child's packet socket as ipoib's would behave, over a
// SOCK_RAW socket on the veth (kernelfabric.PacketOptions.Raw):
//
//   - Send writes the link header ipoib_hard_header would (the 20-byte
//     destination from the name, the EtherType, 2 zero bytes) in front
//     of each datagram, as the fast path's TX program writes it, for the
//     wire to read. The name is checked as packet_snd checks a
//     SOCK_DGRAM one on IPoIB (at least dev->addr_len = 20 address
//     bytes: EINVAL).
//   - Recv takes the 24-byte link header off every datagram: before tc
//     (a socket bound to every protocol) it is the wire's Ethernet
//     header and the 10 bytes after it, after tc (a socket bound to one
//     protocol, under the fast path) the harness's rebuilt IPoIB one;
//     either way L3 follows. The name is made ipoib's: sll_hatype
//     ARPHRD_INFINIBAND and no source address (sll_halen 0), as
//     packet_rcv leaves it without header_ops->parse. sll_pkttype is the
//     kernel's, from the Ethernet destination the wire wrote.
//   - AddMembership and DropMembership make the child's fabric end a
//     member of the group (or not) on the wire, instead of the veth's
//     multicast list, which takes no 20-byte address (packet_mc_add:
//     mr_alen > dev->addr_len is EINVAL). Close drops the socket's
//     memberships (packet_flush_mclist).
type Socket struct {
	k  *Kernel
	in kf.Socket

	tx, rx [sockBatch][kf.IPoIBHardLen]byte

	mu     sync.Mutex
	joined map[membership]bool
}

// membership is one of a socket's groups, on the child named by its
// mreq.
type membership struct {
	child int
	mgid  ipoib.GID
}

// Send is sendmmsg with ipoib's link header.
func (s *Socket) Send(msgs []kf.Msg) (int, error) {
	msgs = msgs[:min(len(msgs), len(s.tx))]
	for i := range msgs {
		m := &msgs[i]
		if len(m.Hdr) != 0 || m.NameLen > len(m.Name) || m.NameLen < kf.SockaddrLLIPoIBLen {
			if i == 0 {
				return 0, unix.EINVAL
			}
			msgs = msgs[:i] // these go now; the bad one is refused on the next call, as sendmmsg does
			break
		}
		h := &s.tx[i]
		copy(h[:ipoib.HwAddrLen], m.Name[kf.SockaddrLLIPoIBLen-ipoib.HwAddrLen:kf.SockaddrLLIPoIBLen])
		h[20], h[21], h[22], h[23] = m.Name[2], m.Name[3], 0, 0
		m.Hdr = h[:]
	}
	n, err := s.in.Send(msgs)
	for i := range msgs {
		msgs[i].Hdr = nil
		if i < n {
			msgs[i].N -= kf.IPoIBHardLen
		}
	}
	return n, err
}

// Recv is recvmmsg without the link header, with ipoib's name.
func (s *Socket) Recv(msgs []kf.Msg) (int, error) {
	msgs = msgs[:min(len(msgs), len(s.rx))]
	for i := range msgs {
		msgs[i].Hdr = s.rx[i][:]
	}
	n, err := s.in.Recv(msgs)
	for i := range msgs {
		msgs[i].Hdr = nil
		if i >= n {
			continue
		}
		m := &msgs[i]
		m.N = max(m.N-kf.IPoIBHardLen, 0)
		if m.NameLen >= kf.SockaddrLLSize && len(m.Name) >= kf.SockaddrLLSize {
			binary.NativeEndian.PutUint16(m.Name[8:10], kf.ARPHRDInfiniBand)
			m.Name[11] = 0
			clear(m.Name[12:kf.SockaddrLLSize])
		}
	}
	return n, err
}

// parseMreq reads a struct packet_mreq_max as packet_setsockopt and
// packet_mc_add do: shorter than a packet_mreq, or an address length
// other than dev->addr_len (20), is EINVAL; a device that is not a
// child ENODEV.
func (s *Socket) parseMreq(mreq []byte) (membership, int, error) {
	if len(mreq) < kf.MreqSize {
		return membership{}, 0, unix.EINVAL
	}
	child := int(int32(binary.NativeEndian.Uint32(mreq[0:4])))
	if alen := binary.NativeEndian.Uint16(mreq[6:8]); alen != ipoib.HwAddrLen || len(mreq) < 8+ipoib.HwAddrLen {
		return membership{}, 0, unix.EINVAL
	}
	s.k.mu.Lock()
	c := s.k.children[child]
	s.k.mu.Unlock()
	if c == nil {
		return membership{}, 0, unix.ENODEV
	}
	return membership{child: child, mgid: ipoib.HwAddr(mreq[8 : 8+ipoib.HwAddrLen]).GID()}, c.fabricEnd, nil
}

// AddMembership makes the child's fabric end a member of the group on
// the wire, once per socket.
func (s *Socket) AddMembership(mreq []byte) error {
	m, end, err := s.parseMreq(mreq)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.joined[m] {
		return nil
	}
	s.k.mu.Lock()
	err = s.k.join(m.mgid, end)
	s.k.mu.Unlock()
	if err == nil {
		s.joined[m] = true
	}
	return err
}

// DropMembership ends the socket's membership; dropping what it never
// joined succeeds, as the backend's conformance suite found the kernel
// does.
func (s *Socket) DropMembership(mreq []byte) error {
	m, end, err := s.parseMreq(mreq)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.joined[m] {
		return nil
	}
	delete(s.joined, m)
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	return s.k.leave(m.mgid, end)
}

// Drops is the real socket's.
func (s *Socket) Drops() (uint64, error) { return s.in.Drops() }

// Close drops the socket's memberships and closes it.
func (s *Socket) Close() error {
	s.mu.Lock()
	var errs []error
	s.k.mu.Lock()
	for m := range s.joined {
		if c := s.k.children[m.child]; c != nil {
			errs = append(errs, s.k.leave(m.mgid, c.fabricEnd))
		}
	}
	s.k.mu.Unlock()
	clear(s.joined)
	s.mu.Unlock()
	return errors.Join(append(errs, s.in.Close())...)
}

// sockBatch is the most messages a Socket moves per call: the backend's
// batch.
const sockBatch = 64
