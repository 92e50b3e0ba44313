// Package mactrans keeps eIPoIB's translation tables, per partition. The
// VIF table maps a local guest's Ethernet MAC (LEMAC) and VLAN to its
// own UD QP and 20-byte IPoIB address (LIMAC). The neighbour table maps
// each remote IPoIB endpoint (RIMAC) to the stable Ethernet MAC shown to
// guests (REMAC). Lookups on the hot path are lock-free and
// allocation-free (xsync.Maps: a lookup is a few atomic loads). Writes
// are serialised per table and change the maps in place. Both tables are
// bounded, age entries with an injected clock and count what they refuse
// or evict.
package mactrans

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

// Errors of the tables.
var (
	ErrFull   = errors.New("mactrans: table full")
	ErrExists = errors.New("mactrans: entry exists")
)

// VIFKey identifies a local guest interface: its MAC on one VLAN.
type VIFKey struct {
	MAC  ether.MAC
	VLAN uint16
}

// VIF is a local guest's virtual interface on the IB port: its own UD QP.
// Fields other than the last-use time, the origin and the counters never
// change after creation.
type VIF struct {
	Key   VIFKey
	PKey  ipoib.PKey
	QPN   uint32
	LIMAC ipoib.HwAddr
	// REMAC is the MAC other hypervisors' shims show their guests for
	// this VIF (DeriveREMAC of the port GID and QPN, first attempt): a
	// guest that migrates here from one of them holds it in its caches.
	REMAC ether.MAC

	lastUsed                               atomic.Int64                 // unix nanoseconds
	ips                                    atomic.Pointer[[]netip.Addr] // the guest's addresses seen in its traffic, at most MaxGuestIPs
	announceUntil                          atomic.Int64                 // unix ns: addresses learned before then are announced
	movedIn                                atomic.Bool
	ready                                  atomic.Bool
	origin                                 atomic.Uint32
	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
}

// Ready reports whether the VIF's guest may send (one atomic load). A
// VIF is published before it is ready, so that the frames its guest sent
// while its QP was being made are translated and sent first; the shim
// sets it after them.
func (v *VIF) Ready() bool { return v.ready.Load() }

// SetReady marks the VIF ready.
func (v *VIF) SetReady() { v.ready.Store(true) }

// MaxGuestIPs bounds the addresses remembered per guest; a new one
// beyond replaces the oldest.
const MaxGuestIPs = 8

// HasIP reports whether the guest was seen using a (lock-free, no
// allocation: the data path asks it of every frame).
func (v *VIF) HasIP(a netip.Addr) bool {
	if p := v.ips.Load(); p != nil {
		for _, x := range *p {
			if x == a {
				return true
			}
		}
	}
	return false
}

// AddIP remembers an address of the guest and reports whether it is new.
func (v *VIF) AddIP(a netip.Addr) bool {
	for {
		old := v.ips.Load()
		var cur []netip.Addr
		if old != nil {
			cur = *old
		}
		if slices.Contains(cur, a) {
			return false
		}
		next := append(slices.Clone(cur[max(0, len(cur)-MaxGuestIPs+1):]), a)
		if v.ips.CompareAndSwap(old, &next) {
			return true
		}
	}
}

