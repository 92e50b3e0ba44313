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
// hypervisor.
func migrate(t *testing.T, from, to *hypervisor) {
	sh(t, in(from.ns, "ip", "link", "set", "vg1", "down")...)
	sh(t, in(from.ns, "ip", "link", "set", "vg1", "name", "vgm")...)
	sh(t, in(from.ns, "ip", "link", "set", "vgm", "netns", to.ns)...)
	sh(t, in(to.ns, "ip", "link", "set", "vgm", "master", "br0", "up")...)
}

// testMigration: guest g11 moves from h1 to h2 while g31 (on h3) and
// g12 (who stays on h1) ping it every 100 ms; announce says whether the
// moved guest then sends QEMU's RARP announcement. Both pings must
// resume within limit; the outages are logged.
func testMigration(t *testing.T, announce bool, limit time.Duration) {
	tp := newTopo(t, 3, true)
	h1, h2, h3 := tp.hvs[0], tp.hvs[1], tp.hvs[2]
	g11, g12, g31 := h1.guests[0], h1.guests[1], h3.guests[0]
	ping(t, g31, g11.ip4)
	ping(t, g12, g11.ip4)
	const n, every = 80, 100 * time.Millisecond
	type res struct {
		r   pingResult
		err error
	}
	results := make(chan res, 2)
	for _, g := range []*guest{g31, g12} {
		go func() {
			r, err := runPing(g, g11.ip4, n, 20*time.Second, "-i", "0.1")
			results <- res{r, err}
		}()
	}
	time.Sleep(time.Second)
	moved := time.Now()
	migrate(t, h1, h2)
	if announce {
		mac := g11.mac(t)
		if err := rawFrames(t, g11.ns, "eth0", 3, func(int) []byte { return rarp(mac) }); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("moved at %v", moved.Format(time.TimeOnly))
	for i, who := range []string{"first", "second"} {
		r := <-results
		o := outage(r.r, n, every)
		t.Logf("%s pinger: %d of %d answered, outage %v", who, r.r.rx, n, o)
		if r.r.rx == 0 || o > limit || !r.r.seqs[n] && !r.r.seqs[n-1] {
			t.Errorf("pinger %d: outage %v (limit %v), %d of %d answered, last answered? %v\n%s", i, o, limit, r.r.rx, n, r.r.seqs[n], r.r.out)
		}
	}
	ping(t, g31, g11.ip4) // and it stays reachable
}

// TestMigrationAnnounced: after the move the guest sends QEMU's RARP
// announcement; pings from a third hypervisor and from the hypervisor it
// left resume within 2 s.
func TestMigrationAnnounced(t *testing.T) { testMigration(t, true, 2*time.Second) }

// TestMigrationSilent: the same with a guest that stays silent until
// spoken to; pings resume within 5 s.
func TestMigrationSilent(t *testing.T) { testMigration(t, false, 5*time.Second) }
