package netns

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// iperf runs iperf3 TCP for 3 s from client to server (reverse: the other
// way), checks for errors and that bytes were received, no more than were
// sent, and returns the throughput. iperf3 cannot say more: its receiver
// stops counting when the sender's end-of-test message overtakes the data
// still in flight, so its sent and received totals differ even over a bare
// veth (tcpBytes checks the exact count).
func iperf(t *testing.T, server, client *guest, reverse bool) float64 {
	t.Helper()
	nstestRequire(t, "iperf3")
	srv := exec.Command("ip", "netns", "exec", server.ns, "iperf3", "-s", "-1")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// A one-off server exits after the test; wait for it, so the next
	// one can listen on the port.
	defer func() { srv.Process.Kill(); srv.Wait() }()
	args := []string{"iperf3", "-J", "-t", "3", "-c", server.ip4}
	if reverse {
		args = append(args, "-R")
	}
	out, err := retryConnect(client, args, "Connection refused")
	type sum struct {
		Bytes         int64   `json:"bytes"`
		BitsPerSecond float64 `json:"bits_per_second"`
	}
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumSent     sum `json:"sum_sent"`
			SumReceived sum `json:"sum_received"`
		} `json:"end"`
	}
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil || err != nil || res.Error != "" {
		t.Fatalf("iperf3 %v: %v %s\n%s", args, err, res.Error, out)
	}
	if sent, rcvd := res.End.SumSent.Bytes, res.End.SumReceived.Bytes; rcvd == 0 || rcvd > sent {
		t.Fatalf("iperf3 %v: %d bytes sent, %d received", args, sent, rcvd)
	}
	return res.End.SumReceived.BitsPerSecond
}

// retryConnect runs a client command in guest g until its output no
// longer says refused: a server started just before needs a moment to
// listen.
func retryConnect(g *guest, args []string, refused string) (string, error) {
	var out string
	var err error
	for i := 0; i < 50; i++ {
		out, err = shErr(in(g.ns, args...)...)
		if !strings.Contains(out, refused) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out, err
}

// tcpBytes sends n bytes over one TCP connection from client to server
// with iperf 2, whose server counts what it reads up to the end of the
// stream, and fails unless both ends counted exactly n.
func tcpBytes(t *testing.T, server, client *guest, n int64) {
	t.Helper()
	nstestRequire(t, "iperf")
	sent, rcvd, err := tcpTransfer(server, client, "-n", strconv.FormatInt(n, 10))
	if err != nil || sent != n || rcvd != n {
		t.Fatalf("TCP %s → %s: %d bytes sent, %d received, want %d both: %v", client.ip4, server.ip4, sent, rcvd, n, err)
	}
}

// tcpTransfer runs one iperf 2 TCP connection from client to server
// with the client arguments given (-n bytes or -t seconds) and returns
// what the client wrote and the server read, each -1 when its report
// is missing. It may run in a goroutine of its own: its caller requires
// iperf.
func tcpTransfer(server, client *guest, args ...string) (sent, rcvd int64, err error) {
	return tcpTransferOn(server, client, 5001, args...)
}

// tcpTransferOn is tcpTransfer with the server on TCP port port (iperf's
// default is 5001), so that several can run between two guests at once.
func tcpTransferOn(server, client *guest, port int, args ...string) (sent, rcvd int64, err error) {
	var srvOut strings.Builder
	p := strconv.Itoa(port)
	srv := exec.Command("ip", in(server.ns, "iperf", "-s", "-p", p, "-y", "C", "-P", "1")[1:]...)
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		return -1, -1, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	defer func() { srv.Process.Kill(); <-done }()
	args = append([]string{"iperf", "-y", "C", "-c", server.ip4, "-p", p}, args...)
	out, err := retryConnect(client, args, "connect failed")
	if err != nil {
		return -1, -1, fmt.Errorf("%v: %v\n%s", args, err, out)
	}
	select { // the server exits after its one client (-P 1)
	case <-done:
		done <- nil
	case <-time.After(10 * time.Second):
		return csvBytes(out), -1, fmt.Errorf("iperf server in %s did not finish:\n%s", server.ns, srvOut.String())
	}
	sent, rcvd = csvBytes(out), csvBytes(srvOut.String())
	if sent != rcvd {
		err = fmt.Errorf("client: %s\nserver: %s", out, srvOut.String())
	}
	return sent, rcvd, err
}

// csvBytes returns the bytes transferred in an iperf 2 CSV report
// (-y C: date,src,sport,dst,dport,id,interval,bytes,bits/s), or -1.
func csvBytes(out string) int64 {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Split(strings.TrimSpace(l), ","); len(f) == 9 {
			if v, err := strconv.ParseInt(f[7], 10, 64); err == nil {
				return v
			}
		}
	}
	return -1
}

