package udprate

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// listen binds a receiver on 127.0.0.1 (a port the kernel picks) and runs
// it; the result arrives on the channel.
func listen(t *testing.T) (netip.AddrPort, <-chan RecvResult) {
	t.Helper()
	r, err := Listen(RecvConfig{Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		Duration: time.Minute, Idle: 5 * time.Second, Batch: 64, SockBuf: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ap, err := r.Addr()
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan RecvResult, 1)
	go func() {
		res, err := r.Run()
		if err != nil {
			t.Error(err)
		}
		ch <- res
	}()
	return ap, ch
}

// 100,000 datagrams at a modest rate over loopback, in two flows, one by
// one and as GSO buffers: all of them arrive, each once, and the receiver
// knows from the end datagrams that that is all there was.
func TestLoopbackExactCount(t *testing.T) {
	const n = 100000
	for _, gso := range []int{0, 16} {
		ap, results := listen(t)
		sent, err := Send(SendConfig{To: ap, Rate: 50000, Size: 64, Flows: 2, Count: n, Batch: 64, GSO: gso, SockBuf: 4 << 20})
		if err != nil {
			t.Fatal(err)
		}
		got := <-results
		if sent.Sent != n || sent.Bytes != n*64 || sent.Errors != 0 {
			t.Errorf("gso %d: sent %d (%d bytes, %d errors), want %d (%d bytes, no errors)", gso, sent.Sent, sent.Bytes, sent.Errors, n, n*64)
		}
		want := Stats{Sent: n, SentKnown: true, Received: n, Bytes: n * 64, Flows: 2}
		if got.Stats != want || got.LossPercent != 0 || got.SocketDrops != 0 {
			t.Errorf("gso %d: received %+v, loss %v %%, %d socket drops\nwant %+v, no loss", gso, got.Stats, got.LossPercent, got.SocketDrops, want)
		}
	}
}

// Datagrams written by hand with gaps, a duplicate, a late one, a foreign
// datagram and the flow's end: the receiver's accounting is exact.
func TestReceiverCountsInjectedGapsAndDuplicates(t *testing.T) {
	ap, results := listen(t)
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var msgs [][]byte
	for _, s := range []uint64{0, 1, 3, 3, 2, 6} {
		msgs = append(msgs, datagram(64, Header{Kind: Data, Flows: 1, Seq: s}))
	}
	msgs = append(msgs, []byte("foreign"), datagram(64, Header{Kind: End, Flows: 1, Seq: 8}))
	for _, m := range msgs {
		if _, err := c.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	got := <-results
	want := Stats{
		Sent:       8,
		SentKnown:  true,
		Received:   5,      // 0 1 2 3 6
		Bytes:      5 * 64, //
		Lost:       3,      // 4 5 7
		Duplicates: 1,      // 3
		Reordered:  1,      // 2 after 3
		Invalid:    1,
		Flows:      1,
	}
	if got.Stats != want || got.LossPercent != 37.5 {
		t.Fatalf("got %+v, loss %v %%\nwant %+v, loss 37.5 %%", got.Stats, got.LossPercent, want)
	}
}
