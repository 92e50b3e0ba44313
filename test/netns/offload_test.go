package netns

import (
	"strconv"
	"strings"
	"testing"
)

// csumErrors are the kernel's checksum error counters (nstat names).
var csumErrors = []string{"TcpInCsumErrors", "UdpInCsumErrors", "Udp6InCsumErrors", "IcmpInCsumErrors", "Icmp6InCsumErrors", "IpExtInCsumErrors"}

// nstat returns guest g's kernel counters that matter here: the checksum
// errors and the TCP segments received and retransmitted.
func nstat(t *testing.T, g *guest) map[string]int64 {
	t.Helper()
	nstestRequire(t, "nstat")
	out := sh(t, in(g.ns, "nstat", "-a", "-z", "-s")...) // absolute values, zeros too, no history file
	m := make(map[string]int64)
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	for _, k := range append(csumErrors, "TcpInSegs") {
		if _, ok := m[k]; !ok {
			t.Fatalf("nstat in %s has no %s:\n%s", g.ns, k, out)
		}
	}
	return m
}

// csumWatch remembers guests' checksum error counters (nstat), to assert
// later that none rose.
type csumWatch map[*guest]map[string]int64

// watchCsumErrors snapshots the counters of gs.
func watchCsumErrors(t *testing.T, gs ...*guest) csumWatch {
	t.Helper()
	w := csumWatch{}
	for _, g := range gs {
		w[g] = nstat(t, g)
	}
	return w
}

// check fails the test for each checksum error counter that rose.
func (w csumWatch) check(t *testing.T) {
	t.Helper()
	for g, b := range w {
		after := nstat(t, g)
		for _, k := range csumErrors {
			if after[k] != b[k] {
				t.Errorf("%s: %s rose by %d", g.ns, k, after[k]-b[k])
			}
		}
	}
}

// TestOffloads: with the TAP's offloads on (the default) and off, 64 MiB
// of TCP cross each way between guests at the IPoIB MTU. Both ends count
// exactly 64 MiB (iperf 2). No checksum error counter rises in either
// guest's kernel, so a segment cut or merged with a wrong checksum
// cannot hide. No drop counter rises. With offloads on, the super-frame
// paths really ran: guests' super-frames crossed the shim whole to the
// port, which cut them, and the TAP wrote merged ones. With them off
// they did not.
func TestOffloads(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run("offload="+strconv.FormatBool(on), func(t *testing.T) {
			tp := newTopo(t, 2, false, "--offload="+strconv.FormatBool(on))
			h1, h2 := tp.hvs[0], tp.hvs[1]
			g1, g2 := h1.guests[0], h2.guests[0]
			for _, h := range tp.hvs {
				for _, l := range []string{"vg1", "vg2"} {
					sh(t, in(h.ns, "ip", "link", "set", l, "mtu", "4092")...)
				}
				for _, g := range h.guests {
					sh(t, in(g.ns, "ip", "link", "set", "eth0", "mtu", "4092")...)
				}
			}
			ping(t, g1, g2.ip4)
			drops := watchDrops(t, h1, h2)
			csums := watchCsumErrors(t, g1, g2)
			tcpBytes(t, g2, g1, 64<<20)
			tcpBytes(t, g1, g2, 64<<20)
			csums.check(t)
			drops.check(t)
			for _, h := range tp.hvs {
				m := h.metrics(t)
				cut, merged := m["tap_gso_segments_cut"], m["tap_gro_segments_merged"]
				// The simulated fabric's port cuts super-packets itself
				// (TSO), so every super-frame read crosses the shim whole.
				if on && (m["tap_gso_frames_read"] < 1 || m["tx_super"] != m["tap_gso_frames_read"] || cut != 0 || m["tap_gro_frames_written"] < 1 || merged < 2) {
					t.Errorf("%s: offloads on but super-frames read %v (%v handed to the port whole, %v segments cut by the TAP), written %v (of %v segments)",
						h.name, m["tap_gso_frames_read"], m["tx_super"], cut, m["tap_gro_frames_written"], merged)
				}
				if !on && m["tap_gso_frames_read"]+cut+m["tap_gro_frames_written"]+merged+m["tx_super"] != 0 {
					t.Errorf("%s: offloads off but the super-frame counters moved: %v", h.name, m)
				}
			}
		})
	}
}
