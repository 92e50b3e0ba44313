package simfabric

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// pair opens a port in each of two namespaces joined by a veth.
func pair(t testing.TB, mtu int) (a, b *Port, nsA, nsB string) {
	t.Helper()
	return pairN(t, mtu, 1, 1)
}

// pairN is pair with ports of sa and sb sockets.
func pairN(t testing.TB, mtu, sa, sb int) (a, b *Port, nsA, nsB string) {
	t.Helper()
	nstest.Require(t)
	pfx := fmt.Sprintf("sf%d", os.Getpid()%10000)
	nsA, nsB = pfx+"a", pfx+"b"
	nstest.Add(t, nsA)
	nstest.Add(t, nsB)
	nstest.Must(t, "ip", "link", "add", "ula", "netns", nsA, "type", "veth", "peer", "name", "ulb", "netns", nsB)
	nstest.Must(t, nstest.In(nsA, "ip", "link", "set", "ula", "mtu", fmt.Sprint(mtu), "up")...)
	nstest.Must(t, nstest.In(nsB, "ip", "link", "set", "ulb", "mtu", fmt.Sprint(mtu), "up")...)
	var err error
	nstest.Do(t, nsA, func() { a, err = Open(Config{Underlay: "ula", IBMTU: 2048, Sockets: sa}) })
	if err != nil {
		t.Fatal(err)
	}
	nstest.Do(t, nsB, func() { b, err = Open(Config{Underlay: "ulb", IBMTU: 2048, Sockets: sb}) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, nsA, nsB
}

func send(t *testing.T, p ipoib.Port, payload []byte, m ipoib.TxMeta) {
	t.Helper()
	buf := make([]byte, 64, 64+len(payload)+TailRoom)
	buf = append(buf, payload...)
	if _, err := p.Write([][]byte{buf}, []ipoib.TxMeta{m}, 64); err != nil {
		t.Fatal(err)
	}
}

type rx struct {
	payload []byte
	meta    ipoib.RxMeta
}

// reader collects what a port receives, on every socket; the channel
// is closed once every socket's Read returned an error.
func reader(p *Port) <-chan rx {
	ch := make(chan rx, 64)
	readQueues(p, 2, func(r rx, _ int) { ch <- r }, func() { close(ch) })
	return ch
}

// readQueues reads each of p's sockets in a goroutine of its own, n
// packets per Read at most, and hands put each packet with its socket's
// index; once every socket's Read returned an error, it calls end.
func readQueues(p *Port, n int, put func(r rx, q int), end func()) {
	var wg sync.WaitGroup
	for i, q := range p.RxQueues() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := make([][]byte, n)
			for k := range bufs {
				bufs[k] = make([]byte, 4200)
			}
			sizes := make([]int, n)
			meta := make([]ipoib.RxMeta, n)
			for {
				got, err := q.Read(bufs, sizes, meta, 64)
				if err != nil {
					return
				}
				for k := range got {
					put(rx{append([]byte(nil), bufs[k][64:64+sizes[k]]...), meta[k]}, i)
				}
			}
		}()
	}
	go func() { wg.Wait(); end() }()
}

func expect(t *testing.T, ch <-chan rx, what string) rx {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(testutil.Settle):
		t.Fatalf("%s: nothing received", what)
	}
	return rx{}
}

func none(t *testing.T, ch <-chan rx, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: received %x", what, r.payload)
	case <-time.After(200 * time.Millisecond):
	}
}

