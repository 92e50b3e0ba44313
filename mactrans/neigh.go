package mactrans

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

// maxDeriveAttempts bounds the rehashing done to resolve REMAC collisions.
const maxDeriveAttempts = 16

// DeriveREMAC returns the REMAC of the endpoint (gid, qpn) for a collision
// attempt (0 first): the first 6 bytes of FNV-1a-64 over GID, QPN and
// attempt, made locally administered (bit 0x02 set) and unicast (bit 0x01
// clear). It depends on neither the LID nor the flags byte, so it is stable
// across subnet-manager LID changes and daemon restarts.
func DeriveREMAC(gid ipoib.GID, qpn uint32, attempt int) ether.MAC {
	var b [16 + 3 + 1]byte
	copy(b[:16], gid[:])
	b[16], b[17], b[18] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	b[19] = byte(attempt)
	h := uint64(14695981039346656037) // FNV-1a 64 offset basis
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211 // FNV-1a 64 prime
	}
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], h)
	m := ether.MAC(sum[:6])
	m[0] = m[0]&^0x01 | 0x02
	return m
}

// Neighbour is a remote IPoIB endpoint as guests see it.
type Neighbour struct {
	PKey  ipoib.PKey   // partition (full-membership bit set)
	RIMAC ipoib.HwAddr // QPN + GID, flags as last learned
	REMAC ether.MAC    // the MAC guests use for it

	slot     int // index in NeighTable.all, under the table's mu
	lastSeen atomic.Int64
	lastUsed atomic.Int64 // a local guest last sent to it; 0: never
	movedTo  atomic.Pointer[VIF]
}

// MoveTo records that a guest this endpoint spoke for now lives on a
// local VIF (it migrated here: the VIF claimed an address the endpoint
// had claimed on the fabric) and reports whether that is news. Frames
// guests still send to the endpoint's REMAC for an address of v belong
// to v, not to the fabric, where the endpoint's QP is gone.
func (n *Neighbour) MoveTo(v *VIF) bool { return n.movedTo.Swap(v) != v }

// MovedTo is the local VIF MoveTo recorded, or nil: one atomic load, for
// the data path.
func (n *Neighbour) MovedTo() *VIF { return n.movedTo.Load() }

// Touch records traffic from or to the neighbour at now.
func (n *Neighbour) Touch(now time.Time) { touch(&n.lastSeen, now) }

// Use records a local guest sending to the neighbour at now: it is in
// use, and eviction spares it while entries no guest used remain.
func (n *Neighbour) Use(now time.Time) {
	touch(&n.lastSeen, now)
	touch(&n.lastUsed, now)
}

type remacKey struct {
	pkey ipoib.PKey
	mac  ether.MAC
}

type rimacKey struct {
	pkey ipoib.PKey
	hw   ipoib.HwAddr // flags cleared
}

// NeighCounters is a snapshot of a neighbour table's counters.
type NeighCounters struct {
	Learned, Aged, Evicted, Collisions, Unresolved uint64
}

// NeighTable maps RIMAC ↔ REMAC per partition.
//
// Collisions: when the derived REMAC of a new RIMAC is already taken by
// a different RIMAC in the partition, the next attempt of DeriveREMAC is
// tried (counted as a collision). The two are never merged.
//
// Bound and eviction policy: at most max entries. Learning a new RIMAC
// in a full table evicts one entry, counted as an eviction. A hand
// sweeps the table and looks at the next evictWindow entries, and at the
// windows after it (at most evictScan of them) while every entry seen is
// in use. It evicts one that no local guest has sent to if there is any,
// else the least recently used; among equals, the least recently seen.
// So a flood of endpoints that only speak (a neighbour flood on the
// fabric) never pushes out entries guests use, and the work per eviction
// stays bounded. Use the table does not see (UseElsewhere) is asked for
// the chosen entry only, which is spared when it was used. A guest still talking to an evicted endpoint re-learns
// it on the next packet or ARP, under the same REMAC.
//
// Memory: both indexes are xsync.Maps. Their lookups are a few atomic
// loads (no lock, no allocation) and their writes change one bucket in
// place. So a flood of new endpoints leaves no garbage but the evicted
// entries.
type NeighTable struct {
	max     int
	derive  func(ipoib.GID, uint32, int) ether.MAC // DeriveREMAC; replaced in tests to force collisions
	byREMAC *xsync.Map[remacKey, *Neighbour]
	byRIMAC *xsync.Map[rimacKey, *Neighbour]

	mu   sync.Mutex   // serialises writers
	all  []*Neighbour // every entry, each at its slot: what eviction sweeps
	hand int          // where the next eviction looks first

	learned, aged, evicted, collisions, unresolved atomic.Uint64

	usedElsewhere func(n *Neighbour) (sent, received bool) // see UseElsewhere
}

