package kernelfabric

// System: the real kernel boundary. Netlink link operations through
// vishvananda/netlink (the IPoIB child request is built by
// newChildRequest so that its bytes are tested), packet sockets through
// raw sendmmsg/recvmmsg/setsockopt on the runtime poller, ethtool through
// SIOCETHTOOL, sysctls through /proc/sys.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// System is the running kernel.
type System struct{}

var _ Kernel = System{}

func toLink(l netlink.Link) Link {
	a := l.Attrs()
	out := Link{Index: a.Index, ParentIndex: a.ParentIndex, Name: a.Name, Kind: l.Type(), MTU: a.MTU,
		Up: a.Flags&net.FlagUp != 0, Carrier: a.OperState == netlink.OperUp || a.RawFlags&unix.IFF_LOWER_UP != 0}
	if len(a.HardwareAddr) == ipoib.HwAddrLen {
		out.HwAddr = ipoib.HwAddr(a.HardwareAddr)
	}
	return out
}

// LinkByName is RTM_GETLINK by name.
func (System) LinkByName(name string) (Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return Link{}, err
	}
	return toLink(l), nil
}

// Links is an RTM_GETLINK dump.
func (System) Links() ([]Link, error) {
	ls, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	out := make([]Link, len(ls))
	for i, l := range ls {
		out[i] = toLink(l)
	}
	return out, nil
}

// AddChild sends newChildRequest.
func (System) AddChild(c ChildSpec) error {
	_, err := newChildRequest(c).Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// DelLink is RTM_DELLINK.
func (System) DelLink(index int) error {
	return netlink.LinkDel(byIndex(index))
}

func byIndex(index int) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}}
}

// SetUp sets IFF_UP.
func (System) SetUp(index int) error { return netlink.LinkSetUp(byIndex(index)) }

// SetNoARP sets IFF_NOARP.
func (System) SetNoARP(index int) error { return netlink.LinkSetARPOff(byIndex(index)) }

// Mode reads /sys/class/net/NAME/mode.
func (System) Mode(name string) (string, error) {
	b, err := os.ReadFile("/sys/class/net/" + name + "/mode")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// WriteSysctl writes /proc/sys/path.
func (System) WriteSysctl(path, value string) error {
	return os.WriteFile("/proc/sys/"+path, []byte(value), 0)
}

// ethtool commands (linux/ethtool.h).
const (
	ethtoolGTSO = 0x1e
	ethtoolSGRO = 0x2c
)

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct{ cmd, data uint32 }

// ifreqData is struct ifreq with ifr_data.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte
}

func ethtool(name string, v *ethtoolValue) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr ifreqData
	copy(ifr.name[:MaxNameLen], name)
	ifr.data = unsafe.Pointer(v)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(v)
	if e != 0 {
		return e
	}
	return nil
}

// TSO is ETHTOOL_GTSO.
func (System) TSO(name string) (bool, error) {
	v := &ethtoolValue{cmd: ethtoolGTSO}
	if err := ethtool(name, v); err != nil {
		return false, err
	}
	return v.data != 0, nil
}

// DisableGRO is ETHTOOL_SGRO 0.
func (System) DisableGRO(name string) error {
	return ethtool(name, &ethtoolValue{cmd: ethtoolSGRO})
}

// SubscribeLinks is an RTNLGRP_LINK subscription.
func (System) SubscribeLinks(done <-chan struct{}) (<-chan Link, error) {
	in := make(chan netlink.LinkUpdate, 16)
	if err := netlink.LinkSubscribe(in, done); err != nil {
		return nil, err
	}
	out := make(chan Link)
	go func() {
		defer close(out)
		for u := range in {
			select {
			case out <- toLink(u.Link):
			case <-done:
				return
			}
		}
	}()
	return out, nil
}

// htons is the network-order value of a 16-bit protocol number, as the
// protocol fields of socket(2) and struct sockaddr_ll take it.
func htons(p uint16) uint16 { return p>>8 | p<<8 }

