package kernelfabric_test

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/ipoib"
	kf "github.com/eipoib/eipoibd/ipoib/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib/kernelfabric/fakekernel"
)

// sendOne sends one 100-byte IPv4 datagram on s through ifindex and
// returns what Send said.
func sendOne(s kf.Socket, ifindex int) (int, error) {
	var name [kf.SockaddrLLIPoIBLen]byte
	kf.PutSockaddrLL(&name, ifindex, 0x0800, ipoib.MakeHwAddr(0, 0x100, gid("fe80::b")))
	return s.Send([]kf.Msg{{Name: name[:], NameLen: kf.SockaddrLLIPoIBLen, Buf: append([]byte{0x45}, make([]byte, 99)...)}})
}

// TestNoCarrierSendAgrees: a packet socket's send on an interface that is
// up without carrier is reported as sent and goes nowhere (the noop
// qdisc's NET_XMIT_CN, which packet_snd turns into success): the real
// kernel on a veth whose peer is down, and the fake on a child whose port
// is down (ib.go's dropNoCarrier) agree. With carrier, the same send
// leaves (tx_packets), so the check can tell.
func TestNoCarrierSendAgrees(t *testing.T) {
	t.Run("kernel", func(t *testing.T) {
		nstest.Require(t)
		const ns = "kf-nocarrier"
		nstest.Add(t, ns)
		nstest.Must(t, nstest.In(ns, "ip", "link", "add", "nc0", "type", "veth", "peer", "name", "nc1")...)
		nstest.Must(t, nstest.In(ns, "ip", "link", "set", "nc0", "up")...)
		nstest.Do(t, ns, func() {
			l, err := kf.System{}.LinkByName("nc0")
			if err != nil || l.Carrier {
				t.Fatalf("nc0 %+v %v: want up without carrier", l, err)
			}
			s, err := kf.System{}.OpenPacket(l.Index, false)
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
			waitFor(t, func() bool { l, _ = (kf.System{}).LinkByName("nc0"); return l.Carrier })
			if n, err := sendOne(s, l.Index); n != 1 || err != nil || txPackets() != before+1 {
				t.Fatalf("with carrier: Send %d %v, tx_packets %d → %d", n, err, before, txPackets())
			}
		})
	})
	t.Run("fake", func(t *testing.T) {
		k := fakekernel.NewFabric().NewHost(gid("fe80::a"), "ib0", 2044)
		p := open(t, k)
		if _, err := p.AllocQP(0xffff, 0); err != nil {
			t.Fatal(err)
		}
		k.SetCarrier(false)
		l, _ := k.LinkByName("ib0.e1")
		if !l.Up || l.Carrier {
			t.Fatalf("ib0.e1 %+v: want up without carrier", l)
		}
		s, err := k.OpenPacket(l.Index, false)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if n, err := sendOne(s, l.Index); n != 1 || err != nil || k.TxNoCarrier() != 1 {
			t.Fatalf("without carrier: Send %d %v, dropped %d", n, err, k.TxNoCarrier())
		}
	})
}