func waitDrop(t *testing.T, p ipoib.Port, reason string, want uint64) {
	t.Helper()
	deadline := time.Now().Add(testutil.Settle)
	for p.Counters().Drops[reason] < want {
		if time.Now().After(deadline) {
			t.Fatalf("drop %s = %d, want %d (%v)", reason, p.Counters().Drops[reason], want, p.Counters().Drops)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPortOverVeth: a port's traffic, receive checks, faults and Close,
// with one socket and with four (whose packets each arrive on one of
// them).
func TestPortOverVeth(t *testing.T) {
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("sockets=%d", n), func(t *testing.T) { portOverVeth(t, n) })
	}
}

func portOverVeth(t *testing.T, sockets int) {
	a, b, _, _ := pairN(t, 9000, sockets, sockets)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0x1234)
	if qb != 0x1234 {
		t.Fatalf("hinted QPN %#x", qb)
	}
	qb2, _ := b.AllocQP(0x8001, 0)
	got := reader(b)
	to := func(qpn uint32) ipoib.HwAddr { return ipoib.MakeHwAddr(0, qpn, b.LocalGID()) }

	// Unicast, with an odd length (padding) and the maximum payload.
	send(t, a, []byte{8, 0, 0, 0, 1, 2, 3}, ipoib.TxMeta{Dst: to(qb), SrcQPN: qa, PKey: 0xffff})
	r := expect(t, got, "unicast")
	if string(r.payload) != "\x08\x00\x00\x00\x01\x02\x03" || r.meta.Src != ipoib.MakeHwAddr(0, qa, a.LocalGID()) || r.meta.DstQPN != qb || r.meta.PKey != 0xffff {
		t.Fatalf("got %x %+v", r.payload, r.meta)
	}
	send(t, a, make([]byte, 2048), ipoib.TxMeta{Dst: to(qb), SrcQPN: qa, PKey: 0xffff})
	if r := expect(t, got, "2048 bytes"); len(r.payload) != 2048 {
		t.Fatalf("MTU-sized payload arrived as %d bytes", len(r.payload))
	}
	send(t, a, make([]byte, 2049), ipoib.TxMeta{Dst: to(qb), SrcQPN: qa, PKey: 0xffff})
	waitDrop(t, a, "oversize", 1)

	// Multicast: only once joined.
	mgid := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	bc := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, mgid), SrcQPN: qa, PKey: 0xffff}
	send(t, a, []byte{8, 6, 0, 0}, bc)
	none(t, got, "multicast before join")
	if err := b.Join(mgid); err != nil {
		t.Fatal(err)
	}
	send(t, a, []byte{8, 6, 0, 0}, bc)
	if r := expect(t, got, "multicast"); r.meta.DstQPN != ipoib.MulticastQPN || r.meta.MGID != mgid {
		t.Fatalf("multicast meta %+v", r.meta)
	}

	// Receive checks: P_Key, unknown QPN.
	send(t, a, []byte{8, 0, 0, 0}, ipoib.TxMeta{Dst: to(qb2), SrcQPN: qa, PKey: 0xffff})
	send(t, a, []byte{8, 0, 0, 0}, ipoib.TxMeta{Dst: to(0x999), SrcQPN: qa, PKey: 0xffff})
	waitDrop(t, b, "pkey_mismatch", 1)
	waitDrop(t, b, "unknown_qpn", 1)

	// Q_Key mismatch and corruption, crafted by hand.
	raw := func(qkey uint32, corrupt bool) {
		src, dst := [16]byte(a.LocalGID()), [16]byte(b.LocalGID())
		buf := make([]byte, 64, 128)
		buf = append(buf, 8, 0, 0, 0)
		out := new(Codec).Encode(buf, 64, &Packet{PKey: 0xffff, DestQPN: qb, QKey: qkey, SrcQPN: qa}, &src, &dst, UDPPort, UDPPort)
		if corrupt {
			out[len(out)-6] ^= 1
		}
		a.wmu.Lock()
		_, err := a.conns[0].WriteToUDP(out, &net.UDPAddr{IP: net.IP(dst[:]), Port: UDPPort, Zone: a.ifi.Name})
		a.wmu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	raw(0x1234, false)
	raw(ipoib.QKey, true)
	waitDrop(t, b, "qkey_mismatch", 1)
	waitDrop(t, b, "bad_icrc", 1)
	none(t, got, "bad packets")

	// Faults, through the faultport wrapper; corruption through the
	// encode hook, after the ICRC was computed.
	uni := ipoib.TxMeta{Dst: to(qb), SrcQPN: qa, PKey: 0xffff}
	fa, err := faultport.New(a, faultport.Faults{Loss: 1})
	if err != nil {
		t.Fatal(err)
	}
	send(t, fa, []byte{8, 0, 0, 0}, uni)
	waitDrop(t, fa, "fault_loss", 1)
	none(t, got, "loss")
	fa.SetFaults(faultport.Faults{Dup: 1})
	send(t, fa, []byte{8, 0, 0, 0, 0xd}, uni)
	expect(t, got, "dup 1")
	expect(t, got, "dup 2")
	fa.SetFaults(faultport.Faults{Corrupt: 1})
	send(t, fa, []byte{8, 0, 0, 0}, uni)
	waitDrop(t, b, "bad_icrc", 2)
	fa.SetFaults(faultport.Faults{Corrupt: 1, Dup: 1}) // a corrupted duplicate is a second bad packet
	send(t, fa, []byte{8, 0, 0, 0}, uni)
	waitDrop(t, b, "bad_icrc", 4)
	if n := fa.Counters().Stats["tx_fault_corrupt"]; n != 3 {
		t.Fatalf("tx_fault_corrupt %d, want 3 (the receiver counted 3 bad ICRCs since the corrupt fault went on)", n)
	}
	fa.SetFaults(faultport.Faults{Reorder: 1})
	send(t, fa, []byte{8, 0, 0, 0, 1}, uni)
	none(t, got, "held back")
	send(t, fa, []byte{8, 0, 0, 0, 2}, uni)
	if r1, r2 := expect(t, got, "reorder 1"), expect(t, got, "reorder 2"); r1.payload[4] != 2 || r2.payload[4] != 1 {
		t.Fatalf("reorder: %x then %x", r1.payload, r2.payload)
	}
	fa.SetFaults(faultport.Faults{})
	if err := fa.SetFaults(faultport.Faults{Loss: 2}); err == nil {
		t.Fatal("loss=2 accepted")
	}
	a.SetDown(true)
	send(t, a, []byte{8, 0, 0, 0}, uni)
	waitDrop(t, a, "port_down", 1)
	a.SetDown(false)
	b.SetDown(true)
	send(t, a, []byte{8, 0, 0, 0}, uni)
	waitDrop(t, b, "port_down", 1)
	b.SetDown(false)
	none(t, got, "port down")

	// Close: Read and Write return net.ErrClosed.
	b.Close()
	if _, ok := <-got; ok {
		t.Fatal("reader got a packet after Close")
	}
	if _, err := b.Write(nil, nil, 64); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
}