func TestTwoHypervisors(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21, g22 := h1.guests[0], h1.guests[1], h2.guests[0], h2.guests[1]

	// Healthy traffic, from resolution to full speed: no drop counted.
	drops := watchDrops(t, h1, h2)
	// Capture the underlay while the guests resolve each other and ping.
	pcap, stopCapture := capture(t, h1)

	t.Run("ping", func(t *testing.T) {
		ping(t, g11, g21.ip4)
		ping(t, g12, g22.ip4)
		ping(t, g22, g11.ip4)
	})
	t.Run("ping6", func(t *testing.T) {
		ping(t, g11, g21.ip6)
		ping(t, g22, g12.ip6)
	})
	t.Run("arping", func(t *testing.T) {
		arping(t, g12, g21.ip4, 3)
	})
	t.Run("same hypervisor", func(t *testing.T) {
		ping(t, g11, g12.ip4)
		ping(t, g21, g22.ip6)
	})
	stopCapture()
	t.Run("wire", func(t *testing.T) {
		checkWire(t, pcap, g11, g12)
		checkARPing(t, pcap, g12, g21, 3)
	})

	t.Run("iperf3", func(t *testing.T) {
		fwd := iperf(t, g21, g11, false)
		rev := iperf(t, g21, g11, true)
		t.Logf("iperf3 TCP g11→g21 %.0f Mbit/s, g21→g11 %.0f Mbit/s", fwd/1e6, rev/1e6)
	})
	t.Run("TCP bytes", func(t *testing.T) {
		tcpBytes(t, g21, g11, 64<<20)
		tcpBytes(t, g11, g21, 64<<20)
	})
	drops.check(t)

	for _, h := range tp.hvs {
		m := h.metrics(t)
		// The port sent every packet the shim handed it (each super-frame
		// as the segments it was cut into) and the shim read every packet
		// the port accepted.
		if m["tx_packets"] == 0 || m["port_tx_packets"] != m["tx_packets"]-m["tx_super"]+m["tx_super_segments"] || m["port_rx_packets"] != m["rx_packets"] {
			t.Errorf("%s: tx_packets %v (super-frames %v of %v segments), port_tx_packets %v; rx_packets %v, port_rx_packets %v", h.name,
				m["tx_packets"], m["tx_super"], m["tx_super_segments"], m["port_tx_packets"], m["rx_packets"], m["port_rx_packets"])
		}
		// One VIF per source MAC, none aged: each guest's, and those of
		// the hypervisor's own br0 and eib0 when their IPv6 stacks spoke
		// (DAD, MLD) in time; one neighbour per remote guest.
		// The TAP has a queue per CPU (--queues' default), each with
		// its TX worker.
		if q := strings.Fields(sh(t, in(h.ns, "ls", "/sys/class/net/eib0/queues")...)); len(q) != 2*runtime.NumCPU() {
			t.Errorf("%s: eib0 queues %v, want rx and tx for each of %d CPUs", h.name, q, runtime.NumCPU())
		}
		vifs := h.vifMACs()
		own := map[string]bool{linkMAC(t, h.ns, "br0").String(): true, linkMAC(t, h.ns, "eib0").String(): true}
		for _, g := range h.guests {
			if mac := g.mac(t).String(); vifs[mac] != 1 {
				t.Errorf("%s: %d VIFs for guest %s (%s), want 1", h.name, vifs[mac], g.ip4, mac)
			}
			own[g.mac(t).String()] = true
		}
		for mac, n := range vifs {
			if !own[mac] || n != 1 {
				t.Errorf("%s: %d VIFs for %s, not one of its guests' or its own MACs", h.name, n, mac)
			}
		}
		if m["vifs"] != float64(len(vifs)) || m["vifs_created"] != m["vifs"] || m["neighbours"] != 2 {
			t.Errorf("%s: vifs %v (created %v), the log names %d; neighbours %v, want 2", h.name, m["vifs"], m["vifs_created"], len(vifs), m["neighbours"])
		}
	}
	h1.stop(t, true)
	h2.stop(t, true)
	if !strings.Contains(h1.log(), "shim stopped") {
		t.Errorf("no clean shutdown in the log:\n%s", h1.log())
	}
}

