// Package warnlimit keeps warnings that traffic can provoke (a guest per
// frame, a fabric per packet) from flooding the log. A Limit lets one
// warning of its kind through per interval and counts the ones it holds
// back, so that the next warning says how many there were. The counters
// of the data path still count every occurrence.
package warnlimit

import (
	"sync/atomic"
	"time"
)

// Interval is the least time between two warnings of one kind.
const Interval = time.Minute

// Limit is one kind of warning. The zero Limit lets the first through. It
// is safe for concurrent use, with no lock: workers call Allow per frame.
type Limit struct {
	last       atomic.Int64  // unix ns of the last warning let through
	suppressed atomic.Uint64 // held back since
}

// Allow reports whether a warning may be logged at now; if not, it counts
// one more held back.
func (w *Limit) Allow(now time.Time) bool {
	n, last := now.UnixNano(), w.last.Load()
	if last != 0 && n-last < int64(Interval) || !w.last.CompareAndSwap(last, n) {
		w.suppressed.Add(1)
		return false
	}
	return true
}

// Suppressed returns and resets the number of warnings held back, for
// the warning Allow let through to report.
func (w *Limit) Suppressed() uint64 { return w.suppressed.Swap(0) }