func TestUnderlayMTUTooSmall(t *testing.T) {
	_, _, nsA, _ := pair(t, 9000)
	nstest.Must(t, nstest.In(nsA, "ip", "link", "set", "ula", "mtu", "1500")...)
	var err error
	nstest.Do(t, nsA, func() { _, err = Open(Config{Underlay: "ula", IBMTU: 4096}) })
	if err == nil || !strings.Contains(err.Error(), "1500") || !strings.Contains(err.Error(), "4168") {
		t.Fatalf("want an error naming 1500 and 4168, got %v", err)
	}
}

// batchOf returns n packets with headroom and tail room, packet i
// carrying i in its payload, all to dst from src.
func batchOf(n int, m ipoib.TxMeta) ([][]byte, []ipoib.TxMeta) {
	bufs := make([][]byte, n)
	meta := make([]ipoib.TxMeta, n)
	for i := range bufs {
		b := make([]byte, 64, 64+8+TailRoom)
		bufs[i] = append(b, 8, 0, 0, 0, byte(i>>8), byte(i))
		meta[i] = m
	}
	return bufs, meta
}

// TestWriteAnyBatchLength: one Write of 1,000 packets (far more than the
// 64 messages one system call takes) is sent whole, each packet once,
// and n and the counters say so. Before Write chunked its batches, this
// panicked with an index out of range.
func TestWriteAnyBatchLength(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	got := reader(b)
	const total = 1000
	bufs, meta := batchOf(total, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	n, err := a.Write(bufs, meta, 64)
	if err != nil || n != total {
		t.Fatalf("Write of %d: n %d, err %v", total, n, err)
	}
	seen := make(map[int]bool)
	for len(seen) < total {
		r := expect(t, got, fmt.Sprintf("packet %d of %d", len(seen)+1, total))
		i := int(r.payload[4])<<8 | int(r.payload[5])
		if seen[i] {
			t.Fatalf("packet %d received twice", i)
		}
		seen[i] = true
	}
	if c := a.Counters(); c.TxPackets != total || len(c.Drops) != 0 {
		t.Fatalf("sender counters %+v, want %d packets and no drops", c, total)
	}
	if c := b.Counters(); c.RxPackets != total || len(c.Drops) != 0 {
		t.Fatalf("receiver counters %+v, want %d packets and no drops", c, total)
	}
}

// TestWriteCountsAccepted: n and tx_packets count only the packets the
// port accepted. Others are counted as drops and never reach the wire.
// They are packets from a QP the port did not allocate (or has freed) or
// from a QP of another partition, to an MGID with a unicast QPN, or lost
// by a fault.
func TestWriteCountsAccepted(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	freed, _ := a.AllocQP(0xffff, 0)
	if err := a.FreeQP(freed); err != nil {
		t.Fatal(err)
	}
	qb, _ := b.AllocQP(0xffff, 0)
	got := reader(b)
	dst := ipoib.MakeHwAddr(0, qb, b.LocalGID())
	bufs, meta := batchOf(5, ipoib.TxMeta{Dst: dst, SrcQPN: qa, PKey: 0xffff})
	meta[1].SrcQPN = freed
	meta[2].PKey = 0x8001                                                                    // not qa's partition
	meta[4].Dst = ipoib.MakeHwAddr(0, qb, ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)) // an MGID with a unicast QPN
	if n, err := a.Write(bufs, meta, 64); err != nil || n != 2 {
		t.Fatalf("Write: n %d, err %v; want 2 of 5 accepted", n, err)
	}
	for i := 0; i < 2; i++ {
		r := expect(t, got, "accepted packet")
		if idx := r.payload[5]; idx != 0 && idx != 3 {
			t.Fatalf("refused packet %d reached the wire", idx)
		}
	}
	none(t, got, "refused packets")
	if c := a.Counters(); c.TxPackets != 2 || c.Drops["bad_meta"] != 3 {
		t.Fatalf("counters %+v, want 2 sent and 3 bad_meta", c)
	}
	fa, err := faultport.New(a, faultport.Faults{Loss: 1})
	if err != nil {
		t.Fatal(err)
	}
	bufs, meta = batchOf(3, ipoib.TxMeta{Dst: dst, SrcQPN: qa, PKey: 0xffff})
	if n, err := fa.Write(bufs, meta, 64); err != nil || n != 0 {
		t.Fatalf("Write under total loss: n %d, err %v; want 0", n, err)
	}
	if c := fa.Counters(); c.TxPackets != 2 || c.Drops["fault_loss"] != 3 {
		t.Fatalf("counters %+v, want still 2 sent and 3 fault_loss", c)
	}
}

