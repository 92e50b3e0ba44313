package memfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestEvents: the first event is the link up. SetDown and
// SetPartitionMTU give their events in order, and PartitionMTU agrees;
// an MTU above the fabric's reads as the fabric's. While down nothing is
// sent or delivered, counted as port_down. A reader that does not read
// never blocks the port. Close closes the channel.
func TestEvents(t *testing.T) {
	a, b := twoPorts(t)
	ch := a.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	a.SetDown(true)
	a.SetPartitionMTU(0x0002, 1024)
	a.SetDown(false)
	a.SetPartitionMTU(0x8003, 4096)
	eventtest.Expect(t, ch, eventtest.Link(false), eventtest.MTU(0x8002, 1024), eventtest.Link(true), eventtest.MTU(0x8003, 2048))
	if a.PartitionMTU(0x8002) != 1024 || a.PartitionMTU(0x0003) != 2048 || a.PartitionMTU(0xffff) != 2048 {
		t.Fatalf("PartitionMTU %d %d %d", a.PartitionMTU(0x8002), a.PartitionMTU(0x0003), a.PartitionMTU(0xffff))
	}

	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	pkt := append(make([]byte, ipoib.Headroom), 0x08, 0, 0, 0, 0x45)
	a.SetDown(true)
	if n, err := a.Write([][]byte{pkt}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, qb, b.gid), SrcQPN: qa, PKey: 0xffff}}, ipoib.Headroom); n != 0 || err != nil {
		t.Fatalf("down port sent: %d %v", n, err)
	}
	if n, _ := b.Write([][]byte{pkt}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, qa, a.gid), SrcQPN: qb, PKey: 0xffff}}, ipoib.Headroom); n != 1 || a.Counters().Drops[ipoib.DropPortDown.String()] != 2 || len(a.rx) != 0 {
		t.Fatalf("to a down port: sent %d, drops %v, queued %d", n, a.Counters().Drops, len(a.rx))
	}
	eventtest.Expect(t, ch, eventtest.Link(false))

	mark := eventtest.SlowReader(t, ch, func(up bool) { a.SetDown(!up) }, func() { a.SetPartitionMTU(0xffff, 1024) })
	if mark != eventtest.MTU(0xffff, 1024) {
		t.Fatalf("mark %+v", mark)
	}
	a.Close()
	eventtest.Closed(t, ch)
}
