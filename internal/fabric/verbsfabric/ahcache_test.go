package verbsfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
)

// keyN is a distinct unicast key per n.
func keyN(n int) ahKey {
	var g ipoib.GID
	g[0], g[1], g[13], g[14], g[15] = 0xfe, 0x80, byte(n>>16), byte(n>>8), byte(n)
	return ahKey{g, 0xffff}
}

// TestAHCacheClock: eviction takes a ready unicast handle whose bit is
// clear, giving each used one a second chance. It never takes a group's
// handle or a resolution under way. It skips slots made stale by a
// delete or a replacement. The ring stays bounded as entries come and
// go.
func TestAHCacheClock(t *testing.T) {
	c := newAHCache()
	mc := ahKey{ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal), 0xffff}
	c.set(mc, &ahEntry{h: 99, ready: true})
	c.set(keyN(100), &ahEntry{}) // under way
	for i := range 4 {
		c.set(keyN(i), &ahEntry{h: handle(i), ready: true})
	}
	if c.n.Load() != 6 || len(c.ring) != 4 {
		t.Fatalf("%d entries, ring %d", c.n.Load(), len(c.ring))
	}
	// Every bit is set: the first sweep clears them, the second takes
	// the first slot.
	if h, ok := c.evict(); !ok || h != 0 || c.get(keyN(0)) != nil {
		t.Fatalf("evicted %d %v", h, ok)
	}
	// 1 is used again: 2 goes before it.
	if _, ok := c.lookup(keyN(1)); !ok {
		t.Fatal("lookup of 1")
	}
	if h, _ := c.evict(); h == 1 {
		t.Fatal("a used handle evicted before an unused one")
	}
	// A deleted key and a replaced one leave stale slots, skipped.
	c.del(keyN(3))
	c.set(keyN(2), &ahEntry{})
	for {
		h, ok := c.evict()
		if !ok {
			break
		}
		if h == 3 || h == 99 {
			t.Fatalf("evicted %d: stale or a group's", h)
		}
	}
	if c.get(mc) == nil || c.get(keyN(100)) == nil || len(c.ring) != 0 {
		t.Fatalf("group or pending entry gone, or ring left %d", len(c.ring))
	}
	for i := range 10000 {
		c.set(keyN(i%10), &ahEntry{h: handle(i), ready: true})
	}
	if len(c.ring) > 2*max(int(c.n.Load()), 64) {
		t.Fatalf("ring %d for %d entries", len(c.ring), c.n.Load())
	}
}

// BenchmarkAHLookup: the send path's lookup allocates nothing.
func BenchmarkAHLookup(b *testing.B) {
	c := newAHCache()
	for i := range ahMax {
		c.set(keyN(i), &ahEntry{h: handle(i), ready: true})
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := c.lookup(keyN(i & (ahMax - 1))); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}