// TestTrains: packets to one destination with one length (the last of a
// run may be shorter) leave as UDP GSO trains, and every packet arrives
// once, intact, with its own metadata. When the kernel refuses a train
// the port falls back to single datagrams for good, losing nothing.
func TestTrains(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	qb2, _ := b.AllocQP(0xffff, 0)
	got := reader(b)
	// 40 packets of 1,000 bytes to qb, 3 of 500 to qb2 and one of 1,000
	// to qb, all to b's GID (the QPN is inside the packet). They leave
	// as a train of 40, one of 3 (a longer packet cannot follow shorter
	// ones) and a single datagram.
	var bufs [][]byte
	var meta []ipoib.TxMeta
	dst := b.LocalGID()
	for i := 0; i < 44; i++ {
		size, q := 1000, qb
		if i >= 40 && i < 43 {
			size, q = 500, qb2
		}
		buf := make([]byte, 64, 64+size+TailRoom)
		p := make([]byte, size)
		p[0], p[4] = 8, byte(i)
		bufs = append(bufs, append(buf, p...))
		meta = append(meta, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, q, dst), SrcQPN: qa, PKey: 0xffff})
	}
	check := func(what string) {
		t.Helper()
		if n, err := a.Write(bufs, meta, 64); err != nil || n != len(bufs) {
			t.Fatalf("%s: Write n %d, err %v", what, n, err)
		}
		seen := make(map[byte]bool)
		for len(seen) < len(bufs) {
			r := expect(t, got, fmt.Sprintf("%s: packet %d of %d", what, len(seen)+1, len(bufs)))
			i := r.payload[4]
			wantQ, wantLen := qb, 1000
			if i >= 40 && i < 43 {
				wantQ, wantLen = qb2, 500
			}
			if seen[i] || len(r.payload) != wantLen || r.meta.DstQPN != wantQ || r.meta.Src != ipoib.MakeHwAddr(0, qa, a.LocalGID()) {
				t.Fatalf("%s: packet %d: %d bytes to %#x (seen %v)", what, i, len(r.payload), r.meta.DstQPN, seen[i])
			}
			seen[i] = true
		}
	}
	check("trains")
	if s := a.Counters().Stats; s["tx_trains"] != 2 || s["tx_train_packets"] != 43 || s["tx_gso_fallbacks"] != 0 {
		t.Fatalf("stats %v, want 2 trains (40 and 3 packets), no fallback", s)
	}
	// Over a veth the trains reach the receiving socket whole (UDP GRO).
	if s := b.Counters().Stats; s["rx_trains"] != 2 || s["rx_train_packets"] != 43 {
		t.Fatalf("receiver stats %v, want the 2 trains of 43 packets received whole", s)
	}
	// A socket that sends zero UDP checksums may not send GSO trains
	// (udp_send_skb: EINVAL with sk_no_check_tx), so the kernel refuses.
	rc, err := a.conns[0].SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1) })
	if err != nil {
		t.Fatal(err)
	}
	check("fallback")
	if s := a.Counters().Stats; s["tx_trains"] != 2 || s["tx_gso_fallbacks"] != 1 || len(a.Counters().Drops) != 0 {
		t.Fatalf("stats %v drops %v, want one fallback, no more trains, no drops", s, a.Counters().Drops)
	}
}

