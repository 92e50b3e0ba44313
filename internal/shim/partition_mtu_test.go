package shim

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// smallPartitionFabric makes ports on an IB MTU 4096 memfabric with TSO
// whose partition pkey has IB MTU mtu, below the port's, as an SM may
// configure a partition's broadcast group.
type smallPartitionFabric struct {
	memFabric
	pkey ipoib.PKey
	mtu  int
}

func newSmallPartitionFabric(t *testing.T, pkey ipoib.PKey, mtu int) smallPartitionFabric {
	mf := memFab(t, 4096)
	mf.SetTSO(true)
	return smallPartitionFabric{mf, pkey, mtu}
}

func (f smallPartitionFabric) port(t *testing.T, gid ipoib.GID) testPort {
	p := f.memFabric.port(t, gid)
	p.(*memfabric.Port).SetPartitionMTU(f.pkey, f.mtu)
	return p
}

// tagged inserts an 802.1Q tag of vlan into an untagged Ethernet frame.
func tagged(frame []byte, vlan uint16) []byte {
	out := append(append([]byte(nil), frame[:12]...), 0x81, 0x00, byte(vlan>>8), byte(vlan))
	return append(out, frame[12:]...)
}

// vlanOf returns the VLAN a delivered frame carries (0 untagged).
func vlanOf(p gopacket.Packet) uint16 {
	if d, ok := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q); ok {
		return d.VLANIdentifier
	}
	return 0
}

// meetOn has guests A1 (on a) and B1 (on b) exchange ARP on vlan and
// returns the REMAC of B1 that A1 sees.
func meetOn(t *testing.T, a, b *hv, vlan uint16) ether.MAC {
	t.Helper()
	a.dev.Inject(tagged(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1), vlan))
	req := b.recv(t)
	remacA1 := ether.MAC(req.Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress)
	b.dev.Inject(tagged(arpFrame(t, layers.ARPReply, macB1, ipB1, remacA1, remacA1, ipA1), vlan))
	rep := a.recv(t)
	if vlanOf(req) != vlan || vlanOf(rep) != vlan {
		t.Fatalf("ARP not on VLAN %d", vlan)
	}
	return ether.MAC(rep.Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress)
}

// checkTooBig checks that A1's 3000-byte packets to B1 on vlan are
// answered or fragmented for an IPoIB MTU of mtu. The answers are ICMP
// fragmentation-needed (IPv4 with DF) and packet-too-big (IPv6) carrying
// mtu, on vlan. IPv4 without DF crosses in two fragments of at most mtu
// bytes.
func checkTooBig(t *testing.T, a, b *hv, vlan uint16, remacB1 ether.MAC, mtu int) {
	t.Helper()
	a.dev.Inject(tagged(udpFrame(t, macA1, remacB1, ipA1, ipB1, 3000, true), vlan))
	p := a.recv(t)
	if icmp, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); !ok || icmp.TypeCode != layers.CreateICMPv4TypeCode(3, 4) || int(icmp.Seq) != mtu || vlanOf(p) != vlan {
		t.Fatalf("not a fragmentation-needed with MTU %d on VLAN %d: %v", mtu, vlan, p)
	}
	a.dev.Inject(tagged(udpFrame(t, macA1, remacB1, ipA1, ipB1, 3000, false), vlan))
	total := 0
	for range 2 {
		ip := b.recv(t).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if int(ip.Length) > mtu {
			t.Fatalf("fragment of %d bytes over the partition's MTU %d", ip.Length, mtu)
		}
		total += len(ip.Payload)
	}
	if total != 8+3000 {
		t.Fatalf("fragments carry %d bytes", total)
	}
	ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: []byte{0xfd, 15: 0xa1}, DstIP: []byte{0xfd, 15: 0xb1}}
	udp := &layers.UDP{SrcPort: 1, DstPort: 2}
	udp.SetNetworkLayerForChecksum(ip6)
	a.dev.Inject(tagged(serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv6), ip6, udp, gopacket.Payload(make([]byte, 3000))), vlan))
	p = a.recv(t)
	ptb, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	if !ok || ptb.TypeCode.Type() != layers.ICMPv6TypePacketTooBig || int(binary.BigEndian.Uint32(ptb.LayerPayload())) != mtu {
		t.Fatalf("not a packet-too-big with MTU %d: %v", mtu, p)
	}
}

