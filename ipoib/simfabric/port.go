// Package simfabric is the simulated InfiniBand UD fabric, eipoibd's
// default backend: each Port is one IB port bound to an underlay interface,
// its GID the interface's IPv6 link-local address, and every IB packet one
// UDP datagram on port 4791 carrying a RoCEv2-style UD SEND-only (BTH,
// DETH, IPoIB payload, ICRC). MGIDs are IPv6 multicast groups on the
// underlay. The exact format is in DESIGN.md; other implementations
// interoperate with it from that text alone.
//
// Receive path: recvmmsg straight into the caller's buffers, BTH and DETH
// landing in the headroom → Decode (opcode, TVer, ICRC, pad) → Q_Key, QPN,
// group and P_Key checks → payload left in place at offset. Send path:
// BTH+DETH written into the headroom, pad and ICRC appended → faults →
// sendmmsg. Every drop has a counter.
package simfabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/ipoib"
)

// Drop reasons counted by a Port. The first ones are the DecodeError
// values, so a decode failure indexes the same array.
const (
	DropQKey = int(numDecodeErrors) + iota
	DropPKey
	DropUnknownQPN
	DropNotJoined
	DropOversize
	DropNoRoom
	DropBadMeta
	DropPortDown
	DropNoPktinfo
	DropFaultLoss
	DropSendError
	DropBadSource
	DropBadDestQPN
	DropBadGSO
	numDrops
)

// DropNames are the counter names of the drop reasons, by index.
var DropNames = func() [numDrops]string {
	var n [numDrops]string
	for e := DecodeError(1); e < numDecodeErrors; e++ {
		n[e] = e.String()
	}
	n[DropQKey] = "qkey_mismatch"
	n[DropPKey] = "pkey_mismatch"
	n[DropUnknownQPN] = "unknown_qpn"
	n[DropNotJoined] = "not_joined"
	n[DropOversize] = "oversize"
	n[DropNoRoom] = "no_room"
	n[DropBadMeta] = "bad_meta"
	n[DropPortDown] = "port_down"
	n[DropNoPktinfo] = "no_pktinfo"
	n[DropFaultLoss] = "fault_loss"
	n[DropSendError] = "send_error"
	n[DropBadSource] = "bad_source"
	n[DropBadDestQPN] = "bad_dest_qpn"
	n[DropBadGSO] = "bad_gso"
	return n
}()

// TailRoom is what Write needs after each payload: pad and ICRC.
const TailRoom = 3 + ICRCLen

// Faults are injected on send, for tests; all zero (off) by default.
// Probabilities are in [0, 1].
type Faults struct {
	Loss    float64 // drop the packet
	Dup     float64 // send it twice
	Reorder float64 // hold it back and send it after the next one
	Corrupt float64 // flip a byte after the ICRC was computed
}

// Validate checks the probabilities.
func (f Faults) Validate() error {
	for _, p := range []struct {
		n string
		v float64
	}{{"loss", f.Loss}, {"dup", f.Dup}, {"reorder", f.Reorder}, {"corrupt", f.Corrupt}} {
		if p.v < 0 || p.v > 1 {
			return fmt.Errorf("simfabric: fault %s=%v is not a probability in [0,1]", p.n, p.v)
		}
	}
	return nil
}

// Config configures a Port.
type Config struct {
	Underlay string // interface name
	IBMTU    int    // 2048 or 4096
	Faults   Faults
	// DADWait bounds the wait for the link-local address to leave the
	// tentative state; 0 means 5 s.
	DADWait time.Duration
}

