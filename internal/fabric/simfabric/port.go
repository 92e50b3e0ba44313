// Package simfabric is the simulated InfiniBand UD fabric, eipoibd's
// default backend. Each Port is one IB port bound to an underlay
// interface, its GID the interface's IPv6 link-local address. Every IB
// packet is one UDP datagram on port 4791 carrying a RoCEv2-style UD
// SEND-only (BTH, DETH, IPoIB payload, ICRC). MGIDs are IPv6 multicast
// groups on the underlay. The exact format is in docs/architecture.md;
// other implementations interoperate with it from that text alone.
//
// Receive path: recvmmsg into the port's buffers (a UDP GRO train whole)
// → Decode (opcode, TVer, ICRC, pad) → Q_Key and size → the shared
// receive checks (ipoib.CheckRx: QPN, group, P_Key) → payload copied to
// the caller's buffer at offset.
//
// Send path: the shared transmit checks (ipoib.CheckTx) → BTH+DETH
// written into the headroom, pad and ICRC appended → the encode hook, if
// one is set (faultport's corruption) → sendmmsg, in UDP GSO trains when
// no hook is set.
//
// Every drop is counted under its ipoib.Drop reason.
package simfabric

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/ipoib"
)

// Config configures a Port.
type Config struct {
	Underlay string // interface name
	IBMTU    int    // 2048 or 4096
	// DADWait bounds the wait for the link-local address to leave the
	// tentative state; 0 means 5 s.
	DADWait time.Duration
	// BusyPoll makes the receiver spin on non-blocking receives for up
	// to this long after finding the socket empty, before it waits in
	// the netpoller, and sets SO_BUSY_POLL and SO_PREFER_BUSY_POLL; 0 turns
	// both off.
	BusyPoll time.Duration
	// Sockets is the number of sockets the port receives on, each read
	// by its own caller through RxQueues, and sends from. 0 or 1 is one
	// socket, on UDP port 4791 both ways. With more, they are bound to
	// port 4791 together (SO_REUSEPORT), and the kernel spreads
	// datagrams over them by a hash of the sender's address and UDP
	// source port. The port then sends from 2×Sockets lanes: the first
	// receive socket and 2×Sockets-1 more sockets on ephemeral ports.
	// Each unicast packet leaves from the lane its inner flow hashes to,
	// so that a peer's receive sockets see one source port per flow (see
	// lanes.go). At most MaxSockets.
	Sockets int
}

// MaxSockets bounds Config.Sockets.
const MaxSockets = 32

// lanesPerSocket is the number of send lanes (source ports) per receive
// socket when there are several. Which of a peer's sockets a source port
// lands on is the peer's secret hash. With as many ports as the peer has
// sockets, two flows on different ports would share a socket as often as
// not. All the ports would share one socket 1 time in n^(n-1) for n
// sockets (1 in 64 for 4). Twice as many ports spread flows more evenly,
// for a sendmmsg per lane a batch holds packets of.
const lanesPerSocket = 2

// Port is one IB port on the simulated fabric. It implements ipoib.Port
// and ipoib.RxQueues. Each receive queue (RxQueues; Read is the first's)
// may be read by one goroutine at a time, in parallel with the others;
// Write may be called from several goroutines (wmu orders them).
type Port struct {
	ifi    *net.Interface
	gid    ipoib.GID
	mtu    int
	conns  []*net.UDPConn // every socket; the first receive socket first: the group member, and lane 0's sender
	pc     *ipv6.PacketConn
	closed atomic.Bool
	down   atomic.Bool
	downMu sync.Mutex        // orders down's changes with their events
	events *ipoib.EventQueue // events.go

	qps    *ipoib.QPTable
	groups *ipoib.GroupTable
	psn    atomic.Uint32

	rx     []*rxLane  // the receive sockets' state (read.go), rx[i] on conns[i]
	wmu    sync.Mutex // Write state
	wcodec Codec
	chunk  chunk
	cutter gso.Segmenter
	segBuf [][]byte // storage of the segments cut from super-packets, one per chunk entry
	segOff int      // the offset segBuf was made for
	wmsgs  []ipv6.Message
	wbufs  [][1][]byte
	snds   []*sender // by lane: the socket each sends from (lanes.go)
	budget budget    // the pauses the senders may make for a chunk, all lanes together
	sports []uint16  // by lane: its socket's UDP port
	addrs  map[ipoib.GID]*peer
	worig  []int   // per message of the chunk: its index in bufs
	wlane  []uint8 // per message of the chunk: its lane
	sorted laneSort
	// UDP GSO trains (see trains): on until the kernel refuses one.
	gso      bool
	tmsgs    []ipv6.Message
	tspan    []span
	trainOOB [][]byte   // per train: its UDP_SEGMENT control message
	trainIOV [][][]byte // per train: its packets, sent as one iovec list
	// hook sees each packet once encoded (SetEncodeHook); while it is
	// set, packets leave one datagram each.
	hook func(body []byte, mcast bool)

	txPackets, txBytes atomic.Uint64
	txMulticast        atomic.Uint64 // of txPackets: those to a group
	// drops counts by reason, but for DropRxOverflow: the kernel's own
	// counts of receive-queue drops (SO_RXQ_OVFL), one per socket, are
	// kept by each rxLane as the kernel reports them and summed by
	// Counters.
	drops                                 ipoib.DropCounters
	trainsSent, trainPackets, gsoFallback atomic.Uint64
}

