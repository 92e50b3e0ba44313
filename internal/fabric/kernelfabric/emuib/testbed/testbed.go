// Package testbed builds two emulated hypervisors joined by the emulated
// IPoIB wire of package emuib, with the fast path's programs at each
// hypervisor's TAP and child, for the fast path's end-to-end test and
// make bench (cmd/fpemu). It is an EMULATION; eipoibd never uses it.
//
// Each hypervisor runs a kernelfabric.Port over the fake kernel
// (package fakekernel: in memory, no device), so that the fast path's
// maps are filled through kernelfabric.FastPath exactly as the shim's
// control goroutine fills them: a guest MAC and the QPN of its VIF, a
// REMAC and its 20-byte address, the senders' IPs and REMACs. The fake
// child of the guest's VIF is mirrored by a real veth with the same
// interface index (fakekernel's SetNextIndex), whose peer is a fabric
// end in the fabric namespace, where the wire runs. The guests learn the
// peer's REMAC from static neighbours, as eipoibd's ARP and NDP
// translation would give them: no daemon answers ARP here, and every
// frame the TX program leaves to user space (ARP, ND, anything it does
// not carry) is read from the TAP and dropped (Fallbacks counts them).
package testbed

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eipoib/eipoibd/ether"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/nsenter"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// Host is one hypervisor: namespace NS, whose bridge Bridge has the
// guest's port, and the guest in namespace GuestNS, on GuestDev.
type Host struct {
	NS, Bridge        string
	GuestNS, GuestDev string
}

// Config describes the test bed.
type Config struct {
	// Fabric is the namespace of the fabric ends.
	Fabric string
	Hosts  [2]Host
	// Prefix names the devices Start makes: <Prefix>t (the TAP) and
	// <Prefix>c (the child) in each hypervisor, <Prefix>f1 and
	// <Prefix>f2 (the fabric ends) in the fabric namespace.
	Prefix string
	// Offload turns the TAPs' offloads on (tap.Config.Offload).
	Offload bool
	// MTU is the IPoIB MTU of the emulated ports (4092: IB MTU 4096).
	MTU int
}

// linkMTU is the veths' MTU: more than any IPoIB MTU plus the 10 bytes
// the IPoIB link header has over Ethernet's, which is_skb_forwardable
// (in __dev_forward_skb) would otherwise count against a frame.
const linkMTU = 9000

// Bed is a running test bed. Close takes it down.
type Bed struct {
	cfg   Config
	progs *emuib.Programs
	hosts [2]*host
	undo  []func() error // in the reverse order
	wg    sync.WaitGroup
}

// host is one hypervisor as Start set it up.
type host struct {
	Host
	name      string // h1, h2
	k         *fakekernel.Kernel
	port      *kf.Port
	gid       ipoib.GID
	qpn       uint32
	addr      ipoib.HwAddr // the child's IPoIB address
	child     int          // the child's (and the veth's) ifindex
	childMAC  net.HardwareAddr
	fabricEnd int
	tap       *tap.TAP
	tapIndex  int
	att       *fastpath.Attached
	fp        *kf.FastPath
	guestMAC  ether.MAC
	guestIPs  []netip.Addr
	remac     ether.MAC // what the other guest sees this one as
	fallbacks atomic.Uint64
}

// Start builds the test bed: for each hypervisor a fake port and a VIF
// for its guest, the child's veth and fabric end, a TAP in the bridge
// with the TX program at its egress, the harness and (by the first
// FastPath round) the RX program at the child's ingress; the wire at
// the fabric ends; the maps filled by FastPath rounds until both
// children are in them; static neighbours in the guests.
func Start(cfg Config) (b *Bed, err error) {
	b = &Bed{cfg: cfg}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
			b = nil
		}
	}()
	if b.progs, err = emuib.Load(); err != nil {
		return b, err
	}
	fab := fakekernel.NewFabric()
	for i := range b.hosts {
		h := &host{Host: cfg.Hosts[i], name: fmt.Sprintf("h%d", i+1)}
		b.hosts[i] = h
		h.gid = ipoib.GID{0xfe, 0x80, 14: 0xeb, 15: byte(i + 1)}
		h.k = fab.NewHost(h.gid, "ib0", cfg.MTU)
		if err := b.setUp(h, fmt.Sprintf("%sf%d", cfg.Prefix, i+1)); err != nil {
			return b, fmt.Errorf("testbed: %s: %w", h.name, err)
		}
	}
	for _, h := range b.hosts {
		h.remac = mactrans.DeriveREMAC(h.gid, h.qpn, 0)
		if err := b.progs.PutEnd(h.addr, h.fabricEnd, h.childMAC); err != nil {
			return b, err
		}
		h.fp = h.port.NewFastPath(h.att, h.tapIndex, cfg.MTU)
		b.undo = append(b.undo, func() error { h.fp.Stop(); return nil })
	}
	if err := b.sync(); err != nil {
		return b, err
	}
	for i, h := range b.hosts {
		peer := b.hosts[1-i]
		for _, ip := range peer.guestIPs {
			if err := ipCmd("-n", h.GuestNS, "neigh", "replace", ip.String(), "lladdr", peer.remac.String(), "dev", h.GuestDev, "nud", "permanent"); err != nil {
				return b, err
			}
			b.undo = append(b.undo, func() error {
				return ipCmd("-n", h.GuestNS, "neigh", "del", ip.String(), "dev", h.GuestDev)
			})
		}
	}
	return b, nil
}