// Port is one IB port on the simulated fabric. It implements ipoib.Port.
// Read and Write may each be used by one goroutine at a time.
type Port struct {
	ifi    *net.Interface
	gid    ipoib.GID
	mtu    int
	faults Faults
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
	worig  []int // per message of the chunk: its index in bufs, -1 for a held one
	// UDP GSO trains (see trains): on until the kernel refuses one.
	gso      bool
	tmsgs    []ipv6.Message
	tspan    []span
	trainOOB [][]byte   // per train: its UDP_SEGMENT control message
	trainIOV [][][]byte // per train: its packets, sent as one iovec list
	held     []byte     // a reordered packet waiting for the next send
	heldTo   *peer
	// heldFrom is the chunk index of a packet held in this chunk, -1
	// when the held packet (if any) came from an earlier one.
	heldFrom int
	heldBuf  []byte // reused storage of held
	rng      *rand.Rand

	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	drops                                  [numDrops]atomic.Uint64
	trainsSent, trainPackets, gsoFallback  atomic.Uint64
	faultCorrupt                           atomic.Uint64 // corrupted unicast packets sent, a held one when it leaves (the peer counts each as bad_icrc)
	faultCorruptMcast                      atomic.Uint64 // corrupted multicast packets sent (counted as bad_icrc by the members only)
	heldCorrupt, heldMcast                 bool          // the held packet is a corrupted one; to a group
	groMerged, groPackets                  atomic.Uint64 // received merged datagrams (UDP GRO)
	rxOverflow                             atomic.Uint64 // kernel receive-queue drops (SO_RXQ_OVFL)
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
	if err := cfg.Faults.Validate(); err != nil {
		return nil, err
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
		ifi: ifi, gid: gid, mtu: cfg.IBMTU, faults: cfg.Faults, conn: conn, pc: pc,
		qps: ipoib.NewQPTable(0x100 + rand.Uint32N(0xff0000)), groups: ipoib.NewGroupTable(),
		rinfo: make([]rxInfo, rxBatch),
		wmsgs: make([]ipv6.Message, 0, 2*batch+1), wbufs: make([][1][]byte, 2*batch+1),
		worig: make([]int, 0, 2*batch+1), heldFrom: -1,
		gso: true, tmsgs: make([]ipv6.Message, 0, 2*batch+1), tspan: make([]span, 0, 2*batch+1),
		addrs: make(map[ipoib.GID]*peer),
		rng:   rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("simfabric: %w", err)
	}
	p.events = ipoib.NewEventQueue(true)
	p.snd = newSender(rc, 2*batch+1)
	p.rcv = newReceiver(rc, rxBatch, maxTrainBytes+ICRCLen+HeaderLen+4, unix.CmsgSpace(unix.SizeofInet6Pktinfo)+2*unix.CmsgSpace(4))
	return p, nil
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

func (p *Port) drop(reason int) { p.drops[reason].Add(1) }

// BatchSize is the largest batch moved per call.
func (p *Port) BatchSize() int { return batch }

// LocalGID is the underlay's link-local address.
func (p *Port) LocalGID() ipoib.GID { return p.gid }

// MTU is the IB MTU.
func (p *Port) MTU() int { return p.mtu }

// PartitionMTU is MTU: every partition of this port has the port's MTU.
func (p *Port) PartitionMTU(ipoib.PKey) int { return p.mtu }

// Offloads reports TSO: the port cuts TCP super-packets itself, straight
// into the UDP GSO trains it sends, as the kernel's GSO would for a
// device.
func (p *Port) Offloads() ipoib.Offloads {
	return ipoib.Offloads{TSO: true, MaxSuper: ipoib.MaxSuperPacket}
}

// SetFaults replaces the injected send faults.
func (p *Port) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.wmu.Lock()
	p.faults = f
	p.wmu.Unlock()
	return nil
}

// SetDown sets the injected port-down fault: while down, nothing is sent
// or delivered (counted as port_down).
func (p *Port) SetDown(down bool) { p.setDown(down) }

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
		Drops: make(map[string]uint64),
	}
	for i := range p.drops {
		if v := p.drops[i].Load(); v != 0 {
			c.Drops[DropNames[i]] = v
		}
	}
	if v := p.rxOverflow.Load(); v != 0 {
		c.Drops["rx_queue_overflow"] = v
	}
	c.Stats = map[string]uint64{
		"tx_trains":                  p.trainsSent.Load(),
		"tx_train_packets":           p.trainPackets.Load(),
		"tx_gso_fallbacks":           p.gsoFallback.Load(),
		"rx_trains":                  p.groMerged.Load(),
		"rx_train_packets":           p.groPackets.Load(),
		"tx_fault_corrupt":           p.faultCorrupt.Load(),
		"tx_fault_corrupt_multicast": p.faultCorruptMcast.Load(),
	}
	return c
}

// Close closes the socket; Read and Write then return net.ErrClosed.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.events.Close()
	return p.conn.Close()
}