var _ ipoib.Port = (*Port)(nil)

const (
	batch        = 64
	socketBuffer = 8 << 20
	// maxTrain and maxTrainBytes bound a UDP GSO train: the kernel's
	// UDP_MAX_SEGMENTS (64 on older kernels) and one IPv6 payload.
	maxTrain      = 64
	maxTrainBytes = 65000
	// rxBatch datagrams are received per system call, each up to a
	// merged train (UDP GRO): 16 × 64 KB of buffers.
	rxBatch = 16
)

// Open binds a port to cfg.Underlay. It fails with a message naming the
// problem when the interface is missing, has no IPv6 link-local address,
// or its MTU cannot carry the IB MTU plus 72 bytes unfragmented.
func Open(cfg Config) (*Port, error) {
	if _, err := ipoib.IPMTU(cfg.IBMTU); err != nil {
		return nil, fmt.Errorf("simfabric: %w", err)
	}
	if cfg.Sockets < 0 || cfg.Sockets > MaxSockets {
		return nil, fmt.Errorf("simfabric: %d sockets: want 1 to %d", cfg.Sockets, MaxSockets)
	}
	nsock := max(cfg.Sockets, 1)
	ifi, err := net.InterfaceByName(cfg.Underlay)
	if err != nil {
		return nil, fmt.Errorf("simfabric: underlay interface %q not found", cfg.Underlay)
	}
	if need := cfg.IBMTU + UnderlayExtra; ifi.MTU < need {
		return nil, fmt.Errorf("simfabric: underlay %s MTU %d is below IB MTU %d + %d = %d; raise it (ip link set %s mtu %d)",
			ifi.Name, ifi.MTU, cfg.IBMTU, UnderlayExtra, need, ifi.Name, need)
	}
	wait := cfg.DADWait
	if wait == 0 {
		wait = 5 * time.Second
	}
	gid, err := linkLocal(ifi, wait)
	if err != nil {
		return nil, err
	}
	p := &Port{
		ifi: ifi, gid: gid, mtu: cfg.IBMTU,
		qps: ipoib.NewQPTable(0x100 + rand.Uint32N(0xff0000)), groups: ipoib.NewGroupTable(),
		wmsgs: make([]ipv6.Message, 0, batch), wbufs: make([][1][]byte, batch),
		worig: make([]int, 0, batch), wlane: make([]uint8, 0, batch),
		gso: true, tmsgs: make([]ipv6.Message, 0, batch), tspan: make([]span, 0, batch),
		addrs: make(map[ipoib.GID]*peer),
	}
	p.sorted.init()
	p.events = ipoib.NewEventQueue(true)
	fail := func(err error) (*Port, error) {
		p.Close() // the sockets made so far, and the receive lanes' eventfds (fdio)
		return nil, err
	}
	// The receive sockets, on port 4791; with several, the kernel picks
	// one per datagram (udp6_lib_lookup2 → inet6_lookup_reuseport →
	// reuseport_select_sock, net/core/sock_reuseport.c: the socket at
	// reciprocal_scale(udp6_ehashfn(daddr, dport, saddr, sport), n) of
	// the group, which binds alike, to one device, by one user).
	for i := range nsock {
		conn, err := listen(ifi, cfg, UDPPort, rxSocket{reuse: nsock > 1, extra: i > 0})
		if err != nil {
			return fail(err)
		}
		p.conns = append(p.conns, conn)
		l, err := newRxLane(p, conn, cfg.BusyPoll)
		if err != nil {
			return fail(err)
		}
		p.rx = append(p.rx, l)
	}
	p.pc = ipv6.NewPacketConn(p.conns[0])
	if err := p.pc.SetMulticastInterface(ifi); err != nil {
		return fail(fmt.Errorf("simfabric: multicast interface %s: %w", ifi.Name, err))
	}
	if err := p.pc.SetMulticastLoopback(false); err != nil {
		return fail(fmt.Errorf("simfabric: multicast loopback: %w", err))
	}
	// The senders: lane 0 on the first receive socket (source port
	// 4791, and every multicast packet), the others each on a socket
	// of its own, on a port the kernel picks, that receives nothing.
	nlanes := 1
	if nsock > 1 {
		nlanes = lanesPerSocket * nsock
	}
	for i := range nlanes {
		conn := p.conns[0]
		if i > 0 {
			if conn, err = listen(ifi, cfg, 0, rxSocket{}); err != nil {
				return fail(err)
			}
			p.conns = append(p.conns, conn)
		}
		rc, err := conn.SyscallConn()
		if err != nil {
			return fail(fmt.Errorf("simfabric: %w", err))
		}
		p.snds = append(p.snds, newSender(rc, batch, &p.budget))
		p.sports = append(p.sports, uint16(conn.LocalAddr().(*net.UDPAddr).Port))
	}
	return p, nil
}

