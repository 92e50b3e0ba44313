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

	"github.com/eipoib/eipoibd/internal/fdio"
	"github.com/eipoib/eipoibd/ipoib"
)

// System is the running kernel.
type System struct{}

var _ Kernel = System{}

// toLink converts a netlink link. Carrier is IFF_LOWER_UP, which
// dev_get_flags (net/core/dev.c) sets when the device is running and
// netif_carrier_ok: the carrier itself, whatever the operational state
// says (a veth whose peer is down is LOWERLAYERDOWN without it; a dummy
// is UNKNOWN with it).
func toLink(l netlink.Link) Link {
	a := l.Attrs()
	out := Link{Index: a.Index, ParentIndex: a.ParentIndex, Name: a.Name, Kind: l.Type(), MTU: a.MTU,
		Up: a.Flags&net.FlagUp != 0, Carrier: a.RawFlags&unix.IFF_LOWER_UP != 0, RxQueues: a.NumRxQueues}
	if len(a.HardwareAddr) == ipoib.HwAddrLen {
		out.HwAddr = ipoib.HwAddr(a.HardwareAddr)
	}
	if ib, ok := l.(*netlink.IPoIB); ok {
		out.PKey, out.Mode, out.Umcast = ipoib.PKey(ib.Pkey), uint16(ib.Mode), ib.Umcast
	}
	return out
}

