package verbsfabric

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

var (
	gid1 = testutil.GID("fe80::1")
	gid2 = testutil.GID("fe80::2")
)

func openPort(t testing.TB, h *fakeHub, g ipoib.GID) (*Port, *fakeDev) {
	t.Helper()
	p, err := New(Config{Device: "fake0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), open: h.opener(g)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, h.devs[g]
}

// packet is an IPoIB IPv4 packet of n bytes with Headroom in front.
func packet(n int, fill byte) []byte {
	b := make([]byte, ipoib.Headroom+n)
	ipoib.PutHeader(b[ipoib.Headroom:], 0x0800)
	for i := ipoib.Headroom + ipoib.HeaderLen; i < len(b); i++ {
		b[i] = fill
	}
	return b
}

// link is two ports on one fake fabric, each with a UD QP in the
// default partition.
type link struct {
	p1, p2 *Port
	d1     *fakeDev
	q1, q2 uint32
}

func newLink(t testing.TB) link {
	h := newHub()
	var l link
	l.p1, l.d1 = openPort(t, h, gid1)
	l.p2, _ = openPort(t, h, gid2)
	l.q1, _ = l.p1.AllocQP(0xffff, 0)
	l.q2, _ = l.p2.AllocQP(0xffff, 0)
	return l
}

// batch is n packets of size bytes from p1's QP to p2's, packet i
// filled with i+1.
func (l link) batch(n, size int) ([][]byte, []ipoib.TxMeta) {
	bufs, meta := make([][]byte, n), make([]ipoib.TxMeta, n)
	for i := range bufs {
		bufs[i], meta[i] = packet(size, byte(i+1)), ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, l.q2, gid2), SrcQPN: l.q1, PKey: 0xffff}
	}
	return bufs, meta
}

// rxBufs are Read's arguments for up to n packets.
func rxBufs(n int) ([][]byte, []int, []ipoib.RxMeta) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, 8192)
	}
	return bufs, make([]int, n), make([]ipoib.RxMeta, n)
}

// readN reads until n packets arrived (or 2 s passed).
func readN(t *testing.T, p *Port, n int) ([][]byte, []ipoib.RxMeta) {
	t.Helper()
	var data [][]byte
	var metas []ipoib.RxMeta
	done := make(chan struct{})
	go func() {
		defer close(done)
		bufs, sizes, meta := rxBufs(64)
		for len(data) < n {
			k, err := p.Read(bufs, sizes, meta, 0)
			if err != nil {
				return
			}
			for i := range k {
				data = append(data, bytes.Clone(bufs[i][:sizes[i]]))
				metas = append(metas, meta[i])
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(testutil.Settle):
		t.Fatalf("read %d of %d packets", len(data), n)
	}
	return data, metas
}

// TestUnicast: the first packet to a destination waits for its address
// handle and then goes; the receiver sees the sender's QPN and GID, its
// own QPN and the partition; the payload arrives as sent.
func TestUnicast(t *testing.T) {
	l := newLink(t)
	p1, p2, q1, q2 := l.p1, l.p2, l.q1, l.q2
	bufs, meta := l.batch(1, 1000)
	pkt := bufs[0]
	if n, err := p1.Write(bufs, meta, ipoib.Headroom); n != 1 || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	data, m := readN(t, p2, 1)
	if !bytes.Equal(data[0], pkt[ipoib.Headroom:]) || m[0].Src != ipoib.MakeHwAddr(0, q1, gid1) || m[0].DstQPN != q2 || m[0].PKey != 0xffff {
		t.Fatalf("received %+v", m[0])
	}
	// The first packet goes from the address handle's resolution, and
	// post counts it once postSend returns, which may be after the
	// receiver has it: the count is waited for.
	testutil.WaitFor(t, "the sender's count", func() bool { return p1.Counters().TxPackets != 0 })
	c := p1.Counters()
	if c.TxPackets != 1 || c.TxBytes != 1000 || c.Stats["address_handles_made"] != 1 || len(c.Drops) != 0 {
		t.Fatalf("sender counters %+v", c)
	}
	// The receiver makes the handle back to the sender ahead of its reply.
	testutil.WaitFor(t, "the receiver's handle back", func() bool { return p2.Counters().Stats["address_handles_made"] == 1 })
}

// TestMulticastOnce: a group packet reaches a port once however many
// VIFs it has (one group QP per partition is attached); the sender's own
// copy, looped back to its group QP, is dropped and counted.
func TestMulticastOnce(t *testing.T) {
	h := newHub()
	p1, _ := openPort(t, h, gid1)
	p2, _ := openPort(t, h, gid2)
	bcast := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	for range 3 {
		p2.AllocQP(0xffff, 0)
	}
	q1, _ := p1.AllocQP(0xffff, 0)
	if err := p1.Join(bcast); err != nil {
		t.Fatal(err)
	}
	if err := p2.Join(bcast); err != nil {
		t.Fatal(err)
	}
	meta := []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, bcast), SrcQPN: q1, PKey: 0xffff}}
	// Write again only while the port refuses it (the group's handle is
	// made first): once taken, it goes out once.
	for deadline := time.Now().Add(testutil.Settle); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := p1.Write([][]byte{packet(100, 1)}, meta, ipoib.Headroom); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not taken: %+v", p1.Counters())
		}
	}
	_, m := readN(t, p2, 1)
	if m[0].DstQPN != ipoib.MulticastQPN || m[0].MGID != bcast || m[0].Src.QPN() != q1 {
		t.Fatalf("received %+v", m[0])
	}
	time.Sleep(50 * time.Millisecond)
	if got := p2.Counters().RxPackets; got != 1 {
		t.Fatalf("p2 received %d copies", got)
	}
	go func() { // the loop-back reaches p1's Read and is dropped there
		p1.Read(make([][]byte, 1), make([]int, 1), make([]ipoib.RxMeta, 1), 0)
	}()
	deadline := time.Now().Add(testutil.Settle)
	for p1.Counters().Drops["own_packet"] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("p1 counters %+v", p1.Counters())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p1.FreeQP(p1.gqps[0xffff]); err == nil {
		t.Fatal("a group QP was freed by FreeQP")
	}
}