// rxSocket says how listen makes a socket: one of several receive
// sockets on port 4791 (reuse), and one of those that must not take
// group traffic (extra).
type rxSocket struct{ reuse, extra bool }

// listen makes a UDP socket bound to port on the underlay, with the
// options the port's sockets share; a receive socket (port 4791) gets
// those of the receive path too.
func listen(ifi *net.Interface, cfg Config, port int, how rxSocket) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = socketOptions(int(fd), ifi, cfg, port == UDPPort, how) })
		if err != nil {
			return err
		}
		return serr
	}}
	pconn, err := lc.ListenPacket(context.Background(), "udp6", fmt.Sprintf("[::]:%d", port))
	if err != nil {
		return nil, fmt.Errorf("simfabric: listen on UDP %d on %s: %w", port, ifi.Name, err)
	}
	return pconn.(*net.UDPConn), nil
}

// socketOptions sets a socket's options before it is bound: those of
// every socket of the port, and of a receive socket (rx) those of the
// receive path.
func socketOptions(fd int, ifi *net.Interface, cfg Config, rx bool, how rxSocket) error {
	if err := unix.BindToDevice(fd, ifi.Name); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	// Deep socket buffers absorb bursts, as an HCA's receive queue does.
	// FORCE works as root, the plain one up to the sysctl limits
	// otherwise. A send-only socket (a lane's other than the first) gets
	// the deep send buffer alone. It is never read, so it takes the
	// smallest receive buffer (sock_setsockopt clamps 0 to
	// SOCK_MIN_RCVBUF). It also gets a filter that drops every datagram
	// before it is queued (sk_filter in udpv6_queue_rcv_one_skb), so
	// that nothing sent to its port holds memory.
	bufs := [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}}
	if rx {
		bufs = append(bufs, [2]int{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF})
	}
	for _, o := range bufs {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], socketBuffer) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], socketBuffer)
		}
	}
	if !rx {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0); err != nil {
			return fmt.Errorf("SO_RCVBUF: %w", err)
		}
		dropAll := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &dropAll[0]}); err != nil {
			return fmt.Errorf("SO_ATTACH_FILTER: %w", err)
		}
		return nil
	}
	if how.reuse {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fmt.Errorf("SO_REUSEPORT: %w", err)
		}
	}
	if how.extra {
		// A group datagram goes to every socket bound to its port that
		// inet6_mc_check lets through (__udp6_lib_mcast_deliver clones
		// it for each, net/ipv6/udp.c): one that has not joined the
		// group passes only while IPV6_MULTICAST_ALL is on, the
		// default (net/ipv6/mcast.c inet6_mc_check returns mc_all).
		// The groups are joined on the first socket alone, so off here:
		// guests get one copy, not one per socket.
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_ALL, 0); err != nil {
			return fmt.Errorf("IPV6_MULTICAST_ALL: %w", err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1); err != nil {
		return err
	}
	// Accept a zero UDP checksum, as rxe sends it (docs/architecture.md): the ICRC
	// protects the packet.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1); err != nil {
		return err
	}
	// Take trains whole (UDP GRO): one queued datagram, cut here,
	// instead of one per packet. Without it (older kernels) datagrams
	// come one by one, which Read handles the same way.
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1)
	// Count what the kernel drops on a full receive queue.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); err != nil {
		return err
	}
	if cfg.BusyPoll > 0 {
		return setBusyPoll(fd, cfg.BusyPoll)
	}
	return nil
}