// checkWhole checks that an untagged 3000-byte packet with DF crosses
// whole (the default partition's MTU is 4092).
func checkWhole(t *testing.T, a, b *hv) {
	t.Helper()
	_, remacB1 := arpExchange(t, a, b)
	a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 3000, true))
	if u, ok := b.recv(t).Layer(layers.LayerTypeUDP).(*layers.UDP); !ok || len(u.Payload) != 3000 {
		t.Fatal("the default partition's 3000-byte packet did not cross whole")
	}
}

// TestPartitionMTU: VLAN 20's partition has IB MTU 2048 on a port of
// 4096. A guest on VLAN 20 gets ICMP fragmentation-needed and ICMPv6
// packet-too-big with 2044. Its IPv4 without DF arrives in fragments of
// at most 2044 bytes. Its TCP super-frames are cut to segments of at
// most 2044 bytes, and its SYNs' MSS is clamped to fit 2044. An untagged
// guest's 3000-byte packet crosses whole (the default partition keeps
// 4092), as the TAP's MTU (IPMTU) stays the port's.
func TestPartitionMTU(t *testing.T) {
	f := newSmallPartitionFabric(t, 0x8014, 2048)
	cfg := func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{20: 0x8014}; c.ClampMSS = true }
	a, b := newHV(t, f, "fe80::a", cfg), newHV(t, f, "fe80::b", cfg)
	if a.s.IPMTU() != 4092 || a.s.Port().PartitionMTUs[20] != 2044 || a.s.Port().PartitionMTUs[0] != 4092 {
		t.Fatalf("IPoIB MTUs: port %d, partitions %v", a.s.IPMTU(), a.s.Port().PartitionMTUs)
	}
	const mtu = 2044
	remacB1 := meetOn(t, a, b, 20)
	checkTooBig(t, a, b, 20, remacB1, mtu)
	// A TCP super-frame of 9000-byte segments: cut to fit 2044.
	payload := gsotest.Pattern(20000)
	link := tagged(serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv4))[:ether.HeaderLen], 20)
	pkt, l4 := gsotest.Super(t, link, false, payload)
	a.dev.InjectSuper(pkt, tap.Super{L4: uint16(l4), Size: 9000})
	mss := mtu - 20 - 32 // IPv4 and TCP with timestamps
	var segs [][]byte
	for range (len(payload) + mss - 1) / mss {
		segs = append(segs, b.recv(t).Data())
	}
	b.quiet(t)
	if back := gsotest.Reassemble(t, segs, len(link), false, mtu); !bytes.Equal(back, payload) {
		t.Fatal("segments do not carry the super-frame's payload")
	}
	// A SYN's MSS is clamped to the partition's MTU.
	a.dev.Inject(tagged(append(serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv4))[:ether.HeaderLen], synPacket(t, false, true, []layers.TCPOption{mssOpt(8960)})...), 20))
	syn := b.recv(t).Layer(layers.LayerTypeTCP).(*layers.TCP)
	if len(syn.Options) == 0 || binary.BigEndian.Uint16(syn.Options[0].OptionData) != mtu-40 {
		t.Fatalf("SYN options %v, want MSS %d", syn.Options, mtu-40)
	}
	checkWhole(t, a, b)
}

// TestPartitionMTURefresh: a partition's MTU that the port lowers while
// the shim runs (the SM changed its broadcast group's) is taken up from
// the port's event. It is not taken from a housekeeping round: there is
// none within the test, as the period is an hour. VLAN 20's guests then
// get ICMP with 2044.
func TestPartitionMTURefresh(t *testing.T) {
	f := newSmallPartitionFabric(t, 0x8014, 4096)
	cfg := func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{20: 0x8014}; c.Housekeeping = time.Hour }
	a, b := newHV(t, f, "fe80::a", cfg), newHV(t, f, "fe80::b", cfg)
	if got := a.s.Port().PartitionMTUs[20]; got != 4092 {
		t.Fatalf("VLAN 20 MTU %d", got)
	}
	for _, h := range []*hv{a, b} {
		h.port.(*memfabric.Port).SetPartitionMTU(0x8014, 2048)
	}
	testutil.WaitFor(t, "VLAN 20's MTU to become 2044", func() bool { return a.s.Port().PartitionMTUs[20] == 2044 })
	checkTooBig(t, a, b, 20, meetOn(t, a, b, 20), 2044)
}

