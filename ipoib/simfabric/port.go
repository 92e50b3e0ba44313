// Package simfabric is the simulated InfiniBand UD fabric, eipoibd's
// default backend: each Port is one IB port bound to an underlay interface,
// its GID the interface's IPv6 link-local address, and every IB packet one
// UDP datagram on port 4791 carrying a RoCEv2-style UD SEND-only (BTH,
// DETH, IPoIB payload, ICRC). MGIDs are IPv6 multicast groups on the
// underlay. The exact format is in DESIGN.md; other implementations
// interoperate with it from that text alone.
//
// Receive path: recvmmsg into the port's buffers (a UDP GRO train whole)
// → Decode (opcode, TVer, ICRC, pad) → Q_Key and size → the shared
// receive checks (ipoib.CheckRx: QPN, group, P_Key) → payload copied to
// the caller's buffer at offset. Send path: the shared transmit checks
// (ipoib.CheckTx) → BTH+DETH written into the headroom, pad and ICRC
// appended → the encode hook, if one is set (faultport's corruption) →
// sendmmsg, in UDP GSO trains when no hook is set. Every drop is counted
// under its ipoib.Drop reason.
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
}

// Port is one IB port on the simulated fabric. It implements ipoib.Port.
// Read and Write may each be used by one goroutine at a time.
type Port struct {
	ifi    *net.Interface
	gid    ipoib.GID
	mtu    int
	conn   *net.UDPConn
	pc     *ipv6.PacketConn
	closed atomic.Bool
	down   atomic.Bool
	downMu sync.Mutex        // orders down's changes with their events
	events *ipoib.EventQueue // events.go

	qps    *ipoib.QPTable
	groups *ipoib.GroupTable
	psn    atomic.Uint32

	rmu    sync.Mutex // Read state
	rcodec Codec
	rcv    *receiver // datagrams of the last receive, rgot of them (a merged train can be 64 KB)
	rinfo  []rxInfo
	rcur   int // the datagram Read hands out packets from
	rgot   int
	wmu    sync.Mutex // Write state
	wcodec Codec
	chunk  chunk
	cutter gso.Segmenter
	segBuf [][]byte // storage of the segments cut from super-packets, one per chunk entry
	segOff int      // the offset segBuf was made for
	wmsgs  []ipv6.Message
	wbufs  [][1][]byte
	snd    *sender
	addrs  map[ipoib.GID]*peer
	worig  []int // per message of the chunk: its index in bufs
	// UDP GSO trains (see trains): on until the kernel refuses one.
	gso      bool
	tmsgs    []ipv6.Message
	tspan    []span
	trainOOB [][]byte   // per train: its UDP_SEGMENT control message
	trainIOV [][][]byte // per train: its packets, sent as one iovec list
	// hook sees each packet once encoded (SetEncodeHook); while it is
	// set, packets leave one datagram each.
	hook func(body []byte, mcast bool)

	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	// drops counts by reason; its DropRxOverflow entry holds the
	// kernel's own count of receive-queue drops (SO_RXQ_OVFL), stored
	// as the kernel reports it rather than added to.
	drops                                 ipoib.DropCounters
	trainsSent, trainPackets, gsoFallback atomic.Uint64
	groMerged, groPackets                 atomic.Uint64 // received merged datagrams (UDP GRO)
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
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.BindToDevice(int(fd), ifi.Name); serr != nil {
				return
			}
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr != nil {
				return
			}
			if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1); serr != nil {
				return
			}
			// Accept a zero UDP checksum, as rxe sends it (DESIGN.md):
			// the ICRC protects the packet.
			if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1); serr != nil {
				return
			}
			// Take trains whole (UDP GRO): one queued datagram, cut
			// here, instead of one per packet. Without it (older
			// kernels) datagrams come one by one, which Read handles
			// the same way.
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1)
			// Count what the kernel drops on a full receive queue.
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); serr != nil {
				return
			}
			if cfg.BusyPoll > 0 {
				serr = setBusyPoll(int(fd), cfg.BusyPoll)
				if serr != nil {
					return
				}
			}
			// Deep socket buffers absorb bursts (an HCA's receive queue
			// does the same); FORCE works as root, the plain one up to
			// the sysctl limits otherwise.
			for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
				if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], socketBuffer) != nil {
					_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], socketBuffer)
				}
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	pconn, err := lc.ListenPacket(context.Background(), "udp6", fmt.Sprintf("[::]:%d", UDPPort))
	if err != nil {
		return nil, fmt.Errorf("simfabric: listen on UDP %d on %s: %w", UDPPort, ifi.Name, err)
	}
	conn := pconn.(*net.UDPConn)
	pc := ipv6.NewPacketConn(conn)
	if err := pc.SetMulticastInterface(ifi); err != nil {
		conn.Close()
		return nil, fmt.Errorf("simfabric: multicast interface %s: %w", ifi.Name, err)
	}
	if err := pc.SetMulticastLoopback(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("simfabric: multicast loopback: %w", err)
	}
	p := &Port{
		ifi: ifi, gid: gid, mtu: cfg.IBMTU, conn: conn, pc: pc,
		qps: ipoib.NewQPTable(0x100 + rand.Uint32N(0xff0000)), groups: ipoib.NewGroupTable(),
		rinfo: make([]rxInfo, rxBatch),
		wmsgs: make([]ipv6.Message, 0, batch), wbufs: make([][1][]byte, batch),
		worig: make([]int, 0, batch),
		gso:   true, tmsgs: make([]ipv6.Message, 0, batch), tspan: make([]span, 0, batch),
		addrs: make(map[ipoib.GID]*peer),
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("simfabric: %w", err)
	}
	p.events = ipoib.NewEventQueue(true)
	p.snd = newSender(rc, batch)
	if p.rcv, err = newReceiver(rc, rxBatch, maxTrainBytes+ICRCLen+HeaderLen+4, unix.CmsgSpace(unix.SizeofInet6Pktinfo)+2*unix.CmsgSpace(4)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("simfabric: %w", err)
	}
	p.rcv.io.SetBusyPoll(cfg.BusyPoll)
	return p, nil
}

