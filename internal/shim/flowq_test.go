package shim

import (
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
)

// TestFlowQueue: a flow's frames go to one queue whichever way they
// travel; TCP and UDP flows spread over the queues; frames without ports
// (ARP, ICMP) and a single queue give queue 0.
func TestFlowQueue(t *testing.T) {
	frame := func(sip, dip netip.Addr, sport, dport uint16, tcp bool) ether.Frame {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: sip.AsSlice(), DstIP: dip.AsSlice()}
		if tcp {
			ip.Protocol = layers.IPProtocolTCP
			l4 := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), ACK: true}
			l4.SetNetworkLayerForChecksum(ip)
			return serialize(t, eth(macA1, macB1, layers.EthernetTypeIPv4), ip, l4)
		}
		l4 := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		l4.SetNetworkLayerForChecksum(ip)
		return serialize(t, eth(macA1, macB1, layers.EthernetTypeIPv4), ip, l4)
	}
	used := map[int]int{}
	for port := uint16(40000); port < 40032; port++ {
		for _, tcp := range []bool{false, true} {
			q := flowQueue(frame(ipA1, ipB1, port, 5201, tcp), 4)
			if back := flowQueue(frame(ipB1, ipA1, 5201, port, tcp), 4); back != q {
				t.Fatalf("port %d tcp %v: queue %d one way, %d the other", port, tcp, q, back)
			}
			if again := flowQueue(frame(ipA1, ipB1, port, 5201, tcp), 4); again != q {
				t.Fatalf("port %d: queue %d, then %d", port, q, again)
			}
			used[q]++
		}
	}
	if len(used) != 4 {
		t.Fatalf("64 flows over 4 queues used only %v", used)
	}
	if q := flowQueue(frame(ipA1, ipB1, 1, 2, true), 1); q != 0 {
		t.Fatalf("one queue: %d", q)
	}
	arp := ether.Frame(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	if q := flowQueue(arp, 4); q != 0 {
		t.Fatalf("ARP on queue %d", q)
	}
}
