package netns

import (
	"strings"
	"testing"
)

// TestPathMTU: guests at MTU 9000, as many clouds run them, behind
// eipoibd with its defaults. Nothing is blackholed. An 8000-byte ping
// with DF gets ICMP fragmentation-needed naming the IPoIB MTU. An IPv6
// one gets Packet Too Big, after which IPv6 pings of that size work both
// ways (source fragmentation). iperf3 from a 9000-MTU guest runs; its
// throughput against a 4092-MTU guest's is reported. With --clamp-mss, a
// guest with path MTU discovery off gets its SYN's MSS (and its peer's
// SYN-ACK's) lowered to 4052, and a transfer needs no fragmentation and
// no ICMP.
func TestPathMTU(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21, g22 := h1.guests[0], h1.guests[1], h2.guests[0], h2.guests[1]
	mtu := func(h *hypervisor, port string, g *guest, mtu string) {
		sh(t, in(h.ns, "ip", "link", "set", port, "mtu", mtu)...)
		sh(t, in(g.ns, "ip", "link", "set", "eth0", "mtu", mtu)...)
	}
	mtu(h1, "vg1", g11, "9000")
	mtu(h1, "vg2", g12, "4092")
	mtu(h2, "vg1", g21, "9000")
	mtu(h2, "vg2", g22, "9000")
	drops := watchDrops(t, h1, h2)
	defer drops.check(t)
	ping(t, g11, g21.ip4)
	ping(t, g11, g21.ip6)

	out, err := shErr(in(g11.ns, "ping", "-c", "1", "-W", "1", "-M", "do", "-s", "8000", g21.ip4)...)
	if err == nil || !strings.Contains(out, "mtu = 4092") {
		t.Errorf("ping -M do -s 8000: want fragmentation needed with mtu = 4092, got %v\n%s", err, out)
	}
	out, err = shErr(in(g11.ns, "ping", "-6", "-c", "1", "-W", "1", "-s", "8000", g21.ip6)...)
	if err == nil || !strings.Contains(out, "Packet too big: mtu=4092") {
		t.Errorf("ping -6 -s 8000: want Packet too big: mtu=4092, got %v\n%s", err, out)
	}
	// The far guest learns it too (its first big reply is answered
	// with Packet Too Big); then big pings cross both ways, fragmented
	// at their sources.
	shErr(in(g21.ns, "ping", "-6", "-c", "1", "-W", "1", "-s", "8000", g11.ip6)...)
	ping(t, g11, g21.ip6, "-s", "8000")
	ping(t, g21, g11.ip6, "-s", "8000")

	jumbo, small := iperf(t, g21, g11, false), iperf(t, g21, g12, false)
	t.Logf("iperf3 TCP from a guest at MTU 9000: %.2f Gbit/s; at MTU 4092: %.2f Gbit/s (%.0f %%)", jumbo/1e9, small/1e9, 100*jumbo/small)

	t.Run("clamp-mss", func(t *testing.T) {
		for _, h := range tp.hvs {
			h.stop(t, true)
			h.extra = []string{"--clamp-mss"}
			h.start(t)
		}
		drops := watchDrops(t, h1, h2)
		defer drops.check(t)
		// Path MTU discovery off in the guest: no DF, ICMP ignored.
		sh(t, in(g11.ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_no_pmtu_disc")...)
		before1, before2 := h1.metrics(t), h2.metrics(t)
		synAtServer, stop1 := captureOn(t, g22.ns, "eth0", "tcp[tcpflags] & tcp-syn != 0")
		synAtClient, stop2 := captureOn(t, g11.ns, "eth0", "tcp[tcpflags] & tcp-syn != 0")
		tcpBytes(t, g22, g11, 20<<20)
		stop1()
		stop2()
		for _, c := range []struct{ pcap, from string }{{synAtServer, g11.ip4}, {synAtClient, g22.ip4}} {
			out := tshark(t, "-r", c.pcap, "-Y", "ip.src == "+c.from, "-T", "fields", "-e", "tcp.options.mss_val")
			if lines := strings.Fields(out); len(lines) == 0 || strings.Count(out, "4052") != len(lines) {
				t.Errorf("MSS of the SYNs from %s as received: %q, want 4052 each", c.from, lines)
			}
		}
		after1, after2 := h1.metrics(t), h2.metrics(t)
		for _, c := range []struct {
			h             *hypervisor
			before, after map[string]float64
		}{{h1, before1, after1}, {h2, before2, after2}} {
			if c.after["tx_mss_clamped"] <= c.before["tx_mss_clamped"] {
				t.Errorf("%s: tx_mss_clamped did not rise", c.h.name)
			}
			for _, k := range []string{"tx_fragmented", "tx_icmp_too_big"} {
				if d := c.after[k] - c.before[k]; d != 0 {
					t.Errorf("%s: %s rose by %v during the clamped transfer, want 0", c.h.name, k, d)
				}
			}
		}
	})
}
