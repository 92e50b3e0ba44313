package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/ipoib"
)

// The daemon under faults and floods: each test bounded in time, each
// asserting what was kept (traffic, counts, memory).

// rssKB returns the resident set of the hypervisor's daemon in KB.
func (h *hypervisor) rssKB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Fatalf("no VmRSS for %s", h.name)
	return 0
}

// running fails the test if the hypervisor's daemon has exited.
func (h *hypervisor) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-h.done:
		h.done <- err
		t.Fatalf("eipoibd in %s exited: %v\n%s", h.name, err, abridge(h.log(), 20, 20))
	default:
	}
}

// logClean fails the test if the daemon logged a warning or an error.
func (h *hypervisor) logClean(t *testing.T) {
	t.Helper()
	for _, l := range strings.Split(h.log(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("%s logged: %s", h.name, l)
		}
	}
}

// rawFrames writes n Ethernet frames made by frame into dev in namespace
// ns, with an AF_PACKET socket, as a guest's own driver would hand them
// over. It writes about 40,000 a second, so that the bridge and the
// TAP's queue, not the sender, are what is tested.
func rawFrames(t *testing.T, ns, dev string, n int, frame func(i int) []byte) error {
	return rawFramesPaced(t, ns, dev, n, frame, n, nil)
}

// rawFramesPaced is rawFrames that, after every burst frames and after
// the last, calls caughtUp with the number written so far. It writes on
// only once caughtUp returns nil. With caughtUp waiting until the reader
// has taken all of them, the writer never has more than burst frames in
// flight, however late the reader is scheduled.
func rawFramesPaced(t *testing.T, ns, dev string, n int, frame func(i int) []byte, burst int, caughtUp func(sent int) error) error {
	var err error
	nsDo(t, ns, func() {
		var ifi *net.Interface
		if ifi, err = net.InterfaceByName(dev); err != nil {
			return
		}
		var fd int
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0); err != nil {
			return
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index}
		start := time.Now()
		for i := 0; i < n; i++ {
			if err = unix.Sendto(fd, frame(i), 0, to); err != nil {
				err = fmt.Errorf("frame %d: %w", i, err)
				return
			}
			if caughtUp != nil && ((i+1)%burst == 0 || i+1 == n) {
				if err = caughtUp(i + 1); err != nil {
					return
				}
			}
			if ahead := time.Duration(i)*time.Second/40000 - time.Since(start); ahead > time.Millisecond {
				time.Sleep(ahead)
			}
		}
	})
	return err
}

// pingDuring pings dst from g n times while fn runs (in the test's
// goroutine) and fails the test unless every request was answered once.
func pingDuring(t *testing.T, g *guest, dst string, n int, fn func()) {
	t.Helper()
	nstestRequire(t, "ping")
	type result struct {
		r   pingResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := runPing(g, dst, n, time.Duration(n)*200*time.Millisecond+5*time.Second)
		done <- result{r, err}
	}()
	fn()
	res := <-done
	if res.err != nil || !res.r.lossless(n) {
		t.Errorf("ping %s → %s during the flood: replies to %v of requests 1–%d (%d transmitted, %d received, %d duplicates): %v\n%s",
			g.ns, dst, sortedKeys(res.r.seqs), n, res.r.tx, res.r.rx, res.r.dups, res.err, res.r.out)
	}
}

// ethHeader returns an Ethernet header.
func ethHeader(dst, src net.HardwareAddr, et uint16) []byte {
	b := append(append(make([]byte, 0, 64), dst...), src...)
	return binary.BigEndian.AppendUint16(b, et)
}