// NewNeighTable returns an empty table bounded to max entries.
func NewNeighTable(max int) *NeighTable {
	return &NeighTable{max: max, derive: DeriveREMAC, byREMAC: xsync.NewMap[remacKey, *Neighbour](), byRIMAC: xsync.NewMap[rimacKey, *Neighbour]()}
}

// LookupREMAC returns the neighbour shown as mac in partition pkey. It takes
// no lock and does not allocate.
func (t *NeighTable) LookupREMAC(pkey ipoib.PKey, mac ether.MAC) (*Neighbour, bool) {
	return t.byREMAC.Load(remacKey{pkey.Full(), mac})
}

// LookupRIMAC returns the neighbour with address hw in partition pkey.
func (t *NeighTable) LookupRIMAC(pkey ipoib.PKey, hw ipoib.HwAddr) (*Neighbour, bool) {
	return t.byRIMAC.Load(rimacKey{pkey.Full(), hw.WithoutFlags()})
}

// Learn returns the neighbour for hw in partition pkey, creating it (and
// its REMAC) when new, and marks it seen at now. The known case takes no
// lock and does not allocate.
func (t *NeighTable) Learn(pkey ipoib.PKey, hw ipoib.HwAddr, now time.Time) (*Neighbour, error) {
	if n, ok := t.LookupRIMAC(pkey, hw); ok {
		n.Touch(now)
		return n, nil
	}
	return t.learnSlow(pkey, hw, now)
}

func (t *NeighTable) learnSlow(pkey ipoib.PKey, hw ipoib.HwAddr, now time.Time) (*Neighbour, error) {
	pkey = pkey.Full()
	rk := rimacKey{pkey, hw.WithoutFlags()}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n, ok := t.byRIMAC.Load(rk); ok {
		n.Touch(now)
		return n, nil
	}
	var mac ether.MAC
	found := false
	for a := 0; a < maxDeriveAttempts; a++ {
		mac = t.derive(hw.GID(), hw.QPN(), a)
		if _, taken := t.byREMAC.Load(remacKey{pkey, mac}); !taken {
			found = true
			break
		}
		t.collisions.Add(1)
	}
	if !found {
		t.unresolved.Add(1)
		return nil, fmt.Errorf("mactrans: no free REMAC for %s after %d attempts", hw, maxDeriveAttempts)
	}
	if len(t.all) >= t.max {
		t.evictLocked(now)
	}
	n := &Neighbour{PKey: pkey, RIMAC: hw, REMAC: mac, slot: len(t.all)}
	n.lastSeen.Store(now.UnixNano())
	t.all = append(t.all, n)
	t.byRIMAC.Store(rk, n)
	t.byREMAC.Store(remacKey{pkey, mac}, n)
	t.learned.Add(1)
	return n, nil
}

// An eviction looks at evictWindow entries, and at up to evictScan
// windows while all it saw are in use. It chooses again at most
// evictSpare times for a victim UseElsewhere's function says was used.
const (
	evictWindow = 64
	evictScan   = 16
	evictSpare  = 4
)

// UseElsewhere sets f, which aging and eviction ask about a neighbour
// they are about to remove: whether traffic went to it from a local
// guest (sent) or from it to one (received) where the table does not see
// it (the in-kernel fast path) since f was last asked about it. A
// neighbour sent to is then marked used (Use), one received from seen
// (Touch), at that time, and stays; eviction chooses again. f is called
// with the table's lock held, from the goroutines that learn and age.
// Set it before the table is used.
func (t *NeighTable) UseElsewhere(f func(n *Neighbour) (sent, received bool)) {
	t.usedElsewhere = f
}

