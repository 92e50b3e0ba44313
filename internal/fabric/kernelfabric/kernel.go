// Package kernelfabric is the kernel IPoIB backend of ipoib.Port. Each
// VIF gets a datagram-mode IPoIB child interface, created over netlink
// on the parent (ib0). The child has its own UD QP, so its own QPN and
// 20-byte address, as Mellanox's eIPoIB gave each guest. Each child gets
// an AF_PACKET SOCK_DGRAM socket that sends with a 20-byte sockaddr_ll
// destination and receives what the child's QP receives. The host's own
// stack is kept off the children (no addresses, IPv6 off, NOARP, no
// forwarding).
//
// Everything it asks of the kernel goes through the small Kernel
// interface. System is the real one (netlink, packet sockets, sysctls,
// ethtool). Package kernelfabric/fakekernel is a fake that behaves as
// the kernel code does, so that the backend and the shim over it are
// tested here, without InfiniBand hardware. docs/kernel-backend.md cites
// the kernel function behind each rule.
//
// The kernel gives no source address on receive (IPoIB has no
// header_ops->parse, so sll_halen is 0): received packets carry
// ipoib.RxMeta.SrcUnknown and the shim finds the sender from ARP/NDP.
package kernelfabric

import "github.com/eipoib/eipoibd/ipoib"

// Link is what the backend needs to know of a network interface.
type Link struct {
	Index       int
	ParentIndex int    // IFLA_LINK: the parent of an IPoIB child, 0 for others
	Name        string // IFLA_IFNAME
	Kind        string // IFLA_INFO_KIND, "ipoib" for IPoIB interfaces
	MTU         int
	HwAddr      ipoib.HwAddr // the 20-byte IPoIB address (flags, QPN, GID)
	// PKey is an IPoIB interface's P_Key, full-membership bit set
	// (IFLA_IPOIB_PKEY, which ipoib_netlink.c ipoib_fill_info reports);
	// 0 for other interfaces.
	PKey ipoib.PKey
	// Mode and Umcast are an IPoIB interface's IFLA_IPOIB_MODE
	// (ModeDatagram or ModeConnected) and IFLA_IPOIB_UMCAST, as
	// ipoib_fill_info reports them; 0 for other interfaces.
	Mode    uint16
	Umcast  uint16
	Up      bool // IFF_UP
	Carrier bool // operationally up (carrier on)
	// RxQueues is IFLA_NUM_RX_QUEUES, the receive queues the device
	// was allocated with: one per channel on an mlx5 enhanced-IPoIB
	// parent (mlx5_rdma_rn_get_params), 1 on the other IPoIB drivers.
	RxQueues int
}

// IFLA_IPOIB_MODE values (include/uapi/linux/if_link.h IPOIB_MODE_*).
const (
	ModeDatagram  = 0
	ModeConnected = 1
)

// ChildSpec is an IPoIB child to create (RTM_NEWLINK, kind "ipoib"):
// always datagram mode, user-multicast off.
type ChildSpec struct {
	Name   string
	Parent int        // parent ifindex (IFLA_LINK)
	PKey   ipoib.PKey // IFLA_IPOIB_PKEY; the driver sets the full-membership bit
}

// Msg is one message of a batch on a packet socket: an optional header
// iovec (the virtio_net_hdr of a socket with PACKET_VNET_HDR), the data
// iovec, and the socket address (struct sockaddr_ll bytes).
type Msg struct {
	// Name holds the sockaddr_ll: Send reads Name[:NameLen], Recv writes
	// it and sets NameLen to what the kernel returned.
	Name    []byte
	NameLen int
	// Hdr is an optional first iovec; on a socket with
	// PACKET_VNET_HDR, Recv takes it empty (the virtio_net_hdr then
	// leads Buf) or of VnetHdrLen bytes.
	Hdr   []byte
	Buf   []byte
	N     int  // bytes moved (Hdr included)
	Trunc bool // Recv: the datagram was longer than Hdr+Buf (MSG_TRUNC)
}

