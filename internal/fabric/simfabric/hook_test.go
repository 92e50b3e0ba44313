package simfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
)

// TestEncodeHook: a hook set with SetEncodeHook sees every packet sent,
// encoded: its body is the payload, pad and ICRC after the BTH and DETH.
// While it is set, packets leave one datagram each, not in UDP GSO
// trains. A change it makes is on the wire (the receiver counts a bad
// ICRC). Without it, the same batch leaves as one train.
func TestEncodeHook(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	got := reader(b)
	bufs, meta := batchOf(16, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	calls := 0
	a.SetEncodeHook(func(body []byte, mcast bool) {
		// 6 bytes of payload, 2 of pad, the ICRC.
		if len(body) != 6+2+ICRCLen || mcast || body[0] != 8 {
			t.Errorf("hook saw %x (multicast %v)", body, mcast)
		}
		if calls == 3 {
			body[1] ^= 0x40
		}
		calls++
	})
	if n, err := a.Write(bufs, meta, 64); err != nil || n != 16 {
		t.Fatalf("Write: %d, %v", n, err)
	}
	for i := 0; i < 15; i++ {
		expect(t, got, "packet sent with the hook set")
	}
	waitDrop(t, b, "bad_icrc", 1)
	if calls != 16 || a.Counters().Stats["tx_trains"] != 0 {
		t.Fatalf("hook called %d times, %d trains; want 16 and none", calls, a.Counters().Stats["tx_trains"])
	}
	a.SetEncodeHook(nil)
	bufs, meta = batchOf(16, meta[0])
	if n, err := a.Write(bufs, meta, 64); err != nil || n != 16 {
		t.Fatalf("Write: %d, %v", n, err)
	}
	for i := 0; i < 16; i++ {
		expect(t, got, "packet sent without the hook")
	}
	if calls != 16 || a.Counters().Stats["tx_trains"] != 1 {
		t.Fatalf("hook called %d times, %d trains; want still 16 and one", calls, a.Counters().Stats["tx_trains"])
	}
}
