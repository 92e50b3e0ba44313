package ipoib

import (
	"errors"
	"fmt"
	"iter"
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
// that numbers QPs itself uses Alloc, one whose device numbers them Add.
//
// Lookups take no lock and allocate nothing, as the data path makes one
// per packet. The table is a two-level radix tree of atomic pointers by
// QPN: qpRoots leaves of qpLeafSize entries, each entry an immutable QP.
// The root is 65,536 pointers, 512 KB a table; a leaf is 2 KB for 256
// QPNs, made when first used.
//
// Alloc, Add and Free are the control plane's, serialised among
// themselves. Each changes one entry and makes or drops at most one
// leaf. So filling or emptying a table of n QPs costs O(n), not the
// O(n²) of a map copied on every change. It is safe for concurrent use.
type QPTable struct {
	mu   sync.Mutex // serialises writers
	root [qpRoots]atomic.Pointer[qpLeaf]
	n    atomic.Int64
	next uint32
}

const (
	// qpLeafBits of a QPN index a leaf; the rest index the root.
	qpLeafBits = 8
	qpLeafSize = 1 << qpLeafBits
	qpRoots    = (MaxQPN + 1) >> qpLeafBits
)

// qpLeaf is qpLeafSize consecutive QPNs' entries; n counts those in use
// (under the table's mu), so that an emptied leaf is dropped.
type qpLeaf struct {
	n   int
	qps [qpLeafSize]atomic.Pointer[QP]
}

// NewQPTable returns an empty table that numbers from first when no hint
// is given (QPNs 0 and 1 are the IBA's special QPs and never handed out).
func NewQPTable(first uint32) *QPTable {
	return &QPTable{next: max(first%MaxQPN, 2)}
}

// entry returns qpn's slot (nil: its leaf does not exist), without a
// lock.
func (t *QPTable) entry(qpn uint32) *atomic.Pointer[QP] {
	if qpn >= MaxQPN {
		return nil
	}
	l := t.root[qpn>>qpLeafBits].Load()
	if l == nil {
		return nil
	}
	return &l.qps[qpn&(qpLeafSize-1)]
}

// used reports qpn in the table. Called with mu held.
func (t *QPTable) used(qpn uint32) bool {
	e := t.entry(qpn)
	return e != nil && e.Load() != nil
}

// put records q as qpn's entry, which is free, making its leaf when
// needed. Called with mu held.
func (t *QPTable) put(qpn uint32, q QP) {
	r := &t.root[qpn>>qpLeafBits]
	l := r.Load()
	if l == nil {
		l = &qpLeaf{}
		r.Store(l)
	}
	l.n++
	l.qps[qpn&(qpLeafSize-1)].Store(&q)
	t.n.Add(1)
}

// Alloc records a QP in partition pkey, numbered hint when that is a free
// valid QPN, else the next free one.
func (t *QPTable) Alloc(pkey PKey, hint uint32) (uint32, error) {
	if !pkey.IsValid() {
		return 0, fmt.Errorf("ipoib: invalid P_Key %s", pkey)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q, ok := hint, hint > 1 && hint < MaxQPN && !t.used(hint)
	for i := 0; !ok && i < MaxQPN; i++ {
		q = t.next
		t.next++
		if t.next >= MaxQPN {
			t.next = 2
		}
		ok = !t.used(q)
	}
	if !ok {
		return 0, ErrNoQPN
	}
	t.put(q, QP{PKey: pkey})
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
	if t.used(qpn) {
		return fmt.Errorf("ipoib: QPN %#x already in use", qpn)
	}
	t.put(qpn, QP{PKey: pkey, Data: data})
	return nil
}

// Free forgets a QP.
func (t *QPTable) Free(qpn uint32) error {
	_, err := t.Remove(qpn)
	return err
}

// Remove forgets a QP and returns its entry. A leaf left empty is
// dropped: a reader still in it finds no entry, as it would after the
// Remove.
func (t *QPTable) Remove(qpn uint32) (QP, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(qpn)
	var q *QP
	if e != nil {
		q = e.Swap(nil)
	}
	if q == nil {
		return QP{}, fmt.Errorf("ipoib: QPN %#x not allocated", qpn)
	}
	t.n.Add(-1)
	r := &t.root[qpn>>qpLeafBits]
	l := r.Load()
	if l.n--; l.n == 0 {
		r.Store(nil)
	}
	return *q, nil
}

// Clear forgets every QP and returns what the table held.
func (t *QPTable) Clear() map[uint32]QP {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := make(map[uint32]QP, t.n.Load())
	for qpn, q := range t.All() {
		old[qpn] = q
	}
	for i := range t.root {
		t.root[i].Store(nil)
	}
	t.n.Store(0)
	return old
}

// Lookup returns QP qpn's entry, and whether it exists. It takes no lock
// and allocates nothing.
func (t *QPTable) Lookup(qpn uint32) (QP, bool) {
	if e := t.entry(qpn); e != nil {
		if q := e.Load(); q != nil {
			return *q, true
		}
	}
	return QP{}, false
}

// PKey returns the P_Key of QP qpn, and whether it exists.
func (t *QPTable) PKey(qpn uint32) (PKey, bool) {
	q, ok := t.Lookup(qpn)
	return q.PKey, ok
}

// All yields every QP in QPN order, without a lock: a QP in the table
// throughout is yielded once, one added or removed meanwhile may or may
// not be.
func (t *QPTable) All() iter.Seq2[uint32, QP] {
	return func(yield func(uint32, QP) bool) {
		for i := range t.root {
			l := t.root[i].Load()
			if l == nil {
				continue
			}
			for j := range l.qps {
				if q := l.qps[j].Load(); q != nil && !yield(uint32(i<<qpLeafBits|j), *q) {
					return
				}
			}
		}
	}
}

// Len is the number of QPs.
func (t *QPTable) Len() int { return int(t.n.Load()) }