// setUp makes one hypervisor's port, VIF, child, TAP and attachments.
func (b *Bed) setUp(h *host, fabricEnd string) error {
	if err := nsenter.Do(h.GuestNS, func() error {
		ifc, err := net.InterfaceByName(h.GuestDev)
		if err != nil {
			return err
		}
		h.guestMAC = ether.MAC(ifc.HardwareAddr)
		addrs, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
				h.guestIPs = append(h.guestIPs, p.Addr())
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("guest %s in %s: %w", h.GuestDev, h.GuestNS, err)
	}
	if len(h.guestIPs) == 0 {
		return fmt.Errorf("guest %s in %s has no address", h.GuestDev, h.GuestNS)
	}

	// The fake child gets the first index no link in NS has, and the
	// veth that index.
	var next int
	if err := nsenter.Do(h.NS, func() error {
		ifs, err := net.Interfaces()
		for _, ifc := range ifs {
			next = max(next, ifc.Index+1)
		}
		return err
	}); err != nil {
		return err
	}
	h.k.SetNextIndex(next)
	var err error
	if h.port, err = kf.New(kf.Config{Kernel: h.k, Parent: "ib0", FastPath: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		return err
	}
	b.undo = append(b.undo, h.port.Close)
	if h.qpn, err = h.port.AllocQP(ipoib.DefaultPKey, 0); err != nil {
		return err
	}
	links, err := h.k.Links()
	if err != nil {
		return err
	}
	for _, l := range links {
		if l.ParentIndex != 0 && l.HwAddr.QPN() == h.qpn {
			h.child, h.addr = l.Index, l.HwAddr
		}
	}
	if h.child == 0 {
		return fmt.Errorf("no fake child has QPN %#x", h.qpn)
	}
	child := b.cfg.Prefix + "c"
	if err := b.veth(h.NS, child, fabricEnd, h.child); err != nil {
		return err
	}
	if err := nsenter.Do(b.cfg.Fabric, func() error {
		ifc, err := net.InterfaceByName(fabricEnd)
		if err != nil {
			return err
		}
		h.fabricEnd = ifc.Index
		return b.attach(ifc.Index, b.progs.Wire)
	}); err != nil {
		return fmt.Errorf("the wire at %s: %w", fabricEnd, err)
	}

	tapName := b.cfg.Prefix + "t"
	if err := nsenter.Do(h.NS, func() error {
		ifc, err := net.InterfaceByName(child)
		if err != nil {
			return err
		}
		h.childMAC = ifc.HardwareAddr
		if h.tap, err = tap.Create(tap.Config{Name: tapName, MTU: b.cfg.MTU, Offload: b.cfg.Offload}); err != nil {
			return err
		}
		b.undo = append(b.undo, h.tap.Close)
		if ifc, err = net.InterfaceByName(tapName); err != nil {
			return err
		}
		h.tapIndex = ifc.Index
		// The harness first: the RX program, which the first FastPath
		// round attaches, comes after it (tcx appends).
		if err := b.attach(h.child, b.progs.Harness); err != nil {
			return err
		}
		if h.att, err = fastpath.Attach(h.tapIndex); err != nil {
			return err
		}
		b.undo = append(b.undo, h.att.Close)
		return nil
	}); err != nil {
		return err
	}
	if err := ipCmd("-n", h.NS, "link", "set", tapName, "master", h.Bridge, "up"); err != nil {
		return err
	}
	b.wg.Add(1)
	go b.drain(h)
	return nil
}

// veth makes the veth child in namespace ns (with interface index
// index, unless 0) and its peer fabricEnd in the fabric namespace, both
// up without IPv6, until Close.
func (b *Bed) veth(ns, child, fabricEnd string, index int) error {
	args := []string{"-n", ns, "link", "add", child}
	if index != 0 {
		args = append(args, "index", fmt.Sprint(index))
	}
	args = append(args, "mtu", fmt.Sprint(linkMTU), "type", "veth", "peer", "name", fabricEnd, "netns", b.cfg.Fabric, "mtu", fmt.Sprint(linkMTU))
	if err := ipCmd(args...); err != nil {
		return err
	}
	b.undo = append(b.undo, func() error { return ipCmd("-n", ns, "link", "del", child) })
	for _, d := range [][2]string{{ns, child}, {b.cfg.Fabric, fabricEnd}} {
		// No IPv6 of their own: they carry only the guests' frames.
		if err := ipCmd("netns", "exec", d[0], "sysctl", "-qw", "net.ipv6.conf."+d[1]+".disable_ipv6=1"); err != nil {
			return err
		}
		if err := ipCmd("-n", d[0], "link", "set", d[1], "up"); err != nil {
			return err
		}
	}
	return nil
}

// StartPlain builds the emulation alone, for make bench to state its
// own cost: in each hypervisor a veth child in the bridge, its fabric
// end in the fabric namespace, and at each fabric end's ingress a
// program (emuib.LoadRedirect) that redirects every frame to the other
// fabric end's egress, as the wire does. There is no TAP, fast path
// program, harness or port: the guests' Ethernet frames, ARP included,
// cross the same veths and redirects as the fast path's do. Only Close
// may be called on it.
func StartPlain(cfg Config) (b *Bed, err error) {
	b = &Bed{cfg: cfg}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
			b = nil
		}
	}()
	child := cfg.Prefix + "c"
	var ends [2]int
	for i, h := range cfg.Hosts {
		fabricEnd := fmt.Sprintf("%sf%d", cfg.Prefix, i+1)
		if err := b.veth(h.NS, child, fabricEnd, 0); err != nil {
			return b, err
		}
		if err := ipCmd("-n", h.NS, "link", "set", child, "master", h.Bridge); err != nil {
			return b, err
		}
		if err := nsenter.Do(cfg.Fabric, func() error {
			ifc, err := net.InterfaceByName(fabricEnd)
			if err == nil {
				ends[i] = ifc.Index
			}
			return err
		}); err != nil {
			return b, err
		}
	}
	for i := range ends {
		prog, err := emuib.LoadRedirect(ends[1-i])
		if err != nil {
			return b, err
		}
		b.undo = append(b.undo, prog.Close)
		if err := nsenter.Do(cfg.Fabric, func() error { return b.attach(ends[i], prog) }); err != nil {
			return b, err
		}
	}
	return b, nil
}