// TestSocketPathAllocs: once warm, sending a batch of 16 packets (a UDP
// GSO train) and receiving them allocates nothing, socket calls included,
// with the receiver waiting at once and busy-polling first.
func TestSocketPathAllocs(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	bufs, meta := batchOf(16, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	rbufs := make([][]byte, 16)
	for i := range rbufs {
		rbufs[i] = make([]byte, 4200)
	}
	sizes, rm := make([]int, 16), make([]ipoib.RxMeta, 16)
	round := func() {
		if n, err := a.Write(bufs, meta, 64); err != nil || n != 16 {
			t.Fatalf("Write: %d, %v", n, err)
		}
		for got := 0; got < 16; {
			n, err := b.Read(rbufs, sizes, rm, 64)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	round() // warm: caches and pools fill
	for _, busy := range []time.Duration{0, 50 * time.Microsecond} {
		b.rx[0].rcv.io.SetBusyPoll(busy)
		if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
			t.Fatalf("busy poll %v: %.1f allocations per batch sent and received, want 0", busy, allocs)
		}
	}
}

// TestSuperPackets: a TCP super-packet is cut by the port into segments
// that fit the IB MTU and sent as one UDP GSO train. The segments arrive
// carrying the super-packet's payload with valid checksums. Write counts
// it as one packet; the port's counters count the segments. One that
// does not parse is refused and counted as bad_gso.
func TestSuperPackets(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	got := reader(b)
	payload := gsotest.Pattern(30000)
	for _, v6 := range []bool{false, true} {
		ipoibHdr := []byte{0x08, 0x00, 0, 0}
		if v6 {
			ipoibHdr[0], ipoibHdr[1] = 0x86, 0xdd
		}
		pkt, l4 := gsotest.Super(t, ipoibHdr, v6, payload)
		m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff,
			GSO: ipoib.GSO{Type: ipoib.GSOTCPv4, L4: uint16(l4), Size: 1000}}
		if v6 {
			m.GSO.Type = ipoib.GSOTCPv6
		}
		before, trains := a.Counters().TxPackets, a.Counters().Stats["tx_trains"]
		buf := append(make([]byte, 64, 64+len(pkt)+TailRoom), pkt...)
		if n, err := a.Write([][]byte{buf}, []ipoib.TxMeta{m}, 64); n != 1 || err != nil {
			t.Fatalf("v6 %v: Write %d, %v; want 1 accepted", v6, n, err)
		}
		var segs [][]byte
		for len(segs) < 30 {
			r := expect(t, got, fmt.Sprintf("v6 %v: segment %d of 30", v6, len(segs)+1))
			if r.meta.DstQPN != qb || r.meta.Src != ipoib.MakeHwAddr(0, qa, a.LocalGID()) {
				t.Fatalf("v6 %v: segment to %#x from %v", v6, r.meta.DstQPN, r.meta.Src)
			}
			segs = append(segs, r.payload)
		}
		none(t, got, "after the 30 segments")
		if back := gsotest.Reassemble(t, segs, ipoib.HeaderLen, v6, 2044); !bytes.Equal(back, payload) {
			t.Fatalf("v6 %v: the segments carry %d bytes that differ from the %d sent", v6, len(back), len(payload))
		}
		if c := a.Counters(); c.TxPackets-before != 30 || c.Stats["tx_trains"]-trains != 1 {
			t.Fatalf("v6 %v: %d packets in %d trains sent, want 30 in 1", v6, c.TxPackets-before, c.Stats["tx_trains"]-trains)
		}
	}
	pkt, l4 := gsotest.Super(t, []byte{0x08, 0x00, 0, 0}, false, payload)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff,
		GSO: ipoib.GSO{Type: ipoib.GSOTCPv6, L4: uint16(l4), Size: 1000}} // IPv4 described as IPv6
	buf := append(make([]byte, 64, 64+len(pkt)+TailRoom), pkt...)
	if n, err := a.Write([][]byte{buf}, []ipoib.TxMeta{m}, 64); n != 0 || err != nil {
		t.Fatalf("bad super-packet: Write %d, %v; want 0 accepted", n, err)
	}
	waitDrop(t, a, "bad_gso", 1)
	none(t, got, "a refused super-packet")
}

