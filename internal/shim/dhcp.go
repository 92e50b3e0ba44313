package shim

// In RFC 4390 mode a guest's DHCP request leaves with a zero chaddr, and
// servers need not echo the client-identifier, so the shim remembers
// which guest MAC sent which transaction ID to restore the reply.

import (
	"sync"
	"time"

	"github.com/eipoib/eipoibd/ether"
)

const (
	maxDHCPXIDs = 256
	dhcpXIDTTL  = time.Minute
)

type xidEntry struct {
	mac  ether.MAC
	seen time.Time
}

// dhcpXIDs maps DHCP transaction IDs to guest MACs; DHCP only, never per
// frame.
type dhcpXIDs struct {
	mu sync.Mutex
	m  map[uint32]xidEntry
}

// remember records that mac sent transaction xid at now.
func (d *dhcpXIDs) remember(xid uint32, mac ether.MAC, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = make(map[uint32]xidEntry)
	}
	if len(d.m) >= maxDHCPXIDs {
		for k, e := range d.m {
			if now.Sub(e.seen) > dhcpXIDTTL {
				delete(d.m, k)
			}
		}
		if len(d.m) >= maxDHCPXIDs {
			return
		}
	}
	d.m[xid] = xidEntry{mac, now}
}

// lookup returns the guest MAC of transaction xid.
func (d *dhcpXIDs) lookup(xid uint32, now time.Time) (ether.MAC, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[xid]
	if !ok || now.Sub(e.seen) > dhcpXIDTTL {
		return ether.MAC{}, false
	}
	return e.mac, true
}