// IPs returns the guest's addresses seen in its traffic, oldest first.
func (v *VIF) IPs() []netip.Addr {
	if p := v.ips.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// AnnounceUntil opens the announcement window: addresses the guest shows
// until t are announced on the fabric (its MAC just appeared here).
func (v *VIF) AnnounceUntil(t time.Time) { v.announceUntil.Store(t.UnixNano()) }

// Announcing reports whether now is within the announcement window.
func (v *VIF) Announcing(now time.Time) bool { return now.UnixNano() < v.announceUntil.Load() }

// SetMovedIn records that the guest migrated here: it claimed an
// address a remote endpoint had spoken for (see Neighbour.MoveTo).
func (v *VIF) SetMovedIn() { v.movedIn.Store(true) }

// MovedIn reports whether SetMovedIn was called (one atomic load).
func (v *VIF) MovedIn() bool { return v.movedIn.Load() }

// Origin is how a VIF came to be.
type Origin uint32

// The origins: from a guest's first frame, declared through the control
// socket, or from the virtual switch (a static bridge FDB entry, an OVS
// port's attached-mac).
const (
	OriginLearned Origin = iota
	OriginDeclared
	OriginBridge
	OriginOVS
)

// String is the origin's name as the CLI shows it.
func (o Origin) String() string {
	switch o {
	case OriginDeclared:
		return "declared"
	case OriginBridge:
		return "bridge"
	case OriginOVS:
		return "ovs"
	}
	return "learned"
}

// LogValue logs the origin by its name in every log format (a JSON log
// would otherwise show the number).
func (o Origin) LogValue() slog.Value { return slog.StringValue(o.String()) }

// ParseOrigin returns the origin String names.
func ParseOrigin(s string) (Origin, bool) {
	for o := OriginLearned; o <= OriginOVS; o++ {
		if o.String() == s {
			return o, true
		}
	}
	return 0, false
}

// Frees reports whether a removal by source o frees a VIF whose origin
// is held. The control socket (an operator, the CNI plugin) frees any
// VIF; a switch's static entry or port frees what it declared and what
// was learned; a learned FDB entry going frees only a learned VIF. So a
// guest declared over the control socket stays while the bridge learns
// and forgets its MAC.
func (o Origin) Frees(held Origin) bool {
	return o == OriginDeclared || held == OriginLearned || held == o
}

// Origin is how the VIF came to be (the last declaration wins over
// learning).
func (v *VIF) Origin() Origin { return Origin(v.origin.Load()) }

// SetOrigin records a declaration of the VIF.
func (v *VIF) SetOrigin(o Origin) { v.origin.Store(uint32(o)) }

// CountTx counts a frame of n bytes from the guest; CountRx one to it.
func (v *VIF) CountTx(n int) { v.txPackets.Add(1); v.txBytes.Add(uint64(n)) }

// CountRx counts a frame of n bytes delivered to the guest.
func (v *VIF) CountRx(n int) { v.rxPackets.Add(1); v.rxBytes.Add(uint64(n)) }

// VIFStats are a VIF's traffic counters.
type VIFStats struct {
	TxPackets, TxBytes, RxPackets, RxBytes uint64
}

// Stats returns the VIF's traffic counters.
func (v *VIF) Stats() VIFStats {
	return VIFStats{v.txPackets.Load(), v.txBytes.Load(), v.rxPackets.Load(), v.rxBytes.Load()}
}

// LastUsed is when the VIF last carried traffic (within a second).
func (v *VIF) LastUsed() time.Time { return time.Unix(0, v.lastUsed.Load()) }

// Touch records use at now (cheap enough for the hot path: one atomic
// store, skipped while the stamp is under a second old).
func (v *VIF) Touch(now time.Time) { touch(&v.lastUsed, now) }

func touch(stamp *atomic.Int64, now time.Time) {
	n := now.UnixNano()
	if n-stamp.Load() >= int64(time.Second) {
		stamp.Store(n)
	}
}

// VIFCounters is a snapshot of a VIF table's counters.
type VIFCounters struct {
	Created, Removed, Aged, Overflow uint64
}

// VIFTable maps (LEMAC, VLAN) → VIF and QPN → VIF.
//
// Bound and eviction policy: at most max VIFs exist. When the table is full
// a new source MAC is refused (ErrFull, counted as overflow) and nothing is
// evicted: a MAC flood must not push real guests off the fabric. Idle
// VIFs are removed by Expire, which makes room again.
type VIFTable struct {
	gid     ipoib.GID
	byKey   *xsync.Map[VIFKey, *VIF]
	byQPN   *xsync.Map[uint32, *VIF]
	byREMAC *xsync.Map[ether.MAC, *VIF]

	createMu sync.Mutex // serialises Create
	mu       sync.Mutex // serialises writers
	reserved map[VIFKey]bool
	// size is the VIFs and reservations, limit the bound: written under
	// mu, read without a lock by Full.
	size, limit atomic.Int64

	created, removed, aged, overflow atomic.Uint64

	usedElsewhere func(v *VIF) bool // see UseElsewhere
}

// NewVIFTable returns an empty table for the port with GID gid.
func NewVIFTable(gid ipoib.GID, max int) *VIFTable {
	t := &VIFTable{gid: gid, byKey: xsync.NewMap[VIFKey, *VIF](), byQPN: xsync.NewMap[uint32, *VIF](), byREMAC: xsync.NewMap[ether.MAC, *VIF](), reserved: make(map[VIFKey]bool)}
	t.limit.Store(int64(max))
	return t
}

// Full reports, without locking, whether max VIFs exist or are reserved,
// and counts a refusal as overflow when they are. The data path asks it
// before asking for a new guest's VIF. So a MAC flood past the bound is
// refused per frame without a request to the control plane.
func (t *VIFTable) Full() bool {
	if t.size.Load() < t.limit.Load() {
		return false
	}
	t.overflow.Add(1)
	return true
}

// Lookup returns the VIF of (mac, vlan). It takes no lock.
func (t *VIFTable) Lookup(k VIFKey) (*VIF, bool) { return t.byKey.Load(k) }

// LookupQPN returns the VIF owning qpn. It takes no lock.
func (t *VIFTable) LookupQPN(qpn uint32) (*VIF, bool) { return t.byQPN.Load(qpn) }

// LookupREMAC returns the VIF whose REMAC (as other hypervisors show it)
// is mac. It takes no lock.
func (t *VIFTable) LookupREMAC(mac ether.MAC) (*VIF, bool) { return t.byREMAC.Load(mac) }

// Create returns the VIF of k, creating it when missing: Reserve, then
// alloc (QPNHint(k) as the wished-for QPN, called once per VIF and
// under no lock of the table), then Publish. created reports whether a
// new VIF was made. Creates are serialised among themselves (not
// against lookups, Remove or Len), so concurrent creators of one key get
// one VIF. The shim does the three steps itself, to send a new guest's
// held frames between the allocation and the publication.
func (t *VIFTable) Create(k VIFKey, pkey ipoib.PKey, origin Origin, now time.Time, alloc func(pkey ipoib.PKey, hint uint32) (uint32, error)) (v *VIF, created bool, err error) {
	if v, ok := t.byKey.Load(k); ok {
		return v, false, nil
	}
	t.createMu.Lock()
	defer t.createMu.Unlock()
	if v, ok := t.byKey.Load(k); ok {
		return v, false, nil
	}
	if err := t.Reserve(k); err != nil {
		return nil, false, err
	}
	qpn, err := alloc(pkey, QPNHint(k))
	if err != nil {
		t.Unreserve(k)
		return nil, false, fmt.Errorf("mactrans: allocate QP for %s vlan %d: %w", k.MAC, k.VLAN, err)
	}
	v = t.NewVIF(k, pkey, qpn, origin, now)
	t.Publish(v)
	v.SetReady()
	return v, true, nil
}

// Reserve takes a place in the table for the VIF of k, before its QP is
// allocated (slowly, with no lock of the table held). It returns ErrFull
// (counted as overflow) when max VIFs exist or are reserved, and
// ErrExists when k has a VIF or a reservation. Publish or Unreserve ends
// the reservation.
func (t *VIFTable) Reserve(k VIFKey) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byKey.Load(k); ok || t.reserved[k] {
		return fmt.Errorf("%w: %s vlan %d", ErrExists, k.MAC, k.VLAN)
	}
	if t.size.Load() >= t.limit.Load() {
		t.overflow.Add(1)
		return fmt.Errorf("%w: %d VIFs (max)", ErrFull, t.limit.Load())
	}
	t.reserved[k] = true
	t.size.Add(1)
	return nil
}

