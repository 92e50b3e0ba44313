package testbed_test

import (
	"fmt"
	"os"
	"regexp"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib/testbed"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// transferBytes is what each TCP transfer carries: 4 MiB, 2,873
// segments of at most 1,460 bytes without offloads.
const transferBytes = 4 << 20

// TestFastPathEndToEnd runs guest traffic between two emulated
// hypervisors through the fast path: TX program at each TAP's egress,
// the emulated IPoIB wire, harness and RX program at each child's
// ingress, the maps filled through kernelfabric.FastPath (package
// testbed). The guests know each other's REMAC from static neighbours,
// as eipoibd's ARP and NDP translation would teach them; nothing answers
// ARP here. With the guests' offloads and the TAPs' on, then off:
//
//   - ping and ping -6 get every reply;
//   - a TCP transfer from guest 1 to guest 2 (IPv4) and one from guest 2
//     to guest 1 (IPv6) each deliver exactly transferBytes bytes with the
//     sender's SHA-256;
//   - the sender's TX program and the receiver's RX program each
//     redirected at least as many packets as the transfer needs: with
//     offloads off one per 1,460 bytes (the largest TCP payload of a
//     1,500-byte IPv4 or IPv6 packet); with them on one per 65,536
//     bytes, the most a GSO super-frame holds (GSO_MAX_SIZE), since how
//     the stack batches segments into super-frames varies;
//   - the wire and the harnesses dropped nothing.
//
// Nothing else forwards between the guests, so a transfer completes only
// through the programs: without the TX or RX program, or without a map
// entry, the pings get no reply and the transfers time out.
func TestFastPathEndToEnd(t *testing.T) {
	nstest.Require(t, "ping", "ethtool")
	p := fmt.Sprintf("fe%d", os.Getpid()%100000)
	fabric := p + "fab"
	nstest.Add(t, fabric)
	var hosts [2]testbed.Host
	for i := range hosts {
		h, g := fmt.Sprintf("%sh%d", p, i+1), fmt.Sprintf("%sg%d", p, i+1)
		nstest.Add(t, h)
		nstest.Add(t, g)
		nstest.Must(t, "ip", "-n", h, "link", "add", "br0", "type", "bridge")
		nstest.Must(t, "ip", "-n", h, "link", "set", "br0", "up")
		nstest.Must(t, "ip", "link", "add", "eth0", "netns", g, "type", "veth", "peer", "name", "vg", "netns", h)
		nstest.Must(t, "ip", "-n", h, "link", "set", "vg", "master", "br0", "up")
		nstest.Must(t, "ip", "-n", g, "link", "set", "eth0", "up")
		nstest.Must(t, "ip", "-n", g, "addr", "add", fmt.Sprintf("10.77.0.%d/24", i+1), "dev", "eth0")
		nstest.Must(t, "ip", "-n", g, "addr", "add", fmt.Sprintf("fd77::%d/64", i+1), "dev", "eth0", "nodad")
		hosts[i] = testbed.Host{NS: h, Bridge: "br0", GuestNS: g, GuestDev: "eth0"}
	}

	for _, offload := range []bool{true, false} {
		t.Run(fmt.Sprintf("offloads %v", map[bool]string{true: "on", false: "off"}[offload]), func(t *testing.T) {
			for _, h := range hosts {
				if offload {
					nstest.Must(t, nstest.In(h.GuestNS, "ethtool", "-K", "eth0", "tx", "on", "sg", "on", "tso", "on", "gso", "on")...)
				} else {
					nstest.Must(t, nstest.In(h.GuestNS, "ethtool", "-K", "eth0", "tx", "off", "sg", "off", "tso", "off", "gso", "off")...)
				}
			}
			bed := startBed(t, testbed.Start, testbed.Config{Fabric: fabric, Hosts: hosts, Prefix: "fp", Offload: offload, MTU: 4092})

			for _, dst := range []string{"10.77.0.2", "fd77::2"} {
				ping(t, hosts[0].GuestNS, dst, 4)
			}

			perPacket := 1460
			if offload {
				perPacket = 65536
			}
			need := uint64((transferBytes + perPacket - 1) / perPacket)
			for _, tr := range []struct {
				from, to int
				addr     string
			}{{0, 1, "10.77.0.2"}, {1, 0, "fd77::1"}} {
				tx0 := counts(t, bed, tr.from)
				rx0 := counts(t, bed, tr.to)
				transfer(t, hosts[tr.from].GuestNS, hosts[tr.to].GuestNS, tr.addr, transferBytes)
				tx1 := counts(t, bed, tr.from)
				rx1 := counts(t, bed, tr.to)
				t.Logf("to %s: h%d TX redirected %d, h%d RX redirected %d (at least %d each)", tr.addr,
					tr.from+1, tx1.tx[fastpath.Redirected]-tx0.tx[fastpath.Redirected], tr.to+1, rx1.rx[fastpath.RXRedirected]-rx0.rx[fastpath.RXRedirected], need)
				if d := tx1.tx[fastpath.Redirected] - tx0.tx[fastpath.Redirected]; d < need {
					t.Errorf("to %s: h%d's TX program redirected %d packets, want at least %d", tr.addr, tr.from+1, d, need)
				}
				if d := rx1.rx[fastpath.RXRedirected] - rx0.rx[fastpath.RXRedirected]; d < need {
					t.Errorf("to %s: h%d's RX program redirected %d packets, want at least %d", tr.addr, tr.to+1, d, need)
				}
			}

			w, err := bed.WireCounts()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("wire %v; TAPs left to user space %d and %d frames", w, bed.Fallbacks(0), bed.Fallbacks(1))
			if w[emuib.Redirected] == 0 || w[emuib.Short] != 0 || w[emuib.Unknown] != 0 || w[emuib.HarnessRefused] != 0 {
				t.Errorf("wire counters %v: want redirects and no drops", w)
			}
		})
	}

	// The emulation alone (make bench's row (g)): the same veths and
	// redirects join the bridges; the guests resolve each other by ARP
	// and ND over them, and reach each other. Start's Close removed its
	// static neighbours, so this also shows nothing of it is left.
	t.Run("plain", func(t *testing.T) {
		startBed(t, testbed.StartPlain, testbed.Config{Fabric: fabric, Hosts: hosts, Prefix: "fp"})
		for _, dst := range []string{"10.77.0.2", "fd77::2"} {
			ping(t, hosts[0].GuestNS, dst, 4)
		}
		transfer(t, hosts[1].GuestNS, hosts[0].GuestNS, "10.77.0.1", transferBytes)
	})
}

// hostCounts are one hypervisor's program counters.
type hostCounts struct {
	tx [fastpath.NumReasons]uint64
	rx [fastpath.NumRXReasons]uint64
}

func counts(t *testing.T, bed *testbed.Bed, i int) hostCounts {
	t.Helper()
	tx, rx, err := bed.Counts(i)
	if err != nil {
		t.Fatal(err)
	}
	return hostCounts{tx, rx}
}

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// ping pings dst from namespace ns n times and fails unless every
// reply came.
func ping(t *testing.T, ns, dst string, n int) {
	t.Helper()
	out, _ := nstest.Run(nstest.In(ns, "ping", "-c", fmt.Sprint(n), "-i", "0.2", "-W", "3", dst)...)
	m := pingSummary.FindStringSubmatch(out)
	if m == nil || m[1] != fmt.Sprint(n) || m[2] != fmt.Sprint(n) {
		t.Errorf("ping %s: want %d sent and %d received:\n%s", dst, n, n, out)
	}
}

// startBed starts a bed with start (Start or StartPlain), fails the
// test if it does not start, and closes it when the test ends.
func startBed(t *testing.T, start func(testbed.Config) (*testbed.Bed, error), cfg testbed.Config) *testbed.Bed {
	t.Helper()
	bed, err := start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return bed
}

// transfer sends n pseudo-random bytes over TCP from a socket in
// namespace from to a listener on addr in namespace to, and fails unless
// exactly those bytes arrive (count and SHA-256).
func transfer(t *testing.T, from, to, addr string, n int) {
	t.Helper()
	nstest.TCPDigest(t, from, to, "tcp", addr, int64(n), 1)
}