// LinkByName is RTM_GETLINK by name. A missing link is ENODEV, as the
// kernel answers (rtnl_getlink); vishvananda/netlink turns that errno
// into its own LinkNotFoundError, which is turned back here.
func (System) LinkByName(name string) (Link, error) {
	l, err := netlink.LinkByName(name)
	if _, ok := err.(netlink.LinkNotFoundError); ok {
		return Link{}, fmt.Errorf("kernel: no link %s: %w", name, unix.ENODEV)
	}
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

// HasIPv6 reports whether /proc/sys/net/ipv6/conf exists. With
// ipv6.disable=1 it does not: net/ipv6/af_inet6.c inet6_init returns
// early when disable_ipv6_mod is set ("Loaded, but administratively
// disabled"). That is before ipv6_sysctl_register and addrconf_init,
// which register net/ipv6 and its conf/DEV directories
// (addrconf_sysctl_register). The same holds for a kernel without
// CONFIG_IPV6 or with the ipv6 module not loaded.
func (System) HasIPv6() (bool, error) {
	_, err := os.Stat("/proc/sys/net/ipv6/conf")
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
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

// linkRcvBuf is the receive buffer of the RTNLGRP_LINK socket: a port
// flap with 1,024 children is over 2,000 RTM_NEWLINK messages (about
// 1.5 KB each, twice that in skb truesize), far more than the default
// net.core.rmem_default (212,992 bytes) holds. netlink_overrun
// (net/netlink/af_netlink.c) drops what does not fit and reports
// ENOBUFS, which ends the subscription.
const linkRcvBuf = 8 << 20

// rcvbufForceRefused: SO_RCVBUFFORCE was refused (EPERM); SO_RCVBUF is
// used from then on.
var rcvbufForceRefused atomic.Bool

// SubscribeLinks is an RTNLGRP_LINK subscription with a linkRcvBuf
// receive buffer (SO_RCVBUFFORCE, which needs CAP_NET_ADMIN; without it
// SO_RCVBUF, capped at net.core.rmem_max). vishvananda/netlink's
// linkSubscribeAt closes its channel on any receive error, ENOBUFS
// included, after telling onErr (its ErrorCallback); the channel
// returned here is closed then too.
func (System) SubscribeLinks(done <-chan struct{}, onErr func(error)) (<-chan Link, error) {
	return subscribeLinks(done, onErr, linkRcvBuf)
}

// subscribeLinks is SubscribeLinks with a receive buffer of rcvbuf bytes
// (the kernel doubles it, and keeps at least SOCK_MIN_RCVBUF).
func subscribeLinks(done <-chan struct{}, onErr func(error), rcvbuf int) (<-chan Link, error) {
	in := make(chan netlink.LinkUpdate, 64)
	opt := netlink.LinkSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: rcvbuf, ReceiveBufferForceSize: !rcvbufForceRefused.Load()}
	err := netlink.LinkSubscribeWithOptions(in, done, opt)
	if errors.Is(err, unix.EPERM) && opt.ReceiveBufferForceSize {
		// net/core/sock.c sk_setsockopt: SO_RCVBUFFORCE wants
		// sockopt_capable(CAP_NET_ADMIN), capable() in the initial
		// user namespace (a container's CAP_NET_ADMIN is not enough). linkSubscribeAt returns this
		// error before it arranges to close its socket, which stays
		// open: asked once a process.
		rcvbufForceRefused.Store(true)
		opt.ReceiveBufferForceSize = false
		err = netlink.LinkSubscribeWithOptions(in, done, opt)
	}
	if err != nil {
		return nil, fmt.Errorf("kernel: subscribe to RTNLGRP_LINK: %w", err)
	}
	out := make(chan Link)
	go func() {
		defer close(out)
		for u := range in {
			select {
			case out <- toLink(u.Link):
			case <-done:
				for range in { // the library's reader ends once it is not blocked on in
				}
				return
			}
		}
	}()
	return out, nil
}

// htons is the network-order value of a 16-bit protocol number, as the
// protocol fields of socket(2) and struct sockaddr_ll take it.
func htons(p uint16) uint16 { return p>>8 | p<<8 }

// OpenPacketWith opens a non-blocking AF_PACKET socket with options o,
// bound to ifindex, on the runtime poller.
//
// af_packet.c packet_bind passes sll_protocol to packet_do_bind as it
// is, in network order (x/sys/unix's SockaddrLinklayer.sockaddr copies
// Protocol unchanged), and packet_do_bind hooks the socket to that
// ethertype: bound with a host-order ETH_P_ALL (0x0003 read as 0x0300) it
// matches no traffic at all. The bind takes htons.
//
// The socket itself is created with protocol 0. packet_create hooks a
// socket created with a protocol to every device at once. What arrived
// on any device before the bind would then be queued on it and read as
// the bound child's: in TestNothingBeforeBind, about half of the sockets
// opened while another device was busy held such packets. Created with
// 0, the socket is hooked by the bind alone, after its options and
// filter are set.
//
// The socket is SOCK_DGRAM, unless o.Vnet: packet_setsockopt refuses
// PACKET_VNET_HDR (EINVAL) on any socket but SOCK_RAW. A Vnet socket is
// SOCK_RAW and behaves as a SOCK_DGRAM one would (see linkHdr). A Raw
// socket is SOCK_RAW too, with no linkHdr: its caller writes and reads
// the link header itself.
func (System) OpenPacketWith(ifindex int, o PacketOptions) (Socket, error) {
	proto := htons(unix.ETH_P_ALL)
	if o.Protocol != 0 {
		proto = htons(o.Protocol)
	}
	typ := unix.SOCK_DGRAM
	if o.Vnet || o.Raw {
		typ = unix.SOCK_RAW
	}
	fd, err := unix.Socket(unix.AF_PACKET, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kernel: packet socket: %w", err)
	}
	s := &sysSocket{hdrs: make([]unix.Mmsghdr, batchSize), iovs: make([]unix.Iovec, 3*batchSize)}
	if err := setOptions(fd, o, unix.SetsockoptInt); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Before the bind: nothing is queued yet. FORCE needs CAP_NET_ADMIN;
	// the plain one is capped at net.core.rmem_max.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, packetRcvBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, packetRcvBuf)
	}
	if o.HostOnly {
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &hostOnlyProg); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("kernel: attach the PACKET_HOST socket filter: %w", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kernel: bind packet socket to ifindex %d: %w", ifindex, err)
	}
	if o.Vnet && !o.Raw {
		if s.link, err = newLinkHdr(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	s.f = os.NewFile(uintptr(fd), "packet")
	if s.rc, err = s.f.SyscallConn(); err != nil {
		s.f.Close()
		return nil, err
	}
	s.sendFn, s.recvFn = s.sendCall, s.recvCall
	return s, nil
}

// packetRcvBuf is the receive buffer of a child's packet socket (the
// kernel doubles it: sock_setsockopt). packet_rcv drops what arrives
// while the queue holds sk_rcvbuf bytes (counted: Socket.Drops), and the
// default, net.core.rmem_default (212,992 bytes), holds about 30
// datagrams of a 4092-byte MTU (each costs its skb's truesize, over
// 6 KB): one TCP burst while the reader is scheduled away. Memory is
// taken only by what waits in the queue.
const packetRcvBuf = 4 << 20

// Classic BPF ancillary loads (linux/filter.h): SKF_AD_OFF +
// SKF_AD_PKTTYPE loads skb->pkt_type (net/core/filter.c
// convert_bpf_extensions).
const (
	skfAdOff     = 0xfffff000 // SKF_AD_OFF, -0x1000
	skfAdPktType = 4          // SKF_AD_PKTTYPE
)

// hostOnlyFilter accepts PACKET_HOST packets whole and drops the rest
// (PACKET_BROADCAST, PACKET_MULTICAST, PACKET_OTHERHOST,
// PACKET_OUTGOING). af_packet.c packet_rcv runs it (run_filter) before
// it clones the skb or queues it. It drops a packet the filter gives 0
// without counting it in PACKET_STATISTICS (drop_n_restore, not
// drop_n_acct).
var hostOnlyFilter = [...]unix.SockFilter{
	{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: skfAdOff + skfAdPktType},
	{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: PacketHost, Jt: 0, Jf: 1},
	{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
	{Code: unix.BPF_RET | unix.BPF_K, K: 0},
}

// hostOnlyProg is hostOnlyFilter as SO_ATTACH_FILTER takes it.
var hostOnlyProg = unix.SockFprog{Len: uint16(len(hostOnlyFilter)), Filter: &hostOnlyFilter[0]}

// linkHdr makes a SOCK_RAW socket send and receive as a SOCK_DGRAM one.
//
// Send puts the link header between the virtio_net_hdr and the data, as
// the device's header_ops->create does for SOCK_DGRAM in packet_snd.
// ipoib_hard_header writes the 20-byte destination as the pseudo header,
// then the ethertype and 2 reserved bytes, IPOIB_HARD_LEN in all.
// eth_header writes the destination, the device's address and the
// ethertype. Send checks the name as packet_snd checks a SOCK_DGRAM one:
// at least dev->addr_len address bytes, else EINVAL.
//
// Recv lands the link header of what it receives in a scratch buffer;
// packet_rcv pushes it back for SOCK_RAW, from the MAC header on.
// csum_start counts from the link header either way
// (virtio_net_hdr_to_skb on skb->data), so the virtio_net_hdr is the
// same as a SOCK_DGRAM socket's would be.
type linkHdr struct {
	hlen, alen int     // dev->hard_header_len, dev->addr_len
	hatype     uint16  // dev->type
	src        [6]byte // Ethernet: the device's address
	tx         [batchSize][IPoIBHardLen]byte
	scratch    [IPoIBHardLen]byte
}

// newLinkHdr reads the bound device's type and address (getsockname:
// af_packet.c packet_getname).
func newLinkHdr(fd int) (*linkHdr, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, fmt.Errorf("kernel: packet socket name: %w", err)
	}
	ll, ok := sa.(*unix.SockaddrLinklayer)
	if !ok {
		return nil, fmt.Errorf("kernel: packet socket name %T", sa)
	}
	h := &linkHdr{hatype: ll.Hatype}
	switch ll.Hatype {
	case ARPHRDInfiniBand:
		h.hlen, h.alen = IPoIBHardLen, ipoib.HwAddrLen
	case unix.ARPHRD_ETHER:
		h.hlen, h.alen = 14, 6
		copy(h.src[:], ll.Addr[:6])
	default:
		return nil, fmt.Errorf("kernel: PACKET_VNET_HDR on link type %d: only InfiniBand and Ethernet are supported: %w", ll.Hatype, unix.EPROTONOSUPPORT)
	}
	return h, nil
}

// nameOK reports whether m's name passes packet_snd's SOCK_DGRAM checks
// as far as the socket's device tells: sizeof(sockaddr_ll), sll_halen
// and dev->addr_len address bytes.
func (h *linkHdr) nameOK(m *Msg) bool {
	n := m.NameLen
	return n >= SockaddrLLSize && n <= len(m.Name) && n >= sllAddrOff+int(m.Name[11]) && n >= sllAddrOff+h.alen
}

// put builds message i's link header from its name.
func (h *linkHdr) put(i int, name []byte) []byte {
	b := h.tx[i][:h.hlen]
	if h.hatype == ARPHRDInfiniBand {
		copy(b, name[sllAddrOff:sllAddrOff+ipoib.HwAddrLen])
		b[20], b[21], b[22], b[23] = name[2], name[3], 0, 0
		return b
	}
	copy(b, name[sllAddrOff:sllAddrOff+6])
	copy(b[6:], h.src[:])
	b[12], b[13] = name[2], name[3]
	return b
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

// sysSocket is a packet socket. Send and Recv are each called by one
// goroutine at a time (the port's TX lock, the child's reader).
type sysSocket struct {
	f    *os.File
	rc   syscall.RawConn
	link *linkHdr // a SOCK_RAW socket made to look SOCK_DGRAM; nil for SOCK_DGRAM

	hdrs           []unix.Mmsghdr // for Send
	iovs           []unix.Iovec
	k, n           int
	err            error
	sendFn, recvFn func(fd uintptr) bool

	rhdrs []unix.Mmsghdr // for Recv
	riovs []unix.Iovec
	rk    int
	rn    int
	rerr  error
}

// appendIov appends an iovec of b, if b is not empty.
func appendIov(iov []unix.Iovec, b []byte) []unix.Iovec {
	if len(b) == 0 {
		return iov
	}
	iov = append(iov, unix.Iovec{Base: &b[0]})
	iov[len(iov)-1].SetLen(len(b))
	return iov
}

// setMsgs points hdrs at msgs' names and buffers: three iovecs a
// message, Hdr, the link header of a SOCK_RAW socket and Buf; on
// receive, the virtio_net_hdr lands in Hdr, or in Buf's first bytes when
// Hdr is empty.
func (s *sysSocket) setMsgs(hdrs []unix.Mmsghdr, iovs []unix.Iovec, msgs []Msg, recv bool) {
	for i := range msgs {
		m := &msgs[i]
		h := &hdrs[i].Hdr
		iov := iovs[3*i : 3*i : 3*i+3]
		switch {
		case s.link == nil:
			iov = appendIov(appendIov(iov, m.Hdr), m.Buf)
		case recv && len(m.Hdr) == 0:
			v := min(len(m.Buf), VnetHdrLen)
			iov = appendIov(appendIov(appendIov(iov, m.Buf[:v]), s.link.scratch[:s.link.hlen]), m.Buf[v:])
		case recv:
			iov = appendIov(appendIov(appendIov(iov, m.Hdr), s.link.scratch[:s.link.hlen]), m.Buf)
		default:
			iov = appendIov(appendIov(appendIov(iov, m.Hdr), s.link.put(i, m.Name)), m.Buf)
		}
		h.Iov = &iovs[3*i]
		h.SetIovlen(len(iov))
		h.Name = &m.Name[0]
		h.Namelen = uint32(m.NameLen)
		if recv {
			h.Namelen = uint32(len(m.Name))
		}
		h.Flags = 0
	}
}

func (s *sysSocket) sendCall(fd uintptr) bool {
	s.n, s.err = fdio.RawMmsg(unix.SYS_SENDMMSG, fd, s.hdrs[:s.k], unix.MSG_DONTWAIT)
	return s.err != unix.EAGAIN
}

func (s *sysSocket) recvCall(fd uintptr) bool {
	s.rn, s.rerr = fdio.RawMmsg(unix.SYS_RECVMMSG, fd, s.rhdrs[:s.rk], unix.MSG_DONTWAIT)
	return s.rerr != unix.EAGAIN
}

// Send is sendmmsg.
func (s *sysSocket) Send(msgs []Msg) (int, error) {
	msgs = msgs[:min(len(msgs), len(s.hdrs))]
	if s.link != nil {
		for i := range msgs {
			if !s.link.nameOK(&msgs[i]) {
				if i == 0 {
					return 0, unix.EINVAL
				}
				msgs = msgs[:i] // these go now; the bad one is refused on the next call, as sendmmsg does
				break
			}
		}
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	s.setMsgs(s.hdrs, s.iovs, msgs, false)
	s.k = len(msgs)
	if err := s.rc.Write(s.sendFn); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, net.ErrClosed
		}
		return 0, err
	}
	for i := range s.n {
		msgs[i].N = int(s.hdrs[i].Len)
		if s.link != nil {
			msgs[i].N -= s.link.hlen
		}
	}
	return s.n, s.err
}

// Recv is recvmmsg.
func (s *sysSocket) Recv(msgs []Msg) (int, error) {
	if len(s.rhdrs) < len(msgs) {
		s.rhdrs, s.riovs = make([]unix.Mmsghdr, len(msgs)), make([]unix.Iovec, 3*len(msgs))
	}
	s.setMsgs(s.rhdrs, s.riovs, msgs, true)
	s.rk = len(msgs)
	if err := s.rc.Read(s.recvFn); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, net.ErrClosed
		}
		return 0, err
	}
	for i := range s.rn {
		h := &s.rhdrs[i]
		msgs[i].N, msgs[i].NameLen = int(h.Len), int(h.Hdr.Namelen)
		if s.link != nil && msgs[i].N > VnetHdrLen {
			msgs[i].N -= min(s.link.hlen, msgs[i].N-VnetHdrLen)
		}
		msgs[i].Trunc = h.Hdr.Flags&unix.MSG_TRUNC != 0
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

// Drops is PACKET_STATISTICS' tp_drops: the datagrams packet_rcv
// (net/packet/af_packet.c) dropped because the receive queue held
// sk_rcvbuf bytes (drop_n_acct, which adds to po->tp_drops), since the
// last call: packet_getsockopt takes the count with atomic_xchg(0).
func (s *sysSocket) Drops() (uint64, error) {
	var st *unix.TpacketStats
	var serr error
	err := s.rc.Control(func(fd uintptr) {
		st, serr = unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
	})
	if err = errors.Join(err, serr); err != nil {
		return 0, fmt.Errorf("kernel: PACKET_STATISTICS: %w", err)
	}
	return uint64(st.Drops), nil
}

// Close closes the socket; a blocked Recv returns net.ErrClosed.
func (s *sysSocket) Close() error { return s.f.Close() }
