package mactrans

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// nShards splits a table so that a write copies only 1/256 of it.
const nShards = 256

// shardMap is a read-mostly map: lookups are one atomic load and a map read
// (no lock, no allocation); writes lock one shard and replace its map with
// an edited copy (copy-on-write), so readers never see a map being changed.
type shardMap[K comparable, V any] struct {
	seed   maphash.Seed
	shards [nShards]shard[K, V]
}

type shard[K comparable, V any] struct {
	mu sync.Mutex // serialises writers of this shard
	m  atomic.Pointer[map[K]V]
}

func newShardMap[K comparable, V any]() *shardMap[K, V] {
	return &shardMap[K, V]{seed: maphash.MakeSeed()}
}

func (s *shardMap[K, V]) index(k K) int { return int(maphash.Comparable(s.seed, k) % nShards) }

func (s *shardMap[K, V]) shard(k K) *shard[K, V] { return &s.shards[s.index(k)] }

// load returns the value for k without locking.
func (s *shardMap[K, V]) load(k K) (V, bool) {
	m := s.shard(k).m.Load()
	if m == nil {
		var zero V
		return zero, false
	}
	v, ok := (*m)[k]
	return v, ok
}

// update runs fn with a private copy of k's shard map under the shard lock
// and publishes the copy afterwards.
func (s *shardMap[K, V]) update(k K, fn func(m map[K]V)) {
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.edit(fn)
}

func (sh *shard[K, V]) edit(fn func(m map[K]V)) {
	old := sh.m.Load()
	n := 1
	if old != nil {
		n += len(*old)
	}
	m := make(map[K]V, n)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	fn(m)
	sh.m.Store(&m)
}

// store sets k to v.
func (s *shardMap[K, V]) store(k K, v V) { s.update(k, func(m map[K]V) { m[k] = v }) }

// remove deletes k.
func (s *shardMap[K, V]) remove(k K) { s.update(k, func(m map[K]V) { delete(m, k) }) }

// rangeAll calls fn for every entry of a consistent per-shard snapshot.
func (s *shardMap[K, V]) rangeAll(fn func(k K, v V) bool) {
	for i := range s.shards {
		m := s.shards[i].m.Load()
		if m == nil {
			continue
		}
		for k, v := range *m {
			if !fn(k, v) {
				return
			}
		}
	}
}

// deleteWhere removes, shard by shard, the entries for which del is true
// and returns them.
func (s *shardMap[K, V]) deleteWhere(del func(k K, v V) bool) []V {
	var out []V
	for i := range s.shards {
		sh := &s.shards[i]
		m := sh.m.Load()
		if m == nil {
			continue
		}
		any := false
		for k, v := range *m {
			if del(k, v) {
				any = true
				break
			}
		}
		if !any {
			continue
		}
		sh.mu.Lock()
		sh.edit(func(m map[K]V) {
			for k, v := range m {
				if del(k, v) {
					delete(m, k)
					out = append(out, v)
				}
			}
		})
		sh.mu.Unlock()
	}
	return out
}