// setBusyPoll asks the kernel to busy-poll the device's NAPI context for
// up to d when a receive finds the socket empty (SO_BUSY_POLL, in µs),
// and to prefer that to interrupts (SO_PREFER_BUSY_POLL).
//
// Both act only on a socket whose packets came through a NAPI context
// with an ID: sk_busy_loop needs sk_napi_id >= MIN_NAPI_ID
// (include/net/busy_poll.h), and napi_busy_loop in net/core/dev.c polls
// that context. A veth peer without XDP or GRO delivers through netif_rx
// and the per-CPU backlog, which has none. So on such an underlay they
// do nothing, and only the receiver's own spinning acts.
//
// Raising SO_BUSY_POLL above the net.core.busy_read sysctl, and
// SO_PREFER_BUSY_POLL, need CAP_NET_ADMIN (sk_setsockopt,
// net/core/sock.c).
func setBusyPoll(fd int, d time.Duration) error {
	us := int(min(d/time.Microsecond, 1<<31-1))
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BUSY_POLL, max(us, 1)); err != nil {
		return fmt.Errorf("SO_BUSY_POLL %dµs: %w (it needs CAP_NET_ADMIN above net.core.busy_read; run as root or without --busy-poll)", us, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PREFER_BUSY_POLL, 1); err != nil {
		return fmt.Errorf("SO_PREFER_BUSY_POLL: %w (it needs CAP_NET_ADMIN; run as root or without --busy-poll)", err)
	}
	return nil
}