// Unreserve gives back the place Reserve took (the QP was refused).
func (t *VIFTable) Unreserve(k VIFKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reserved[k] {
		delete(t.reserved, k)
		t.size.Add(-1)
	}
}

// NewVIF makes the VIF of k on QP qpn, not yet in the table.
func (t *VIFTable) NewVIF(k VIFKey, pkey ipoib.PKey, qpn uint32, origin Origin, now time.Time) *VIF {
	v := &VIF{Key: k, PKey: pkey, QPN: qpn, LIMAC: ipoib.MakeHwAddr(0, qpn, t.gid), REMAC: DeriveREMAC(t.gid, qpn, 0)}
	v.lastUsed.Store(now.UnixNano())
	v.origin.Store(uint32(origin))
	return v
}

// Publish makes v, reserved with Reserve, visible to lookups (not ready
// yet: see Ready).
func (t *VIFTable) Publish(v *VIF) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.reserved[v.Key] {
		t.size.Add(1) // published without a reservation
	}
	delete(t.reserved, v.Key)
	t.byQPN.Store(v.QPN, v)
	t.byREMAC.Store(v.REMAC, v)
	t.byKey.Store(v.Key, v)
	t.created.Add(1)
}

// SetMax changes the bound (a configuration reload). Lowering it below
// the VIFs there are evicts none: new MACs are refused until enough age
// out.
func (t *VIFTable) SetMax(n int) {
	t.mu.Lock()
	t.limit.Store(int64(n))
	t.mu.Unlock()
}

