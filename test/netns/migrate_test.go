package netns

import (
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// outage is the longest run of unanswered requests of a ping at interval
// every, as a duration (the requests after the last reply count too).
func outage(r pingResult, n int, every time.Duration) time.Duration {
	longest, run := 0, 0
	for seq := 1; seq <= n; seq++ {
		if r.seqs[seq] {
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	return time.Duration(longest) * every
}

// rarp is QEMU's announcement after a migration (qemu_announce_self): a
// broadcast RARP request (opcode 3) with the guest's MAC as sender and
// target and zero addresses.
func rarp(mac net.HardwareAddr) []byte {
	b := ethHeader(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac, 0x8035)
	b = binary.BigEndian.AppendUint16(b, 1)      // Ethernet
	b = binary.BigEndian.AppendUint16(b, 0x0800) // IPv4
	b = append(b, 6, 4)
	b = binary.BigEndian.AppendUint16(b, 3) // RARP request
	b = append(b, mac...)
	b = append(b, 0, 0, 0, 0)
	b = append(b, mac...)
	b = append(b, 0, 0, 0, 0)
	return append(b, make([]byte, 18)...) // padded to 60 bytes
}

// migrate moves guest g's port (vg1 of hypervisor from) to to's bridge,
// as a live migration moves a guest: same MAC and addresses, another
// hypervisor, and the same ARP and neighbour caches. A migrated guest's
// NIC never loses its carrier. The veth whose peer moves does, and Linux
// would then flush the guest's caches (neigh_carrier_down). The guest
// would re-resolve everything by broadcast on the new bridge, which
// hides what a real guest's stale caches do. So the guest's eth0 keeps
// them (arp_evict_nocarrier, ndisc_evict_nocarrier off).
func migrate(t *testing.T, g *guest, from, to *hypervisor) {
	sh(t, in(g.ns, "sysctl", "-q", "-w", "net.ipv4.conf.eth0.arp_evict_nocarrier=0", "net.ipv6.conf.eth0.ndisc_evict_nocarrier=0")...)
	sh(t, in(from.ns, "ip", "link", "set", "vg1", "down")...)
	sh(t, in(from.ns, "ip", "link", "set", "vg1", "name", "vgm")...)
	sh(t, in(from.ns, "ip", "link", "set", "vgm", "netns", to.ns)...)
	sh(t, in(to.ns, "ip", "link", "set", "vgm", "master", "br0", "up")...)
}

// testMigration: guest g11 moves from h1 to h2. Meanwhile g31 (on h3),
// g12 (who stays on h1) and g21 (on h2, the hypervisor it moves to) ping
// it every 100 ms, each over IPv4 and over IPv6 (with destOnly, g21
// alone). announce says whether the moved guest then sends QEMU's RARP
// announcement. Before the move, g21 reaches g11 through the fabric, so
// its ARP and neighbour caches hold the REMAC h2's shim shows for g11's
// QP on h1. Every ping must resume within limit of the move and be
// answered at its end. h2's shim must have told its guests where the
// guest went (tx_told_local). The outages (the longest run of unanswered
// requests) are logged.
func testMigration(t *testing.T, announce, destOnly bool, limit time.Duration) {
	tp := newTopo(t, 3, true)
	h1, h2, h3 := tp.hvs[0], tp.hvs[1], tp.hvs[2]
	g11, g12, g21, g31 := h1.guests[0], h1.guests[1], h2.guests[0], h3.guests[0]
	pingers := []struct {
		name string
		g    *guest
		dst  string
	}{
		{"g31 (third hypervisor) IPv4", g31, g11.ip4}, {"g31 (third hypervisor) IPv6", g31, g11.ip6},
		{"g12 (hypervisor left) IPv4", g12, g11.ip4}, {"g12 (hypervisor left) IPv6", g12, g11.ip6},
		{"g21 (destination hypervisor) IPv4", g21, g11.ip4}, {"g21 (destination hypervisor) IPv6", g21, g11.ip6},
	}
	if destOnly {
		pingers = pingers[4:]
	}
	for _, p := range pingers {
		ping(t, p.g, p.dst)
	}
	const n, every = 80, 100 * time.Millisecond
	type res struct {
		i   int
		r   pingResult
		err error
	}
	results := make(chan res, len(pingers))
	for i, p := range pingers {
		go func() {
			r, err := runPing(p.g, p.dst, n, 20*time.Second, "-i", "0.1")
			results <- res{i, r, err}
		}()
	}
	time.Sleep(time.Second)
	moved := time.Now()
	migrate(t, g11, h1, h2)
	if announce {
		mac := g11.mac(t)
		if err := rawFrames(t, g11.ns, "eth0", 3, func(int) []byte { return rarp(mac) }); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("moved at %v", moved.Format(time.TimeOnly))
	for range pingers {
		r := <-results
		o := outage(r.r, n, every)
		who := pingers[r.i].name
		t.Logf("%s: %d of %d answered, outage %v", who, r.r.rx, n, o)
		if r.r.rx == 0 || o > limit || !r.r.seqs[n] && !r.r.seqs[n-1] {
			t.Errorf("%s: outage %v (limit %v), %d of %d answered, last answered? %v\n%s", who, o, limit, r.r.rx, n, r.r.seqs[n], r.r.out)
		}
	}
	if m := h2.metrics(t); m["tx_told_local"] == 0 {
		t.Errorf("h2 told its guests nothing of the guest that moved there (tx_told_local 0)")
	}
	for _, p := range pingers { // and it stays reachable
		ping(t, p.g, p.dst)
	}
}

// TestMigrationAnnounced: after the move the guest sends QEMU's RARP
// announcement; pings from a third hypervisor, from the hypervisor it
// left and from the one it moved to, over IPv4 and IPv6, resume within
// 2 s.
func TestMigrationAnnounced(t *testing.T) { testMigration(t, true, false, 2*time.Second) }

// TestMigrationSilent: the same with a guest that stays silent until
// spoken to; pings resume within 5 s.
func TestMigrationSilent(t *testing.T) { testMigration(t, false, false, 5*time.Second) }

// TestMigrationAnnouncedDestination: only the guest on the hypervisor
// the guest moves to pings it, so nothing but the RARP announcement
// shows the move (no other hypervisor resolves the guest's address);
// its pings, over IPv4 and IPv6, resume within 2 s.
func TestMigrationAnnouncedDestination(t *testing.T) { testMigration(t, true, true, 2*time.Second) }