// linkLocal returns the interface's IPv6 link-local address once it is no
// longer tentative (duplicate address detection), waiting up to wait.
func linkLocal(ifi *net.Interface, wait time.Duration) (ipoib.GID, error) {
	deadline := time.Now().Add(wait)
	for {
		link, err := netlink.LinkByIndex(ifi.Index)
		if err != nil {
			return ipoib.GID{}, fmt.Errorf("simfabric: underlay %s: %w", ifi.Name, err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return ipoib.GID{}, fmt.Errorf("simfabric: addresses of %s: %w", ifi.Name, err)
		}
		tentative := false
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
					return ipoib.GID(a.IP.To16()), nil
				}
				tentative = true
			}
		}
		if time.Now().After(deadline) {
			if tentative {
				return ipoib.GID{}, fmt.Errorf("simfabric: underlay %s link-local address still tentative after %s (DAD)", ifi.Name, wait)
			}
			return ipoib.GID{}, fmt.Errorf("simfabric: underlay %s has no IPv6 link-local address (is it up, with IPv6 enabled?)", ifi.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BatchSize is the largest batch moved per call.
func (p *Port) BatchSize() int { return batch }

// LocalGID is the underlay's link-local address.
func (p *Port) LocalGID() ipoib.GID { return p.gid }

// MTU is the IB MTU.
func (p *Port) MTU() int { return p.mtu }

// PartitionMTU is MTU: every partition of this port has the port's MTU.
func (p *Port) PartitionMTU(ipoib.PKey) int { return p.mtu }

// Offloads reports TSO and USO: the port cuts TCP and UDP super-packets
// itself, straight into the UDP GSO trains it sends, as the kernel's GSO
// would for a device.
func (p *Port) Offloads() ipoib.Offloads {
	return ipoib.Offloads{TSO: true, USO: true, MaxSuper: ipoib.MaxSuperPacket}
}

// SetEncodeHook installs fn, which Write calls with each packet once it
// is encoded, ICRC included, before it is sent. body is what follows the
// BTH and DETH: payload, pad and ICRC, so that changing any byte of it
// makes the receiver count bad_icrc. mcast says whether the packet goes
// to a group. fn may change body in place; faultport's corrupt fault
// does. While a hook is set, every packet leaves as a datagram of its
// own, never in a UDP GSO train, so that each fault acts on single
// packets. nil removes the hook.
func (p *Port) SetEncodeHook(fn func(body []byte, mcast bool)) {
	p.wmu.Lock()
	p.hook = fn
	p.wmu.Unlock()
}

// IsDown reports the injected port-down fault.
func (p *Port) IsDown() bool { return p.down.Load() }

// AllocQP creates a QP in partition pkey, numbered hint when that is free.
func (p *Port) AllocQP(pkey ipoib.PKey, hint uint32) (uint32, error) {
	q, err := p.qps.Alloc(pkey, hint)
	if err != nil {
		return 0, fmt.Errorf("simfabric: %w", err)
	}
	return q, nil
}

// FreeQP destroys a QP.
func (p *Port) FreeQP(qpn uint32) error { return p.qps.Free(qpn) }

// Join joins the IPv6 group mgid on the underlay.
func (p *Port) Join(mgid ipoib.GID) error {
	return p.groups.Join(mgid, func() error {
		if err := p.pc.JoinGroup(p.ifi, &net.UDPAddr{IP: mgid[:]}); err != nil {
			return fmt.Errorf("simfabric: join %s on %s: %w", mgid, p.ifi.Name, err)
		}
		return nil
	})
}

// JoinSendOnly records a send-only membership of mgid. Sending to an
// IPv6 group needs no membership on the underlay, so nothing is joined
// there: the port receives none of the group's traffic, as a send-only
// member on a real fabric.
func (p *Port) JoinSendOnly(mgid ipoib.GID) error { return p.groups.JoinSendOnly(mgid) }

// Leave leaves the IPv6 group mgid, or drops a send-only membership.
func (p *Port) Leave(mgid ipoib.GID) error {
	return p.groups.Leave(mgid, func() error {
		if err := p.pc.LeaveGroup(p.ifi, &net.UDPAddr{IP: mgid[:]}); err != nil {
			return fmt.Errorf("simfabric: leave %s on %s: %w", mgid, p.ifi.Name, err)
		}
		return nil
	})
}

// Counters returns a snapshot of the counters. The receive sockets'
// counts are summed; with several sockets, each one's received packets
// also appear as rx_socket_<i>_packets. Of the packets sent and
// received, those to a group also appear as tx_multicast_packets and
// rx_multicast_packets. So the unicast ones of two ports can be
// compared: a group's packets reach only the ports that joined it.
func (p *Port) Counters() ipoib.PortCounters {
	c := ipoib.PortCounters{
		TxPackets: p.txPackets.Load(), TxBytes: p.txBytes.Load(),
		Drops: p.drops.Snapshot(),
	}
	var trains, trainPackets, rxMulticast uint64
	c.Stats = make(map[string]uint64)
	for i, l := range p.rx {
		n := l.packets.Load()
		c.RxPackets += n
		rxMulticast += l.multicast.Load()
		c.RxBytes += l.bytes.Load()
		trains += l.groMerged.Load()
		trainPackets += l.groPackets.Load()
		if len(p.rx) > 1 {
			c.Stats[fmt.Sprintf("rx_socket_%d_packets", i)] = n
		}
	}
	c.Stats["tx_multicast_packets"] = p.txMulticast.Load()
	c.Stats["rx_multicast_packets"] = rxMulticast
	c.Stats["tx_trains"] = p.trainsSent.Load()
	c.Stats["tx_train_packets"] = p.trainPackets.Load()
	c.Stats["tx_gso_fallbacks"] = p.gsoFallback.Load()
	c.Stats["rx_trains"] = trains
	c.Stats["rx_train_packets"] = trainPackets
	for _, s := range p.snds {
		s.refusalStats(c.Stats)
	}
	return c
}

// Close closes the sockets; Read and Write then return net.ErrClosed.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.events.Close()
	// Each receiver's thread is woken and leaves its system call before
	// its socket's descriptor is closed.
	var first error
	for i, c := range p.conns {
		var err error
		if i < len(p.rx) {
			err = p.rx[i].rcv.io.Close(c.Close)
		} else {
			err = c.Close()
		}
		if first == nil {
			first = err
		}
	}
	return first
}
