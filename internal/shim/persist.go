package shim

// Saving and restoring the guests across a daemon restart (--persist):
// the VIFs with their origins, QPNs and the addresses their guests
// claimed. Restored VIFs ask for their old QPN, and their addresses are
// announced as after a live migration, so peers holding the old QPN (a
// backend that cannot choose QPNs) move to the new one at once. One that
// gets its old QPN back has no announcement window (makeVIF): the fast
// path carries it at once.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/eipoib/eipoibd/internal/state"
	"github.com/eipoib/eipoibd/mactrans"
)

// Guests returns every VIF as a state file keeps it, sorted by VLAN and
// MAC (so that an unchanged table saves the same bytes). ok is false once
// Run has begun to free the VIFs on its way out: the list may then miss
// guests that still exist and must not be saved.
func (s *Shim) Guests() (guests []state.Guest, ok bool) {
	var out []state.Guest
	for _, v := range s.vifs.All() {
		out = append(out, state.Guest{MAC: v.Key.MAC, VLAN: v.Key.VLAN, Origin: v.Origin(), QPN: v.QPN, IPs: v.IPs()})
	}
	slices.SortFunc(out, func(a, b state.Guest) int {
		if a.VLAN != b.VLAN {
			return int(a.VLAN) - int(b.VLAN)
		}
		return strings.Compare(a.MAC.String(), b.MAC.String())
	})
	return out, !s.stopping.Load()
}

// RestoreGuests creates the VIFs of saved guests, each wishing for its
// saved QPN, remembers their addresses and queues the announcement of
// each (three times, a second apart, from the housekeeping rounds). It
// returns the VIFs restored, the addresses queued, and why any guest
// was skipped: its VLAN has no P_Key now, a learned guest under
// --learn declared, or the VIF table is full.
func (s *Shim) RestoreGuests(gs []state.Guest) (vifs, addrs int, skipped []error) {
	now := s.clk.Now()
	for _, g := range gs {
		var p *partition
		if int(g.VLAN) < len(s.byVLAN) {
			p = s.byVLAN[g.VLAN].Load()
		}
		switch {
		case p == nil:
			skipped = append(skipped, fmt.Errorf("%s: VLAN %d has no P_Key now", g.MAC, g.VLAN))
			continue
		case g.Origin == mactrans.OriginLearned && s.cfg.Learn == LearnDeclared:
			skipped = append(skipped, fmt.Errorf("%s: learned, and only declared guests are served (--learn declared)", g.MAC))
			continue
		}
		qpn := g.QPN
		var v *mactrans.VIF
		err := s.call(func() (err error) {
			v, err = s.makeVIF(p, g.MAC, g.Origin, now, qpn)
			return err
		})
		if err != nil {
			skipped = append(skipped, fmt.Errorf("%s on VLAN %d: %w", g.MAC, g.VLAN, err))
			continue
		}
		v.SetOrigin(g.Origin)
		vifs++
		for _, ip := range g.IPs {
			if v.AddIP(ip) {
				s.mobility.announce(p, v, ip, now)
				addrs++
			}
		}
	}
	return vifs, addrs, skipped
}
