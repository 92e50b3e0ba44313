package kernelfabric_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// sendOne sends one 100-byte IPv4 datagram on s through ifindex and
// returns what Send said.
func sendOne(s kf.Socket, ifindex int) (int, error) {
	var name [kf.SockaddrLLIPoIBLen]byte
	kf.PutSockaddrLL(&name, ifindex, 0x0800, ipoib.MakeHwAddr(0, 0x100, testutil.GID("fe80::b")))
	return s.Send([]kf.Msg{{Name: name[:], NameLen: kf.SockaddrLLIPoIBLen, Buf: append([]byte{0x45}, make([]byte, 99)...)}})
}

// TestNoCarrierSendAgrees: a packet socket's send on an interface that
// is up without carrier is reported as sent and goes nowhere (the noop
// qdisc's NET_XMIT_CN, which packet_snd turns into success). The real
// kernel on a veth whose peer is down and the fake on a child whose port
// is down (ib.go's dropNoCarrier) agree. With carrier, the same send
// leaves (tx_packets), so the check can tell.
//
// The veths have no IPv6. With it, the kernel sends packets of its own
// on nc0 as carrier comes, and a loaded machine may schedule them before
// the send; tx_packets would count them. (The link becomes ready:
// addrconf_notify's NETDEV_CHANGE makes the link-local address and runs
// its DAD, net/ipv6/addrconf.c, with MLD reports and router
// solicitations after.)
func TestNoCarrierSendAgrees(t *testing.T) {
	t.Run("kernel", func(t *testing.T) {
		nstest.Require(t, "sysctl")
		const ns = "kf-nocarrier"
		nstest.Add(t, ns)
		nstest.Must(t, nstest.In(ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")...)
		nstest.Must(t, nstest.In(ns, "ip", "link", "add", "nc0", "type", "veth", "peer", "name", "nc1")...)
		nstest.Must(t, nstest.In(ns, "ip", "link", "set", "nc0", "up")...)
		nstest.Do(t, ns, func() {
			l, err := kf.System{}.LinkByName("nc0")
			if err != nil || l.Carrier {
				t.Fatalf("nc0 %+v %v: want up without carrier", l, err)
			}
			s, err := kf.System{}.OpenPacketWith(l.Index, kf.PacketOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			txPackets := func() uint64 {
				nl, err := netlink.LinkByName("nc0")
				if err != nil {
					t.Fatal(err)
				}
				return nl.Attrs().Statistics.TxPackets
			}
			before := txPackets()
			if n, err := sendOne(s, l.Index); n != 1 || err != nil {
				t.Fatalf("without carrier: Send %d %v, want 1 <nil>", n, err)
			}
			if got := txPackets(); got != before {
				t.Fatalf("without carrier: tx_packets %d → %d", before, got)
			}
			nstest.Must(t, nstest.In(ns, "ip", "link", "set", "nc1", "up")...)
			testutil.WaitFor(t, "carrier on nc0", func() bool { l, _ = (kf.System{}).LinkByName("nc0"); return l.Carrier })
			if n, err := sendOne(s, l.Index); n != 1 || err != nil || txPackets() != before+1 {
				t.Fatalf("with carrier: Send %d %v, tx_packets %d → %d", n, err, before, txPackets())
			}
		})
	})
	t.Run("fake", func(t *testing.T) {
		k := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
		p := open(t, k)
		if _, err := p.AllocQP(0xffff, 0); err != nil {
			t.Fatal(err)
		}
		k.SetCarrier(false)
		l, _ := k.LinkByName("ib0.e1")
		if !l.Up || l.Carrier {
			t.Fatalf("ib0.e1 %+v: want up without carrier", l)
		}
		s, err := k.OpenPacketWith(l.Index, kf.PacketOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if n, err := sendOne(s, l.Index); n != 1 || err != nil || k.TxNoCarrier() != 1 {
			t.Fatalf("without carrier: Send %d %v, dropped %d", n, err, k.TxNoCarrier())
		}
	})
}

// staleKernel is a fake that makes the carrier poll read a stale link
// state. The first time LinkByName reads child gate after it was set up,
// it reads the link (no carrier: its P_Key is not in the port's table).
// It then puts the P_Key in the table (the child joins: carrier on) and
// waits until the backend has applied that notification. Only then does
// it return what it read. Its P_Key table cannot be read, so the backend
// makes the child without checking it.
type staleKernel struct {
	*fakekernel.Kernel
	gate    string
	pkeys   []ipoib.PKey // the table once the gate opens
	armed   atomic.Bool
	polled  sync.Once
	applied chan struct{} // closed once the backend applied gate's carrier on
	notify  sync.Once
}

func (k *staleKernel) PKeys(string) (kf.PKeyTable, error) { return kf.PKeyTable{}, unix.ENOENT }

func (k *staleKernel) SetUp(index int) error {
	if l, err := k.Kernel.LinkByName(k.gate); err == nil && l.Index == index {
		k.armed.Store(true)
	}
	return k.Kernel.SetUp(index)
}

func (k *staleKernel) LinkByName(name string) (kf.Link, error) {
	l, err := k.Kernel.LinkByName(name)
	if name == k.gate && k.armed.Load() {
		k.polled.Do(func() {
			k.Kernel.SetPKeys(k.pkeys...)
			<-k.applied
		})
	}
	return l, err
}

// SubscribeLinks passes the fake's notifications on and, after gate's
// carrier on, one for an index no child has: once the backend takes
// that, it has applied the one before.
func (k *staleKernel) SubscribeLinks(done <-chan struct{}, onErr func(error)) (<-chan kf.Link, error) {
	in, err := k.Kernel.SubscribeLinks(done, onErr)
	if err != nil {
		return nil, err
	}
	out := make(chan kf.Link)
	go func() {
		defer close(out)
		for l := range in {
			ls := []kf.Link{l}
			if l.Name == k.gate && l.Carrier {
				ls = append(ls, kf.Link{Index: -1})
			}
			for _, x := range ls {
				select {
				case out <- x:
				case <-done:
					return
				}
			}
			if len(ls) == 2 {
				k.notify.Do(func() { close(k.applied) })
			}
		}
	}()
	return out, nil
}

// TestStaleCarrierPollIgnored: the carrier poll of a waiting child reads
// "no carrier", the child's "carrier on" notification is applied, and
// then the poll's reading arrives. It must not turn the ready child's
// carrier off. That would count a false child_carrier_lost and drop the
// VIF's packets as child_no_carrier for good, with no notification to
// come. Here the child is partition 0x8001's group child, which sends
// the VIF's broadcast.
func TestStaleCarrierPollIgnored(t *testing.T) {
	inner := fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044)
	inner.SetPKeys(0xffff)
	k := &staleKernel{Kernel: inner, gate: "ib0.m8001", pkeys: []ipoib.PKey{0xffff, 0x8001}, applied: make(chan struct{})}
	a := openCfg(t, k, kf.Config{})
	qa, err := a.AllocQP(0x8001, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.applied:
	default:
		t.Fatal("the poll never read the child: the case did not happen")
	}
	bc := kf.McastHwAddr(ipoib.BroadcastMGID(0x8001, ipoib.ScopeLinkLocal))
	if n := unicast(a, qa, 0x8001, bc, 100); n != 1 {
		t.Fatalf("broadcast not sent: drops %v", a.Counters().Drops)
	}
	if c := a.Counters(); c.Stats[kf.StatCarrierLost] != 0 || c.Drops[ipoib.DropNoCarrier.String()] != 0 {
		t.Fatalf("stats %v, drops %v", c.Stats, c.Drops)
	}
}

// TestCarrierFollowedAfterOverrun: the link subscription ends as an
// overrun ends it (ENOBUFS), losing the notifications of a P_Key leaving
// the port's table. The backend subscribes again (counted). It reads
// every link's state: its two children of the partition have lost
// carrier, counted once each. It follows the carrier changes after that:
// with the P_Key back, the VIF's packets flow again. This holds also
// when its first attempts to subscribe again are refused.
func TestCarrierFollowedAfterOverrun(t *testing.T) {
	t.Run("resubscribed at once", func(t *testing.T) { overrun(t, 0) })
	t.Run("resubscription refused twice", func(t *testing.T) { overrun(t, 2) })
}

// overrun is TestCarrierFollowedAfterOverrun with the backend's first
// refused attempts to subscribe again refused: it retries, and counts
// one resubscription (made only once the refusals are used up).
func overrun(t *testing.T, refused int) {
	ka, a, b, qa, dst := partitionPair(t)
	ka.OverrunLinks(func() {
		ka.SetPKeys(0xffff)
		ka.RefuseSubscriptions(refused)
	})
	testutil.WaitFor(t, "2 carrier losses", func() bool { return a.Counters().Stats[kf.StatCarrierLost] == 2 })
	if n := unicast(a, qa, 0x8001, dst, 100); n != 0 || ka.TxNoCarrier() != 0 {
		t.Fatalf("sent %d, handed to the kernel without carrier %d", n, ka.TxNoCarrier())
	}
	pkeyBack(t, ka, a, b, qa, dst)
	if n := a.Counters().Stats[kf.StatResubscribed]; n != 1 {
		t.Fatalf("%d resubscriptions, want 1", n)
	}
}
