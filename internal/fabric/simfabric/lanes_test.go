package simfabric

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// queued is a packet received on socket q of a port.
type queued struct {
	rx
	q int
}

// queueReader collects what each of a port's sockets receives, tagged
// with the socket; it stops at the port's Close, at the test's end.
func queueReader(t *testing.T, p *Port) <-chan queued {
	ch := make(chan queued, 1024)
	done := make(chan struct{})
	readQueues(p, 8, func(r rx, q int) { ch <- queued{r, q} }, func() { close(done) })
	t.Cleanup(func() { p.Close(); <-done })
	return ch
}

// udpPacket is an IPoIB packet carrying an IPv4 UDP datagram of flow
// (its source port 10000+flow) with seq in its payload, with headroom and
// tail room for Write.
func udpPacket(flow, seq int) []byte {
	b := make([]byte, 64, 64+4+20+8+8+TailRoom)
	b = append(b, 8, 0, 0, 0) // IPoIB header: IPv4
	ip := []byte{0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2}
	b = append(b, ip...)
	b = binary.BigEndian.AppendUint16(b, uint16(10000+flow))
	b = binary.BigEndian.AppendUint16(b, 5201)
	b = append(b, 0, 16, 0, 0) // UDP length, checksum
	b = binary.BigEndian.AppendUint32(b, uint32(flow))
	return binary.BigEndian.AppendUint32(b, uint32(seq))
}

// TestSocketsSpreadFlows: between two ports of four sockets each, 16 UDP
// flows of 8 packets are sent interleaved. Each packet arrives once.
// Each flow's packets all arrive on one socket, in the order sent: the
// sender gives a flow one source port, and the receiver's SO_REUSEPORT
// hash gives it one socket. The flows arrive over more than one socket.
// (The 16 flows use most of the sender's 8 lanes, each landing on one of
// the receiver's 4 sockets at random: all on one socket has a chance of
// the order of 4^-6.) The port's counters, per socket and summed, count
// exactly what each socket delivered.
func TestSocketsSpreadFlows(t *testing.T) {
	const flows, per = 16, 8
	a, b, _, _ := pairN(t, 9000, 4, 4)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	got := queueReader(t, b)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff}
	var bufs [][]byte
	var meta []ipoib.TxMeta
	for seq := range per {
		for f := range flows {
			bufs, meta = append(bufs, udpPacket(f, seq)), append(meta, m)
		}
	}
	if n, err := a.Write(bufs, meta, 64); err != nil || n != len(bufs) {
		t.Fatalf("Write: %d of %d, %v", n, len(bufs), err)
	}
	queueOf := make(map[int]int)  // flow → socket
	next := make(map[int]int)     // flow → next seq
	perQueue := make(map[int]int) // socket → packets
	for i := range flows * per {
		var r queued
		select {
		case r = <-got:
		case <-time.After(testutil.Settle):
			t.Fatalf("received %d of %d packets (by socket %v)", i, flows*per, perQueue)
		}
		p := r.payload[4+28:]
		f, seq := int(binary.BigEndian.Uint32(p)), int(binary.BigEndian.Uint32(p[4:]))
		if q, ok := queueOf[f]; ok && q != r.q {
			t.Fatalf("flow %d on sockets %d and %d", f, q, r.q)
		}
		queueOf[f] = r.q
		if seq != next[f] {
			t.Fatalf("flow %d: packet %d arrived when %d was next", f, seq, next[f])
		}
		next[f]++
		perQueue[r.q]++
	}
	select {
	case r := <-got:
		t.Fatalf("a packet more than sent arrived on socket %d: %x", r.q, r.payload)
	case <-time.After(200 * time.Millisecond):
	}
	if len(perQueue) < 2 {
		t.Fatalf("all %d flows arrived on one socket: %v", flows, perQueue)
	}
	c := b.Counters()
	if c.RxPackets != flows*per || len(c.Drops) != 0 {
		t.Fatalf("receiver counters %+v, want %d packets and no drops", c, flows*per)
	}
	for q := range 4 {
		if got := c.Stats[fmt.Sprintf("rx_socket_%d_packets", q)]; got != uint64(perQueue[q]) {
			t.Fatalf("rx_socket_%d_packets %d, socket delivered %d (%v)", q, got, perQueue[q], c.Stats)
		}
	}
	t.Logf("packets by socket: %v", perQueue)
}

