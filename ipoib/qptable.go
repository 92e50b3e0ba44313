package ipoib

import (
	"errors"
	"fmt"
	"sync"
)

// ErrNoQPN is returned when every 24-bit QPN is in use.
var ErrNoQPN = errors.New("ipoib: out of QPNs")

// QPTable numbers a port's UD QPs and remembers each one's P_Key; the
// fabric backends share it. It is safe for concurrent use.
type QPTable struct {
	mu   sync.RWMutex
	qps  map[uint32]PKey
	next uint32
}

// NewQPTable returns an empty table that numbers from first when no hint
// is given (QPNs 0 and 1 are the IBA's special QPs and never handed out).
func NewQPTable(first uint32) *QPTable {
	return &QPTable{qps: make(map[uint32]PKey), next: max(first%MaxQPN, 2)}
}

// Alloc records a QP in partition pkey, numbered hint when that is a free
// valid QPN, else the next free one.
func (t *QPTable) Alloc(pkey PKey, hint uint32) (uint32, error) {
	if !pkey.IsValid() {
		return 0, fmt.Errorf("ipoib: invalid P_Key %s", pkey)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, used := t.qps[hint]; hint > 1 && hint < MaxQPN && !used {
		t.qps[hint] = pkey
		return hint, nil
	}
	for range MaxQPN {
		q := t.next
		t.next++
		if t.next >= MaxQPN {
			t.next = 2
		}
		if _, used := t.qps[q]; !used {
			t.qps[q] = pkey
			return q, nil
		}
	}
	return 0, ErrNoQPN
}

// Free forgets a QP.
func (t *QPTable) Free(qpn uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.qps[qpn]; !ok {
		return fmt.Errorf("ipoib: QPN %#x not allocated", qpn)
	}
	delete(t.qps, qpn)
	return nil
}

// PKey returns the P_Key of QP qpn, and whether it exists.
func (t *QPTable) PKey(qpn uint32) (PKey, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	p, ok := t.qps[qpn]
	return p, ok
}