// setBusyPoll asks the kernel to busy-poll the device's NAPI context for
// up to d when a receive finds the socket empty (SO_BUSY_POLL, in µs),
// and to prefer that to interrupts (SO_PREFER_BUSY_POLL). Both act only
// on a socket whose packets came through a NAPI context with an ID
// (sk_busy_loop needs sk_napi_id >= MIN_NAPI_ID, include/net/busy_poll.h;
// napi_busy_loop in net/core/dev.c polls that context): a veth peer
// without XDP or GRO delivers through netif_rx and the per-CPU backlog,
// which has none, so on such an underlay they do nothing and only the
// receiver's own spinning acts. Raising SO_BUSY_POLL above the
// net.core.busy_read sysctl, and SO_PREFER_BUSY_POLL, need
// CAP_NET_ADMIN (sk_setsockopt, net/core/sock.c).
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

// SetEncodeHook installs fn, which Write calls with each packet once it is
// encoded, ICRC included, before it is sent: body is what follows the BTH
// and DETH (payload, pad and ICRC, so that changing any byte of it makes
// the receiver count bad_icrc) and mcast says whether the packet goes to a
// group. fn may change body in place; faultport's corrupt fault does. While
// a hook is set, every packet leaves as a datagram of its own, never in a
// UDP GSO train, so that each fault acts on single packets. nil removes
// the hook.
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

// Counters returns a snapshot of the counters.
func (p *Port) Counters() ipoib.PortCounters {
	c := ipoib.PortCounters{
		TxPackets: p.txPackets.Load(), TxBytes: p.txBytes.Load(),
		RxPackets: p.rxPackets.Load(), RxBytes: p.rxBytes.Load(),
		Drops: p.drops.Snapshot(),
	}
	c.Stats = map[string]uint64{
		"tx_trains":        p.trainsSent.Load(),
		"tx_train_packets": p.trainPackets.Load(),
		"tx_gso_fallbacks": p.gsoFallback.Load(),
		"rx_trains":        p.groMerged.Load(),
		"rx_train_packets": p.groPackets.Load(),
	}
	p.snd.refusalStats(c.Stats)
	return c
}

// Close closes the socket; Read and Write then return net.ErrClosed.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.events.Close()
	// The receiver's thread is woken and leaves its system call before
	// the socket's descriptor is closed.
	return p.rcv.io.Close(p.conn.Close)
}