func (p *Port) udpAddr(g ipoib.GID) *peer {
	a, ok := p.addrs[g]
	if !ok {
		if len(p.addrs) > 65536 {
			clear(p.addrs) // bound the cache; it refills on demand
		}
		a = newPeer(g, p.ifi.Index)
		p.addrs[g] = a
	}
	return a
}

// Write sends a batch of any length, up to BatchSize packets per system
// call. bufs[i][offset:] is the IPoIB header and payload; HeaderLen bytes
// before offset and TailRoom bytes of capacity after the payload are
// used. A TCP super-packet (meta[i].GSO) is cut into segments here, in
// the port's own buffers. n counts the packets the port accepted (a
// super-packet when all its segments were): handed to the kernel, or
// held back by the reorder fault to go out with the next send. A packet
// refused locally (oversize, no room, bad metadata or a source QP this
// port did not allocate, a super-packet that does not parse, port down),
// lost by the loss fault or refused by the kernel is counted under its
// drop reason and not in n; the port's packet counters count segments.
func (p *Port) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if offset < HeaderLen {
		return 0, fmt.Errorf("simfabric: write offset %d below header length %d", offset, HeaderLen)
	}
	if len(meta) < len(bufs) {
		return 0, fmt.Errorf("simfabric: write of %d packets with %d metadata", len(bufs), len(meta))
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	c := &p.chunk
	c.reset()
	for i, b := range bufs {
		m := &meta[i]
		if m.GSO.Type == ipoib.GSONone {
			c.add(b, m, i)
			if c.full() {
				if err := p.flush(offset); err != nil {
					return c.n, err
				}
			}
			continue
		}
		if !p.ownQP(m) {
			p.drop(DropBadMeta)
			continue
		}
		if p.cutter.Start(b[offset:], ipoib.HeaderLen, int(m.GSO.L4), m.GSO.Type == ipoib.GSOTCPv6, int(m.GSO.Size), p.mtu-ipoib.HeaderLen) != nil {
			p.drop(DropBadGSO)
			continue
		}
		sm := *m
		sm.GSO = ipoib.GSO{}
		for !p.cutter.Done() {
			buf := p.segment(len(c.bufs), offset)
			k := p.cutter.Cut(buf[offset:])
			c.add(buf[:offset+k], &sm, i)
			if c.full() {
				if err := p.flush(offset); err != nil {
					return c.n, err
				}
			}
		}
	}
	if err := p.flush(offset); err != nil {
		return c.n, err
	}
	c.finish()
	return c.n, nil
}

// segment returns the storage of chunk entry k's segment, with offset
// bytes of headroom.
func (p *Port) segment(k, offset int) []byte {
	if p.segBuf == nil || p.segOff != offset {
		p.segBuf, p.segOff = make([][]byte, batch), offset
		for i := range p.segBuf {
			p.segBuf[i] = make([]byte, offset+p.mtu+TailRoom)
		}
	}
	return p.segBuf[k]
}

// flush sends the chunk's packets; call with wmu held.
func (p *Port) flush(offset int) error {
	c := &p.chunk
	if len(c.bufs) == 0 {
		return nil
	}
	var ok [batch]bool
	err := p.writeChunk(c.bufs, c.meta, offset, &ok)
	c.tally(ok[:len(c.bufs)])
	c.bufs, c.meta, c.orig = c.bufs[:0], c.meta[:0], c.orig[:0]
	return err
}

// chunk gathers up to batch packets for one writeChunk, each with the
// index in Write's batch of the packet it is (or is a segment of), and
// counts the packets of the batch accepted whole.
type chunk struct {
	bufs [][]byte
	meta []ipoib.TxMeta
	orig []int
	n    int  // packets of the batch accepted
	cur  int  // the packet whose entries are being tallied, -1 for none
	ok   bool // all of cur's entries so far were accepted
}

func (c *chunk) reset() {
	if c.bufs == nil {
		c.bufs, c.meta, c.orig = make([][]byte, 0, batch), make([]ipoib.TxMeta, 0, batch), make([]int, 0, batch)
	}
	c.bufs, c.meta, c.orig = c.bufs[:0], c.meta[:0], c.orig[:0]
	c.n, c.cur = 0, -1
}

