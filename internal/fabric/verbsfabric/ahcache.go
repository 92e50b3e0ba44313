package verbsfabric

import (
	"maps"
	"sync/atomic"
	"time"
)

// The address handle cache. The send path looks a destination's handle
// up per packet, and the receive path asks for the sender's per packet
// so that the reply finds it made. Both read without a lock.
//
// The cache is ahShards immutable maps. The control side (the resolver,
// a new destination, a flush, an eviction) holds ahMu and replaces a
// shard copy on write, so a change copies one shard, not the whole
// cache. Entries are immutable once published, but for their CLOCK
// reference bit. A resolution's result replaces its pending entry with a
// ready or a failed one.
//
// Eviction is CLOCK (second chance) over a ring of the ready unicast
// entries. A lookup sets the entry's bit, with a store only when it is
// clear. The hand clears set bits and evicts the first clear one. So an
// eviction is amortised O(1), never a scan of the cache for the oldest.

// ahShards is the number of shards of the cache (a power of 2).
const ahShards = 256

// ahEntry is a cached address handle (ready), a resolution under way
// (neither ready nor failed) or a failed one (failedAt set). Only used
// changes after it is published; pending, the packets held for a
// resolution under way, is the send path's (under txMu).
type ahEntry struct {
	h        handle
	ready    bool
	failedAt time.Time
	used     atomic.Bool // CLOCK reference bit
	pending  int
}

// resolving reports e as a resolution under way.
func (e *ahEntry) resolving() bool { return !e.ready && e.failedAt.IsZero() }

// clockSlot is a ring slot: a key and the entry it held when added; a
// slot whose key now holds another entry (or none) is stale.
type clockSlot struct {
	key ahKey
	e   *ahEntry
}

// ahCache is the cache: lock-free get, every other method with ahMu
// held (its owner's).
type ahCache struct {
	shards [ahShards]atomic.Pointer[map[ahKey]*ahEntry]
	n      atomic.Int64 // entries
	gen    uint64       // bumped by each flush: a resolution begun before is stale
	ring   []clockSlot
	hand   int
}

// newAHCache returns an empty cache.
func newAHCache() *ahCache {
	c := &ahCache{}
	for i := range c.shards {
		c.shards[i].Store(&map[ahKey]*ahEntry{})
	}
	return c
}

// shard is key's shard: GIDs and MGIDs differ in their low bytes.
func (k ahKey) shard() int {
	return int(k.gid[15]^k.gid[14]<<3^k.gid[13]<<5^k.gid[12]^byte(k.pkey)) & (ahShards - 1)
}

// get returns key's entry (nil: none). It takes no lock.
func (c *ahCache) get(key ahKey) *ahEntry {
	return (*c.shards[key.shard()].Load())[key]
}

// lookup returns key's handle when it is ready, marking it used.
func (c *ahCache) lookup(key ahKey) (handle, bool) {
	e := c.get(key)
	if e == nil || !e.ready {
		return 0, false
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	return e.h, true
}

// set makes e key's entry; a ready unicast one joins the CLOCK ring.
func (c *ahCache) set(key ahKey, e *ahEntry) {
	s := &c.shards[key.shard()]
	m := maps.Clone(*s.Load())
	if _, ok := m[key]; !ok {
		c.n.Add(1)
	}
	m[key] = e
	s.Store(&m)
	if e.ready && !key.gid.IsMulticast() {
		e.used.Store(true) // a second chance from the first
		if len(c.ring) >= 2*max(int(c.n.Load()), 64) {
			c.compact()
		}
		c.ring = append(c.ring, clockSlot{key, e})
	}
}

// del removes key's entry.
func (c *ahCache) del(key ahKey) {
	s := &c.shards[key.shard()]
	if _, ok := (*s.Load())[key]; !ok {
		return
	}
	m := maps.Clone(*s.Load())
	delete(m, key)
	s.Store(&m)
	c.n.Add(-1)
}

// deleteIf removes the entries f selects, each shard copied once.
func (c *ahCache) deleteIf(f func(ahKey, *ahEntry) bool) {
	for i := range c.shards {
		s := &c.shards[i]
		m := maps.Clone(*s.Load())
		before := len(m)
		maps.DeleteFunc(m, f)
		if len(m) != before {
			c.n.Add(int64(len(m) - before))
			s.Store(&m)
		}
	}
}

// live reports slot s as still its key's entry.
func (c *ahCache) live(s clockSlot) bool { return c.get(s.key) == s.e }

// compact drops the ring's stale slots.
func (c *ahCache) compact() {
	keep := c.ring[:0]
	for _, s := range c.ring {
		if c.live(s) {
			keep = append(keep, s)
		}
	}
	clear(c.ring[len(keep):])
	c.ring = keep
	c.hand = 0
}

// evict removes one ready unicast entry by CLOCK and returns its handle
// (false: the ring has none). The hand goes round at most twice.
func (c *ahCache) evict() (handle, bool) {
	for steps := 2*len(c.ring) + 1; steps > 0 && len(c.ring) > 0; steps-- {
		if c.hand >= len(c.ring) {
			c.hand = 0
		}
		s := c.ring[c.hand]
		switch {
		case !c.live(s):
			c.removeSlot()
		case s.e.used.Swap(false):
			c.hand++
		default:
			c.removeSlot()
			c.del(s.key)
			return s.e.h, true
		}
	}
	return 0, false
}

// removeSlot takes the slot under the hand out of the ring (the last
// slot takes its place).
func (c *ahCache) removeSlot() {
	last := len(c.ring) - 1
	c.ring[c.hand] = c.ring[last]
	c.ring[last] = clockSlot{}
	c.ring = c.ring[:last]
}
