package simfabric

import (
	"net"
	"testing"

	"golang.org/x/net/ipv6"

	"github.com/eipoib/eipoibd/internal/fabric/fabrictest"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestSharedChecks runs the backends' shared conformance suite over a
// port on a veth. A packet is injected as the peer's socket would send
// it: encoded with the metadata asked and sent to the port's GID or to
// the MGID. Its source is the peer's own address, since the kernel
// writes it and the ICRC covers it.
//
// A group the port has not joined is first joined on the underlay by
// another socket. So the kernel takes the datagram in and the port's
// socket gets it: its IPV6_MULTICAST_ALL is on by default
// (net/ipv6/mcast.c inet6_mc_check returns np->mc_all for a group the
// socket has no membership of). The port's own group check is then what
// drops it, as it does for a group some other program on the host
// joined.
func TestSharedChecks(t *testing.T) {
	a, b, nsA, _ := pair(t, 9000)
	var other *net.UDPConn
	var otherPC *ipv6.PacketConn
	nstest.Do(t, nsA, func() {
		c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6unspecified})
		if err != nil {
			t.Fatal(err)
		}
		other, otherPC = c, ipv6.NewPacketConn(c)
	})
	t.Cleanup(func() { other.Close() })
	var codec Codec
	fabrictest.Run(t, fabrictest.Backend{
		Port: a,
		Peer: b,
		Inject: func(payload []byte, m ipoib.RxMeta) bool {
			dst := a.LocalGID()
			if m.DstQPN == ipoib.MulticastQPN {
				dst = m.MGID
				if !a.groups.Full(dst) {
					if err := otherPC.JoinGroup(a.ifi, &net.UDPAddr{IP: dst[:]}); err != nil {
						t.Fatalf("join %s on the underlay: %v", dst, err)
					}
				}
			}
			src, to := [16]byte(b.LocalGID()), [16]byte(dst)
			buf := append(make([]byte, HeaderLen, HeaderLen+len(payload)+TailRoom), payload...)
			pkt := Packet{PKey: uint16(m.PKey), DestQPN: m.DstQPN, QKey: ipoib.QKey, SrcQPN: m.Src.QPN()}
			out := codec.Encode(buf, HeaderLen, &pkt, &src, &to, UDPPort, UDPPort)
			b.wmu.Lock()
			_, err := b.conns[0].WriteToUDP(out, &net.UDPAddr{IP: to[:], Port: UDPPort, Zone: b.ifi.Name})
			b.wmu.Unlock()
			if err != nil {
				t.Fatalf("send to %s: %v", dst, err)
			}
			return true
		},
	})
}