func (c *chunk) add(b []byte, m *ipoib.TxMeta, orig int) {
	c.bufs = append(c.bufs, b)
	c.meta = append(c.meta, *m)
	c.orig = append(c.orig, orig)
}

func (c *chunk) full() bool { return len(c.bufs) == batch }

// tally counts the entries sent (ok[k] for entry k) by the packet they
// belong to; a packet's entries are consecutive, and may span chunks.
func (c *chunk) tally(ok []bool) {
	for k, o := range c.orig[:len(ok)] {
		if o != c.cur {
			c.finish()
			c.cur, c.ok = o, true
		}
		c.ok = c.ok && ok[k]
	}
}

// finish counts the packet being tallied.
func (c *chunk) finish() {
	if c.cur >= 0 && c.ok {
		c.n++
	}
	c.cur = -1
}

// writeChunk sends at most batch packets and sets ok[i] for each one
// accepted; call with wmu held.
func (p *Port) writeChunk(bufs [][]byte, meta []ipoib.TxMeta, offset int, ok *[batch]bool) error {
	if p.down.Load() {
		p.drops[DropPortDown].Add(uint64(len(bufs)))
		return nil
	}
	var size [batch]int // payload length of each accepted packet, 0 if refused
	src := [16]byte(p.gid)
	msgs := p.wmsgs[:0]
	p.worig = p.worig[:0]
	for i, b := range bufs {
		m := &meta[i]
		payload := len(b) - offset
		switch {
		case payload > p.mtu:
			p.drop(DropOversize)
			continue
		case cap(b)-len(b) < TailRoom:
			p.drop(DropNoRoom)
			continue
		case !p.ownQP(m):
			p.drop(DropBadMeta)
			continue
		}
		dstGID := m.Dst.GID()
		dst := [16]byte(dstGID)
		pkt := Packet{PKey: uint16(m.PKey), DestQPN: m.Dst.QPN(), PSN: p.psn.Add(1) & 0xffffff, QKey: ipoib.QKey, SrcQPN: m.SrcQPN}
		out := p.wcodec.Encode(b, offset, &pkt, &src, &dst, UDPPort, UDPPort)
		before := len(msgs)
		msgs = p.faulty(msgs, out, p.udpAddr(dstGID), i, dstGID[0] == 0xff)
		if len(msgs) > before || p.heldFrom == i {
			size[i] = payload
		}
	}
	if p.held != nil && p.heldFrom < 0 && len(msgs) > 0 {
		msgs = p.add(msgs, p.held, p.heldTo, -1)
		p.held = nil
		if p.heldCorrupt {
			p.corrupted(p.heldMcast, 1)
		}
	}
	p.heldFrom = -1 // from here on, a held packet belongs to an earlier call
	var out []ipv6.Message
	var spans []span
	if p.gso && !p.faulted() {
		out, spans = p.trains(msgs)
	} else {
		out, spans = msgs, p.singles(len(msgs))
	}
	if err := p.send(out, spans, msgs, &size); err != nil {
		return err
	}
	for i, l := range size[:len(bufs)] {
		if l > 0 {
			ok[i] = true
			p.txPackets.Add(1)
			p.txBytes.Add(uint64(l))
		}
	}
	return nil
}

// span is the messages [from, to) of a chunk that one message sends.
type span struct{ from, to int }

// singles returns the spans of n messages sent one by one.
func (p *Port) singles(n int) []span {
	s := p.tspan[:0]
	for i := 0; i < n; i++ {
		s = append(s, span{i, i + 1})
	}
	return s
}

// faulted reports whether a fault is configured (trains are then not
// built, so that each fault acts on single packets).
func (p *Port) faulted() bool {
	f := &p.faults
	return f.Loss != 0 || f.Dup != 0 || f.Reorder != 0 || f.Corrupt != 0
}

