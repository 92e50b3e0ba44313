package kernelfabric

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/eipoib/eipoibd/ether"
)

// takeOver starts FastPath from what the maps hold (maps an earlier
// process filled and pinned, under --persist) rather than from nothing,
// so that the first Commit deletes what is stale and puts what is
// missing. A child whose TX and RX entries disagree, or do not name this
// TAP and its MTU, is held as no child ever stated, so the first Commit
// replaces it.
//
// Entries of children that are not this port's (the previous run's,
// which reclaim deleted) are deleted at once, not at the first Commit
// (dropGone): until then the TX program would redirect their guests'
// frames to a device that is gone (skb_do_redirect drops a frame whose
// target ifindex has no device), where the user-space path would carry
// them. Under Config.Persist the children left for adoption count as
// the port's: their entries stay, and keep carrying, until EndAdoption
// deletes the children no VIF claimed, and their entries with them.
func (f *FastPath) takeOver() error {
	e, err := f.m.Entries()
	if err != nil {
		return err
	}
	for mac, g := range e.Guests {
		c := fastChild{index: int(g.Ifindex), mtu: int(g.MTU)}
		if rg, ok := e.Children[c.index]; !ok || !bytes.Equal(rg.MAC, mac[:]) || rg.TAP != uint32(f.tap) || rg.MTU != uint32(f.tapMTU) {
			c.mtu = -1
		}
		f.have.children[ether.MAC(mac)] = c
	}
	var errs []error
	for index, rg := range e.Children {
		mac := ether.MAC(rg.MAC)
		if c, ok := f.have.children[mac]; !ok {
			f.have.children[mac] = fastChild{index: index, mtu: -1}
		} else if c.index != index {
			// A second child for one guest: no Commit would find it.
			errs = append(errs, f.m.DeleteChild(index))
		}
	}
	for mac, addr := range e.REMACs {
		f.setREMAC(ether.MAC(mac), addr, true)
	}
	for s, remac := range e.Senders {
		f.setSender(fastSender{s.Child, s.IP}, ether.MAC(remac), true)
	}
	errs = append(errs, f.dropGone())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.seedHits()
	return nil
}

// dropGone deletes the entries of children that are neither the port's
// nor left for it to adopt. It is called by takeOver and EndAdoption,
// before the shim's rounds begin, so no Commit writes have meanwhile;
// it changes have through the locked setters all the same, as the
// FastPath is published by then and GuestUsed or NeighbourUsed may
// read it.
func (f *FastPath) dropGone() error {
	live := map[int]bool{}
	f.p.mu.RLock()
	for _, c := range f.p.all {
		live[c.index] = true
	}
	for _, l := range f.p.leftover {
		live[l.Index] = true
	}
	f.p.mu.RUnlock()
	var errs []error
	for k, remac := range f.have.bySender {
		if !live[k.child] {
			if err := f.m.DeleteSender(uint32(k.child), k.ip); err != nil {
				errs = append(errs, err)
				continue
			}
			f.setSender(k, remac, false)
		}
	}
	for mac, c := range f.have.children {
		if !live[c.index] {
			if err := errors.Join(f.m.DeleteGuest(mac[:]), f.m.DeleteChild(c.index)); err != nil {
				errs = append(errs, err)
				continue
			}
			f.setChild(mac, c, false)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete the entries of children gone: %w", err)
	}
	return nil
}

// seedHits starts GuestUsed's and NeighbourUsed's baselines from the hit
// counts of the entries taken over, which count the earlier process's
// redirects too: only what is redirected from now on is use. A count
// that cannot be read stays at 0 (the first question then answers used,
// which keeps an entry a round longer, never drops one early).
func (f *FastPath) seedHits() {
	for mac, c := range f.have.children {
		if n, err := f.m.GuestHits(mac[:], c.index); err == nil {
			f.lastGuest[mac] = n
		}
	}
	for mac := range f.have.remacs {
		if n, err := f.m.REMACHits(mac[:]); err == nil {
			f.lastREMAC[mac] = n
		}
	}
	for k := range f.have.bySender {
		if n, err := f.m.SenderHits(uint32(k.child), k.ip); err == nil {
			f.lastSender[k] = n
		}
	}
}
