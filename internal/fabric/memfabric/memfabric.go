// Package memfabric is an in-memory InfiniBand UD fabric connecting any
// number of ipoib.Port values in one process. The shim's unit tests and the
// library tests use it; it applies the same receive checks as the simulated
// fabric (IB MTU, P_Key, unknown QPN) and counts its drops, but has no wire
// format. A multicast packet reaches every other port joined to the group,
// never the sending port (the shim delivers locally itself).
package memfabric

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/eipoib/eipoibd/internal/fabric/rxq"
	"github.com/eipoib/eipoibd/internal/gso"
	"github.com/eipoib/eipoibd/ipoib"
)

// queueLen is the receive queue of a port in packets.
const queueLen = 1024

// Fabric connects ports. The zero value is not usable; call New.
type Fabric struct {
	mu    sync.RWMutex
	mtu   int
	tso   bool
	uso   bool
	noSrc bool
	ports map[ipoib.GID]*Port
	pool  sync.Pool
}

// New returns an empty fabric with IB MTU mtu (2048 or 4096).
func New(mtu int) (*Fabric, error) {
	if _, err := ipoib.IPMTU(mtu); err != nil {
		return nil, fmt.Errorf("memfabric: %w", err)
	}
	f := &Fabric{mtu: mtu, ports: make(map[ipoib.GID]*Port)}
	f.pool.New = func() any { b := make([]byte, mtu); return &b }
	return f, nil
}

// Port is one port on a Fabric. It implements ipoib.Port.
type Port struct {
	f      *Fabric
	gid    ipoib.GID
	rx     chan rxq.Packet
	done   chan struct{}
	closed atomic.Bool

	// down, partMTU and events: events.go (stateMu orders their changes).
	stateMu sync.Mutex
	down    atomic.Bool
	partMTU map[ipoib.PKey]int
	events  *ipoib.EventQueue

	qps    *ipoib.QPTable
	groups *ipoib.GroupTable

	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	rxCtr                                  rxq.Counters
	drops                                  ipoib.DropCounters
}

var _ ipoib.Port = (*Port)(nil)

// NewPort attaches a port with GID gid.
func (f *Fabric) NewPort(gid ipoib.GID) (*Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.ports[gid]; ok {
		return nil, fmt.Errorf("memfabric: GID %s already attached", gid)
	}
	p := &Port{
		f: f, gid: gid,
		rx:     make(chan rxq.Packet, queueLen),
		done:   make(chan struct{}),
		qps:    ipoib.NewQPTable(0x48),
		groups: ipoib.NewGroupTable(),
	}
	p.partMTU, p.events = make(map[ipoib.PKey]int), ipoib.NewEventQueue(true)
	p.rxCtr = rxq.Counters{Packets: &p.rxPackets, Bytes: &p.rxBytes, TooSmall: func() { p.drops.Add(ipoib.DropBufferSmall) }}
	f.ports[gid] = p
	return p, nil
}

// BatchSize is the largest batch Read and Write move at once.
func (p *Port) BatchSize() int { return 64 }

// LocalGID returns the port GID.
func (p *Port) LocalGID() ipoib.GID { return p.gid }

// MTU returns the fabric's IB MTU.
func (p *Port) MTU() int { return p.f.mtu }

// SetTSO makes the fabric's ports take TCP super-packets and cut them, as
// a port with LSO does; call it before attaching ports.
func (f *Fabric) SetTSO(on bool) { f.tso = on }

// SetUSO makes the fabric's ports (set to TSO) take UDP super-packets as
// well and cut them, as the simulated fabric's do; call it before
// attaching ports.
func (f *Fabric) SetUSO(on bool) { f.uso = on }

// HideSources makes the fabric's ports receive every packet with
// RxMeta.SrcUnknown and no sender. So does the kernel IPoIB backend
// (packet sockets learn no sender), and verbs for a sender without a GRH
// whose LID it never saw. Call it before attaching ports.
func (f *Fabric) HideSources() { f.noSrc = true }

// Offloads reports TSO when the fabric was set to take super-packets,
// and USO when to take UDP ones too.
func (p *Port) Offloads() ipoib.Offloads {
	if p.f.tso {
		return ipoib.Offloads{TSO: true, USO: p.f.uso, MaxSuper: ipoib.MaxSuperPacket}
	}
	return ipoib.Offloads{}
}

// AllocQP creates a QP in partition pkey, numbered hint when that is a
// free valid QPN.
func (p *Port) AllocQP(pkey ipoib.PKey, hint uint32) (uint32, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	q, err := p.qps.Alloc(pkey, hint)
	if err != nil {
		return 0, fmt.Errorf("memfabric: %w", err)
	}
	return q, nil
}

// FreeQP destroys a QP.
func (p *Port) FreeQP(qpn uint32) error { return p.qps.Free(qpn) }

// Join attaches the port to mgid.
func (p *Port) Join(mgid ipoib.GID) error { return p.groups.Join(mgid, nil) }

// JoinSendOnly records a send-only membership: nothing is delivered.
func (p *Port) JoinSendOnly(mgid ipoib.GID) error { return p.groups.JoinSendOnly(mgid) }