// trains replaces each run of messages to one address with equal
// lengths (the last may be shorter) by one message gathering them end to
// end (an iovec per packet) with a UDP_SEGMENT control message: the kernel sends the train as
// one super-datagram and cuts it into the same datagrams at the device
// (UDP GSO), one traversal of the stack instead of one per packet.
func (p *Port) trains(msgs []ipv6.Message) ([]ipv6.Message, []span) {
	out, spans := p.tmsgs[:0], p.tspan[:0]
	nt := 0 // trains built
	for i := 0; i < len(msgs); {
		seg := len(msgs[i].Buffers[0])
		j, total := i+1, seg
		for j < len(msgs) && j-i < maxTrain && msgs[j].Addr == msgs[i].Addr &&
			len(msgs[j].Buffers[0]) <= seg && len(msgs[j-1].Buffers[0]) == seg && total+len(msgs[j].Buffers[0]) <= maxTrainBytes {
			total += len(msgs[j].Buffers[0])
			j++
		}
		if j-i == 1 {
			out = append(out, msgs[i])
		} else {
			if nt == len(p.trainOOB) {
				p.trainOOB = append(p.trainOOB, make([]byte, unix.CmsgSpace(2)))
				p.trainIOV = append(p.trainIOV, make([][]byte, 0, maxTrain))
			}
			iov := p.trainIOV[nt][:0]
			for _, m := range msgs[i:j] {
				iov = append(iov, m.Buffers[0]) // the kernel gathers them: no copy
			}
			p.trainIOV[nt] = iov
			oob := p.trainOOB[nt]
			h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
			h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			h.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(seg)
			out = append(out, ipv6.Message{Buffers: iov, OOB: oob, Addr: msgs[i].Addr})
			nt++
		}
		spans = append(spans, span{i, j})
		i = j
	}
	return out, spans
}

// send sends out (each message standing for the messages of its span in
// orig) and clears size for the packets lost. A refused train's packets
// go again one by one; when the refusal is the kernel's word on GSO
// itself, trains are off for the port from then on.
func (p *Port) send(out []ipv6.Message, spans []span, orig []ipv6.Message, size *[batch]int) error {
	// lost counts a packet the kernel refused: a send error (no route,
	// no buffer) loses it, as a full HCA send queue would.
	lost := func(k int) {
		p.drop(DropSendError)
		if o := p.worig[k]; o >= 0 {
			size[o] = 0
		}
	}
	for off := 0; off < len(out); off++ {
		sent, err := p.snd.send(out[off:])
		if err == nil && sent <= 0 {
			err = io.ErrNoProgress
		}
		for _, s := range spans[off : off+max(sent, 0)] {
			if s.to-s.from > 1 {
				p.trainsSent.Add(1)
				p.trainPackets.Add(uint64(s.to - s.from))
			}
		}
		if off += max(sent, 0); err == nil {
			off-- // sent up to here
			continue
		}
		if p.closed.Load() {
			return net.ErrClosed
		}
		s := spans[off]
		if s.to-s.from == 1 {
			lost(s.from)
			continue
		}
		// The kernel refuses GSO itself (no UDP GSO, or not with this
		// socket or device): trains off for good. Other errors (no
		// buffer, link down) are passing: the train's packets go one
		// by one this time only.
		if p.gso && (errors.Is(err, unix.EIO) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
			p.gso = false
			p.gsoFallback.Add(1)
		}
		for k := s.from; k < s.to; k++ {
			if _, err := p.snd.send(orig[k : k+1]); err != nil {
				if p.closed.Load() {
					return net.ErrClosed
				}
				lost(k)
			}
		}
	}
	return nil
}

// ownQP reports whether m names a QP of this port and that QP's P_Key (a
// QP freed or never allocated cannot send, as on a real HCA), and a
// destination QPN that is 0xFFFFFF exactly when the GID is an MGID.
func (p *Port) ownQP(m *ipoib.TxMeta) bool {
	pk, ok := p.qps.PKey(m.SrcQPN)
	return ok && m.PKey.IsValid() && pk == m.PKey && (m.Dst.QPN() == ipoib.MulticastQPN) == m.Dst.GID().IsMulticast()
}

// add appends a message for b, sent on behalf of bufs[orig] of the
// current chunk (-1: a packet held back by an earlier call).
func (p *Port) add(msgs []ipv6.Message, b []byte, to *peer, orig int) []ipv6.Message {
	i := len(msgs)
	p.wbufs[i][0] = b
	p.worig = append(p.worig, orig)
	return append(msgs, ipv6.Message{Buffers: p.wbufs[i][:], Addr: to})
}

