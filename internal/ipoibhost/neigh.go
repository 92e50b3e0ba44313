package ipoibhost

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// Resolution limits, as Linux's defaults for ARP and NDP: three packets
// wait per destination, solicitations go out a second apart, three of
// them, then the waiting packets are dropped.
const (
	pendingPerDst  = 3
	maxPendingDsts = 256
	solicitTries   = 3
	solicitEvery   = time.Second
)

// neighbour is one resolved IP address.
type neighbour struct {
	hw        ipoib.HwAddr
	confirmed time.Time // last ARP or NDP message that stated it
}

// resolution is a destination being resolved and the packets waiting
// for it (copies of IP packets).
type resolution struct {
	pkts  [][]byte
	tries int
	next  time.Time
}

// neighTable maps IP addresses to IPoIB hardware addresses (the host's
// ARP and NDP cache) and holds the packets waiting for a resolution.
// Lookups take a read lock and allocate nothing; learning, evicting and
// queueing take the write lock.
type neighTable struct {
	mu      sync.RWMutex
	max     int
	m       map[netip.Addr]neighbour
	pending map[netip.Addr]*resolution
	version atomic.Uint64 // bumped on every change of m
}

func newNeighTable(max int) *neighTable {
	return &neighTable{max: max, m: make(map[netip.Addr]neighbour), pending: make(map[netip.Addr]*resolution)}
}

// lookup returns the hardware address of ip.
func (t *neighTable) lookup(ip netip.Addr) (ipoib.HwAddr, bool) {
	t.mu.RLock()
	n, ok := t.m[ip]
	t.mu.RUnlock()
	return n.hw, ok
}

// has reports whether ip is known or being resolved.
func (t *neighTable) has(ip netip.Addr) bool {
	t.mu.RLock()
	_, known := t.m[ip]
	_, asked := t.pending[ip]
	t.mu.RUnlock()
	return known || asked
}

// learn records ip at hw, evicting the least recently confirmed entry of a
// full table, and returns the packets that waited for it. evicted reports
// whether an entry had to go.
func (t *neighTable) learn(ip netip.Addr, hw ipoib.HwAddr, now time.Time) (waiting [][]byte, evicted bool) {
	hw = hw.WithoutFlags() // UD only: connected mode is never used
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.m[ip]
	if !ok && len(t.m) >= t.max {
		var victim netip.Addr
		var oldest time.Time
		for a, n := range t.m {
			if !victim.IsValid() || n.confirmed.Before(oldest) {
				victim, oldest = a, n.confirmed
			}
		}
		delete(t.m, victim)
		evicted = true
	}
	t.m[ip] = neighbour{hw: hw, confirmed: now}
	if !ok || old.hw != hw {
		t.version.Add(1)
	}
	if r, ok := t.pending[ip]; ok {
		waiting = r.pkts
		delete(t.pending, ip)
	}
	return waiting, evicted
}

// forget removes the entries not confirmed for ttl and returns how many.
func (t *neighTable) forget(now time.Time, ttl time.Duration) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for a, e := range t.m {
		if now.Sub(e.confirmed) >= ttl {
			delete(t.m, a)
			n++
		}
	}
	if n > 0 {
		t.version.Add(1)
	}
	return n
}

// enqueue keeps a copy of pkt until dst is resolved. solicit reports that
// dst is new, so a solicitation must go out now; queued is false when the
// packet was dropped (queue full).
func (t *neighTable) enqueue(dst netip.Addr, pkt []byte, now time.Time) (queued, solicit bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.pending[dst]
	if !ok {
		if len(t.pending) >= maxPendingDsts {
			return false, false
		}
		r = &resolution{tries: 1, next: now.Add(solicitEvery)}
		t.pending[dst] = r
		solicit = true
	}
	if len(r.pkts) >= pendingPerDst {
		return false, solicit
	}
	r.pkts = append(r.pkts, append([]byte(nil), pkt...))
	return true, solicit
}

// tick returns the destinations due for another solicitation and the
// number of packets dropped because their destination stayed silent.
func (t *neighTable) tick(now time.Time) (again []netip.Addr, dropped int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for dst, r := range t.pending {
		if now.Before(r.next) {
			continue
		}
		if r.tries >= solicitTries {
			dropped += len(r.pkts)
			delete(t.pending, dst)
			continue
		}
		r.tries++
		r.next = now.Add(solicitEvery)
		again = append(again, dst)
	}
	return again, dropped
}

// size returns the number of entries and of destinations being resolved.
func (t *neighTable) size() (entries, resolving int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.m), len(t.pending)
}

// dump formats the table like ip-neigh(8), one entry a line sorted by
// address: "10.77.0.11 dev ib0 lladdr 00:00:01:…(20 bytes) age 3s".
func (t *neighTable) dump(dev string, now time.Time) string {
	t.mu.RLock()
	addrs := make([]netip.Addr, 0, len(t.m))
	for a := range t.m {
		addrs = append(addrs, a)
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
	var b strings.Builder
	for _, a := range addrs {
		n := t.m[a]
		fmt.Fprintf(&b, "%s dev %s lladdr %s age %ds\n", a, dev, n.hw, int(now.Sub(n.confirmed).Seconds()))
	}
	t.mu.RUnlock()
	return b.String()
}