// SendOnly reports whether the port is a send-only member of mgid (for
// tests).
func (p *Port) SendOnly(mgid ipoib.GID) bool { return p.groups.SendOnly(mgid) }

// Leave detaches the port from mgid.
func (p *Port) Leave(mgid ipoib.GID) error { return p.groups.Leave(mgid, nil) }

// Joined reports whether the port is attached to mgid (for tests).
func (p *Port) Joined(mgid ipoib.GID) bool { return p.groups.Full(mgid) }

// Counters returns a snapshot of the counters.
func (p *Port) Counters() ipoib.PortCounters {
	return ipoib.PortCounters{
		TxPackets: p.txPackets.Load(), TxBytes: p.txBytes.Load(),
		RxPackets: p.rxPackets.Load(), RxBytes: p.rxBytes.Load(),
		Drops: p.drops.Snapshot(),
	}
}

// Close detaches the port; blocked and later Reads and Writes return
// net.ErrClosed.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.f.mu.Lock()
	delete(p.f.ports, p.gid)
	p.f.mu.Unlock()
	close(p.done)
	p.events.Close()
	return nil
}

// Write sends a batch of any length. A packet the port refuses is
// counted and skipped: oversize, or bad metadata (a source QP it did not
// allocate, another P_Key than the QP's, a destination QPN that is
// 0xFFFFFF when the GID is no MGID or the reverse). n counts the packets
// handed to the fabric. One to a GID no port has is lost there and
// counted as no_route, as the simulated fabric's kernel accepts a
// datagram to an absent peer. On a fabric set to TSO (USO), a TCP (UDP)
// super-packet is cut into segments (datagrams), each sent and counted
// as a packet; one that cannot be cut is counted as bad_gso.
func (p *Port) Write(bufs [][]byte, meta []ipoib.TxMeta, offset int) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(meta) < len(bufs) {
		return 0, fmt.Errorf("memfabric: write of %d packets with %d metadata", len(bufs), len(meta))
	}
	if p.down.Load() {
		p.drops.AddN(ipoib.DropPortDown, uint64(len(bufs)))
		return 0, nil
	}
	n := 0
	for i, b := range bufs {
		payload := b[offset:]
		m := meta[i]
		if _, d := ipoib.CheckTxOffloads(&m, len(payload), p.qps, p.Offloads()); d != ipoib.DropNone {
			p.drops.Add(d)
			continue
		}
		if m.GSO.Type == ipoib.GSONone {
			if len(payload) > p.f.mtu {
				p.drops.Add(ipoib.DropOversize)
				continue
			}
			p.send(payload, m)
			n++
			continue
		}
		var seg gso.Segmenter
		if seg.StartIPoIB(m.GSO, payload, p.f.mtu) != nil {
			p.drops.Add(ipoib.DropBadGSO)
			continue
		}
		buf := p.f.pool.Get().(*[]byte)
		for !seg.Done() {
			p.send((*buf)[:seg.Cut(*buf)], m)
		}
		p.f.pool.Put(buf)
		n++
	}
	return n, nil
}

// send hands one packet to the fabric.
func (p *Port) send(payload []byte, m ipoib.TxMeta) {
	p.txPackets.Add(1)
	p.txBytes.Add(uint64(len(payload)))
	rm := ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, m.SrcQPN, p.gid), DstQPN: m.Dst.QPN(), PKey: m.PKey}
	if p.f.noSrc {
		rm.Src, rm.SrcUnknown = ipoib.HwAddr{}, true
	}
	p.f.mu.RLock()
	defer p.f.mu.RUnlock()
	if m.Dst.QPN() == ipoib.MulticastQPN {
		rm.MGID = m.Dst.GID()
		for _, q := range p.f.ports {
			// The switch forwards a group's packets to its members
			// only (the SM programs its forwarding tables so).
			if q != p && q.groups.Full(rm.MGID) {
				q.deliver(payload, rm)
			}
		}
	} else if q, ok := p.f.ports[m.Dst.GID()]; ok {
		q.deliver(payload, rm)
	} else {
		p.drops.Add(ipoib.DropNoRoute)
	}
}

// deliver applies the receive checks (ipoib.CheckRx) and queues a copy
// of payload.
func (p *Port) deliver(payload []byte, m ipoib.RxMeta) {
	if p.closed.Load() {
		return
	}
	if p.down.Load() {
		p.drops.Add(ipoib.DropPortDown)
		return
	}
	if d := ipoib.CheckRx(&m, p.qps, p.groups); d != ipoib.DropNone {
		p.drops.Add(d)
		return
	}
	buf := p.f.pool.Get().(*[]byte)
	n := copy(*buf, payload)
	select {
	case p.rx <- rxq.Packet{Buf: buf, N: n, Meta: m}:
	default:
		p.f.pool.Put(buf)
		p.drops.Add(ipoib.DropQueueFull)
	}
}

// Read blocks for at least one packet and returns up to len(bufs). A
// packet larger than its buffer is dropped and counted.
func (p *Port) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	return rxq.Read(p.rx, p.done, &p.f.pool, p.rxCtr, bufs, sizes, meta, offset)
}
