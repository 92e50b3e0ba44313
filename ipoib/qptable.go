package ipoib

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"sync"
	"sync/atomic"
)

// ErrNoQPN is returned when every 24-bit QPN is in use.
var ErrNoQPN = errors.New("ipoib: out of QPNs")

// QP is a QPTable entry: the QP's partition and the backend's own state
// for it (nil when it keeps none).
type QP struct {
	PKey PKey
	Data any
}

// QPTable is a port's UD QPs by QPN, each with its P_Key and the
// backend's state; every fabric backend keeps its QPs in one. A backend
// that numbers QPs itself uses Alloc, one whose device numbers them
// Add. Lookups take no lock (the data path makes one per packet): the
// table is an immutable map replaced, copy on write, by Alloc, Add and
// Free, which are the control plane's and serialised among themselves.
// It is safe for concurrent use.
type QPTable struct {
	mu   sync.Mutex // serialises writers
	qps  atomic.Pointer[map[uint32]QP]
	next uint32
}

// NewQPTable returns an empty table that numbers from first when no hint
// is given (QPNs 0 and 1 are the IBA's special QPs and never handed out).
func NewQPTable(first uint32) *QPTable {
	t := &QPTable{next: max(first%MaxQPN, 2)}
	t.qps.Store(&map[uint32]QP{})
	return t
}

// set replaces the table with a copy changed by f. Called with mu held.
func (t *QPTable) set(f func(map[uint32]QP)) {
	m := maps.Clone(*t.qps.Load())
	f(m)
	t.qps.Store(&m)
}

// Alloc records a QP in partition pkey, numbered hint when that is a free
// valid QPN, else the next free one.
func (t *QPTable) Alloc(pkey PKey, hint uint32) (uint32, error) {
	if !pkey.IsValid() {
		return 0, fmt.Errorf("ipoib: invalid P_Key %s", pkey)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.qps.Load()
	_, used := cur[hint]
	q, ok := hint, hint > 1 && hint < MaxQPN && !used
	for i := 0; !ok && i < MaxQPN; i++ {
		q = t.next
		t.next++
		if t.next >= MaxQPN {
			t.next = 2
		}
		_, used = cur[q]
		ok = !used
	}
	if !ok {
		return 0, ErrNoQPN
	}
	t.set(func(m map[uint32]QP) { m[q] = QP{PKey: pkey} })
	return q, nil
}

// Add records QP qpn, numbered by the device, in partition pkey with the
// backend's state data.
func (t *QPTable) Add(qpn uint32, pkey PKey, data any) error {
	if !pkey.IsValid() {
		return fmt.Errorf("ipoib: invalid P_Key %s", pkey)
	}
	if qpn < 2 || qpn >= MaxQPN {
		return fmt.Errorf("ipoib: QPN %#x is no UD QP's", qpn)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, used := (*t.qps.Load())[qpn]; used {
		return fmt.Errorf("ipoib: QPN %#x already in use", qpn)
	}
	t.set(func(m map[uint32]QP) { m[qpn] = QP{PKey: pkey, Data: data} })
	return nil
}

// Free forgets a QP.
func (t *QPTable) Free(qpn uint32) error {
	_, err := t.Remove(qpn)
	return err
}

// Remove forgets a QP and returns its entry.
func (t *QPTable) Remove(qpn uint32) (QP, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q, ok := (*t.qps.Load())[qpn]
	if !ok {
		return QP{}, fmt.Errorf("ipoib: QPN %#x not allocated", qpn)
	}
	t.set(func(m map[uint32]QP) { delete(m, qpn) })
	return q, nil
}

// Clear forgets every QP and returns what the table held.
func (t *QPTable) Clear() map[uint32]QP {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.qps.Load()
	t.qps.Store(&map[uint32]QP{})
	return old
}

// Lookup returns QP qpn's entry, and whether it exists. It takes no lock.
func (t *QPTable) Lookup(qpn uint32) (QP, bool) {
	q, ok := (*t.qps.Load())[qpn]
	return q, ok
}

// PKey returns the P_Key of QP qpn, and whether it exists.
func (t *QPTable) PKey(qpn uint32) (PKey, bool) {
	q, ok := t.Lookup(qpn)
	return q.PKey, ok
}

// All yields every QP of one snapshot of the table.
func (t *QPTable) All() iter.Seq2[uint32, QP] {
	return maps.All(*t.qps.Load())
}

// Len is the number of QPs.
func (t *QPTable) Len() int { return len(*t.qps.Load()) }