// keptElsewhere marks n as UseElsewhere's function says and reports
// whether it was used.
func (t *NeighTable) keptElsewhere(n *Neighbour, now time.Time) bool {
	if t.usedElsewhere == nil {
		return false
	}
	sent, received := t.usedElsewhere(n)
	switch {
	case sent:
		n.Use(now)
	case received:
		n.Touch(now)
	}
	return sent || received
}

// evictLocked removes one entry, chosen as NeighTable's doc says.
func (t *NeighTable) evictLocked(now time.Time) {
	for spared := 0; ; spared++ {
		victim := t.victimLocked()
		if victim == nil {
			return
		}
		if spared < evictSpare && t.keptElsewhere(victim, now) {
			continue
		}
		t.removeLocked(victim)
		t.evicted.Add(1)
		return
	}
}

// victimLocked is the entry to evict next, or nil in an empty table.
func (t *NeighTable) victimLocked() *Neighbour {
	var victim *Neighbour
	older := func(n *Neighbour) bool {
		nu, vu := n.lastUsed.Load(), victim.lastUsed.Load()
		return nu < vu || nu == vu && n.lastSeen.Load() < victim.lastSeen.Load()
	}
	for seen := 0; seen < min(len(t.all), evictWindow*evictScan); seen++ {
		if t.hand >= len(t.all) {
			t.hand = 0
		}
		if n := t.all[t.hand]; victim == nil || older(n) {
			victim = n
		}
		t.hand++
		if (seen+1)%evictWindow == 0 && victim.lastUsed.Load() == 0 {
			break // an entry no guest uses: as good a victim as any
		}
	}
	return victim
}

// removeLocked deletes n from both indexes and from all, where the last
// entry takes its slot.
func (t *NeighTable) removeLocked(n *Neighbour) {
	t.byRIMAC.Delete(rimacKey{n.PKey, n.RIMAC.WithoutFlags()})
	t.byREMAC.Delete(remacKey{n.PKey, n.REMAC})
	last := t.all[len(t.all)-1]
	t.all[n.slot], last.slot = last, n.slot
	t.all[len(t.all)-1] = nil
	t.all = t.all[:len(t.all)-1]
}

// removeWhereLocked removes the entries for which del is true and
// returns how many went.
func (t *NeighTable) removeWhereLocked(del func(n *Neighbour) bool) int {
	gone := 0
	for i := 0; i < len(t.all); {
		if n := t.all[i]; del(n) {
			t.removeLocked(n) // the last entry moves to i: look at it next
			gone++
			continue
		}
		i++
	}
	if cap(t.all) > 64 && len(t.all) < cap(t.all)/4 {
		t.all = append([]*Neighbour(nil), t.all...) // a smaller array: give back what a flood grew
	}
	return gone
}

// Expire removes the neighbours not seen for ttl or longer, but for those
// UseElsewhere's function says were used, and returns how many went.
func (t *NeighTable) Expire(now time.Time, ttl time.Duration) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	cut := now.Add(-ttl).UnixNano()
	gone := t.removeWhereLocked(func(n *Neighbour) bool { return n.lastSeen.Load() <= cut && !t.keptElsewhere(n, now) })
	t.aged.Add(uint64(gone))
	return gone
}

// SetMax changes the bound (a configuration reload). Lowering it below
// the neighbours there are evicts none at once: each new endpoint then
// evicts one as usual, and aging does the rest.
func (t *NeighTable) SetMax(n int) {
	t.mu.Lock()
	t.max = n
	t.mu.Unlock()
}

// All returns every neighbour (a snapshot, for inspection).
func (t *NeighTable) All() []*Neighbour {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.all)
}

// Flush removes every neighbour and returns how many went; guests'
// traffic re-learns them (under the same REMACs, which derive from the
// RIMACs).
func (t *NeighTable) Flush() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.removeWhereLocked(func(*Neighbour) bool { return true })
}

// LastSeen is when the neighbour was last seen (within a second).
func (n *Neighbour) LastSeen() time.Time { return time.Unix(0, n.lastSeen.Load()) }

// Len returns the number of neighbours.
func (t *NeighTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.all)
}

// Counters returns a snapshot of the counters.
func (t *NeighTable) Counters() NeighCounters {
	return NeighCounters{Learned: t.learned.Load(), Aged: t.aged.Load(), Evicted: t.evicted.Load(), Collisions: t.collisions.Load(), Unresolved: t.unresolved.Load()}
}