// BenchmarkSocketPath is the socket layer per packet: a batch of 16
// packets of 2,000 bytes (one UDP GSO train) sent by one port and
// received by another over a veth, system calls included.
func BenchmarkSocketPath(b *testing.B) {
	a, p, _, _ := pair(b, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := p.AllocQP(0xffff, 0)
	bufs, meta := batchOf(16, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, p.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	for i := range bufs {
		bufs[i] = append(bufs[i][:64], make([]byte, 2000)...)
	}
	benchRoundTrip(b, a, p, bufs, meta, 16, 16*2000)
}

// BenchmarkSocketSuper64K is the socket layer per 64 KB TCP super-packet:
// cut by the port into 2,000-byte segments (33 of them), sent as UDP GSO
// trains, received and handed out one packet each.
func BenchmarkSocketSuper64K(b *testing.B) {
	a, p, _, _ := pair(b, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := p.AllocQP(0xffff, 0)
	payload := gsotest.Pattern(65535 - 20 - 32)
	pkt, l4 := gsotest.Super(b, []byte{0x08, 0x00, 0, 0}, false, payload)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, p.LocalGID()), SrcQPN: qa, PKey: 0xffff,
		GSO: ipoib.GSO{Type: ipoib.GSOTCPv4, L4: uint16(l4), Size: 2044 - 20 - 32}}
	buf := append(make([]byte, 64, 64+len(pkt)+TailRoom), pkt...)
	segs := (len(payload) + int(m.GSO.Size) - 1) / int(m.GSO.Size)
	benchRoundTrip(b, a, p, [][]byte{buf}, []ipoib.TxMeta{m}, segs, len(payload))
}

// benchRoundTrip writes bufs on a and reads the want packets they become
// on p, per op, reporting allocations and bytes per op.
func benchRoundTrip(b *testing.B, a, p *Port, bufs [][]byte, meta []ipoib.TxMeta, want, bytes int) {
	rbufs := make([][]byte, 16)
	for i := range rbufs {
		rbufs[i] = make([]byte, 4200)
	}
	sizes, rm := make([]int, 16), make([]ipoib.RxMeta, 16)
	round := func() {
		if n, err := a.Write(bufs, meta, 64); err != nil || n != len(bufs) {
			b.Fatalf("Write: %d of %d, %v (drops %v)", n, len(bufs), err, a.Counters().Drops)
		}
		for got := 0; got < want; {
			n, err := p.Read(rbufs, sizes, rm, 64)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
	round() // warm: caches and pools fill
	b.ReportAllocs()
	b.SetBytes(int64(bytes))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		round()
	}
}

// readInto reads one packet into a buffer of size bytes at offset,
// failing after a while.
func readInto(t *testing.T, p *Port, size, offset int) (payload []byte, meta ipoib.RxMeta) {
	t.Helper()
	type result struct {
		n, size int
		err     error
		meta    ipoib.RxMeta
	}
	buf := make([]byte, size)
	got := make(chan result, 1)
	go func() {
		sizes, rm := []int{0}, []ipoib.RxMeta{{}}
		n, err := p.Read([][]byte{buf}, sizes, rm, offset)
		got <- result{n, sizes[0], err, rm[0]}
	}()
	select {
	case r := <-got:
		if r.n != 1 || r.err != nil {
			t.Fatalf("Read: %d, %v", r.n, r.err)
		}
		return buf[offset : offset+r.size], r.meta
	case <-time.After(testutil.Settle):
		t.Fatalf("nothing received; drops %v", p.Counters().Drops)
	}
	return nil, ipoib.RxMeta{}
}

// TestAnyBuffers: the port takes the buffers ipoib.Port allows, not only
// the ones it would like. A packet written with no capacity after it (no
// room for pad and ICRC) leaves from the port's own copy, intact and
// counted as sent. Read fills a buffer at any offset, 0 included. A
// packet larger than the buffer is dropped as oversize, while the next
// one, which fits, is read.
func TestAnyBuffers(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff}
	var bufs [][]byte
	var meta []ipoib.TxMeta
	for _, n := range []int{5, 6, 7, 8, 1001} {
		p := make([]byte, n)
		p[0], p[4] = 8, byte(n)
		bufs, meta = append(bufs, append(make([]byte, 64), p...)), append(meta, m) // cap == len
	}
	if n, err := a.Write(bufs, meta, 64); err != nil || n != len(bufs) {
		t.Fatalf("Write without tail room: %d of %d, %v (drops %v)", n, len(bufs), err, a.Counters().Drops)
	}
	for i, want := range bufs {
		got, rm := readInto(t, b, 4096, i) // offsets 0 to 4
		if !bytes.Equal(got, want[64:]) || rm.DstQPN != qb || rm.Src != ipoib.MakeHwAddr(0, qa, a.LocalGID()) {
			t.Fatalf("packet %d read at offset %d as %x %+v, want %x", i, i, got, rm, want[64:])
		}
	}
	if c := a.Counters(); c.TxPackets != uint64(len(bufs)) || len(c.Drops) != 0 {
		t.Fatalf("sender counters %+v", c)
	}
	send(t, a, append([]byte{8, 0, 0, 0}, make([]byte, 96)...), m)
	send(t, a, []byte{8, 0, 0, 0, 0xab}, m)
	if got, _ := readInto(t, b, 60, 10); !bytes.Equal(got, []byte{8, 0, 0, 0, 0xab}) {
		t.Fatalf("read %x, want the packet that fits", got)
	}
	if c := b.Counters(); c.Drops["oversize"] != 1 || c.RxPackets != uint64(len(bufs))+1 {
		t.Fatalf("receiver counters %+v, want one oversize and the packets that fit", c)
	}
}