// faulty appends the packet (bufs[orig] of the chunk) to msgs, applying
// the configured faults.
func (p *Port) faulty(msgs []ipv6.Message, out []byte, to *peer, orig int, mcast bool) []ipv6.Message {
	f := &p.faults
	if f.Loss == 0 && f.Dup == 0 && f.Reorder == 0 && f.Corrupt == 0 {
		return p.add(msgs, out, to, orig)
	}
	if f.Loss > 0 && p.rng.Float64() < f.Loss {
		p.drop(DropFaultLoss)
		return msgs
	}
	corrupt := f.Corrupt > 0 && p.rng.Float64() < f.Corrupt
	if corrupt {
		out[HeaderLen+p.rng.IntN(len(out)-HeaderLen)] ^= 0x40
	}
	if f.Reorder > 0 && p.held == nil && p.rng.Float64() < f.Reorder {
		p.held = append(p.heldBuf[:0], out...)
		p.heldBuf = p.held
		p.heldTo, p.heldFrom, p.heldCorrupt, p.heldMcast = to, orig, corrupt, mcast
		return msgs
	}
	msgs = p.add(msgs, out, to, orig)
	sent := uint64(1)
	if f.Dup > 0 && p.rng.Float64() < f.Dup {
		msgs = p.add(msgs, out, to, orig)
		sent++
	}
	if corrupt {
		p.corrupted(mcast, sent)
	}
	return msgs
}

// corrupted counts n corrupted packets sent, to a group or not.
func (p *Port) corrupted(mcast bool, n uint64) {
	if mcast {
		p.faultCorruptMcast.Add(n)
	} else {
		p.faultCorrupt.Add(n)
	}
}

// oobInfo is what the control messages of a received datagram say.
type oobInfo struct {
	dst     [16]byte // destination address (IPV6_PKTINFO)
	ok      bool     // dst was there
	ovfl    uint32   // the kernel's cumulative receive-queue drops (SO_RXQ_OVFL)
	hasOvfl bool
	seg     int // the datagrams' size when UDP GRO merged several (UDP_GRO), else 0
}

// parseOOB reads the control messages of a datagram.
func parseOOB(oob []byte) (o oobInfo) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			copy(o.dst[:], data)
			o.ok = true
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			o.ovfl, o.hasOvfl = *(*uint32)(unsafe.Pointer(&data[0])), true
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			o.seg = int(*(*int32)(unsafe.Pointer(&data[0])))
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return
}

// Read receives datagrams into the port's buffers, where UDP GRO may
// have merged a train of them into one, and hands out one packet per
// buffer: the BTH and DETH land in the headroom (offset must be at least
// HeaderLen) and the IPoIB payload at bufs[i][offset:]. Packets of a
// merged datagram that do not fit this call's bufs wait for the next.
// Packets that fail a check are counted and skipped.
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	if offset < HeaderLen {
		return 0, fmt.Errorf("simfabric: read offset %d below header length %d", offset, HeaderLen)
	}
	p.rmu.Lock()
	defer p.rmu.Unlock()
	for {
		n := 0
		for ; p.rcur < p.rgot && n < len(bufs); p.rcur++ {
			data, _, _, _ := p.rcv.datagram(p.rcur)
			n += p.split(data, &p.rinfo[p.rcur], bufs[n:], sizes[n:], meta[n:], offset)
			if p.rinfo[p.rcur].off < len(data) {
				break // bufs are full: the rest of this datagram next time
			}
		}
		if n > 0 {
			return n, nil
		}
		got, err := p.rcv.recv()
		if err != nil {
			if p.closed.Load() || errors.Is(err, net.ErrClosed) {
				return 0, net.ErrClosed
			}
			return 0, fmt.Errorf("simfabric: receive: %w", err)
		}
		p.rcur, p.rgot = 0, got
		for i := 0; i < got; i++ {
			p.rinfo[i] = p.inspect(p.rcv.datagram(i))
		}
	}
}

// rxInfo is what inspect learned of a received datagram, and how far
// split has got through it.
type rxInfo struct {
	oobInfo
	src   [16]byte
	sport uint16
	good  bool // addresses and framing fine: its packets go to check
	off   int  // next byte split hands out
}