// TestRefusals: packets the port must not post are counted by reason.
func TestRefusals(t *testing.T) {
	h := newHub()
	p1, d1 := openPort(t, h, gid1)
	openPort(t, h, gid2)
	q, _ := p1.AllocQP(0xffff, 0)
	dst := ipoib.MakeHwAddr(0, 0x99, gid2)
	cases := []struct {
		pkt  []byte
		meta ipoib.TxMeta
		drop string
	}{
		{packet(4097, 0), ipoib.TxMeta{Dst: dst, SrcQPN: q, PKey: 0xffff}, "oversize"},
		{packet(100, 0), ipoib.TxMeta{Dst: dst, SrcQPN: 0x777, PKey: 0xffff}, "bad_meta"},
		{packet(100, 0), ipoib.TxMeta{Dst: dst, SrcQPN: q, PKey: 0x8001}, "bad_meta"},
		{packet(100, 0), ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, gid2), SrcQPN: q, PKey: 0xffff}, "bad_meta"},
		{packet(100, 0), ipoib.TxMeta{Dst: dst, SrcQPN: q, PKey: 0xffff, GSO: ipoib.GSO{Type: ipoib.GSOTCPv4}}, "bad_gso"},
	}
	for i, c := range cases {
		before := p1.Counters().Drops[c.drop]
		if n, _ := p1.Write([][]byte{c.pkt}, []ipoib.TxMeta{c.meta}, ipoib.Headroom); n != 0 || p1.Counters().Drops[c.drop] != before+1 {
			t.Errorf("case %d: accepted %d, drops %v", i, n, p1.Counters().Drops)
		}
	}
	if len(d1.sq) != 0 || p1.Counters().TxPackets != 0 {
		t.Fatal("a refused packet was posted")
	}
	if _, err := p1.AllocQP(0x8001, 0); err == nil {
		t.Fatal("a QP in a partition the P_Key table lacks")
	}
}

