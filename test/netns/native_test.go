package netns

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// native is a native IPoIB host on the fabric: eipoibd host in its own
// namespace, on the underlay bridge. Its TUN ib0 has 10.77.0.20N/24 and
// fd77::20N/64; ep is an endpoint the guest helpers can ping from and
// to. It writes its neighbour table to neighFile.
type native struct {
	d         *hypervisor
	ep        *guest
	neighFile string
}

// addNative starts native host i on tp's underlay bridge (newTopoOpts
// with viaBridge).
func addNative(t *testing.T, tp *topo, i int) *native {
	t.Helper()
	ns := fmt.Sprintf("%snh%d", tp.pfx, i)
	sh(t, "ip", "netns", "add", ns)
	n := &native{ep: &guest{ns: ns, ip4: fmt.Sprintf("10.77.0.20%d", i), ip6: fmt.Sprintf("fd77::20%d", i)}}
	n.neighFile = filepath.Join(t.TempDir(), "neigh")
	n.d = &hypervisor{name: fmt.Sprintf("nh%d", i), ns: ns, underlay: "ul", host: true, logDir: t.TempDir(),
		extra: []string{"--neigh-file", n.neighFile}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s: eipoibd host log:\n%s", n.d.name, abridge(n.d.log(), 40, 20))
		}
		n.d.stop(t, true)
		shErr("ip", "netns", "delete", ns)
	})
	sh(t, in(ns, "ip", "link", "set", "lo", "up")...)
	port := fmt.Sprintf("pnh%d", i)
	sh(t, "ip", "link", "add", "ul", "netns", ns, "type", "veth", "peer", "name", port, "netns", tp.pfx+"ul")
	sh(t, in(tp.pfx+"ul", "ip", "link", "set", port, "mtu", "9000", "master", "ubr", "up")...)
	underlayUp(t, ns, "ul")
	n.d.start(t)
	sh(t, in(ns, "ip", "addr", "add", n.ep.ip4+"/24", "dev", "ib0")...)
	sh(t, in(ns, "ip", "addr", "add", n.ep.ip6+"/64", "dev", "ib0", "nodad")...)
	// Multicast leaves by ib0, not by the underlay the namespace also
	// holds (an artefact of the simulation: a real host's fabric port
	// is no IP interface).
	sh(t, in(ns, "ip", "route", "add", "224.0.0.0/4", "dev", "ib0")...)
	sh(t, in(ns, "ip", "-6", "route", "add", "multicast", "ff00::/8", "dev", "ib0", "table", "local", "metric", "1")...)
	return n
}

var hostQPN = regexp.MustCompile(`msg="host running" .* qpn=0x([0-9a-f]+)`)

// hwAddr returns the native host's 20-byte address: its QPN (from its
// log) and its port GID.
func (n *native) hwAddr(t *testing.T) ipoib.HwAddr {
	t.Helper()
	m := hostQPN.FindStringSubmatch(n.d.log())
	if m == nil {
		t.Fatalf("%s: no QPN in the log:\n%s", n.d.name, n.d.log())
	}
	qpn, _ := strconv.ParseUint(m[1], 16, 32)
	return ipoib.MakeHwAddr(0, uint32(qpn), ipoib.GID(n.d.gid(t).As16()))
}