// TestLossyFabric: TCP runs both ways at once for 20 s over a fabric
// that loses, duplicates and reorders 1 % of the packets and corrupts
// 0.5 %. Both transfers complete with the bytes sent equal to the bytes
// received. Every unicast packet one port corrupted, the other counted
// as a bad ICRC. It counted a corrupted multicast one at most, as the
// peer receives it only if it is a member of the group. Nothing else
// went missing unaccounted (no receive-queue overflow). Neither daemon
// logged a warning or an error.
func TestLossyFabric(t *testing.T) {
	nstestRequire(t, "iperf") // tcpTransfer's
	tp := newTopo(t, 2, false, "--fault", "loss=0.01,dup=0.01,reorder=0.01,corrupt=0.005")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	before1, before2 := h1.metrics(t), h2.metrics(t)
	type result struct {
		sent, rcvd int64
		err        error
	}
	var res [2]result
	var wg sync.WaitGroup
	for i, p := range [][2]*guest{{g21, g11}, {g11, g21}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].sent, res[i].rcvd, res[i].err = tcpTransfer(p[0], p[1], "-t", "20")
		}()
	}
	wg.Wait()
	// The reorder fault holds a packet back until the port's next send:
	// a few more packets each way flush the last one held (maybe a
	// corrupted one) before the counters are read. Their own loss does
	// not matter here.
	runPing(g11, g21.ip4, 3, 2*time.Second)
	runPing(g21, g11.ip4, 3, 2*time.Second)
	for i, r := range res {
		if r.err != nil || r.sent <= 0 || r.sent != r.rcvd {
			t.Errorf("transfer %d: %d bytes sent, %d received: %v", i+1, r.sent, r.rcvd, r.err)
		} else {
			t.Logf("transfer %d: %d bytes in 20 s, sent = received", i+1, r.sent)
		}
	}
	// The two daemons' counters are read one after the other while the
	// last packets may still be in flight: read until they settle.
	rise := func(a, b map[string]float64, k string) float64 { return a[k] - b[k] }
	type pair struct {
		from, to               *hypervisor
		fromA, fromB, toA, toB map[string]float64
	}
	var pairs []pair
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		after1, after2 := h1.metrics(t), h2.metrics(t)
		pairs = []pair{{h1, h2, after1, before1, after2, before2}, {h2, h1, after2, before2, after1, before1}}
		settled := true
		for _, c := range pairs {
			uni, mc, bad := rise(c.fromA, c.fromB, "port_tx_fault_corrupt"), rise(c.fromA, c.fromB, "port_tx_fault_corrupt_multicast"), rise(c.toA, c.toB, "port_drop_bad_icrc")
			settled = settled && bad >= uni && bad <= uni+mc
		}
		if settled || time.Now().After(deadline) {
			break
		}
	}
	for _, c := range pairs {
		// Each corrupted unicast packet reaches the peer; a corrupted
		// multicast one only when the peer is a member of its group.
		corrupted, mc, bad := rise(c.fromA, c.fromB, "port_tx_fault_corrupt"), rise(c.fromA, c.fromB, "port_tx_fault_corrupt_multicast"), rise(c.toA, c.toB, "port_drop_bad_icrc")
		if corrupted == 0 || bad < corrupted || bad > corrupted+mc {
			t.Errorf("%s corrupted %v unicast and %v multicast packets, %s counted %v bad ICRCs; want all the unicast ones and at most the multicast ones", c.from.name, corrupted, mc, c.to.name, bad)
		} else {
			t.Logf("%s corrupted %v unicast and %v multicast packets, %s counted %v bad ICRCs", c.from.name, corrupted, mc, c.to.name, bad)
		}
		if o := rise(c.toA, c.toB, "port_drop_rx_queue_overflow"); o != 0 {
			t.Errorf("%s: %v packets lost in the kernel's receive queue", c.to.name, o)
		}
	}
	for _, h := range tp.hvs {
		h.running(t)
		h.logClean(t)
	}
}