// TestSocketsMulticastOnce: a port of four sockets that joined a group
// hands each packet sent to the group up once, on its first socket (the
// member), not once per socket: the others have IPV6_MULTICAST_ALL off.
func TestSocketsMulticastOnce(t *testing.T) {
	const sent = 20
	a, b, _, _ := pairN(t, 9000, 4, 4)
	qa, _ := a.AllocQP(0xffff, 0)
	mgid := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	if err := b.Join(mgid); err != nil {
		t.Fatal(err)
	}
	got := queueReader(t, b)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, mgid), SrcQPN: qa, PKey: 0xffff}
	for i := range sent {
		send(t, a, []byte{8, 6, 0, 0, byte(i)}, m)
	}
	seen := make(map[byte]bool)
	for len(seen) < sent {
		select {
		case r := <-got:
			if r.q != 0 || seen[r.payload[4]] {
				t.Fatalf("packet %d on socket %d, seen before: %v", r.payload[4], r.q, seen[r.payload[4]])
			}
			seen[r.payload[4]] = true
		case <-time.After(testutil.Settle):
			t.Fatalf("received %d of %d group packets", len(seen), sent)
		}
	}
	select {
	case r := <-got:
		t.Fatalf("a copy more: packet %d on socket %d", r.payload[4], r.q)
	case <-time.After(200 * time.Millisecond):
	}
	if c := b.Counters(); c.RxPackets != sent {
		t.Fatalf("receiver counted %d packets, want %d", c.RxPackets, sent)
	}
}

// BenchmarkSocketLanes is BenchmarkSocketPath's batch of 16 packets as
// 16 UDP flows, from a port of four sockets (each flow sent from its
// lane's socket: a sendmmsg per lane) to a port of one.
func BenchmarkSocketLanes(b *testing.B) {
	a, p, _, _ := pairN(b, 9000, 4, 1)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := p.AllocQP(0xffff, 0)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, p.LocalGID()), SrcQPN: qa, PKey: 0xffff}
	bufs, meta := make([][]byte, 16), make([]ipoib.TxMeta, 16)
	for f := range bufs {
		bufs[f], meta[f] = udpPacket(f, 0), m
	}
	benchRoundTrip(b, a, p, bufs, meta, 16, 16*len(bufs[0][64:]))
}

