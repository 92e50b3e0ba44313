package memfabric

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

func twoPorts(t testing.TB) (*Port, *Port) {
	t.Helper()
	f, err := New(2048)
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.NewPort(testutil.GID("fe80::a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.NewPort(testutil.GID("fe80::b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func send(t *testing.T, p *Port, payload []byte, m ipoib.TxMeta) {
	t.Helper()
	buf := append(make([]byte, ipoib.Headroom), payload...)
	if _, err := p.Write([][]byte{buf}, []ipoib.TxMeta{m}, ipoib.Headroom); err != nil {
		t.Fatal(err)
	}
}

// recv reads one packet or fails after a second.
func recv(t *testing.T, p *Port) ([]byte, ipoib.RxMeta) {
	t.Helper()
	type res struct {
		b []byte
		m ipoib.RxMeta
	}
	ch := make(chan res, 1)
	go func() {
		bufs := [][]byte{make([]byte, 4200)}
		sizes := []int{0}
		meta := []ipoib.RxMeta{{}}
		n, err := p.Read(bufs, sizes, meta, 64)
		if err != nil || n != 1 {
			ch <- res{}
			return
		}
		ch <- res{bufs[0][64 : 64+sizes[0]], meta[0]}
	}()
	select {
	case r := <-ch:
		return r.b, r.m
	case <-time.After(testutil.Settle):
		t.Fatal("no packet")
	}
	return nil, ipoib.RxMeta{}
}

func TestUnicastAndChecks(t *testing.T) {
	a, b := twoPorts(t)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	qb2, _ := b.AllocQP(0x8001, 0)
	send(t, a, []byte{8, 0, 0, 0, 1, 2, 3, 4}, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	got, m := recv(t, b)
	if string(got) != "\x08\x00\x00\x00\x01\x02\x03\x04" || m.Src != ipoib.MakeHwAddr(0, qa, a.LocalGID()) || m.DstQPN != qb {
		t.Fatalf("got %x %+v", got, m)
	}
	// P_Key mismatch, unknown QPN, oversize: all dropped and counted.
	send(t, a, []byte{8, 0, 0, 0}, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb2, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	send(t, a, []byte{8, 0, 0, 0}, ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, 0x999, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	send(t, a, make([]byte, 2049), ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff})
	if d := b.Counters().Drops; d[ipoib.DropPKey.String()] != 1 || d[ipoib.DropUnknownQPN.String()] != 1 {
		t.Fatalf("receiver drops %v", d)
	}
	if d := a.Counters().Drops; d[ipoib.DropOversize.String()] != 1 {
		t.Fatalf("sender drops %v", d)
	}
	if c := b.Counters(); c.RxPackets != 1 || c.RxBytes != 8 {
		t.Fatalf("rx counters %+v", c)
	}
}

func TestMulticast(t *testing.T) {
	a, b := twoPorts(t)
	qa, _ := a.AllocQP(0xffff, 0)
	bc := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, bc), SrcQPN: qa, PKey: 0xffff}
	send(t, a, []byte{8, 0, 0, 0, 9}, m) // b not joined: not delivered
	if err := b.Join(bc); err != nil {
		t.Fatal(err)
	}
	if !b.Joined(bc) {
		t.Fatal("Joined = false after Join")
	}
	send(t, a, []byte{8, 0, 0, 0, 7}, m)
	got, rm := recv(t, b)
	if got[4] != 7 || rm.DstQPN != ipoib.MulticastQPN || rm.MGID != bc {
		t.Fatalf("got %x %+v", got, rm)
	}
	if b.Counters().RxPackets != 1 {
		t.Fatalf("non-member received: %+v", b.Counters())
	}
	// Wrong partition on the group's P_Key is a P_Key drop.
	qa2, _ := a.AllocQP(0x8001, 0)
	send(t, a, []byte{8, 0, 0, 0}, ipoib.TxMeta{Dst: m.Dst, SrcQPN: qa2, PKey: 0x8001})
	if b.Counters().Drops[ipoib.DropPKey.String()] != 1 {
		t.Fatalf("drops %v", b.Counters().Drops)
	}
}

func TestCloseAndQPs(t *testing.T) {
	a, b := twoPorts(t)
	q, err := a.AllocQP(0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocQP(0x8000, 0); err == nil {
		t.Fatal("invalid P_Key accepted")
	}
	if h, err := a.AllocQP(0xffff, 0x1234); err != nil || h != 0x1234 {
		t.Fatalf("hinted QP %#x, %v", h, err)
	}
	if h, _ := a.AllocQP(0xffff, 0x1234); h == 0x1234 {
		t.Fatal("hint reused a QPN in use")
	}
	if err := a.FreeQP(q); err != nil {
		t.Fatal(err)
	}
	if err := a.FreeQP(q); err == nil {
		t.Fatal("double free accepted")
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Read([][]byte{make([]byte, 100)}, []int{0}, []ipoib.RxMeta{{}}, 0)
		done <- err
	}()
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close: %v", err)
		}
	case <-time.After(testutil.Settle):
		t.Fatal("Read did not return after Close")
	}
	if _, err := b.Write(nil, nil, 0); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
}

// TestWriteAnyBatchLength: one Write of 1,000 packets is delivered
// whole, each packet once, and n and the counters say so. A packet from
// a freed QP, from a QP of another partition or with QPN 0xFFFFFF to a
// unicast GID is refused (bad_meta), as on the simulated fabric.
func TestWriteAnyBatchLength(t *testing.T) {
	a, b := twoPorts(t)
	qa, _ := a.AllocQP(0xffff, 0)
	freed, _ := a.AllocQP(0xffff, 0)
	if err := a.FreeQP(freed); err != nil {
		t.Fatal(err)
	}
	qb, _ := b.AllocQP(0xffff, 0)
	const total = 1000
	bufs := make([][]byte, total+3)
	meta := make([]ipoib.TxMeta, total+3)
	for i := range bufs {
		bufs[i] = append(make([]byte, ipoib.Headroom), 8, 0, 0, 0, byte(i>>8), byte(i))
		meta[i] = ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, qb, b.LocalGID()), SrcQPN: qa, PKey: 0xffff}
	}
	meta[total].SrcQPN = freed
	meta[total+1].PKey = 0x8001
	meta[total+2].Dst = ipoib.MakeHwAddr(0, ipoib.MulticastQPN, b.LocalGID()) // 0xFFFFFF to a unicast GID
	if n, err := a.Write(bufs, meta, ipoib.Headroom); err != nil || n != total {
		t.Fatalf("Write of %d: n %d, err %v; want %d", total+3, n, err, total)
	}
	seen := make(map[int]bool)
	rb := make([][]byte, 64)
	for i := range rb {
		rb[i] = make([]byte, 128)
	}
	sizes, rm := make([]int, 64), make([]ipoib.RxMeta, 64)
	for len(seen) < total {
		n, err := b.Read(rb, sizes, rm, 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, buf := range rb[:n] {
			i := int(buf[68])<<8 | int(buf[69])
			if seen[i] || i >= total {
				t.Fatalf("packet %d received twice or refused one delivered", i)
			}
			seen[i] = true
		}
	}
	if c := a.Counters(); c.TxPackets != total || c.Drops[ipoib.DropBadMeta.String()] != 3 {
		t.Fatalf("sender counters %+v, want %d packets and 3 bad_meta", c, total)
	}
	if c := b.Counters(); c.RxPackets != total || len(c.Drops) != 0 {
		t.Fatalf("receiver counters %+v, want %d packets, no drops", c, total)
	}
}
