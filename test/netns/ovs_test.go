package netns

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// ovsDB returns the --ovs-db argument a hypervisor's daemon got.
func (h *hypervisor) ovsDB() string {
	for i, a := range h.switchArgs {
		if a == "--ovs-db" {
			return h.switchArgs[i+1]
		}
	}
	return ""
}

// TestOVSVLANs: Open vSwitch (userspace datapath) on both hypervisors,
// guests as access ports of VLAN 10 and 20, mapped to P_Keys 0x800a and
// 0x8014. Same-VLAN guests talk across the fabric. Different-VLAN guests
// cannot, even in one subnet. The wire shows both partitions and, in the
// default partition, only the hypervisors' own untagged stacks. A packet
// forged into the wrong partition is dropped by the receive-side P_Key
// check.
func TestOVSVLANs(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{
		n: 2, ovs: []bool{true, true}, tags: [][]int{{10, 20}, {10, 20}},
		extra: []string{"--vlan-pkey", "10=0x800a,20=0x8014"},
	})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	drops := watchDrops(t, h1, h2)
	if out := sh(t, "ovs-vsctl", "--db="+h1.ovsDB(), "list-ports", "obr"); !strings.Contains(out, "eib0") {
		t.Fatalf("TAP not on the OVS bridge: %s", out)
	}

	pcap, stopCapture := capture(t, h1)

	ping(t, h1.guests[0], h2.guests[0].ip4) // VLAN 10
	ping(t, h1.guests[1], h2.guests[1].ip4) // VLAN 20
	ping(t, h2.guests[0], h1.guests[0].ip6)
	ping(t, h2.guests[1], h1.guests[1].ip6)
	for _, c := range [][2]*guest{{h1.guests[0], h2.guests[1]}, {h2.guests[1], h1.guests[0]}} {
		if out, err := shErr(in(c[0].ns, "ping", "-c", "2", "-i", "0.2", "-W", "1", c[1].ip4)...); err == nil {
			t.Errorf("VLAN %s reached %s in another VLAN:\n%s", c[0].ip4, c[1].ip4, out)
		}
	}
	stopCapture()
	checkPartitions(t, pcap, tp)

	m := h2.metrics(t)
	if m["drop_vlan_unmapped"] != 0 {
		t.Errorf("frames on unmapped VLANs: %v", m["drop_vlan_unmapped"])
	}

	t.Run("P_Key check on receive", func(t *testing.T) { forgePartition(t, h2, h1, forged) })
	// Nothing else was dropped, on either side.
	drops.expect(t, rises{h1.name: {"port_drop_pkey_mismatch": forged}}, 0)

	// Shutdown detaches the TAP from OVS.
	h1.stop(t, true)
	if out := sh(t, "ovs-vsctl", "--db="+h1.ovsDB(), "list-ports", "obr"); strings.Contains(out, "eib0") {
		t.Errorf("TAP still on the OVS bridge after shutdown: %s", out)
	}
}

// checkPartitions asserts that the capture holds only P_Keys 0x800a and
// 0x8014 (both, with their broadcast groups) and 0xffff. 0xffff must
// carry no guest traffic, only IPv6 packets from the link-local
// addresses of the VIFs of the hypervisors' own untagged MACs. Those are
// eib0 and the OVS bridge's internal port, whose IPv6 stacks send MLD
// reports, DAD and router solicitations.
func checkPartitions(t *testing.T, pcap string, tp *topo) {
	t.Helper()
	own := map[string]bool{}   // source QPNs of the hypervisors' own MACs, untagged
	ownIP := map[string]bool{} // their link-local addresses, and DAD's ::
	ownIP["::"] = true
	guestIP := map[string]bool{}
	for _, h := range tp.hvs {
		for _, dev := range []string{"eib0", "obr"} {
			if q := h.vifQPN(linkMAC(t, h.ns, dev).String(), 0); q != 0 {
				own[fmt.Sprintf("0x%08x", q)] = true
			}
			for _, f := range strings.Fields(sh(t, in(h.ns, "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link")...)) {
				if p, err := netip.ParsePrefix(f); err == nil {
					ownIP[p.Addr().String()] = true
				}
			}
		}
		for _, g := range h.guests {
			guestIP[g.ip4], guestIP[g.ip6] = true, true
		}
	}
	out := tshark(t, "-r", pcap, "-T", "fields", "-E", "separator=|", "-e", "infiniband.bth.p_key",
		"-e", "ipv6.dst", "-e", "infiniband.deth.srcqp", "-e", "ipv6.src", "-e", "ip.src", "-e", "arp.src.proto_ipv4", "-e", "frame.protocols")
	counts, dsts := map[string]int{}, map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(l, "|")
		if len(f) != 7 {
			t.Fatalf("bad tshark line %q", l)
		}
		pkey, dst, srcqp, src6, src4, arpSrc, protos := f[0], f[1], f[2], f[3], f[4], f[5], f[6]
		counts[pkey]++
		for _, d := range strings.Split(dst, ",") {
			dsts[d] = true
		}
		switch pkey {
		case "32778", "32788": // 0x800a, 0x8014
		case "65535":
			// ipv6.src lists the underlay's address, then the packet's.
			srcs := strings.Split(src6, ",")
			if !own[srcqp] || len(srcs) != 2 || !ownIP[srcs[1]] || src4 != "" || arpSrc != "" || guestIP[srcs[1]] {
				t.Errorf("default partition 0xffff carries more than the hypervisors' own stacks (their QPNs %v): source QPN %s, %s %s %s, %s",
					own, srcqp, src6, src4, arpSrc, protos)
			}
		default:
			t.Errorf("P_Key %s on the wire, want only 0x800a, 0x8014 and 0xffff: %q", pkey, l)
		}
	}
	for _, want := range []string{"32778", "32788"} { // 0x800a, 0x8014
		if counts[want] == 0 {
			t.Errorf("P_Key %s not on the wire (saw %v)", want, counts)
		}
	}
	for _, want := range []string{"ff12:401b:800a::ffff:ffff", "ff12:401b:8014::ffff:ffff"} {
		if !dsts[want] {
			t.Errorf("broadcast group %s not on the wire", want)
		}
	}
	t.Logf("packets by P_Key: %v", counts)
}

