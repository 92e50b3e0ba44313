package kernelfabric_test

import (
	"bytes"
	"sync"
	"testing"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestConformanceReceiveQueueDrops: the datagrams that find a socket's
// receive queue full are dropped and counted by Drops, which its read
// resets (packet_rcv's drop_n_acct, packet_getsockopt's
// PACKET_STATISTICS); every datagram sent is read or counted, once.
func TestConformanceReceiveQueueDrops(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		rx := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		// More than either queue holds: the fake's 4096 datagrams, the
		// kernel's sk_rcvbuf.
		const sent = 20000
		name := sll(w.a, 0x0800, w.alen, w.bAddr)
		msgs := make([]kf.Msg, 64)
		for i := range msgs {
			msgs[i] = kf.Msg{Name: name, NameLen: len(name), Buf: payload(1, 1000)}
		}
		for n := 0; n < sent; {
			k, err := tx.Send(msgs[:min(len(msgs), sent-n)])
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
		drops, err := rx.Drops()
		if err != nil {
			t.Fatal(err)
		}
		if drops == 0 || drops >= sent {
			t.Fatalf("%d of %d datagrams counted dropped, want some, not all", drops, sent)
		}
		// What was not dropped is queued: read it, then a marker must
		// come next (nothing more was queued, nothing counted twice).
		for i := range sent - int(drops) {
			if r := recvOne(t, rx, 2048); !bytes.Equal(r.Buf[:r.N], msgs[0].Buf) {
				t.Fatalf("datagram %d: %x", i, r.Buf[:r.N])
			}
		}
		marker := payload(2, 100)
		mustSend(t, tx, w.a, 0x0800, w.bAddr, marker)
		if r := recvOne(t, rx, 2048); !bytes.Equal(r.Buf[:r.N], marker) {
			t.Fatalf("after the %d queued datagrams, %x came, not the marker", sent-int(drops), r.Buf[:r.N])
		}
		if again, err := rx.Drops(); again != 0 || err != nil {
			t.Fatalf("Drops again: %d, %v; want 0: the read resets it", again, err)
		}
	})
}

// dropKernel is a fake kernel whose sockets report the drops the test
// sets.
type dropKernel struct {
	*fakekernel.Kernel
	mu    sync.Mutex
	socks []*dropSocket
}

type dropSocket struct {
	kf.Socket
	mu sync.Mutex
	n  uint64
}

func (k *dropKernel) OpenPacketWith(ifindex int, o kf.PacketOptions) (kf.Socket, error) {
	s, err := k.Kernel.OpenPacketWith(ifindex, o)
	if err != nil {
		return nil, err
	}
	ds := &dropSocket{Socket: s}
	k.mu.Lock()
	k.socks = append(k.socks, ds)
	k.mu.Unlock()
	return ds, nil
}

func (s *dropSocket) Drops() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n
	s.n = 0
	return n, nil
}

// setDrops makes each socket opened so far report n drops.
func (k *dropKernel) setDrops(n uint64) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range k.socks {
		s.mu.Lock()
		s.n = n
		s.mu.Unlock()
	}
	return len(k.socks)
}

// TestReceiveQueueDropsCounted: the port counts its children's
// sockets' receive-queue drops as rx_queue_overflow, each once: read
// for Counters, and for a child's last ones as it is freed.
func TestReceiveQueueDropsCounted(t *testing.T) {
	k := &dropKernel{Kernel: fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)}
	p := openCfg(t, k, kf.Config{})
	qpn, err := p.AllocQP(ipoib.DefaultPKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	socks := k.setDrops(3) // the group child's and the VIF child's
	overflow := func() uint64 { return p.Counters().Drops[ipoib.DropRxOverflow.String()] }
	if got := overflow(); got != 3*uint64(socks) || socks != 2 {
		t.Fatalf("rx_queue_overflow %d with %d sockets dropping 3 each, want %d of 2", got, socks, 3*socks)
	}
	if got := overflow(); got != 6 {
		t.Fatalf("rx_queue_overflow %d read again, want still 6", got)
	}
	k.setDrops(5)
	if err := p.FreeQP(qpn); err != nil {
		t.Fatal(err)
	}
	// The VIF child's 5 were read as it went; the group child's 5 now.
	if got := overflow(); got != 16 {
		t.Fatalf("rx_queue_overflow %d after the child went, want 16", got)
	}
}