// TestMACFlood: a guest sends 20,000 frames from as many random source
// MACs, paced so that the kernel drops none on the way. The VIFs stay at
// --max-vifs (8). Each flood frame is counted once: a VIF, up to the
// limit, or drop_vif_limit, or drop_vif_pending_full when it came while
// the new guests being made held as many frames as they may. The other
// guests keep pinging across the fabric with no loss. The daemon's RSS
// grows by less than 16 MB (reported). It logs one line per VIF it
// created and a single warning for all the MACs it refused, and nothing
// else.
func TestMACFlood(t *testing.T) {
	tp := newTopo(t, 2, false, "--max-vifs", "8")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21 := h1.guests[0], h1.guests[1], h2.guests[0]
	ping(t, g11, g21.ip4)
	ping(t, g12, g21.ip4)
	quiet(t, h1)
	before, rss := h1.metrics(t), h1.rssKB(t)
	logLines := len(strings.Split(h1.log(), "\n"))
	const n = 20000
	rng := rand.New(rand.NewPCG(1, 2))
	// A valid IPv4 UDP datagram to the subnet's broadcast: nothing but
	// its source MAC is wrong with it.
	ip := []byte{0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 12, 10, 77, 0, 255, 0, 9, 0, 9, 0, 8, 0, 0}
	csum.IPv4Header(ip[:20]) // br_netfilter, when loaded, drops bad IP headers at the bridge
	// Each flood frame is counted once: a VIF made for its MAC, or
	// refused by the bound or by the frames new guests may hold (no
	// other new MAC speaks: quiet). The
	// writer waits for the count after each quarter of the TAP's queue,
	// so that the kernel drops none of the flood on the way.
	counted := func(after map[string]float64) (c float64) {
		for _, k := range []string{"vifs_created", "drop_vif_limit", "drop_vif_pending_full"} {
			c += after[k] - before[k]
		}
		return c
	}
	p := pacer(t, g12, h1, counted)
	pingDuring(t, g11, g21.ip4, 10, func() {
		err := rawFramesPaced(t, g12.ns, "eth0", n, func(int) []byte {
			src := make(net.HardwareAddr, 6)
			binary.BigEndian.PutUint32(src[2:], rng.Uint32())
			src[0], src[1] = 0x02, byte(rng.Uint32())
			return append(ethHeader(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src, 0x0800), ip...)
		}, p.burst, p.caughtUp)
		if err != nil {
			t.Error(err)
		}
	})
	p.checkHops(t)
	after := h1.metrics(t)
	if c := counted(after); c != n {
		t.Errorf("%v flood frames counted (VIFs created + drop_vif_limit + drop_vif_pending_full), want %d", c, n)
	}
	if after["vifs"] != 8 {
		t.Errorf("%v VIFs after the flood, want --max-vifs 8", after["vifs"])
	}
	pingN(t, g12, g21.ip4, 3) // the flooding guest's own VIF was kept too
	grown := h1.rssKB(t) - rss
	t.Logf("MAC flood of %d source MACs: RSS %d KB before, grew by %d KB", n, rss, grown)
	if grown > 16<<10 {
		t.Errorf("RSS grew by %d KB, want under 16 MB", grown)
	}
	// One line per VIF created (up to the limit), one warning for all
	// the MACs refused (at most one a minute).
	created := int(after["vifs_created"] - before["vifs_created"])
	lines := strings.Split(strings.TrimSpace(h1.log()), "\n")[logLines-1:]
	var vifLines, refused int
	for _, l := range lines {
		switch {
		case strings.Contains(l, `msg="VIF created"`):
			vifLines++
		case strings.Contains(l, `level=WARN msg="new guest MAC refused"`):
			refused++
		}
	}
	if vifLines != created || refused != 1 || len(lines) != created+1 {
		t.Errorf("%d log lines during the flood, %d of VIFs created and %d of MACs refused; want %d: the %d VIFs created and one warning:\n%s",
			len(lines), vifLines, refused, created+1, created, strings.Join(lines, "\n"))
	}
	h1.running(t)
}

// fabricFlood sends n UDP datagrams, datagram(i, …) each, from
// hypervisor from's underlay address (a process on the fabric) to to's
// port, paced by to's socket (fabricFloodFrom): the kernel drops none of
// a flood, nor of the pings it is tested against, however loaded the
// machine.
func fabricFlood(t *testing.T, from, to *hypervisor, n int, datagram func(i int, src, dst *[16]byte, sport uint16) []byte) {
	t.Helper()
	if err := fabricFloodFrom(from, to, from.gid(t), to.gid(t), n, datagram); err != nil {
		t.Error(err)
	}
}

