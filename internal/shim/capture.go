package shim

// Packet capture for the control socket: one capture at a time, of the
// fabric side (IPoIB packets as sent to and received from the port) or
// the TAP side (Ethernet frames read from and written to the guests).
// The data path pays one atomic load per packet when no capture runs.
// While one does, each packet is copied into a free buffer of a fixed
// pool and queued. When the reader is slow and no buffer is free, the
// packet is left out of the capture and counted, never waited for.

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// Capture sides.
const (
	CaptureFabric = "fabric"
	CaptureTAP    = "tap"
)

// CaptureHeader is the pseudo-header in front of each fabric-side packet,
// as Wireshark's IPoIB dissector reads pcap link type 242 (LINKTYPE_IPOIB,
// WTAP_ENCAP_IP_OVER_IB_PCAP). A sent packet has 20 zero bytes and its
// 20-byte destination address. A received one has a GRH: IP version 6,
// the source QPN in bytes 5–7, the source GID and the destination GID
// (this port's, or the group's MGID).
const CaptureHeader = 40

// CaptureSnap bounds a captured packet; longer ones (super-packets) are
// cut, their length kept.
const CaptureSnap = 16384

// CapturedPacket is one packet of a capture: Data (at most CaptureSnap
// bytes of it) and its full length.
type CapturedPacket struct {
	Data []byte
	Len  int
	At   time.Time
}

// Capture is a running capture.
type Capture struct {
	s       *Shim
	fabric  bool
	pkts    chan CapturedPacket
	free    chan []byte
	dropped atomic.Uint64
}

// ErrCaptureBusy is returned while another capture runs.
var ErrCaptureBusy = errors.New("shim: a capture is already running")

// StartCapture starts capturing side (CaptureFabric or CaptureTAP) with a
// pool of bufs buffers.
func (s *Shim) StartCapture(side string, bufs int) (*Capture, error) {
	if side != CaptureFabric && side != CaptureTAP {
		return nil, errors.New("shim: capture side must be fabric or tap")
	}
	c := &Capture{s: s, fabric: side == CaptureFabric, pkts: make(chan CapturedPacket, bufs), free: make(chan []byte, bufs)}
	for range bufs {
		c.free <- make([]byte, CaptureSnap)
	}
	if !s.capture.CompareAndSwap(nil, c) {
		return nil, ErrCaptureBusy
	}
	return c, nil
}

// Packets delivers the captured packets; give each Data back with
// Release.
func (c *Capture) Packets() <-chan CapturedPacket { return c.pkts }

// Release returns a packet's buffer to the pool.
func (c *Capture) Release(p CapturedPacket) {
	select {
	case c.free <- p.Data[:cap(p.Data)]:
	default:
	}
}

// Dropped is how many packets the capture missed for want of a buffer.
func (c *Capture) Dropped() uint64 { return c.dropped.Load() }

// Stop ends the capture; the packets queued stay readable.
func (c *Capture) Stop() {
	c.s.capture.CompareAndSwap(c, nil)
}

// take returns a free buffer, or counts the packet missed.
func (c *Capture) take() ([]byte, bool) {
	select {
	case b := <-c.free:
		return b, true
	default:
		c.dropped.Add(1)
		c.s.ctr.inc(CaptureMissed)
		return nil, false
	}
}

// queue hands a filled buffer to the reader (never blocks: the queue
// holds as many as there are buffers).
func (c *Capture) queue(b []byte, n, full int) {
	c.pkts <- CapturedPacket{Data: b[:n], Len: full, At: time.Now()}
}

// capFabricTx captures a packet sent to dst (pkt: IPoIB header and
// payload).
func (s *Shim) capFabricTx(pkt []byte, dst ipoib.HwAddr) {
	c := s.capture.Load()
	if c == nil || !c.fabric {
		return
	}
	b, ok := c.take()
	if !ok {
		return
	}
	clear(b[:20])
	copy(b[20:CaptureHeader], dst[:])
	c.queue(b, CaptureHeader+copy(b[CaptureHeader:], pkt), CaptureHeader+len(pkt))
}

// capFabricRx captures a received packet.
func (s *Shim) capFabricRx(pkt []byte, m *ipoib.RxMeta) {
	c := s.capture.Load()
	if c == nil || !c.fabric {
		return
	}
	b, ok := c.take()
	if !ok {
		return
	}
	clear(b[:8])
	b[0] = 0x60
	binary.BigEndian.PutUint32(b[4:8], m.Src.QPN())
	src, dst := m.Src.GID(), s.port.LocalGID()
	if m.DstQPN == ipoib.MulticastQPN {
		dst = m.MGID
	}
	copy(b[8:24], src[:])
	copy(b[24:40], dst[:])
	c.queue(b, CaptureHeader+copy(b[CaptureHeader:], pkt), CaptureHeader+len(pkt))
}

// capTAP captures an Ethernet frame read from or written to the TAP.
func (s *Shim) capTAP(frame []byte) {
	c := s.capture.Load()
	if c == nil || c.fabric {
		return
	}
	b, ok := c.take()
	if !ok {
		return
	}
	c.queue(b, copy(b, frame), len(frame))
}