// OpenPacket opens a non-blocking AF_PACKET SOCK_DGRAM socket bound to
// ifindex for every protocol, with PACKET_IGNORE_OUTGOING, on the runtime
// poller: OpenPacketWith(ifindex, PacketOptions{Vnet: vnet}).
func (s System) OpenPacket(ifindex int, vnet bool) (Socket, error) {
	return s.OpenPacketWith(ifindex, PacketOptions{Vnet: vnet})
}

// OpenPacketWith opens a non-blocking AF_PACKET SOCK_DGRAM socket with
// options o, bound to ifindex, on the runtime poller.
//
// af_packet.c packet_bind passes sll_protocol to packet_do_bind as it
// is, in network order (x/sys/unix's SockaddrLinklayer.sockaddr copies
// Protocol unchanged), and packet_do_bind hooks the socket to that
// ethertype: bound with a host-order ETH_P_ALL (0x0003 read as 0x0300) it
// matches no traffic at all. Both the socket and the bind take htons.
func (System) OpenPacketWith(ifindex int, o PacketOptions) (Socket, error) {
	proto := htons(unix.ETH_P_ALL)
	if o.Protocol != 0 {
		proto = htons(o.Protocol)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, fmt.Errorf("kernel: packet socket: %w", err)
	}
	if err := setOptions(fd, o, unix.SetsockoptInt); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kernel: bind packet socket to ifindex %d: %w", ifindex, err)
	}
	f := os.NewFile(uintptr(fd), "packet")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	s := &sysSocket{f: f, rc: rc, hdrs: make([]mmsghdr, batchSize), iovs: make([]unix.Iovec, 2*batchSize)}
	s.sendFn, s.recvFn = s.sendCall, s.recvCall
	return s, nil
}

// setOptions sets o's socket options on fd through setsockopt.
//
// PACKET_IGNORE_OUTGOING (Linux 4.20; af_packet.c packet_setsockopt sets
// prot_hook.ignore_outgoing, and net/core/dev.c dev_queue_xmit_nit skips
// such hooks) keeps the copies of what the socket's own device sends
// (PACKET_OUTGOING) out of a socket bound to every protocol. An older
// kernel answers ENOPROTOOPT: the socket then sees those copies, which
// the backend drops as a wrong packet type; that is counted
// (OutgoingNotIgnored) and logged once.
func setOptions(fd int, o PacketOptions, setsockopt func(fd, level, opt, value int) error) error {
	if o.Vnet {
		if err := setsockopt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			return fmt.Errorf("kernel: set PACKET_VNET_HDR: %w", err)
		}
	}
	if o.SeeOutgoing {
		return nil
	}
	err := setsockopt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	if errors.Is(err, unix.ENOPROTOOPT) {
		outgoingNotIgnored.Add(1)
		outgoingOnce.Do(func() {
			slog.Default().Warn("kernel: PACKET_IGNORE_OUTGOING refused (Linux before 4.20): packet sockets get a copy of what their device sends, dropped as a wrong packet type; upgrade the kernel to avoid the extra work")
		})
		return nil
	}
	if err != nil {
		return fmt.Errorf("kernel: set PACKET_IGNORE_OUTGOING: %w", err)
	}
	return nil
}

var (
	outgoingNotIgnored atomic.Uint64
	outgoingOnce       sync.Once
)

// OutgoingNotIgnored counts the packet sockets opened without
// PACKET_IGNORE_OUTGOING because the kernel refused it (ENOPROTOOPT:
// Linux before 4.20).
func OutgoingNotIgnored() uint64 { return outgoingNotIgnored.Load() }

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// sysSocket is a packet socket. Send and Recv are each called by one
// goroutine at a time (the port's TX lock, the child's reader).
type sysSocket struct {
	f  *os.File
	rc syscall.RawConn

	hdrs           []mmsghdr // for Send
	iovs           []unix.Iovec
	k, n           int
	err            error
	sendFn, recvFn func(fd uintptr) bool

	rhdrs []mmsghdr // for Recv
	riovs []unix.Iovec
	rk    int
	rn    int
	rerr  error
}