// kernelHosts is hosts on a fake kernel running the kernel backend on an
// ib0 of IB MTU 4096, each host's kernel and backend configured by mod.
type kernelHosts struct {
	kernelFabric
	mod func(*fakekernel.Kernel, *kernelfabric.Config)
}

func (f kernelHosts) port(t *testing.T, gid ipoib.GID) testPort {
	t.Helper()
	k := f.f.NewHost(gid, "ib0", 4092)
	cfg := kernelfabric.Config{Kernel: k, Parent: "ib0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if f.mod != nil {
		f.mod(k, &cfg)
	}
	p, err := kernelfabric.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPartitionMTUKernel: end to end over the kernel backend on the fake
// kernel, with a partition whose broadcast group the SM set to IB MTU
// 2048 under 4096 parents. Its children take 2044 when they join, and
// the port reports it. VLAN 20's guests get ICMP with 2044 and fragments
// that fit; the default partition keeps 4092.
func TestPartitionMTUKernel(t *testing.T) {
	f := kernelHosts{kernelFabric: kernelFabric{fakekernel.NewFabric()}}
	f.f.SetGroupMTU(0x8014, 2048)
	cfg := func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{20: 0x8014} }
	a, b := newHV(t, f, "fe80::a", cfg), newHV(t, f, "fe80::b", cfg)
	if a.port.PartitionMTU(0x8014) != 2048 || a.s.Port().PartitionMTUs[20] != 2044 || a.s.Port().PartitionMTUs[0] != 4092 {
		t.Fatalf("partition MTU %d, shim's %v", a.port.PartitionMTU(0x8014), a.s.Port().PartitionMTUs)
	}
	remacB1 := meetOn(t, a, b, 20)
	checkTooBig(t, a, b, 20, remacB1, 2044)
	checkWhole(t, a, b)
}

// TestVIFPastAttachLimit: over the kernel backend, with the HCA's
// per-group QP limit at 4, a third guest is refused. The four are the
// parent, the default partition's group child and two VIF children
// attached to the broadcast group. The third guest's child's join never
// completes. It is counted as a refused VIF, with no VIF and no child
// left of it, while the first guests keep talking across.
func TestVIFPastAttachLimit(t *testing.T) {
	var ka *fakekernel.Kernel
	f := kernelHosts{kernelFabric: kernelFabric{fakekernel.NewFabric()}, mod: func(k *fakekernel.Kernel, c *kernelfabric.Config) {
		if ka == nil {
			ka = k
			k.MaxQPPerGroup = 4
			c.ChildTimeout = 100 * time.Millisecond
		}
	}}
	a, b := newHV(t, f, "fe80::a", nil), newHV(t, f, "fe80::b", nil)
	_, remacB1 := arpExchange(t, a, b)
	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA2, ipA2, ether.Broadcast, ether.MAC{}, ipB1))
	b.recv(t)
	macA3 := ether.MAC{0x52, 0x54, 0, 0, 0xa, 3}
	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA3, netip.MustParseAddr("10.0.0.5"), ether.Broadcast, ether.MAC{}, ipB1))
	a.waitCounter(t, DropVIFRefused, 1) // the ARP held while the VIF was tried
	b.quiet(t)
	if _, ok := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA3}); ok || len(a.s.VIFs()) != 2 {
		t.Fatalf("VIFs after the refusal: %v", a.s.VIFs())
	}
	if links, _ := ka.Links(); len(links) != 4 || a.port.Counters().Stats[kernelfabric.StatRefusedJoin] != 1 || a.s.Counters()["vifs_refused_join"] != 1 {
		t.Fatalf("links %v, port stats %v, shim counters %v", links, a.port.Counters().Stats, a.s.Counters())
	}
	a.dev.Inject(udpFrame(t, macA1, remacB1, ipA1, ipB1, 100, true))
	if u, ok := b.recv(t).Layer(layers.LayerTypeUDP).(*layers.UDP); !ok || len(u.Payload) != 100 {
		t.Fatal("the first guest stopped reaching across")
	}
}