// floodBurst is how many datagrams fabricFloodFrom sends before it waits
// for to's port socket to be drained: far fewer than its receive buffer
// holds.
const floodBurst = 64

// fabricFloodFrom is fabricFlood from address src to dst (to's), for a
// goroutine other than the test's: it reports what went wrong instead
// of failing the test. Every floodBurst datagrams it waits until to's
// port socket has nothing queued (the daemon read all it was sent), so
// that the socket never overflows however late the daemon is scheduled
// on a loaded machine; a rate would assume a speed. It reports the
// datagrams the kernel dropped at that socket meanwhile, if any.
func fabricFloodFrom(from, to *hypervisor, src, dst netip.Addr, n int, datagram func(i int, src, dst *[16]byte, sport uint16) []byte) error {
	port, err := openUDP6(to)
	if err != nil {
		return err
	}
	defer port.close()
	_, dropsBefore, err := port.state()
	if err != nil {
		return err
	}
	err = nstest.DoErr(from.ns, func() error {
		c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: src.AsSlice(), Zone: from.underlay})
		if err != nil {
			return err
		}
		defer c.Close()
		sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
		s16, d16 := src.As16(), dst.As16()
		addr := &net.UDPAddr{IP: dst.AsSlice(), Zone: from.underlay, Port: simfabric.UDPPort}
		for i := 0; i < n; i++ {
			if i > 0 && i%floodBurst == 0 {
				if err := port.waitDrained(to.name, i); err != nil {
					return err
				}
			}
			if _, err := c.WriteToUDP(datagram(i, &s16, &d16, sport), addr); err != nil {
				return fmt.Errorf("datagram %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if _, drops, err := port.state(); err != nil || drops != dropsBefore {
		return errors.Join(err, fmt.Errorf("the kernel dropped %d datagrams of the flood at %s's port socket", drops-dropsBefore, to.name))
	}
	return nil
}

// udp6Table is /proc/net/udp6 of a hypervisor's namespace, opened there
// (the file shows the namespace of the thread that opened it), read again
// from any thread.
type udp6Table struct{ f *os.File }

func openUDP6(h *hypervisor) (udp6Table, error) {
	var f *os.File
	err := nstest.DoErr(h.ns, func() (err error) {
		f, err = os.Open("/proc/thread-self/net/udp6")
		return err
	})
	return udp6Table{f}, err
}

func (u udp6Table) close() { u.f.Close() }

// state returns the bytes queued on the sockets bound to the simulated
// fabric's port and the datagrams the kernel dropped at them (the
// rx_queue and drops columns: udp6_sock_seq_show, net/ipv6/udp.c, and
// __ip6_dgram_sock_seq_show, net/ipv6/datagram.c).
func (u udp6Table) state() (queued, drops uint64, err error) {
	b, err := io.ReadAll(io.NewSectionReader(u.f, 0, 1<<20))
	if err != nil {
		return 0, 0, err
	}
	port := fmt.Sprintf(":%04X", simfabric.UDPPort)
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 13 || !strings.HasSuffix(f[1], port) {
			continue
		}
		_, rx, _ := strings.Cut(f[4], ":")
		q, err1 := strconv.ParseUint(rx, 16, 64)
		d, err2 := strconv.ParseUint(f[len(f)-1], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("/proc/net/udp6 line %q: %w", l, err)
		}
		queued += q
		drops += d
	}
	return queued, drops, nil
}

// waitDrained waits until nothing is queued on the port socket (of
// hypervisor name, after datagram sent), 20 s at most.
func (u udp6Table) waitDrained(name string, sent int) error {
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		queued, _, err := u.state()
		if err != nil || queued == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's port socket not drained 20 s after datagram %d", name, sent)
		}
	}
}

// floodFabric sends n fabric packets, pkt(i) each (packet and payload),
// from hypervisor from's underlay to to's port, encoded with the
// simulated fabric's codec so that each ICRC, which covers the IPv6
// addresses and UDP ports, is valid.
func floodFabric(t *testing.T, from, to *hypervisor, n int, pkt func(i int) (simfabric.Packet, []byte)) {
	var codec simfabric.Codec
	buf := make([]byte, 4200)
	fabricFlood(t, from, to, n, func(i int, src, dst *[16]byte, sport uint16) []byte {
		p, pay := pkt(i)
		copy(buf[simfabric.HeaderLen:], pay)
		return codec.Encode(buf[:simfabric.HeaderLen+len(pay)], simfabric.HeaderLen, &p, src, dst, sport, simfabric.UDPPort)
	})
}