// TestSendOnlySockets: a port of two sockets has send-only sockets (the
// lanes' other than the first) with the deep send buffer but the
// smallest receive buffer. A datagram sent to one (from the port's first
// socket) is dropped, not queued. The receive sockets keep the deep
// receive buffer.
func TestSendOnlySockets(t *testing.T) {
	a, _, _, _ := pairN(t, 9000, 2, 1)
	if len(a.conns) <= len(a.rx) {
		t.Fatalf("%d sockets, %d receive sockets: no send-only socket", len(a.conns), len(a.rx))
	}
	opt := func(c *net.UDPConn, o int) int {
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var serr error
		if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, o) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return v
	}
	// The kernel reports twice what was set (sock_setsockopt doubles
	// it for its bookkeeping).
	if r := opt(a.conns[0], unix.SO_RCVBUF); r < socketBuffer {
		t.Fatalf("receive socket: SO_RCVBUF %d, want %d", r, socketBuffer)
	}
	for _, c := range a.conns[len(a.rx):] {
		if r, s := opt(c, unix.SO_RCVBUF), opt(c, unix.SO_SNDBUF); r > 8192 || s < socketBuffer {
			t.Fatalf("send-only socket %s: SO_RCVBUF %d, SO_SNDBUF %d; want the smallest and %d", c.LocalAddr(), r, s, socketBuffer)
		}
	}
	c := a.conns[len(a.rx)]
	to := &net.UDPAddr{IP: net.IP(a.gid[:]), Port: c.LocalAddr().(*net.UDPAddr).Port, Zone: a.ifi.Name}
	if _, err := a.conns[0].WriteToUDP([]byte("stray"), to); err != nil {
		t.Fatalf("send to the send-only socket %v: %v", to, err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, from, err := c.ReadFromUDP(make([]byte, 64)); err == nil {
		t.Fatalf("the send-only socket queued %d bytes from %v", n, from)
	}
}

// TestOverflowPerSocket: each receive socket reports the kernel's count
// of its own receive-queue drops (SO_RXQ_OVFL, a u32). The port's
// rx_queue_overflow rises by each socket's rise, kept apart per socket:
// a count one socket repeats adds nothing, and another socket's lower
// count is no step back. It also rises across the u32's wrap (0xfffffffe
// then 1 is 3).
func TestOverflowPerSocket(t *testing.T) {
	p := &Port{}
	lanes := []*rxLane{{p: p}, {p: p}}
	for _, c := range []struct {
		lane int
		ovfl uint32
		want uint64 // rx_queue_overflow after it
	}{
		{0, 5, 5},
		{1, 3, 8},
		{0, 5, 8},
		{1, 0xfffffffe, 0xfffffffe + 5},
		{1, 1, 0xfffffffe + 8},
		{0, 7, 0xfffffffe + 10},
	} {
		oob := cmsg(nil, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, binary.NativeEndian.AppendUint32(nil, c.ovfl))
		lanes[c.lane].inspect(make([]byte, 64), oob, 0, &unix.RawSockaddrInet6{})
		if got := p.drops.Snapshot()["rx_queue_overflow"]; got != c.want {
			t.Fatalf("socket %d reporting %#x: rx_queue_overflow %d, want %d", c.lane, c.ovfl, got, c.want)
		}
	}
}

// TestLaneOf: with eight lanes, a packet to a group takes lane 0
// whatever it carries. Each UDP flow's packets take one lane, and 16
// flows more than one. A packet that is not IP takes the lane of the QPs
// it goes between, the same for any payload, and 16 QP pairs take more
// than one.
func TestLaneOf(t *testing.T) {
	p := &Port{snds: make([]*sender, 8)}
	uni := func(src, dst uint32) *ipoib.TxMeta {
		return &ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, dst, ipoib.GID{0xfe, 0x80, 15: 2}), SrcQPN: src, PKey: 0xffff}
	}
	group := &ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)), SrcQPN: 0x100, PKey: 0xffff}
	flowLanes, qpLanes := make(map[int]bool), make(map[int]bool)
	for f := range 16 {
		if l := p.laneOf(udpPacket(f, 0)[64:], group); l != 0 {
			t.Fatalf("flow %d to a group: lane %d, want 0", f, l)
		}
		lane := p.laneOf(udpPacket(f, 0)[64:], uni(0x100, 0x200))
		for seq := 1; seq < 8; seq++ {
			if l := p.laneOf(udpPacket(f, seq)[64:], uni(0x100+uint32(seq), 0x200)); l != lane {
				t.Fatalf("flow %d: packet %d on lane %d, packet 0 on %d", f, seq, l, lane)
			}
		}
		flowLanes[lane] = true
		m := uni(0x100+uint32(f), 0x200)
		q := p.laneOf([]byte{8, 6, 0, 0, 1}, m)
		if l := p.laneOf([]byte{8, 6, 0, 0, 2, 3, 4}, m); l != q {
			t.Fatalf("QPs %#x→%#x: ARP packets on lanes %d and %d", m.SrcQPN, m.Dst.QPN(), q, l)
		}
		qpLanes[q] = true
	}
	if len(flowLanes) < 2 || len(qpLanes) < 2 {
		t.Fatalf("16 flows on lanes %v, 16 QP pairs on lanes %v: want more than one each", flowLanes, qpLanes)
	}
}