// TestRingWrap: five times the send ring's slots go out in batches while
// the receiver reads. Every packet arrives and the ring is empty after.
// Only two sends a batch ask for a completion. A post failure in the
// middle of a batch gives its slots back.
func TestRingWrap(t *testing.T) {
	l := newLink(t)
	p1, p2, d1 := l.p1, l.p2, l.d1
	bufs, meta := l.batch(batchSize, 200)
	p1.Write(bufs[:1], meta[:1], ipoib.Headroom) // waits for the handle
	readN(t, p2, 1)
	// The receiver reads all the while; each batch is sent once the one
	// before arrived (an HCA, like the fake, drops UD packets for which no
	// receive buffer is posted).
	const total = 5 * sendSlots
	var got atomic.Int64
	go func() {
		bufs, sizes, meta := rxBufs(64)
		for {
			k, err := p2.Read(bufs, sizes, meta, 0)
			if err != nil {
				return
			}
			got.Add(int64(k))
		}
	}()
	for sent := 0; sent < total; sent += batchSize {
		if n, err := p1.Write(bufs, meta, ipoib.Headroom); n != batchSize || err != nil {
			t.Fatalf("Write at %d: %d, %v (drops %v)", sent, n, err, p1.Counters().Drops)
		}
		deadline := time.Now().Add(testutil.Settle)
		for got.Load() < int64(sent+batchSize) {
			if time.Now().After(deadline) {
				t.Fatalf("received %d of %d", got.Load(), sent+batchSize)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	if n := got.Load(); n != total {
		t.Fatalf("received %d of %d", n, total)
	}
	p1.Write(nil, nil, ipoib.Headroom) // reaps the last completions
	if c := p1.Counters(); c.Levels["tx_ring_slots_in_use"] != 0 || len(c.Drops) != 0 || c.TxPackets != total+1 {
		t.Fatalf("after the run: %+v", c)
	}
	// Signalled selectively: the first packet (the last of its batch),
	// then in each batch of 64 the last and the one whose sequence is a
	// multiple of 64; every other send completes unseen.
	if got, want := p1.Counters().Stats["tx_signalled"], uint64(1+2*total/batchSize); got != want {
		t.Fatalf("tx_signalled %d for %d packets, want %d", got, total+1, want)
	}
	d1.mu.Lock()
	d1.failAt = 10
	d1.mu.Unlock()
	if n, _ := p1.Write(bufs, meta, ipoib.Headroom); n != batchSize || p1.Counters().Drops["send_error"] != batchSize-10 {
		t.Fatalf("failed post: accepted %d, drops %v", n, p1.Counters().Drops)
	}
	if c := p1.Counters(); c.Levels["tx_ring_slots_in_use"] > 10 {
		t.Fatalf("%d slots held after a failed post of which 10 went", c.Levels["tx_ring_slots_in_use"])
	}
}

// TestPortEvents: the device's async events set the port state the shim
// takes the TAP's carrier from. While the port is down, packets are
// refused and counted as port_down. A GID change or another event leaves
// the state as it is.
func TestPortEvents(t *testing.T) {
	h := newHub()
	p, d := openPort(t, h, gid1)
	openPort(t, h, gid2)
	q, _ := p.AllocQP(0xffff, 0)
	pkt := func() (int, error) {
		return p.Write([][]byte{packet(100, 0)}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, 0x99, gid2), SrcQPN: q, PKey: 0xffff}}, ipoib.Headroom)
	}
	waitDown := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(testutil.Settle)
		for p.IsDown() != want {
			if time.Now().After(deadline) {
				t.Fatalf("IsDown %v, want %v", !want, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if p.IsDown() {
		t.Fatal("an ACTIVE port starts down")
	}
	d.raise(eventPortDown)
	waitDown(true)
	if n, _ := pkt(); n != 0 || p.Counters().Drops["port_down"] != 1 {
		t.Fatalf("down port: accepted %d, drops %v", n, p.Counters().Drops)
	}
	d.raise(eventGIDChange)
	d.raise(eventOther)
	if !p.IsDown() {
		t.Fatal("a GID change or another event brought the port up")
	}
	d.raise(eventPortActive)
	waitDown(false)
	if n, _ := pkt(); n != 1 || p.Counters().Drops["port_down"] != 1 {
		t.Fatalf("active again: accepted %d, drops %v", n, p.Counters().Drops)
	}
}

// TestCloseUnblocksRead: Close ends a Read waiting for packets, and Read
// and Write then report net.ErrClosed.
func TestCloseUnblocksRead(t *testing.T) {
	h := newHub()
	p, _ := openPort(t, h, gid1)
	errc := make(chan error, 1)
	go func() {
		_, err := p.Read(make([][]byte, 1), make([]int, 1), make([]ipoib.RxMeta, 1), 0)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	p.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Read still blocked after Close")
	}
	if _, err := p.Write(nil, nil, 0); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write: %v", err)
	}
}

// TestCloseWaitsForQPCalls: Close does not free the device under an
// AllocQP that is in it (AllocQP runs outside the control lock), and
// QP calls after Close are refused, never sent to a freed device.
func TestCloseWaitsForQPCalls(t *testing.T) {
	p, d := openPort(t, newHub(), gid1)
	d.qpGate, d.qpEntered = make(chan struct{}), make(chan struct{})
	allocated := make(chan error, 1)
	go func() {
		_, err := p.AllocQP(0xffff, 0)
		allocated <- err
	}()
	<-d.qpEntered
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	<-d.woke
	select {
	case <-closed:
		t.Fatal("Close returned while AllocQP was in the device")
	case <-time.After(50 * time.Millisecond): // a Close that does not wait would be done
	}
	close(d.qpGate)
	if err := <-allocated; err != nil {
		t.Fatalf("AllocQP under way at Close: %v", err)
	}
	<-closed
	if _, err := p.AllocQP(0xffff, 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("AllocQP after Close: %v, want net.ErrClosed", err)
	}
	if err := p.FreeQP(0x11); !errors.Is(err, net.ErrClosed) {
		t.Errorf("FreeQP after Close: %v, want net.ErrClosed", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.qpLate != 0 || !d.devClosed {
		t.Fatalf("QP calls after the device was closed: %d (closed %v)", d.qpLate, d.devClosed)
	}
}

// BenchmarkWriteRead: a batch of 64 packets of 1,400 bytes sent from one
// port and read at another over the fake device, address handle cached.
// It measures the Go side of the data path: ring slots, work requests,
// selective signalling, completions, GRH checks, re-posting receive
// buffers.
func BenchmarkWriteRead(b *testing.B) {
	l := newLink(b)
	p1, p2 := l.p1, l.p2
	const n, size = 64, 1400
	bufs, meta := l.batch(n, size)
	rb, sizes, rmeta := rxBufs(n)
	read := func(want int) {
		for got := 0; got < want; {
			k, err := p2.Read(rb, sizes, rmeta, 0)
			if err != nil {
				b.Fatal(err)
			}
			got += k
		}
	}
	p1.Write(bufs[:1], meta[:1], ipoib.Headroom) // waits for the address handle
	read(1)
	b.SetBytes(n * size)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if k, err := p1.Write(bufs, meta, ipoib.Headroom); k != n || err != nil {
			b.Fatalf("Write: %d, %v (drops %v)", k, err, p1.Counters().Drops)
		}
		read(n)
	}
}

// TestSlowReaderKeepsSRQFull: with nobody reading, the receive queue
// (depth 64) stays full: every completion's buffer is replaced at once,
// so no packet finds the SRQ empty (the fake counts those, as an HCA
// loses them: UD has no RNR). 64 more wait for the reader; beyond that
// each new packet is dropped and counted (rx_queue_full). The reader
// then gets the 128 oldest, in order.
func TestSlowReaderKeepsSRQFull(t *testing.T) {
	const depth, sent = MinRecvDepth, 2*MinRecvDepth + 10
	h := newHub()
	p1, _ := openPort(t, h, gid1)
	p2, err := New(Config{Device: "fake1", RecvDepth: depth, Logger: slog.New(slog.DiscardHandler), open: h.opener(gid2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p2.Close() })
	d2 := h.devs[gid2]
	q1, _ := p1.AllocQP(0xffff, 0)
	q2, _ := p2.AllocQP(0xffff, 0)
	key := ahKey{gid2, 0xffff}
	p1.wantAH(key)
	testutil.WaitFor(t, "the address handle", func() bool { return readyAH(p1, key) })
	full := func() bool {
		d2.mu.Lock()
		defer d2.mu.Unlock()
		return len(d2.posted)-d2.postedAt == depth && len(d2.rq) == 0
	}
	meta := make([]ipoib.TxMeta, 8)
	for i := range meta {
		meta[i] = ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, q2, gid2), SrcQPN: q1, PKey: 0xffff}
	}
	for i := 0; i < sent; i += 8 {
		n := min(8, sent-i)
		bufs := make([][]byte, n)
		for j := range bufs {
			bufs[j] = packet(100, byte(i+j))
		}
		if k, err := p1.Write(bufs, meta[:n], ipoib.Headroom); k != n || err != nil {
			t.Fatalf("wrote %d of %d: %v", k, n, err)
		}
		testutil.WaitFor(t, "the SRQ full again", full)
	}
	d2.mu.Lock()
	lost := d2.lost
	d2.mu.Unlock()
	if drops := p2.Counters().Drops["rx_queue_full"]; lost != 0 || drops != sent-2*depth {
		t.Fatalf("lost in the device %d (want 0), rx_queue_full %d (want %d)", lost, drops, sent-2*depth)
	}
	data, _ := readN(t, p2, 2*depth)
	if len(data) != 2*depth {
		t.Fatalf("read %d, want %d", len(data), 2*depth)
	}
	for i, b := range data {
		if len(b) != 100 || b[99] != byte(i) {
			t.Fatalf("packet %d: %d bytes, fill %d", i, len(b), b[len(b)-1])
		}
	}
}