// ipoibARP returns an IPoIB payload: header and an IPoIB ARP request
// from sha/spa for tpa.
func ipoibARP(sha ipoib.HwAddr, spa, tpa netip.Addr) []byte {
	b := []byte{0x08, 0x06, 0, 0, 0, 32, 0x08, 0x00, 20, 4, 0, 1}
	b = append(b, sha[:]...)
	b = append(b, spa.AsSlice()...)
	b = append(b, make([]byte, 20)...)
	return append(b, tpa.AsSlice()...)
}

// TestNeighbourFlood: a process on the fabric sends ARP requests from
// 200,000 distinct (GID, QPN) pairs to a hypervisor with
// --max-neighbours 1000, while one of its guests pings a guest across
// the fabric. The table stays at 1,000 entries. The live guests'
// neighbours are never evicted while in use: the pinging guest's frames
// never wait for a resolution (tx_queued does not rise), and every ping
// is answered. The RSS grows by less than 32 MB (reported).
func TestNeighbourFlood(t *testing.T) {
	tp := newTopo(t, 2, false, "--max-neighbours", "1000")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	ping(t, g11, g21.ip4)
	before, rss := h1.metrics(t), h1.rssKB(t)
	const n = 200000
	gid := ipoib.GID(h2.gid(t).As16())
	dst := h1.vifQPN(g11.mac(t).String(), 0)
	spa, tpa := netip.MustParseAddr("10.77.0.249"), netip.MustParseAddr("10.77.0.250")
	pingDuring(t, g11, g21.ip4, 15, func() {
		floodFabric(t, h2, h1, n, func(i int) (simfabric.Packet, []byte) {
			qpn := 0x100000 + uint32(i)
			return simfabric.Packet{PKey: 0xffff, DestQPN: dst, QKey: ipoib.QKey, SrcQPN: qpn, PSN: uint32(i)},
				ipoibARP(ipoib.MakeHwAddr(0, qpn, gid), spa, tpa)
		})
	})
	after := h1.metrics(t)
	if after["neighbours"] != 1000 {
		t.Errorf("%v neighbours after the flood, want --max-neighbours 1000", after["neighbours"])
	}
	if d := after["tx_queued"] - before["tx_queued"]; d != 0 {
		t.Errorf("tx_queued rose by %v: a live neighbour was evicted while in use", d)
	}
	grown := h1.rssKB(t) - rss
	t.Logf("neighbour flood of %d endpoints: %v learned, %v evicted; RSS %d KB before, grew by %d KB",
		n, after["neighbours_learned"]-before["neighbours_learned"], after["neighbours_evicted"]-before["neighbours_evicted"], rss, grown)
	// The table itself is bounded (checked above); what RSS adds is the
	// garbage the flood leaves, up to the collector's goal over the live
	// heap.
	if grown > 32<<10 {
		t.Errorf("RSS grew by %d KB, want under 32 MB", grown)
	}
	ping(t, g11, g21.ip4)
	h1.running(t)
}