// forged is how many packets TestOVSVLANs forges into the wrong partition.
const forged = 20

// forgePartition sends, from hypervisor from, fabric packets with a
// valid ICRC to the QP of to's VLAN-20 guest (P_Key 0x8014). First comes
// an ICMP echo request in its own partition, which the guest must
// receive, so the packets are well formed and addressed right. Then come
// n of the same in partition 0x800a (VLAN 10). to's port must drop each
// on its P_Key check and count it, and the guest must not see them.
func forgePartition(t *testing.T, from, to *hypervisor, n int) {
	target, src20, src10 := to.guests[1], from.guests[1], from.guests[0]
	mac := target.mac(t)
	qpn := mactrans.QPNHint(mactrans.VIFKey{MAC: ether.MAC(mac), VLAN: 20})
	// The simulated fabric honours the hint (ipoib.QPTable.Alloc) unless
	// another QP holds it: the log says which QPN the VIF got.
	if got := to.vifQPN(mac.String(), 20); got != qpn {
		t.Fatalf("VLAN-20 guest %s has QPN %#x, not its hint %#x", mac, got, qpn)
	}
	const id = 0xe1b0 // ICMP identifier of the forged echo requests
	filter := fmt.Sprintf("icmp[icmptype] == icmp-echo and icmp[4:2] == %#x", id)
	send := func(pkey uint16, src *guest, vlan uint16, n int) (seen []string, mismatch float64) {
		before := to.metrics(t)["port_drop_pkey_mismatch"]
		srcQPN := from.vifQPN(src.mac(t).String(), int(vlan))
		payload := echoRequest(t, src.ip4, target.ip4, id)
		seen = sniff(t, target, filter, func() {
			sendFabric(t, from, to, simfabric.Packet{PKey: pkey, DestQPN: qpn, QKey: ipoib.QKey, SrcQPN: srcQPN}, payload, n)
		})
		return seen, to.metrics(t)["port_drop_pkey_mismatch"] - before
	}
	// In the guest's own partition, from the VLAN-20 guest's QP: delivered.
	if seen, drops := send(0x8014, src20, 20, 5); len(seen) != 5 || drops != 0 {
		t.Fatalf("5 forged packets in the right partition 0x8014: the guest saw %d, port_drop_pkey_mismatch +%v; want 5 and 0\n%s",
			len(seen), drops, strings.Join(seen, "\n"))
	}
	// In partition 0x800a, from the VLAN-10 guest's QP: dropped on receive.
	seen, drops := send(0x800a, src10, 10, n)
	if len(seen) != 0 || drops != float64(n) {
		t.Errorf("%d forged packets in partition 0x800a to a QP of 0x8014: port_drop_pkey_mismatch +%v, the guest saw %d; want +%d and none\n%s",
			n, drops, len(seen), n, strings.Join(seen, "\n"))
	}
}

// echoRequest returns an IPoIB payload: the IPoIB header and an IPv4 ICMP
// echo request from src to dst with identifier id.
func echoRequest(t *testing.T, src, dst string, id uint16) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4,
		SrcIP: net.ParseIP(src).To4(), DstIP: net.ParseIP(dst).To4()}
	icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: id, Seq: 1}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		ip, icmp, gopacket.Payload("forged")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, ipoib.HeaderLen, ipoib.HeaderLen+len(buf.Bytes()))
	ipoib.PutHeader(b, uint16(layers.EthernetTypeIPv4))
	return append(b, buf.Bytes()...)
}

// sendFabric sends n copies of one fabric packet (p with payload, PSNs
// counting up) from hypervisor from's underlay to hypervisor to's port.
func sendFabric(t *testing.T, from, to *hypervisor, p simfabric.Packet, payload []byte, n int) {
	t.Helper()
	floodFabric(t, from, to, n, func(i int) (simfabric.Packet, []byte) {
		p.PSN = uint32(i)
		return p, payload
	})
}

// TestLinuxBridgeAndOVS: a guest behind a Linux bridge pings a guest
// behind OVS on another hypervisor, in the default partition.
func TestLinuxBridgeAndOVS(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{n: 2, ovs: []bool{false, true}})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	drops := watchDrops(t, h1, h2)
	defer drops.check(t)
	ping(t, h1.guests[0], h2.guests[0].ip4)
	ping(t, h2.guests[1], h1.guests[1].ip4)
	ping(t, h1.guests[1], h2.guests[0].ip6)
}