// Socket is an AF_PACKET SOCK_DGRAM socket bound to one interface, with
// protocol ETH_P_ALL and PACKET_IGNORE_OUTGOING as the backend opens it.
type Socket interface {
	// Send is sendmmsg(2): it returns how many messages the kernel took;
	// an error is about the first message not taken.
	Send(msgs []Msg) (int, error)
	// Recv is recvmmsg(2): it blocks for at least one datagram and
	// returns how many it filled; net.ErrClosed after Close.
	Recv(msgs []Msg) (int, error)
	// AddMembership and DropMembership are setsockopt(SOL_PACKET,
	// PACKET_ADD_MEMBERSHIP / PACKET_DROP_MEMBERSHIP) with the given
	// struct packet_mreq_max bytes.
	AddMembership(mreq []byte) error
	DropMembership(mreq []byte) error
	// Drops returns how many datagrams the kernel dropped since the
	// last call because the socket's receive queue was full
	// (getsockopt PACKET_STATISTICS, whose count the read resets).
	Drops() (uint64, error)
	Close() error
}

// Kernel is the backend's boundary with the kernel.
type Kernel interface {
	LinkByName(name string) (Link, error)
	Links() ([]Link, error)
	// AddChild creates an IPoIB child (RTM_NEWLINK); it is down.
	AddChild(c ChildSpec) error
	// DelLink deletes an interface (RTM_DELLINK).
	DelLink(index int) error
	// SetUp sets IFF_UP; SetNoARP sets IFF_NOARP.
	SetUp(index int) error
	SetNoARP(index int) error
	// Mode returns an IPoIB interface's mode, "datagram" or "connected"
	// (/sys/class/net/NAME/mode).
	Mode(name string) (string, error)
	// PKeys reads the P_Key table of the HCA port under IPoIB interface
	// parent (sysfs; see system_ib.go).
	PKeys(parent string) (PKeyTable, error)
	// WriteSysctl writes value to /proc/sys/path.
	WriteSysctl(path, value string) error
	// HasIPv6 reports whether the kernel runs IPv6: false on a kernel
	// booted with ipv6.disable=1 (or built without it), which has no
	// /proc/sys/net/ipv6/conf at all (see System.HasIPv6).
	HasIPv6() (bool, error)
	// TSO reports whether the interface has TCP segmentation offload on
	// (ETHTOOL_GTSO).
	TSO(name string) (bool, error)
	// DisableGRO turns generic receive offload off (ETHTOOL_SGRO), so
	// that packet sockets see datagrams as they arrived, never merged.
	DisableGRO(name string) error
	// SubscribeLinks sends every link change (RTNLGRP_LINK) until done
	// is closed or the subscription fails, and then closes the channel.
	// onErr, if not nil, is told of every error: the one that ends the
	// subscription (ENOBUFS when the kernel overran its socket, and
	// notifications were lost) and those it survives. onErr must not
	// call the Kernel.
	SubscribeLinks(done <-chan struct{}, onErr func(error)) (<-chan Link, error)
	// OpenPacketWith opens a packet socket bound to ifindex with
	// options o.
	OpenPacketWith(ifindex int, o PacketOptions) (Socket, error)
}

// PacketOptions are a packet socket's protocol and options, for
// OpenPacketWith.
type PacketOptions struct {
	// Protocol is the ethertype (host order) the socket is bound to, and
	// receives alone; 0 is every protocol (ETH_P_ALL).
	Protocol uint16
	// Vnet sets PACKET_VNET_HDR: a virtio_net_hdr leads every datagram.
	Vnet bool
	// SeeOutgoing leaves PACKET_IGNORE_OUTGOING off, so that a socket
	// bound to every protocol also gets a copy (PACKET_OUTGOING) of what
	// other sockets and the host send through its device.
	SeeOutgoing bool
	// HostOnly attaches a socket filter that accepts PACKET_HOST
	// packets only: the kernel drops every broadcast, multicast (and
	// outgoing) copy before it is queued to the socket, and counts it
	// nowhere the socket sees.
	HostOnly bool
	// Raw opens a SOCK_RAW socket that System adds no link header to:
	// each message's Hdr carries the whole link header on Send, and
	// receives it on Recv (SOCK_RAW data starts at the MAC header), and
	// N counts it. The backend never sets it; an emulated Kernel does
	// (package emuib), to put an IPoIB link header on a veth.
	Raw bool
}