// TestGarbage: 100,000 random datagrams (1 to 1,500 random bytes) go to
// one hypervisor's UDP 4791 and 100,000 malformed frames into the
// other's TAP, in about 3 s on a quiet machine. The frames go in bursts
// of a quarter of the TAP's queue, each once the daemon has read the one
// before. So the kernel drops none of them however loaded the machine
// (checked: no drop counter of the hops rises). Both daemons stay up.
// Each datagram is counted once under a port drop reason. Each frame is
// counted once under the drop its fault calls for: a VLAN with no
// partition, an ethertype IPoIB does not carry, an ARP packet with a bad
// hardware length. Guests keep pinging across both with no loss.
func TestGarbage(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	ping(t, g11, g21.ip4)
	ping(t, g21, g11.ip4)
	// g11 as g21 sees it: the frames reach the TAP only.
	f := strings.Fields(sh(t, in(g21.ns, "ip", "neigh", "show", g11.ip4, "dev", "eth0")...))
	if len(f) < 3 || f[1] != "lladdr" {
		t.Fatalf("no neighbour entry for %s in %s: %v", g11.ip4, g21.ns, f)
	}
	remac, _ := net.ParseMAC(f[2])
	src := g21.mac(t)
	before1, before2 := h1.metrics(t), h2.metrics(t)
	const n = 100000
	// Faults the bridge lets through (with br_netfilter loaded, it
	// drops bad IP headers itself): a VLAN with no P_Key, an ethertype
	// IPoIB does not carry, ARP with a 9-byte hardware address.
	tagged := append(ethHeader(remac, src, 0x8100), 0, 77, 0x08, 0x00)
	tagged = append(tagged, make([]byte, 42)...)
	ipx := append(ethHeader(remac, src, 0x8137), make([]byte, 46)...)
	badARP := append(ethHeader(remac, src, 0x0806), make([]byte, 46)...)
	copy(badARP[14:], []byte{0, 1, 8, 0, 9, 4, 0, 1}) // a 9-byte hardware address
	want := map[string]float64{"drop_vlan_unmapped": n/3 + 1, "drop_ethertype": n / 3, "drop_tx_rewrite": n / 3}
	// The writer goes on after each quarter queue only once h2 has
	// counted every frame written so far, and the kernel must drop none
	// of them anywhere on the way.
	p := pacer(t, g21, h2, func(after map[string]float64) (c float64) {
		for k := range want {
			c += after[k] - before2[k]
		}
		return c
	})
	pingDuring(t, g11, g21.ip4, 10, func() {
		var wg sync.WaitGroup
		var floodErr error
		src, dst := h2.gid(t), h1.gid(t)
		wg.Add(1)
		go func() { // no t.Fatal here: fabricFloodFrom returns its error
			defer wg.Done()
			rng, buf := rand.New(rand.NewPCG(3, 4)), make([]byte, 1500)
			floodErr = fabricFloodFrom(h2, h1, src, dst, n, func(int, *[16]byte, *[16]byte, uint16) []byte {
				b := buf[:1+rng.IntN(len(buf))]
				for j := range b {
					b[j] = byte(rng.Uint32())
				}
				return b
			})
		}()
		err := rawFramesPaced(t, g21.ns, "eth0", n, func(i int) []byte { return [][]byte{tagged, ipx, badARP}[i%3] },
			p.burst, p.caughtUp)
		wg.Wait()
		if err := errors.Join(err, floodErr); err != nil {
			t.Error(err)
		}
	})
	p.checkHops(t)
	var after1, after2 map[string]float64
	deadline := time.Now().Add(20 * time.Second)
	for {
		after1, after2 = h1.metrics(t), h2.metrics(t)
		var ports, frames float64
		for k, v := range after1 {
			if strings.HasPrefix(k, "port_drop_") {
				ports += v - before1[k]
			}
		}
		for k := range want {
			frames += after2[k] - before2[k]
		}
		if ports >= n && frames >= n || time.Now().After(deadline) {
			if ports != n {
				t.Errorf("%s: port drops rose by %v, want %d (one reason each)", h1.name, ports, n)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k, v := range want {
		if d := after2[k] - before2[k]; d != v {
			t.Errorf("%s: %s rose by %v, want %v", h2.name, k, d, v)
		}
	}
	for k, v := range after2 {
		if _, expected := want[k]; !expected && isDrop(k) && v != before2[k] {
			t.Errorf("%s: %s rose by %v, want 0", h2.name, k, v-before2[k])
		}
	}
	t.Logf("%s's port drops by reason: %s", h1.name, dropRises(before1, after1))
	t.Logf("%s read the %d frames in bursts of %d, %v frames in all (tx_frames); the kernel's drop counters of the hops stayed at %+v",
		h2.name, n, p.burst, after2["tx_frames"]-before2["tx_frames"], p.hopsBefore)
	pingN(t, g21, g11.ip4, 3)
	for _, h := range tp.hvs {
		h.running(t)
	}
}

// linkNumber reads the number in /sys/class/net/dev/file of namespace
// ns: a link attribute such as tx_queue_len, or a counter under
// statistics/.
func linkNumber(t *testing.T, ns, dev, file string) uint64 {
	t.Helper()
	out := strings.TrimSpace(sh(t, in(ns, "cat", "/sys/class/net/"+dev+"/"+file)...))
	v, err := strconv.ParseUint(out, 10, 64)
	if err != nil {
		t.Fatalf("%s of %s in %s: %v", file, dev, ns, err)
	}
	return v
}

// hopCounts are the kernel's drop counters of the hops a guest's frame
// crosses to its hypervisor's TAP:
//   - the guest's veth (tx: veth_xmit counts what its peer refused);
//   - its peer on the bridge (rx: dev.c enqueue_to_backlog counts a full
//     backlog against the receiving device);
//   - the TAP (tx: tun.c tun_net_xmit counts a full queue).
type hopCounts struct{ guestTx, peerRx, tapTx uint64 }

// hopDrops reads the drop counters of the hops from g's eth0, a guest
// of h, to h's TAP.
func hopDrops(t *testing.T, g *guest, h *hypervisor) hopCounts {
	t.Helper()
	peer := fmt.Sprintf("vg%d", slices.Index(h.guests, g)+1) // newTopo's name for g's peer
	return hopCounts{
		guestTx: linkNumber(t, g.ns, "eth0", "statistics/tx_dropped"),
		peerRx:  linkNumber(t, h.ns, peer, "statistics/rx_dropped"),
		tapTx:   linkNumber(t, h.ns, "eib0", "statistics/tx_dropped"),
	}
}

// quiet stops h's bridge and TAP sending frames of their own (IPv6 off:
// no DAD, MLD or router solicitation; they have no IPv4 address). So
// every new source MAC h's daemon sees from then on is a guest's, and a
// flood's count is exact.
func quiet(t *testing.T, h *hypervisor) {
	t.Helper()
	for _, dev := range []string{"br0", "eib0"} {
		sh(t, in(h.ns, "sysctl", "-qw", "net.ipv6.conf."+dev+".disable_ipv6=1")...)
	}
}

// pace is how a test paces frames from a guest to its hypervisor's TAP
// (pacer): rawFramesPaced's burst and caughtUp, and the kernel's drop
// counters on the way when it began.
type pace struct {
	burst      int
	caughtUp   func(sent int) error
	hopsBefore hopCounts
	g          *guest
	h          *hypervisor
}

// checkHops fails the test when the kernel dropped frames on the way
// from the guest to the TAP since the pacing began.
func (p *pace) checkHops(t *testing.T) {
	t.Helper()
	if hops := hopDrops(t, p.g, p.h); hops != p.hopsBefore {
		t.Errorf("the kernel dropped frames on the way to %s's TAP: %+v, then %+v", p.h.name, p.hopsBefore, hops)
	}
}

// pacer returns the pace for frames from guest g of h: bursts of a
// quarter of the TAP's queue of tx_queue_len frames. That queue
// overflows whenever the writer fills it before eipoibd is scheduled to
// read it, as on a loaded machine (tun.c tun_net_xmit: a full ptr_ring
// is a drop, counted in tx_dropped). caughtUp waits until counted (of
// h's metrics) has reached the frames written so far, and fails when it
// is not exactly that by a deadline. It reads the metrics every 10 ms:
// each read is a whole scrape, whose garbage a test of the daemon's RSS
// would otherwise measure.
func pacer(t *testing.T, g *guest, h *hypervisor, counted func(map[string]float64) float64) *pace {
	p := &pace{burst: int(linkNumber(t, h.ns, "eib0", "tx_queue_len")) / 4, hopsBefore: hopDrops(t, g, h), g: g, h: h}
	p.caughtUp = func(sent int) error {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			m, err := h.readMetrics(t)
			if err != nil {
				return err
			}
			if c := counted(m); c >= float64(sent) || time.Now().After(deadline) {
				if c != float64(sent) {
					return fmt.Errorf("%s counted %v of the %d frames written so far; kernel drops on the way %+v, now %+v",
						h.name, c, sent, p.hopsBefore, hopDrops(t, g, h))
				}
				return nil
			}
		}
	}
	return p
}

// dropRises formats the port drop counters that rose.
func dropRises(before, after map[string]float64) string {
	var s []string
	for k, v := range after {
		if strings.HasPrefix(k, "port_drop_") && v != before[k] {
			s = append(s, fmt.Sprintf("%s +%v", strings.TrimPrefix(k, "port_drop_"), v-before[k]))
		}
	}
	return strings.Join(s, ", ")
}

// TestCrashRestart: eipoibd is killed (SIGKILL) in the middle of a TCP
// transfer and started again. The connection recovers, and the transfer,
// which spans the crash, completes with exactly the bytes sent. (iperf 2
// is paced so that it is still running at the kill, whatever TCP's
// retransmission backoff makes of the outage.) A new connection's exact
// transfer follows. A clean stop afterwards leaves nothing behind: exit
// status 0, no TAP, no multicast group on the underlay, no child
// process, no process at all.
func TestCrashRestart(t *testing.T) {
	nstestRequire(t, "iperf")
	tp := newTopo(t, 2, false)
	h1 := tp.hvs[0]
	g11, g21 := h1.guests[0], tp.hvs[1].guests[0]
	ping(t, g11, g21.ip4)
	// 200 MB at 200 Mbit/s: about 8 s, of which the kill comes after 2.
	const n = 200 << 20
	type transfer struct {
		sent, rcvd int64
		err        error
	}
	across := make(chan transfer, 1)
	go func() {
		sent, rcvd, err := tcpTransfer(g21, g11, "-n", strconv.Itoa(n), "-b", "200M")
		across <- transfer{sent, rcvd, err}
	}()
	time.Sleep(2 * time.Second)
	select {
	case r := <-across:
		t.Fatalf("the transfer ended before the crash (%d bytes sent, %d received: %v): it cannot show recovery", r.sent, r.rcvd, r.err)
	default:
	}
	killed := time.Now()
	h1.cmd.Process.Kill()
	<-h1.done
	h1.cmd = nil
	for i := 0; ; i++ { // the kernel removes the TAP with the last file descriptor
		if _, err := shErr(in(h1.ns, "ip", "link", "show", "eib0")...); err != nil {
			break
		}
		if i == 50 {
			t.Fatal("TAP eib0 survived its daemon's death")
		}
		time.Sleep(20 * time.Millisecond)
	}
	h1.start(t)
	t.Logf("killed and started again in %v", time.Since(killed).Round(time.Millisecond))
	select {
	case r := <-across:
		if r.err != nil || r.sent != n || r.rcvd != n {
			t.Fatalf("TCP transfer across the crash: %d bytes sent, %d received, want %d both: %v", r.sent, r.rcvd, n, r.err)
		}
		t.Logf("TCP transfer across the crash: %d bytes, done %v after the kill", n, time.Since(killed).Round(time.Millisecond))
	case <-time.After(90 * time.Second):
		t.Fatal("the TCP transfer across the crash did not finish within 90 s of the restart")
	}
	tcpBytes(t, g21, g11, 10<<20)

	pid := h1.cmd.Process.Pid
	if kids := children(pid); len(kids) > 0 {
		t.Errorf("eipoibd (pid %d) has child processes %v", pid, kids)
	}
	h1.stop(t, true)
	if out := sh(t, in(h1.ns, "ip", "-6", "maddr", "show", "dev", h1.underlay)...); strings.Contains(out, "ff12:") {
		t.Errorf("IPoIB groups still joined on %s after a clean stop:\n%s", h1.underlay, out)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("process %d still exists after a clean stop", pid)
	}
}

// children returns the pids whose parent is pid.
func children(pid int) []int {
	var kids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so cut after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			k, _ := strconv.Atoi(e.Name())
			kids = append(kids, k)
		}
	}
	return kids
}
