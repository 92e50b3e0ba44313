package shim

import (
	"bytes"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestCaptureSlowReader: a capture whose reader never reads keeps only
// what its buffers hold; every other packet is counted as missed, and
// forwarding goes on untouched: all frames reach the other side.
func TestCaptureSlowReader(t *testing.T) {
	a, b := pair(t, nil)
	_, remacB1 := arpExchange(t, a, b)
	c, err := a.s.StartCapture(CaptureFabric, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.s.StartCapture(CaptureTAP, 4); err != ErrCaptureBusy {
		t.Fatalf("second capture: %v", err)
	}
	const n = 50
	for range n {
		a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 100, true))
	}
	for range n {
		b.recv(t)
	}
	if got := c.Dropped(); got != n-4 || a.s.Get(CaptureMissed) != n-4 {
		t.Fatalf("missed %d (counter %d), want %d", got, a.s.Get(CaptureMissed), n-4)
	}
	// What it kept is the first four packets as sent: the 40-byte
	// pseudo-header (zeros, then the destination's 20-byte address) and
	// the IPoIB packet.
	for range 4 {
		p := <-c.Packets()
		var dst ipoib.HwAddr
		copy(dst[:], p.Data[20:CaptureHeader])
		if !bytes.Equal(p.Data[:20], make([]byte, 20)) || dst.GID() != b.port.LocalGID() || p.Len != len(p.Data) ||
			ipoib.Header(p.Data[CaptureHeader:]).EtherType() != ether.TypeIPv4 || len(p.Data) != CaptureHeader+ipoib.HeaderLen+20+8+100 {
			t.Fatalf("captured %x", p.Data)
		}
		c.Release(p)
	}
	c.Stop()
	// A TAP-side capture now sees the received frames as Ethernet.
	c, err = b.s.StartCapture(CaptureTAP, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 100, true))
	b.recv(t)
	p := <-c.Packets()
	if e := ether.Frame(p.Data); !e.IsValid() || e.Dst() != macB1 || e.EtherType() != uint16(layers.EthernetTypeIPv4) {
		t.Fatalf("TAP capture %x", p.Data)
	}
}