// capture captures the hypervisor's underlay (fabric packets only) and
// returns the capture file and a function that ends it. It is captureOn.
// A buffered capture (tshark's dumpcap) loses the packets still in the
// kernel's ring when it ends. A test whose traffic ends just before
// would see an empty capture; a DHCP exchange with a fixed address is
// over in milliseconds.
func capture(t *testing.T, h *hypervisor) (string, func()) {
	t.Helper()
	return captureOn(t, h.ns, h.underlay, "udp port 4791")
}

// bcastGroup is the default partition's broadcast MGID (RFC 4391 §4).
const bcastGroup = "ff12:401b:ffff::ffff:ffff"

// checkWire asserts what the fabric carried, as tshark decodes it.
func checkWire(t *testing.T, pcap string, g1, g2 *guest) {
	t.Helper()
	out := tshark(t, "-r", pcap, "-T", "fields", "-E", "separator=|",
		"-e", "frame.protocols", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
		"-e", "infiniband.deth.q_key", "-e", "infiniband.deth.srcqp", "-e", "ipv6.dst",
		"-e", "arp.hw.type", "-e", "arp.opcode", "-e", "ip.src", "-e", "arp.src.proto_ipv4")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 10 {
		t.Fatalf("only %d packets captured:\n%s", len(lines), out)
	}
	qpnOf := map[string]map[string]bool{g1.ip4: {}, g2.ip4: {}}
	var arps, bcasts int
	for _, l := range lines {
		f := strings.Split(l, "|")
		if len(f) != 10 {
			t.Fatalf("bad tshark line %q", l)
		}
		proto, opcode, dqp, qkey, sqp, dst, hwtype, arpOp, ipSrc, arpSrc := f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]
		if !strings.Contains(proto, ":udp:infiniband:ethertype:") || opcode != "100" {
			t.Errorf("not an IPoIB UD SEND-only: %q", l)
		}
		if qkey != "0x0000000000000b1b" && qkey != "0x00000b1b" {
			t.Errorf("Q_Key %s, want 0x0b1b: %q", qkey, l)
		}
		if strings.Contains(proto, ":arp") {
			arps++
			if hwtype != "32" {
				t.Errorf("ARP hardware type %s, want InfiniBand (32): %q", hwtype, l)
			}
			// Requests go to the broadcast group, except the unicast
			// re-validation probes of a stale entry.
			if arpOp == "1" && !strings.HasPrefix(dst, "fe80:") {
				bcasts++
				if dst != bcastGroup {
					t.Errorf("ARP request to %s, not the broadcast group: %q", dst, l)
				}
			}
		}
		if strings.HasPrefix(dst, "ff") && dqp != "0x00ffffff" && dqp != "0xffffff" {
			t.Errorf("multicast to %s with destination QPN %s, want 0xFFFFFF: %q", dst, dqp, l)
		}
		src := ipSrc
		if src == "" {
			src = arpSrc
		}
		if q, ok := qpnOf[src]; ok {
			q[sqp] = true
		}
	}
	if arps == 0 || bcasts == 0 {
		t.Errorf("%d ARP packets, %d requests captured", arps, bcasts)
	}
	for ip, q := range qpnOf {
		if len(q) != 1 {
			t.Errorf("guest %s sent from QPNs %v, want exactly one", ip, q)
		}
	}
	var q1, q2 string
	for q := range qpnOf[g1.ip4] {
		q1 = q
	}
	for q := range qpnOf[g2.ip4] {
		q2 = q
	}
	if q1 == "" || q1 == q2 {
		t.Errorf("guests %s and %s on one hypervisor share source QPN %q", g1.ip4, g2.ip4, q1)
	}
}

// checkARPing asserts that the capture holds exactly n ARP requests from
// guest a for b's address and n replies: what arping -c n sent and got,
// each crossing the fabric once.
func checkARPing(t *testing.T, pcap string, a, b *guest, n int) {
	t.Helper()
	out := tshark(t, "-r", pcap, "-Y", "arp", "-T", "fields", "-E", "separator=|",
		"-e", "arp.opcode", "-e", "arp.src.proto_ipv4", "-e", "arp.dst.proto_ipv4")
	var req, rep int
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		switch l {
		case "1|" + a.ip4 + "|" + b.ip4:
			req++
		case "2|" + b.ip4 + "|" + a.ip4:
			rep++
		}
	}
	if req != n || rep != n {
		t.Errorf("arping %s → %s: %d requests and %d replies on the wire, want %d each\n%s", a.ip4, b.ip4, req, rep, n, out)
	}
}

