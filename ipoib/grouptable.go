package ipoib

import (
	"fmt"
	"sync"
)

// GroupTable is a port's multicast memberships, full or send-only; the
// fabric backends share it. attach and detach (either may be nil) are the
// backend's own work to receive a group or stop receiving it; they run
// under the table's lock, so they happen once per change. It is safe for
// concurrent use.
type GroupTable struct {
	mu       sync.RWMutex
	full     map[GID]bool
	sendOnly map[GID]bool
}

// NewGroupTable returns an empty table.
func NewGroupTable() *GroupTable {
	return &GroupTable{full: make(map[GID]bool), sendOnly: make(map[GID]bool)}
}

// Join makes the port a full member of mgid, upgrading a send-only
// membership; attach runs when it was not a full member yet.
func (t *GroupTable) Join(mgid GID, attach func() error) error {
	if !mgid.IsMulticast() {
		return fmt.Errorf("ipoib: %s is not an MGID", mgid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.full[mgid] {
		return nil
	}
	if attach != nil {
		if err := attach(); err != nil {
			return err
		}
	}
	t.full[mgid] = true
	delete(t.sendOnly, mgid)
	return nil
}

// JoinSendOnly makes the port a send-only member of mgid unless it is a
// full member.
func (t *GroupTable) JoinSendOnly(mgid GID) error {
	if !mgid.IsMulticast() {
		return fmt.Errorf("ipoib: %s is not an MGID", mgid)
	}
	t.mu.Lock()
	if !t.full[mgid] {
		t.sendOnly[mgid] = true
	}
	t.mu.Unlock()
	return nil
}

// Leave ends either membership of mgid; detach runs when it was a full
// one.
func (t *GroupTable) Leave(mgid GID, detach func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sendOnly, mgid)
	if !t.full[mgid] {
		return nil
	}
	delete(t.full, mgid)
	if detach != nil {
		return detach()
	}
	return nil
}

// Full reports whether the port is a full member of mgid: whether the
// group's traffic may be delivered to it.
func (t *GroupTable) Full(mgid GID) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.full[mgid]
}

// SendOnly reports whether the port is a send-only member of mgid.
func (t *GroupTable) SendOnly(mgid GID) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.sendOnly[mgid]
}
