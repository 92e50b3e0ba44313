package shim

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestLearnOnlyAccepted: packets that RX drops (bad header, ethertype,
// unknown VIF, refused rewrite) teach the neighbour table nothing; an
// accepted one does.
func TestLearnOnlyAccepted(t *testing.T) {
	f := memFab(t, 2048)
	s, _ := stillShim(t, f.Fabric, "fe80::a", nil)
	v, _ := s.vif(s.byVLAN[0].Load(), macA1, mactrans.OriginLearned, s.clk.Now())
	from := func(q uint32) ipoib.HwAddr { return ipoib.MakeHwAddr(0, q, testutil.GID("fe80::b")) }
	for i, c := range []struct {
		pkt    []byte
		dstQPN uint32
	}{
		{[]byte{8, 0, 0, 1, 0x45}, v.QPN},            // reserved bits
		{[]byte{0x88, 0xcc, 0, 0, 1}, v.QPN},         // ethertype
		{[]byte{8, 0, 0, 0, 0x45}, v.QPN + 1},        // no such VIF
		{[]byte{8, 6, 0, 0, 0, 32, 8, 0, 20}, v.QPN}, // truncated ARP
	} {
		if rxPacket(s, c.pkt, ipoib.RxMeta{Src: from(uint32(100 + i)), DstQPN: c.dstQPN, PKey: 0xffff}) != nil {
			t.Fatalf("bad packet %d delivered", i)
		}
	}
	if n := s.neigh.Len(); n != 0 {
		t.Fatalf("%d neighbours learned from dropped packets", n)
	}
	if rxPacket(s, append([]byte{8, 0, 0, 0}, udpPacket(t, ipB1, ipA1, 10)...), ipoib.RxMeta{Src: from(200), DstQPN: v.QPN, PKey: 0xffff}) == nil || s.neigh.Len() != 1 {
		t.Fatalf("accepted packet: neighbours %d", s.neigh.Len())
	}
}