func TestThreeHypervisorsOverBridge(t *testing.T) {
	tp := newTopo(t, 3, true)
	drops := watchDrops(t, tp.hvs...)
	defer drops.check(t)
	for _, a := range tp.hvs {
		for _, b := range tp.hvs {
			if a != b {
				ping(t, a.guests[0], b.guests[1].ip4)
				ping(t, a.guests[1], b.guests[0].ip6)
			}
		}
	}
	arping(t, tp.hvs[2].guests[0], tp.hvs[0].guests[1].ip4, 2)
}

// TestRestart restarts one hypervisor's daemon and checks that every
// path comes back by what the new daemon does, not by waiting for any
// periodic work. Paths whose ends had resolved each other come back
// through one resolution each, at most, in the shim's queue. IPv6 to a
// restarted guest that has not spoken since needs its solicited-node
// group: it comes back when the guest answers the shim's start-up MLD
// query. So when every path has its first reply, the new daemon has sent
// at most one resolution per remote guest and no query but its two
// start-up ones (IGMP and MLD). The time from the restart to each first
// reply is logged: docs/behaviour.md quotes what it measured.
func TestRestart(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	ping(t, h2.guests[0], h1.guests[0].ip4)
	ping(t, h1.guests[1], h2.guests[1].ip6)
	stopping := time.Now()
	h1.stop(t, true)
	restarted := time.Now()
	h1.start(t)
	running := time.Since(restarted)
	paths := []struct {
		from *guest
		to   string
	}{
		{h2.guests[1], h1.guests[0].ip6},
		{h2.guests[0], h1.guests[0].ip4},
		{h1.guests[1], h2.guests[1].ip6},
		{h1.guests[0], h2.guests[0].ip4},
	}
	took := make([]time.Duration, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var at time.Time
			at, errs[i] = firstReply(p.from, p.to, testutil.Settle)
			took[i] = at.Sub(restarted)
		}()
	}
	wg.Wait()
	t.Logf("daemon stopped in %v, running %v after its restart", restarted.Sub(stopping).Round(time.Millisecond), running.Round(time.Millisecond))
	for i, p := range paths {
		if errs[i] != nil {
			t.Errorf("ping %s → %s: no reply within %v of the restart: %v", p.from.ns, p.to, testutil.Settle, errs[i])
			continue
		}
		t.Logf("ping %s → %s: first reply %v after the restart", p.from.ns, p.to, took[i].Round(time.Millisecond))
	}
	// h1's guests talk to h2's two guests: one resolution each at most.
	m := h1.metrics(t)
	if m["tx_resolve_sent"] > 2 || m["tx_queries"] != 2 {
		t.Errorf("the restarted daemon sent %v resolutions and %v queries before every path answered; want at most 2 and exactly its 2 start-up queries", m["tx_resolve_sent"], m["tx_queries"])
	}
}

var pingStamp = regexp.MustCompile(`(?m)^\[(\d+)\.(\d{6})\] \d+ bytes from `)

// firstReply pings dst from g every 10 ms until the first reply and
// returns when it arrived (ping -D's timestamp).
func firstReply(g *guest, dst string, within time.Duration) (time.Time, error) {
	out, err := shErr(in(g.ns, "ping", "-D", "-n", "-i", "0.01", "-c", "1", "-w", strconv.Itoa(int(within.Seconds())), dst)...)
	m := pingStamp.FindStringSubmatch(out)
	if m == nil {
		return time.Time{}, fmt.Errorf("%v\n%s", err, out)
	}
	sec, _ := strconv.ParseInt(m[1], 10, 64)
	usec, _ := strconv.ParseInt(m[2], 10, 64)
	return time.Unix(sec, usec*1000), nil
}