// QPNHint returns the QPN a VIF would like: 24 bits of FNV-1a over MAC and
// VLAN, never 0, 1 or the multicast QPN. With a backend that honours it, a
// guest keeps its QPN, hence its LIMAC and its REMAC on every other
// hypervisor, across daemon restarts.
func QPNHint(k VIFKey) uint32 {
	h := uint32(2166136261) // FNV-1a 32 offset basis
	for _, c := range [8]byte{k.MAC[0], k.MAC[1], k.MAC[2], k.MAC[3], k.MAC[4], k.MAC[5], byte(k.VLAN >> 8), byte(k.VLAN)} {
		h ^= uint32(c)
		h *= 16777619 // FNV-1a 32 prime
	}
	q := h>>8 ^ h&0xff // fold to 24 bits
	if q < 2 || q >= ipoib.MaxQPN {
		q = 2
	}
	return q
}

// Remove deletes the VIF of k, if source by frees it (Origin.Frees),
// and returns it, so the caller frees its QP.
func (t *VIFTable) Remove(k VIFKey, by Origin) (*VIF, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.byKey.Load(k)
	if !ok || !by.Frees(v.Origin()) {
		return nil, false
	}
	t.removeLocked(v)
	t.removed.Add(1)
	return v, true
}

// removeLocked takes v out of every index. Called with mu held.
func (t *VIFTable) removeLocked(v *VIF) {
	t.byKey.Delete(v.Key)
	t.byQPN.Delete(v.QPN)
	t.byREMAC.Delete(v.REMAC)
	t.size.Add(-1)
}

// UseElsewhere sets f, which Expire asks about each VIF it is about to
// remove: whether the VIF's traffic went where the table does not see it
// (the in-kernel fast path) since f was last asked about it. If so, the
// VIF is touched at that round's time and stays. Set it before the table
// is used.
func (t *VIFTable) UseElsewhere(f func(v *VIF) bool) { t.usedElsewhere = f }

// Expire removes the learned VIFs unused for idle or longer and returns
// them, so the caller frees their QPs. A declared VIF (control socket,
// static bridge entry, OVS port) stays, idle or not, until its source
// undeclares it: a silent pod or VM keeps its QP. So does one that
// UseElsewhere's function says was used.
func (t *VIFTable) Expire(now time.Time, idle time.Duration) []*VIF {
	t.mu.Lock()
	defer t.mu.Unlock()
	cut := now.Add(-idle).UnixNano()
	var gone []*VIF
	for _, v := range t.byKey.All() {
		if v.Origin() != OriginLearned || v.lastUsed.Load() > cut {
			continue
		}
		if t.usedElsewhere != nil && t.usedElsewhere(v) {
			v.Touch(now)
			continue
		}
		gone = append(gone, v)
	}
	for _, v := range gone {
		t.removeLocked(v)
	}
	t.aged.Add(uint64(len(gone)))
	return gone
}

// All returns every VIF (for shutdown and the control API).
func (t *VIFTable) All() []*VIF {
	var out []*VIF
	for _, v := range t.byKey.All() {
		out = append(out, v)
	}
	return out
}

// Len returns the number of VIFs (published ones: not reservations).
func (t *VIFTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int(t.size.Load()) - len(t.reserved)
}

// Counters returns a snapshot of the counters.
func (t *VIFTable) Counters() VIFCounters {
	return VIFCounters{Created: t.created.Load(), Removed: t.removed.Load(), Aged: t.aged.Load(), Overflow: t.overflow.Load()}
}
