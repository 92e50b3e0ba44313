package shim

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// queuedPort is a port (the hypervisor's memfabric one) with several
// receive queues (ipoib.RxQueues): the first is the port itself (what
// the fabric brings), the others are fed by the test; what a port with
// several sockets gives the shim.
type queuedPort struct {
	testPort
	queues []ipoib.RxQueue
	closed chan struct{}
	once   sync.Once
}

// fedQueue is one receive queue of a queuedPort: Read returns the
// packets sent on in, one per call, until the port closes.
type fedQueue struct {
	in     chan fedPacket
	closed chan struct{}
}

// fedPacket is an IPoIB packet (IPoIB header first) and its metadata.
type fedPacket struct {
	b []byte
	m ipoib.RxMeta
}

func (q *fedQueue) Read(bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	select {
	case p := <-q.in:
		sizes[0], meta[0] = copy(bufs[0][offset:], p.b), p.m
		return 1, nil
	case <-q.closed:
		return 0, net.ErrClosed
	}
}

func newQueuedPort(p testPort, n int) (*queuedPort, []*fedQueue) {
	qp := &queuedPort{testPort: p, closed: make(chan struct{})}
	qp.queues = append(qp.queues, p)
	fed := []*fedQueue{nil} // queue 0 is fed through the fabric
	for range n - 1 {
		q := &fedQueue{in: make(chan fedPacket), closed: qp.closed}
		fed = append(fed, q)
		qp.queues = append(qp.queues, q)
	}
	return qp, fed
}

func (p *queuedPort) RxQueues() []ipoib.RxQueue { return p.queues }

func (p *queuedPort) Close() error {
	p.once.Do(func() { close(p.closed) })
	return p.testPort.Close()
}

// TestRxQueuesRace: a shim whose port gives three receive queues runs an RX
// worker on each. UDP flows for two guests arrive on all three at once,
// while the second guest's VIF is removed. Each flow comes on one queue:
// the first queue's are sent through the fabric by the other hypervisor's
// port, the others' fed to their queue. Under -race this is the test of the
// RX workers' shared state (VIF table, counters, device queues). Every
// frame of the first guest's flows reaches the device (a tap.Mem of three
// queues), each flow's in the order sent, none twice.
func TestRxQueuesRace(t *testing.T) {
	const queues, flows, per = 3, 6, 200
	var fed []*fedQueue
	f := memFab(t, 2048)
	a := newHV(t, f, "fe80::a", nil)
	b := newHV(t, f, "fe80::b", func(c *Config) {
		c.Device = tap.NewMemQueues(4*flows*per, queues)
		c.Port, fed = newQueuedPort(c.Port.(testPort), queues)
	})
	arpExchange(t, a, b)
	macB2, ipB2 := ether.MAC{0x52, 0x54, 0, 0, 0xb, 2}, netip.MustParseAddr("10.0.0.4")
	b.dev.Inject(arpFrame(t, layers.ARPRequest, macB2, ipB2, ether.Broadcast, ether.MAC{}, ipA1))
	qpn := func(mac ether.MAC) uint32 {
		var v *mactrans.VIF
		testutil.WaitFor(t, "the VIF of "+mac.String(), func() bool {
			w, ok := b.s.vifs.Lookup(mactrans.VIFKey{MAC: mac})
			v = w
			return ok && w.Ready()
		})
		return v.QPN
	}
	va, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
	src := ipoib.MakeHwAddr(0, va.QPN, a.port.LocalGID())
	dst := [2]uint32{qpn(macB1), qpn(macB2)}
	for len(b.dev.Sent()) > 0 {
		<-b.dev.Sent()
	}
	var wg sync.WaitGroup
	for q := range queues {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range per {
				for fl := q; fl < flows; fl += queues {
					for g, ip := range []netip.Addr{ipB1, ipB2} {
						ipv4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: ipA1.AsSlice(), DstIP: ip.AsSlice()}
						udp := &layers.UDP{SrcPort: layers.UDPPort(10000 + fl), DstPort: 5201}
						_ = udp.SetNetworkLayerForChecksum(ipv4)
						payload := binary.BigEndian.AppendUint32(nil, uint32(seq))
						pkt := append([]byte{8, 0, 0, 0}, serialize(t, ipv4, udp, gopacket.Payload(payload))...)
						if q > 0 {
							fed[q].in <- fedPacket{pkt, ipoib.RxMeta{Src: src, DstQPN: dst[g], PKey: ipoib.DefaultPKey}}
							continue
						}
						m := []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, dst[g], b.port.LocalGID()), SrcQPN: va.QPN, PKey: ipoib.DefaultPKey}}
						if n, err := a.port.Write([][]byte{pkt}, m, 0); n != 1 || err != nil {
							t.Errorf("fabric write: %d, %v", n, err)
							return
						}
					}
				}
			}
		}()
	}
	if removed, err := b.s.RemoveVIF(macB2, 0, mactrans.OriginDeclared); err != nil || !removed {
		t.Fatalf("RemoveVIF: %v, %v", removed, err)
	}
	wg.Wait()
	next := make(map[int]int) // flow → next seq, of the first guest's
	for done := 0; done < flows*per; {
		select {
		case fr := <-b.dev.Sent():
			p := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
			e, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
			u, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			if e == nil || u == nil || ether.MAC(e.DstMAC) != macB1 {
				continue // the second guest's (before its VIF went) and the shim's own
			}
			fl, seq := int(u.SrcPort)-10000, int(binary.BigEndian.Uint32(u.Payload))
			if seq != next[fl] {
				t.Fatalf("flow %d: frame %d delivered when %d was next", fl, seq, next[fl])
			}
			next[fl]++
			done++
		case <-time.After(testutil.Settle):
			t.Fatalf("delivered %v of %d frames per flow", next, per)
		}
	}
}