// inspect checks what a received datagram's addresses, flags and control
// messages say, once for all the packets UDP GRO may have merged into it.
// A datagram refused here is counted once per packet in it.
func (p *Port) inspect(data, oob []byte, flags int, sa *unix.RawSockaddrInet6) rxInfo {
	n := len(data)
	r := rxInfo{oobInfo: parseOOB(oob)}
	if r.hasOvfl {
		p.rxOverflow.Store(uint64(r.ovfl))
	}
	if r.seg <= 0 || r.seg > n {
		r.seg = n
	}
	reason := -1
	switch {
	case p.down.Load():
		reason = DropPortDown
	case flags&unix.MSG_TRUNC != 0:
		reason = DropOversize
	case sa.Family != unix.AF_INET6 || !net.IP(sa.Addr[:]).IsLinkLocalUnicast():
		reason = DropBadSource
	case !r.ok:
		reason = DropNoPktinfo
	case n == 0:
		reason = int(ErrTruncated)
	}
	if reason >= 0 {
		p.drops[reason].Add(uint64(max((n+r.seg-1)/max(r.seg, 1), 1)))
		r.off = n
		return r
	}
	port := (*[2]byte)(unsafe.Pointer(&sa.Port))
	r.src, r.sport, r.good = sa.Addr, uint16(port[0])<<8|uint16(port[1]), true
	if r.seg < n {
		p.groMerged.Add(1)
		p.groPackets.Add(uint64((n + r.seg - 1) / r.seg))
	}
	return r
}

// split copies the packets of a datagram, from r.off on, into bufs (the
// BTH at offset-HeaderLen), checks each, and returns how many it filled;
// it stops when bufs are full.
func (p *Port) split(data []byte, r *rxInfo, bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) int {
	n := 0
	for r.off < len(data) && n < len(bufs) {
		pkt := data[r.off:min(r.off+r.seg, len(data))]
		r.off += len(pkt)
		b := bufs[n][offset-HeaderLen:]
		if len(pkt) > len(b) {
			p.drop(DropOversize)
			continue
		}
		copy(b, pkt)
		if l, ok := p.check(b[:len(pkt)], &r.src, &r.dst, r.sport, &meta[n]); ok {
			sizes[n] = l
			n++
		}
	}
	return n
}

// check verifies the UDP payload b (starting with the BTH) of a datagram
// from src, UDP port sport, to dst: decode, Q_Key, size, destination QP
// or group, P_Key. It counts a failure, or fills rm and returns the
// payload length.
func (p *Port) check(b []byte, src, dst *[16]byte, sport uint16, rm *ipoib.RxMeta) (int, bool) {
	var pkt Packet
	if err := p.rcodec.Decode(b, src, dst, sport, UDPPort, &pkt); err != nil {
		p.drop(int(err.(DecodeError)))
		return 0, false
	}
	if pkt.QKey != ipoib.QKey {
		p.drop(DropQKey)
		return 0, false
	}
	if len(pkt.Payload) > p.mtu {
		p.drop(DropOversize)
		return 0, false
	}
	pk := ipoib.PKey(pkt.PKey)
	*rm = ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, pkt.SrcQPN, ipoib.GID(*src)), DstQPN: pkt.DestQPN, PKey: pk}
	// IBA 9.8.1: a multicast packet's destination QP is 0xFFFFFF, and
	// 0xFFFFFF is never a unicast one.
	if (pkt.DestQPN == ipoib.MulticastQPN) != ipoib.GID(*dst).IsMulticast() {
		p.drop(DropBadDestQPN)
		return 0, false
	}
	if pkt.DestQPN == ipoib.MulticastQPN {
		mgid := ipoib.GID(*dst)
		if !p.groups.Full(mgid) {
			p.drop(DropNotJoined)
			return 0, false
		}
		if !ipoib.CanTalk(pk, ipoib.MGIDPKey(mgid)) {
			p.drop(DropPKey)
			return 0, false
		}
		rm.MGID = mgid
	} else {
		qpk, ok := p.qps.PKey(pkt.DestQPN)
		if !ok {
			p.drop(DropUnknownQPN)
			return 0, false
		}
		if !ipoib.CanTalk(pk, qpk) {
			p.drop(DropPKey)
			return 0, false
		}
	}
	p.rxPackets.Add(1)
	p.rxBytes.Add(uint64(len(pkt.Payload)))
	return len(pkt.Payload), true
}