func TestBadInput(t *testing.T) {
	tp := newTopo(t, 2, false, "--mac", "02:00:00:00:01:01")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	if out := sh(t, in(h1.ns, "ip", "link", "show", "eib0")...); !strings.Contains(out, "02:00:00:00:01:01") || !strings.Contains(out, "mtu 9000") || !strings.Contains(out, "qlen 8192\n") {
		t.Fatalf("TAP without the --mac address, the --tap-mtu default (9000) or the --tap-queue-len default (8192): %s", out)
	}
	ping(t, h1.guests[0], h2.guests[0].ip4)
	watch := watchDrops(t, h1, h2)

	// Garbage to the fabric port, from the other hypervisor. The fabric's
	// own decoder says which drop counter each datagram must land in.
	want := map[string]float64{}
	src, dst := h2.gid(t), h1.gid(t)
	nsDo(t, h2.ns, func() {
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: dst.AsSlice(), Port: simfabric.UDPPort, Zone: h2.underlay})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
		s16, d16 := src.As16(), dst.As16()
		var codec simfabric.Codec
		for i := 0; i < 50; i++ {
			b := make([]byte, 1+i*13%200)
			rand.Read(b)
			if i%2 == 0 && len(b) > 4 {
				b[0] = 0x64 // looks like UD SEND-only: reaches the ICRC check
				b = b[:len(b)&^3]
			}
			var p simfabric.Packet
			err := codec.Decode(b, &s16, &d16, sport, simfabric.UDPPort, &p)
			if err == nil {
				continue // a valid ICRC by chance (2^-32): not garbage
			}
			want["port_drop_"+err.(simfabric.DecodeError).String()]++
			c.Write(b)
		}
	})

	// Truncated and oversized frames into the TAP, from the hypervisor's
	// own stack (raw packet socket on eib0); the TAP's MTU (9000) lets
	// the oversized ones through.
	srcMAC := []byte{0x02, 0xee, 0, 0, 0, 1}
	hdr := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, srcMAC...)
	var frames [][]byte
	for i := 0; i < 5; i++ {
		// Shorter than their headers say: a cut 802.1Q tag, an IPv4
		// header of 6 bytes, an ARP packet of 10.
		frames = append(frames, append(append([]byte(nil), hdr...), 0x81, 0x00, 0x00),
			append(append([]byte(nil), hdr...), 0x08, 0x00, 0x45, 0, 0, 20, 0, 0),
			append(append([]byte(nil), hdr...), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1, 2, 0xee))
	}
	big := make([]byte, 8000)
	copy(big, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(big[6:], srcMAC)
	big[12], big[13] = 0x88, 0xb5 // local experimental ethertype
	for i := 0; i < 5; i++ {
		frames = append(frames, big)
	}
	// An oversized IPv4 packet with DF and a bogus total length.
	bad := append([]byte(nil), big...)
	ip := bad[14:]
	ip[0], ip[2], ip[3], ip[6] = 0x45, 0x1f, 0x40, 0x40
	bad[12], bad[13] = 0x08, 0x00
	sendRaw(t, h1.ns, "eib0", append(frames, bad)...)
	// Each frame into the TAP lands in one drop counter. 5 cut 802.1Q
	// tags are runts. 5 short IPv4 headers and the oversized IPv4 packet
	// with a bogus length are bad IP. 5 short ARP packets are refused by
	// the rewrite (as truncated). 5 oversized frames have an ethertype
	// IPoIB does not carry. h2 drops nothing.
	for k, v := range map[string]float64{"drop_runt": 5, "drop_bad_ip": 6, "drop_tx_rewrite": 5, "tx_rewrite_truncated": 5, "drop_ethertype": 5} {
		want[k] = v
	}
	watch.expect(t, rises{h1.name: want}, 5*time.Second)
	select {
	case err := <-h1.done:
		t.Fatalf("eipoibd died on bad input: %v\n%s", err, h1.log())
	default:
	}
	ping(t, h1.guests[0], h2.guests[0].ip4)
	ping(t, h2.guests[1], h1.guests[1].ip6)

	// The TAP's carrier follows the port: SIGUSR1 toggles the simulated
	// port down and up.
	for _, down := range []bool{true, false} {
		h1.cmd.Process.Signal(syscall.SIGUSR1)
		deadline := time.Now().Add(20 * time.Second)
		for strings.Contains(sh(t, in(h1.ns, "ip", "link", "show", "eib0")...), "NO-CARRIER") != down {
			if time.Now().After(deadline) {
				t.Fatalf("carrier not %v after the port went down=%v", !down, down)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ping(t, h1.guests[0], h2.guests[0].ip4)
}

// TestOversize raises the MTU of one hypervisor's guest and its bridge
// port to 9000, above the IPoIB MTU (4092), leaving eipoibd at its
// defaults. It checks that 8000-byte packets are never blackholed. IPv4
// without DF is fragmented by the shim. IPv4 with DF gets "fragmentation
// needed" with MTU 4092. IPv6 gets "packet too big" with MTU 4092 and
// then works through source fragmentation. 16 MiB of TCP from that guest
// arrive exactly.
func TestOversize(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	drops := watchDrops(t, h1, h2)
	defer drops.check(t)
	// Guests and their bridge ports at 9000, as clouds often have them;
	// the TAP's own MTU (--tap-mtu) is 9000 by default, so nothing else
	// is raised.
	for _, l := range []string{"vg1", "vg2"} {
		sh(t, in(h1.ns, "ip", "link", "set", l, "mtu", "9000")...)
	}
	sh(t, in(g11.ns, "ip", "link", "set", "eth0", "mtu", "9000")...)
	// The far side is configured right: the IPoIB MTU end to end.
	for _, l := range []string{"vg1", "vg2"} {
		sh(t, in(h2.ns, "ip", "link", "set", l, "mtu", "4092")...)
	}
	for _, g := range h2.guests {
		sh(t, in(g.ns, "ip", "link", "set", "eth0", "mtu", "4092")...)
	}
	ping(t, g11, g21.ip4)
	ping(t, g11, g21.ip4, "-M", "dont", "-s", "8000")
	out, err := shErr(in(g11.ns, "ping", "-c", "3", "-i", "0.2", "-W", "1", "-M", "do", "-s", "8000", g21.ip4)...)
	if err == nil || !strings.Contains(out, "mtu = 4092") && !strings.Contains(out, "mtu=4092") {
		t.Fatalf("DF ping of 8000 bytes: want fragmentation needed with MTU 4092, got %v\n%s", err, out)
	}
	out, _ = shErr(in(g11.ns, "ping", "-6", "-c", "1", "-W", "1", "-s", "8000", g21.ip6)...) // learns the PMTU
	if !strings.Contains(out, "mtu=4092") && !strings.Contains(out, "mtu = 4092") {
		t.Fatalf("IPv6 ping of 8000 bytes: want packet too big with MTU 4092, got\n%s", out)
	}
	ping(t, g11, g21.ip6, "-s", "8000")
	// TCP from the 9000-byte guest: its segments are cut to the IPoIB
	// MTU (offloads) or its path MTU discovery learns it (no offloads).
	tcpBytes(t, g21, g11, 16<<20)
	// The shim fragmented the 3 requests sent without DF; the replies
	// come from a guest at the IPoIB MTU, which fragments them itself.
	// It answered too big twice: the first DF request (the guest then
	// knows the path MTU and sends no more) and the IPv6 one that taught
	// it.
	m := h1.metrics(t)
	if m["tx_fragmented"] != 3 || m["tx_icmp_too_big"] != 2 {
		t.Fatalf("tx_fragmented %v, want 3; tx_icmp_too_big %v, want 2", m["tx_fragmented"], m["tx_icmp_too_big"])
	}
}

// TestClampMSS: guests at MTU 9000 on both sides, with path MTU
// discovery off, exchange TCP through daemons run with --clamp-mss. Each
// daemon lowers the MSS of its guest's SYN: the SYN on one side, the
// SYN-ACK on the other, counted again if retransmitted. So no segment
// exceeds the IPoIB MTU and none is fragmented, and 16 MiB arrive
// exactly.
func TestClampMSS(t *testing.T) {
	tp := newTopo(t, 2, false, "--clamp-mss")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	drops := watchDrops(t, h1, h2)
	defer drops.check(t)
	for _, h := range tp.hvs {
		for _, l := range []string{"vg1", "vg2"} {
			sh(t, in(h.ns, "ip", "link", "set", l, "mtu", "9000")...)
		}
		for _, g := range h.guests {
			sh(t, in(g.ns, "ip", "link", "set", "eth0", "mtu", "9000")...)
			sh(t, in(g.ns, "sysctl", "-qw", "net.ipv4.ip_no_pmtu_disc=1")...)
		}
	}
	ping(t, g11, g21.ip4)
	tcpBytes(t, g21, g11, 16<<20)
	for _, h := range tp.hvs {
		m := h.metrics(t)
		if m["tx_mss_clamped"] < 1 || m["tx_fragmented"] != 0 {
			t.Errorf("%s: tx_mss_clamped %v, want its guest's SYN (and any retransmission of it); tx_fragmented %v, want 0", h.name, m["tx_mss_clamped"], m["tx_fragmented"])
		}
	}
}