// setMsgs points hdrs at msgs' names and buffers.
func setMsgs(hdrs []mmsghdr, iovs []unix.Iovec, msgs []Msg, recv bool) {
	for i := range msgs {
		m := &msgs[i]
		h := &hdrs[i].hdr
		iov := iovs[2*i : 2*i : 2*i+2]
		if len(m.Hdr) > 0 {
			iov = append(iov, unix.Iovec{Base: &m.Hdr[0]})
			iov[len(iov)-1].SetLen(len(m.Hdr))
		}
		if len(m.Buf) > 0 {
			iov = append(iov, unix.Iovec{Base: &m.Buf[0]})
			iov[len(iov)-1].SetLen(len(m.Buf))
		}
		h.Iov = &iovs[2*i]
		h.SetIovlen(len(iov))
		h.Name = &m.Name[0]
		h.Namelen = uint32(m.NameLen)
		if recv {
			h.Namelen = uint32(len(m.Name))
		}
		h.Flags = 0
	}
}

func mmsgCall(trap, fd uintptr, hdrs []mmsghdr) (int, error) {
	n, _, e := unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func (s *sysSocket) sendCall(fd uintptr) bool {
	s.n, s.err = mmsgCall(unix.SYS_SENDMMSG, fd, s.hdrs[:s.k])
	return s.err != unix.EAGAIN
}

func (s *sysSocket) recvCall(fd uintptr) bool {
	s.rn, s.rerr = mmsgCall(unix.SYS_RECVMMSG, fd, s.rhdrs[:s.rk])
	return s.rerr != unix.EAGAIN
}

// Send is sendmmsg.
func (s *sysSocket) Send(msgs []Msg) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	msgs = msgs[:min(len(msgs), len(s.hdrs))]
	setMsgs(s.hdrs, s.iovs, msgs, false)
	s.k = len(msgs)
	if err := s.rc.Write(s.sendFn); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, net.ErrClosed
		}
		return 0, err
	}
	for i := range s.n {
		msgs[i].N = int(s.hdrs[i].n)
	}
	return s.n, s.err
}

// Recv is recvmmsg.
func (s *sysSocket) Recv(msgs []Msg) (int, error) {
	if len(s.rhdrs) < len(msgs) {
		s.rhdrs, s.riovs = make([]mmsghdr, len(msgs)), make([]unix.Iovec, 2*len(msgs))
	}
	setMsgs(s.rhdrs, s.riovs, msgs, true)
	s.rk = len(msgs)
	if err := s.rc.Read(s.recvFn); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, net.ErrClosed
		}
		return 0, err
	}
	for i := range s.rn {
		h := &s.rhdrs[i]
		msgs[i].N, msgs[i].NameLen = int(h.n), int(h.hdr.Namelen)
		msgs[i].Trunc = h.hdr.Flags&unix.MSG_TRUNC != 0
	}
	return s.rn, s.rerr
}

func (s *sysSocket) setsockopt(opt int, b []byte) error {
	var serr error
	err := s.rc.Control(func(fd uintptr) {
		_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, fd, unix.SOL_PACKET, uintptr(opt), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0)
		if e != 0 {
			serr = e
		}
	})
	return errors.Join(err, serr)
}

// AddMembership is PACKET_ADD_MEMBERSHIP.
func (s *sysSocket) AddMembership(mreq []byte) error {
	return s.setsockopt(unix.PACKET_ADD_MEMBERSHIP, mreq)
}

// DropMembership is PACKET_DROP_MEMBERSHIP.
func (s *sysSocket) DropMembership(mreq []byte) error {
	return s.setsockopt(unix.PACKET_DROP_MEMBERSHIP, mreq)
}

// Close closes the socket; a blocked Recv returns net.ErrClosed.
func (s *sysSocket) Close() error { return s.f.Close() }
