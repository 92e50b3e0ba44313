package mactrans

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
// Collisions: when the derived REMAC of a new RIMAC is already taken by a
// different RIMAC in the partition, the next attempt of DeriveREMAC is
// tried (counted as a collision); the two are never merged.
//
// Bound and eviction policy: at most max entries. Learning a new RIMAC in a
// full table evicts one entry, counted as an eviction: among the entries
// of the new entry's shard and the next non-empty ones (at most
// evictScan shards), one that no local guest has sent to if there is
// any, else the least recently used; the least recently seen among
// equals. Entries guests use are thus never pushed out by a flood of
// endpoints that only speak (a neighbour flood on the fabric), and the
// work per eviction stays bounded. A guest still talking to an evicted
// endpoint re-learns it on the next packet or ARP, under the same REMAC.
type NeighTable struct {
	max     int
	derive  func(ipoib.GID, uint32, int) ether.MAC // DeriveREMAC; replaced in tests to force collisions
	byREMAC *shardMap[remacKey, *Neighbour]
	byRIMAC *shardMap[rimacKey, *Neighbour]

	mu    sync.Mutex
	count int

	learned, aged, evicted, collisions, unresolved atomic.Uint64
}

// NewNeighTable returns an empty table bounded to max entries.
func NewNeighTable(max int) *NeighTable {
	return &NeighTable{max: max, derive: DeriveREMAC, byREMAC: newShardMap[remacKey, *Neighbour](), byRIMAC: newShardMap[rimacKey, *Neighbour]()}
}

// LookupREMAC returns the neighbour shown as mac in partition pkey. It takes
// no lock and does not allocate.
func (t *NeighTable) LookupREMAC(pkey ipoib.PKey, mac ether.MAC) (*Neighbour, bool) {
	return t.byREMAC.load(remacKey{pkey.Full(), mac})
}

// LookupRIMAC returns the neighbour with address hw in partition pkey.
func (t *NeighTable) LookupRIMAC(pkey ipoib.PKey, hw ipoib.HwAddr) (*Neighbour, bool) {
	return t.byRIMAC.load(rimacKey{pkey.Full(), hw.WithoutFlags()})
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
	if n, ok := t.byRIMAC.load(rk); ok {
		n.Touch(now)
		return n, nil
	}
	var mac ether.MAC
	found := false
	for a := 0; a < maxDeriveAttempts; a++ {
		mac = t.derive(hw.GID(), hw.QPN(), a)
		if _, taken := t.byREMAC.load(remacKey{pkey, mac}); !taken {
			found = true
			break
		}
		t.collisions.Add(1)
	}
	if !found {
		t.unresolved.Add(1)
		return nil, fmt.Errorf("mactrans: no free REMAC for %s after %d attempts", hw, maxDeriveAttempts)
	}
	if t.count >= t.max {
		t.evictLocked(rk)
	}
	n := &Neighbour{PKey: pkey, RIMAC: hw, REMAC: mac}
	n.lastSeen.Store(now.UnixNano())
	t.byRIMAC.store(rk, n)
	t.byREMAC.store(remacKey{pkey, mac}, n)
	t.count++
	t.learned.Add(1)
	return n, nil
}

// evictScan bounds the shards evictLocked looks at for an unused entry.
const evictScan = 16

// evictLocked removes one entry, chosen as NeighTable's doc says,
// starting at k's shard.
func (t *NeighTable) evictLocked(k rimacKey) {
	idx := t.byRIMAC.index(k)
	var victim *Neighbour
	older := func(n *Neighbour) bool {
		nu, vu := n.lastUsed.Load(), victim.lastUsed.Load()
		return nu < vu || nu == vu && n.lastSeen.Load() < victim.lastSeen.Load()
	}
	for i, scanned := 0, 0; i < nShards && scanned < evictScan; i++ {
		m := t.byRIMAC.shards[(idx+i)%nShards].m.Load()
		if m == nil || len(*m) == 0 {
			continue
		}
		scanned++
		for _, n := range *m {
			if victim == nil || older(n) {
				victim = n
			}
		}
		if victim.lastUsed.Load() == 0 {
			break // an entry no guest uses: as good a victim as any
		}
	}
	if victim != nil {
		t.removeLocked(victim)
		t.evicted.Add(1)
	}
}

func (t *NeighTable) removeLocked(n *Neighbour) {
	t.byRIMAC.remove(rimacKey{n.PKey, n.RIMAC.WithoutFlags()})
	t.byREMAC.remove(remacKey{n.PKey, n.REMAC})
	t.count--
}

// Expire removes the neighbours not seen for ttl or longer and returns how
// many went.
func (t *NeighTable) Expire(now time.Time, ttl time.Duration) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	cut := now.Add(-ttl).UnixNano()
	gone := t.byRIMAC.deleteWhere(func(_ rimacKey, n *Neighbour) bool { return n.lastSeen.Load() <= cut })
	for _, n := range gone {
		t.byREMAC.remove(remacKey{n.PKey, n.REMAC})
	}
	t.count -= len(gone)
	t.aged.Add(uint64(len(gone)))
	return len(gone)
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
	var out []*Neighbour
	t.byRIMAC.rangeAll(func(_ rimacKey, n *Neighbour) bool { out = append(out, n); return true })
	return out
}

// Flush removes every neighbour and returns how many went; guests'
// traffic re-learns them (under the same REMACs, which derive from the
// RIMACs).
func (t *NeighTable) Flush() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	gone := t.byRIMAC.deleteWhere(func(rimacKey, *Neighbour) bool { return true })
	for _, n := range gone {
		t.byREMAC.remove(remacKey{n.PKey, n.REMAC})
	}
	t.count -= len(gone)
	return len(gone)
}

// LastSeen is when the neighbour was last seen (within a second).
func (n *Neighbour) LastSeen() time.Time { return time.Unix(0, n.lastSeen.Load()) }

// Len returns the number of neighbours.
func (t *NeighTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count
}

// Counters returns a snapshot of the counters.
func (t *NeighTable) Counters() NeighCounters {
	return NeighCounters{Learned: t.learned.Load(), Aged: t.aged.Load(), Evicted: t.evicted.Load(), Collisions: t.collisions.Load(), Unresolved: t.unresolved.Load()}
}