// neighbours reads the native host's neighbour table: address → 20-byte
// hardware address.
func (n *native) neighbours(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(n.neighFile)
	if err != nil {
		t.Fatalf("%s: neighbour table: %v", n.d.name, err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && f[3] == "lladdr" {
			m[f[0]] = f[4]
		}
	}
	return m
}

// TestNativeHost: guests behind eipoibd and native IPoIB hosts (eipoibd
// host) on one fabric.
//   - Ping and ping -6 work both ways.
//   - TCP works both ways with exact byte counts (iperf 2), and iperf3
//     reports the throughput.
//   - IPv4 and IPv6 multicast work both ways with no datagram lost.
//   - The native host's neighbour table holds the two guests of one
//     hypervisor under two 20-byte addresses: their own VIFs' QPNs on
//     the hypervisor's GID.
//   - No guest MAC crosses the fabric, and every ARP on it is IPoIB ARP.
//   - An address moved from one native host to another (gratuitous ARP)
//     is followed by the guests within 2 s.
//   - dnsmasq on the native host leases addresses to a guest in both
//     --dhcp modes.
func TestNativeHost(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{n: 1, viaBridge: true})
	h1 := tp.hvs[0]
	g1, g2 := h1.guests[0], h1.guests[1]
	nh1, nh2 := addNative(t, tp, 1), addNative(t, tp, 2)
	n1 := nh1.ep

	pcap, stopCapture := capture(t, h1)
	for _, g := range []*guest{g1, g2} {
		ping(t, g, n1.ip4)
		ping(t, g, n1.ip6)
		ping(t, n1, g.ip4)
		ping(t, n1, g.ip6)
	}

	t.Run("neighbours", func(t *testing.T) {
		gid := ipoib.GID(h1.gid(t).As16())
		got := nh1.neighbours(t)
		seen := map[string]string{}
		for _, g := range []*guest{g1, g2} {
			want := ipoib.MakeHwAddr(0, h1.vifQPN(g.mac(t).String(), 0), gid).String()
			for _, ip := range []string{g.ip4, g.ip6} {
				if got[ip] != want {
					t.Errorf("%s's neighbour %s: lladdr %q, want %s (its VIF's QPN on %s)", nh1.d.name, ip, got[ip], want, gid)
				}
			}
			if other, dup := seen[want]; dup {
				t.Errorf("guests %s and %s share the address %s", other, g.ip4, want)
			}
			seen[want] = g.ip4
		}
	})

	t.Run("multicast", func(t *testing.T) {
		for _, c := range []struct {
			from, to *guest
			member   *hypervisor // the receiver's port on the fabric
			group    string
		}{{g1, n1, nh1.d, "239.1.2.3"}, {n1, g1, h1, "239.1.2.4"}, {g2, n1, nh1.d, "ff15::1:7"}, {n1, g2, h1, "ff15::1:8"}} {
			r := startReceiver(t, c.to, c.group)
			// The join reaches the fabric (the host polls its groups
			// every 250 ms; the shim joins on the guest's report).
			waitJoined(t, c.member, groupMGID(c.group), true, 5*time.Second)
			r.expectStream(t, c.to, 0, send(t, c.from, c.group))
			r.stop()
		}
	})
	stopCapture()

	t.Run("wire", func(t *testing.T) {
		raw, err := os.ReadFile(pcap)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range []*guest{g1, g2} {
			if mac := g.mac(t); bytes.Contains(raw, mac) {
				t.Errorf("guest %s's MAC %s appears on the fabric", g.ip4, mac)
			}
		}
		out := tshark(t, "-r", pcap, "-Y", "arp or icmpv6.type == 135 or icmpv6.type == 136", "-T", "fields", "-E", "separator=|",
			"-e", "arp.hw.type", "-e", "arp.hw.size", "-e", "icmpv6.opt.type", "-e", "icmpv6.opt.length")
		var arps, nds int
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Split(l, "|")
			if len(f) != 4 {
				t.Fatalf("bad tshark line %q", l)
			}
			if f[0] != "" {
				arps++
				if f[0] != "32" || f[1] != "20" {
					t.Errorf("ARP with hardware type %s, length %s on the fabric, want 32, 20", f[0], f[1])
				}
				continue
			}
			nds++
			types, lens := strings.Split(f[2], ","), strings.Split(f[3], ",")
			for i := range types {
				if (types[i] == "1" || types[i] == "2") && (i >= len(lens) || lens[i] != "3") {
					t.Errorf("NDP link-layer option of length %v (8-byte units), want 3 (24 bytes): %q", lens, l)
				}
			}
		}
		if arps == 0 || nds == 0 {
			t.Errorf("%d ARP and %d NS/NA packets captured, want some of each:\n%s", arps, nds, out)
		}
	})

	t.Run("tcp", func(t *testing.T) {
		tcpBytes(t, n1, g1, 20<<20)
		tcpBytes(t, g1, n1, 20<<20)
		t.Logf("iperf3 guest → native host: %.2f Gbit/s, native host → guest: %.2f Gbit/s",
			iperf(t, n1, g1, false)/1e9, iperf(t, n1, g1, true)/1e9)
	})

	t.Run("address move", func(t *testing.T) {
		const moved = "10.77.0.250"
		sh(t, in(nh1.ep.ns, "ip", "addr", "add", moved+"/24", "dev", "ib0")...)
		ping(t, g1, moved)
		sh(t, in(nh1.ep.ns, "ip", "addr", "del", moved+"/24", "dev", "ib0")...)
		sh(t, in(nh2.ep.ns, "ip", "addr", "add", moved+"/24", "dev", "ib0")...)
		start := time.Now()
		at, err := firstReply(g1, moved, 3*time.Second)
		if err != nil {
			t.Fatalf("no reply from %s after it moved to %s: %v", moved, nh2.d.name, err)
		}
		if d := at.Sub(start); d > 2*time.Second {
			t.Errorf("first reply %v after the move, want within 2 s", d)
		}
		// The guest now reaches nh2 under its REMAC.
		hw := nh2.hwAddr(t)
		want := mactrans.DeriveREMAC(hw.GID(), hw.QPN(), 0)
		out := sh(t, in(g1.ns, "ip", "neigh", "show", moved, "dev", "eth0")...)
		f := strings.Fields(out)
		if len(f) < 3 || f[1] != "lladdr" {
			t.Fatalf("guest's neighbour entry for %s: %q", moved, out)
		}
		if mac, _ := net.ParseMAC(f[2]); !bytes.Equal(mac, want[:]) {
			t.Errorf("guest reaches %s at %s, want %s (%s's REMAC)", moved, f[2], net.HardwareAddr(want[:]), nh2.d.name)
		}
		ping(t, g1, moved)
	})

	t.Run("dhcp", func(t *testing.T) {
		nstestRequire(t, "dnsmasq", "dhclient")
		extra := h1.extra
		defer func() { h1.extra = extra }()
		for _, mode := range []string{"broadcast", "rfc4390"} {
			t.Run(mode, func(t *testing.T) {
				h1.stop(t, true)
				h1.extra = append(append([]string(nil), extra...), "--dhcp", mode)
				h1.start(t)
				dhcpLease(t, mode, h1, n1, g2, "ib0")
			})
		}
	})
}