// attach attaches prog at tcx ingress of ifindex, in the calling
// thread's namespace, until Close.
func (b *Bed) attach(ifindex int, prog *ebpf.Program) error {
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return err
	}
	b.undo = append(b.undo, l.Close)
	return nil
}

// drain reads what the TX program left to user space from h's TAP, as
// eipoibd would, and drops it, counted, until the TAP is closed.
func (b *Bed) drain(h *host) {
	defer b.wg.Done()
	n := h.tap.BatchSize()
	bufs, sizes, super := make([][]byte, n), make([]int, n), make([]tap.Super, n)
	for i := range bufs {
		bufs[i] = make([]byte, tap.Headroom+65536)
	}
	for {
		got, err := h.tap.ReadSuper(bufs, sizes, super, tap.Headroom)
		if err != nil {
			return
		}
		h.fallbacks.Add(uint64(got))
	}
}

// round states to h's FastPath what the shim would: its guest and VIF,
// the other guest's REMAC and address, and the other guest's IPs as
// senders. It runs in h's namespace, where the RX program is attached
// to the child.
func (b *Bed) round(h, peer *host) error {
	return nsenter.Do(h.NS, func() error {
		h.fp.Begin()
		h.fp.Guest(h.guestMAC, h.qpn)
		h.fp.Neighbour(peer.remac, peer.addr)
		for _, ip := range peer.guestIPs {
			h.fp.Sender(ip, peer.remac)
		}
		return h.fp.Commit()
	})
}

// sync runs rounds until both children are in the maps: FastPath skips
// a child until the fake port reports its carrier (its broadcast join).
func (b *Bed) sync() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready := 0
		for i, h := range b.hosts {
			if err := b.round(h, b.hosts[1-i]); err != nil {
				return err
			}
			e, err := h.att.Entries()
			if err != nil {
				return err
			}
			if _, ok := e.Children[h.child]; ok {
				ready++
			}
		}
		if ready == len(b.hosts) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("testbed: the children did not reach the fast path's maps within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// REMAC is the MAC the other guest sees guest i (0 or 1) as.
func (b *Bed) REMAC(i int) ether.MAC { return b.hosts[i].remac }

// GuestIPs are guest i's addresses, as Start read them.
func (b *Bed) GuestIPs(i int) []netip.Addr { return b.hosts[i].guestIPs }

// Counts returns the TX and RX programs' counters of hypervisor i.
func (b *Bed) Counts(i int) (tx [fastpath.NumReasons]uint64, rx [fastpath.NumRXReasons]uint64, err error) {
	return b.hosts[i].att.Counts()
}

// WireCounts returns the wire's and the harnesses' counters.
func (b *Bed) WireCounts() ([emuib.NumReasons]uint64, error) { return b.progs.Counts() }

// Fallbacks is how many frames hypervisor i's TAP handed user space.
func (b *Bed) Fallbacks(i int) uint64 { return b.hosts[i].fallbacks.Load() }

// Close takes everything Start made down: the guests' neighbours, the
// programs, the TAPs, the veths, the ports.
func (b *Bed) Close() error {
	var errs []error
	for i := len(b.undo) - 1; i >= 0; i-- {
		errs = append(errs, b.undo[i]())
	}
	b.undo = nil
	b.wg.Wait()
	if b.progs != nil {
		errs = append(errs, b.progs.Close())
		b.progs = nil
	}
	return errors.Join(errs...)
}

// ipCmd runs ip with args.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
