package netns

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// joined reports whether hypervisor h's port is a member of mgid: the
// simulated fabric joins MGIDs as IPv6 groups on the underlay.
func joined(t *testing.T, h *hypervisor, mgid ipoib.GID) bool {
	t.Helper()
	out := sh(t, in(h.ns, "ip", "-6", "maddr", "show", "dev", h.underlay)...)
	for _, f := range strings.Fields(out) {
		if a, err := netip.ParseAddr(f); err == nil && a == mgid.Addr() {
			return true
		}
	}
	return false
}

// groupMGID is the MGID of an IPv4 or IPv6 group address on the
// default partition, with the link-local scope the shims use.
func groupMGID(group string) ipoib.GID {
	a := netip.MustParseAddr(group)
	if a.Is6() {
		return ipoib.IPv6MGID(a, 0xffff, ipoib.ScopeLinkLocal)
	}
	return ipoib.IPv4MGID(a, 0xffff, ipoib.ScopeLinkLocal)
}

func waitJoined(t *testing.T, h *hypervisor, mgid ipoib.GID, want bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for joined(t, h, mgid) != want {
		if time.Since(start) > within {
			t.Fatalf("%s: member of %s = %v after %s, want %v\n%s", h.name, mgid, !want, within, want, h.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// receiver is an iperf 2 multicast server in a guest.
type receiver struct {
	cmd *exec.Cmd
	out string
}

func startReceiver(t *testing.T, g *guest, group string) *receiver {
	t.Helper()
	nstestRequire(t, "iperf")
	r := &receiver{out: filepath.Join(t.TempDir(), "iperf-"+g.ns+".log")}
	f, err := os.Create(r.out)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"iperf", "-s", "-u", "-B", group, "-i", "1"}
	if strings.Contains(group, ":") {
		args = append(args, "-V")
	}
	r.cmd = exec.Command("ip", in(g.ns, args...)[1:]...)
	r.cmd.Stdout, r.cmd.Stderr = f, f
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.stop(); f.Close() })
	return r
}

func (r *receiver) stop() {
	if r.cmd.Process != nil && r.cmd.ProcessState == nil {
		r.cmd.Process.Signal(syscall.SIGTERM)
		r.cmd.Wait()
	}
}

var (
	streamStart  = regexp.MustCompile(`(?m)connected with \S+ port \d+$`)
	streamReport = regexp.MustCompile(`(\d+)/\s*(\d+)\s+\(`)
	sentCount    = regexp.MustCompile(`Sent (\d+) datagrams`)
)

// stream is what an iperf 2 receiver reported of one sender's stream:
// the lost and total datagrams of its largest report, the whole stream's.
type stream struct{ lost, total int }

// streams returns the streams the receiver reported so far, in the order
// they began.
func (r *receiver) streams() []stream {
	b, _ := os.ReadFile(r.out)
	var ss []stream
	for _, l := range strings.Split(string(b), "\n") {
		if streamStart.MatchString(l) {
			ss = append(ss, stream{})
		} else if m := streamReport.FindStringSubmatch(l); m != nil && len(ss) > 0 {
			lost, _ := strconv.Atoi(m[1])
			total, _ := strconv.Atoi(m[2])
			if s := &ss[len(ss)-1]; total >= s.total {
				s.lost, s.total = lost, total
			}
		}
	}
	return ss
}

// expectStream waits up to 20 s for the receiver's report of its i-th
// stream (from 0) and fails unless it holds every one of the sent
// datagrams, none lost.
func (r *receiver) expectStream(t *testing.T, g *guest, i, sent int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var ss []stream
	for {
		ss = r.streams()
		if len(ss) > i && ss[i].total >= sent || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(ss) <= i {
		t.Errorf("%s reported %d streams, want stream %d of %d datagrams", g.ns, len(ss), i+1, sent)
	} else if ss[i].lost != 0 || ss[i].total != sent {
		t.Errorf("%s: stream %d: %d lost of %d, want all %d sent received", g.ns, i+1, ss[i].lost, ss[i].total, sent)
	}
}

// send runs an iperf 2 multicast client for 2 s at 1 Mbit/s and returns
// the data datagrams it sent: all it counts but the last, the
// end-of-stream marker, which receivers do not count.
func send(t *testing.T, g *guest, group string) int {
	t.Helper()
	nstestRequire(t, "iperf")
	args := []string{"iperf", "-c", group, "-u", "-T", "2", "-t", "2", "-b", "1M"}
	if strings.Contains(group, ":") {
		args = append(args, "-V")
	}
	out := sh(t, in(g.ns, args...)...)
	m := sentCount.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%v: no count of datagrams sent:\n%s", args, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n - 1
}

// TestMulticast: receivers on two hypervisors, a sender on a third.
// Members receive; a guest that did not join receives nothing. A
// hypervisor without members never joins the MGID (the sender's is a
// send-only member).
//
// After a receiver stops, its hypervisor leaves the MGID within the
// leave time: two group-specific queries --mcast-last-member-interval
// apart. That is 1 s with the 500 ms the daemons get here, which their
// start-up queries also give guests to answer; the test allows 1 s more.
// Its port then receives no more than 10 packets (NDP, IGMP) while the
// sender sends its next 2 s stream (some 170 datagrams), which the
// remaining member receives whole.
//
// With IPv4 (IGMP) and IPv6 (MLD, an ff15:: group); NDP keeps working
// throughout.
func TestMulticast(t *testing.T) {
	const lmqi = 500 * time.Millisecond
	tp := newTopo(t, 3, true, "--mcast-last-member-interval", lmqi.String())
	h1, h2, h3 := tp.hvs[0], tp.hvs[1], tp.hvs[2]
	drops := watchDrops(t, h1, h2, h3)
	defer drops.check(t)
	// A snooping Linux bridge floods multicast for the maximum response
	// time after a general query (it waits for the reports before it
	// prunes); the shims' start-up queries ask for answers within lmqi.
	time.Sleep(2 * lmqi)
	for _, tc := range []struct{ name, group string }{{"IPv4", "239.1.1.1"}, {"IPv6", "ff15::1234"}} {
		t.Run(tc.name, func(t *testing.T) {
			mgid := groupMGID(tc.group)
			r1 := startReceiver(t, h1.guests[0], tc.group)
			r2 := startReceiver(t, h2.guests[0], tc.group)
			waitJoined(t, h1, mgid, true, 20*time.Second)
			waitJoined(t, h2, mgid, true, 20*time.Second)

			// Two guests that did not join, one beside a member (h1) and
			// one beside the sender (h3), see nothing of the stream.
			sender := h3.guests[0]
			// Data only: group-specific queries go to the group address
			// and reach every port of the bridge, members or not, as they
			// should.
			data := "udp and dst " + tc.group
			var seen3 []string
			var sent int
			seen1 := sniff(t, h1.guests[1], data, func() {
				seen3 = sniff(t, h3.guests[1], data, func() { sent = send(t, sender, tc.group) })
			})
			for _, c := range []struct {
				g    *guest
				seen []string
			}{{h1.guests[1], seen1}, {h3.guests[1], seen3}} {
				if len(c.seen) != 0 {
					t.Errorf("guest %s did not join but saw %d packets to %s:\n%s", c.g.ns, len(c.seen), tc.group, strings.Join(c.seen, "\n"))
				}
			}
			r1.expectStream(t, h1.guests[0], 0, sent)
			r2.expectStream(t, h2.guests[0], 0, sent)
			if joined(t, h3, mgid) {
				t.Errorf("%s has no member but joined %s", h3.name, mgid)
			}

			// The receiver on h2 stops: its kernel leaves the group, the
			// shim's group-specific queries go unanswered, and h2 leaves
			// the MGID within the leave time.
			r2.stop()
			took := waitJoined(t, h2, mgid, false, 2*lmqi+time.Second)
			t.Logf("%s left %s %s after the receiver stopped", h2.name, mgid, took.Round(10*time.Millisecond))
			rx := func(h *hypervisor) float64 { return h.metrics(t)["rx_packets"] }
			h2rx := rx(h2)
			sent = send(t, sender, tc.group)
			time.Sleep(500 * time.Millisecond)
			if got := rx(h2) - h2rx; got > 10 { // a little NDP/IGMP may pass
				t.Errorf("%s still receives after leaving: %v packets", h2.name, got)
			}
			r1.expectStream(t, h1.guests[0], 1, sent) // the remaining member
			r1.stop()
		})
	}
	t.Run("NDP", func(t *testing.T) {
		ping(t, h1.guests[0], h3.guests[1].ip6)
		ping(t, h3.guests[0], h2.guests[1].ip6)
	})
}

// TestSendOnlyFlood: a guest on h1 sends one datagram to each of 5,000
// IPv4 and 5,000 IPv6 groups nobody joined, making h1's port a send-only
// member of each. Afterwards h1 must still serve real memberships: a
// second guest's IGMP join receives a stream from h2, and a new IPv6
// address on a third guest (its solicited-node group) answers ping -6
// from h2. The flood is not logged per frame: h1's log grows by a few
// lines at most.
func TestSendOnlyFlood(t *testing.T) {
	const lmqi = 500 * time.Millisecond
	tp := newTopoOpts(t, topoOpts{n: 2, guests: 3, extra: []string{"--mcast-last-member-interval", lmqi.String()}})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	flooder, listener, third := h1.guests[0], h1.guests[1], h1.guests[2]
	// The guests answer the start-up queries within lmqi: their joins
	// are logged before the log is measured.
	time.Sleep(2 * lmqi)
	logBefore := strings.Count(h1.log(), "\n")

	floodGroups(t, flooder, h1, 5000)
	m := h1.metrics(t)
	t.Logf("after the flood: groups %v, groups_send_only %v, groups_overflow %v", m["groups"], m["groups_send_only"], m["groups_overflow"])

	t.Run("IGMP join", func(t *testing.T) {
		const group = "239.77.0.1"
		mgid := groupMGID(group)
		r := startReceiver(t, listener, group)
		waitJoined(t, h1, mgid, true, 20*time.Second)
		r.expectStream(t, listener, 0, send(t, h2.guests[0], group))
	})

	t.Run("new IPv6 address", func(t *testing.T) {
		const addr = "fd77::1:13"
		sh(t, in(third.ns, "ip", "addr", "add", addr+"/64", "dev", "eth0", "nodad")...)
		// The guest reports its solicited-node group right away; h2's
		// guest finds the address with a solicitation to that group,
		// once h1 joined it.
		waitJoined(t, h1, groupMGID("ff02::1:ff01:13"), true, 20*time.Second)
		ping(t, h2.guests[0], addr)
	})

	t.Run("log", func(t *testing.T) {
		log := h1.log()
		if grew := strings.Count(log, "\n") - logBefore; grew > 5 {
			added := strings.SplitAfter(log, "\n")[logBefore:]
			byMsg := map[string]int{}
			for _, m := range logMsg.FindAllStringSubmatch(strings.Join(added, ""), -1) {
				byMsg[m[1]]++
			}
			t.Errorf("%s's log grew by %d lines from the flood on, want ≤ 5; by message: %v; the first:\n%s",
				h1.name, grew, byMsg, strings.Join(added[:min(10, len(added))], ""))
		}
	})
}

var logMsg = regexp.MustCompile(`level=\S+ msg=("[^"]*"|\S+)`)

// floodGroups sends, from guest g on hypervisor h, one UDP datagram to
// each of n IPv4 groups (239.0.0.1 on) and n IPv6 groups (ff15::1 on).
// It sends in bursts, each once the shim has read the one before, so
// that no frame is lost in the TAP's queue; the kernel's drop counter of
// h's TAP must not move.
func floodGroups(t *testing.T, g *guest, h *hypervisor, n int) {
	t.Helper()
	var c4, c6 net.PacketConn
	var zone string
	nsDo(t, g.ns, func() {
		var err error
		if c4, err = net.ListenPacket("udp4", g.ip4+":0"); err != nil {
			t.Fatal(err)
		}
		if c6, err = net.ListenPacket("udp6", "["+g.ip6+"]:0"); err != nil {
			t.Fatal(err)
		}
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		zone = strconv.Itoa(ifi.Index) // the name would be looked up in the test's namespace
	})
	defer c4.Close()
	defer c6.Close()
	tapDrops := func() string {
		return strings.Fields(sh(t, in(h.ns, "cat", "/sys/class/net/eib0/statistics/tx_dropped")...))[0]
	}
	drops0, base := tapDrops(), h.metrics(t)["tx_frames"]
	msg := []byte("send-only")
	const burst = 250
	start := time.Now()
	for i := 1; i <= n; i++ {
		g4 := &net.UDPAddr{IP: net.IPv4(239, byte(i>>16), byte(i>>8), byte(i)), Port: 5999}
		g6 := &net.UDPAddr{IP: net.IP{0xff, 0x15, 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)}, Port: 5999, Zone: zone}
		if _, err := c4.WriteTo(msg, g4); err != nil {
			t.Fatalf("send to %s: %v", g4, err)
		}
		if _, err := c6.WriteTo(msg, g6); err != nil {
			t.Fatalf("send to %s: %v", g6, err)
		}
		if i%burst != 0 && i != n {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for h.metrics(t)["tx_frames"]-base < float64(2*i) {
			if time.Now().After(deadline) {
				t.Fatalf("the shim read %v frames of the %d sent (TAP drops %s → %s)", h.metrics(t)["tx_frames"]-base, 2*i, drops0, tapDrops())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if d := tapDrops(); d != drops0 {
		t.Fatalf("the kernel dropped frames to the TAP during the flood: %s → %s", drops0, d)
	}
	t.Logf("flooded %d IPv4 and %d IPv6 groups in %v", n, n, time.Since(start).Round(time.Millisecond))
}
