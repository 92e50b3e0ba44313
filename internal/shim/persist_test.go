package shim

import (
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/state"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestRestoreGuests: Guests lists a VIF with its origin, QPN and the
// address its guest claimed. Restoring it after the VIF was lost (as in
// a restart) recreates it with the saved QPN, not its hash's. It
// announces the address three times, a second apart. Guests on a VLAN
// without a P_Key are skipped with a reason. After Run returned, Guests
// says its list is not to be saved.
func TestRestoreGuests(t *testing.T) {
	a, b := pair(t, func(c *Config) { c.AnnounceWindow = time.Second })
	arpExchange(t, a, b)
	gs, ok := a.s.Guests()
	if !ok || len(gs) != 1 || gs[0].MAC != macA1 || gs[0].Origin != mactrans.OriginLearned || gs[0].QPN != a.s.VIFs()[0].QPN ||
		len(gs[0].IPs) != 1 || gs[0].IPs[0] != ipA1 {
		t.Fatalf("Guests: %+v", gs)
	}
	announceSteps(t, a, b, ipA1, 0, 1) // the first announcements go by
	if removed, err := a.s.RemoveVIF(macA1, 0, mactrans.OriginDeclared); err != nil || !removed {
		t.Fatalf("RemoveVIF: removed %v, %v", removed, err)
	}
	saved := gs[0]
	saved.QPN = 0x777
	saved.Origin = mactrans.OriginBridge
	ip2 := netip.MustParseAddr("fd00::a1")
	saved.IPs = append(saved.IPs, ip2)
	vifs, addrs, skipped := a.s.RestoreGuests([]state.Guest{saved, {MAC: ether.MAC{2, 0, 0, 0, 0, 7}, VLAN: 7, QPN: 0x888}})
	if vifs != 1 || addrs != 2 || len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "VLAN 7 has no P_Key now") {
		t.Fatalf("restored %d VIFs, %d addresses, skipped %v; want 1, 2 and the VLAN 7 guest", vifs, addrs, skipped)
	}
	v := a.s.VIFs()
	if len(v) != 1 || v[0].QPN != 0x777 || v[0].Origin != mactrans.OriginBridge {
		t.Fatalf("restored VIFs %+v, want %s with QPN 0x777 from the bridge", v, macA1)
	}
	// Both addresses' announcements, 3 each; B's guests see the ARP
	// ones (the NAs go by in the same frames read).
	n, _ := announceSteps(t, a, b, ipA1, 3, 2)
	a.clk.Advance(time.Second)
	a.rounds(t, 2) // one began after the advance
	if k, _ := announcements(t, b, ipA1, 0, 200*time.Millisecond); n != 3 || k != 0 {
		t.Errorf("%d announcements of %s after the restore, then %d more; want 3", n, ipA1, k)
	}
	if got := a.s.Get(TxAnnounced); got != 3+6 {
		t.Errorf("tx_announced %d, want 9 (3 at first, 3 for each of 2 addresses after the restore)", got)
	}
	// Once Run has freed the VIFs on its way out, the (empty) list is
	// not to be saved.
	a.shutdown(t)
	if gs, ok := a.s.Guests(); ok || len(gs) != 0 {
		t.Errorf("Guests after Run returned: %v, ok %v; want none, not ok", gs, ok)
	}
}

// TestRestoreGuestsFastPath: a restored guest that got its saved QPN
// back (it did not move; a kernel backend adopted its child) has no
// announcement window, so the fast path is told of it at once; one whose
// saved QPN was taken gets a new QPN and the window of a new guest,
// within which the fast path is not told of it.
func TestRestoreGuestsFastPath(t *testing.T) {
	fp := &fakeFastPath{}
	a := newHV(t, memFab(t, 2048), "fe80::a", func(c *Config) { c.FastPath, c.AnnounceWindow = fp, time.Hour })
	vifs, _, skipped := a.s.RestoreGuests([]state.Guest{
		{MAC: macA1, QPN: 0x777, Origin: mactrans.OriginLearned},
		{MAC: macA2, QPN: 0x777, Origin: mactrans.OriginLearned}, // taken by A1's
	})
	if vifs != 2 || len(skipped) != 0 {
		t.Fatalf("restored %d VIFs, skipped %v; want 2 and none", vifs, skipped)
	}
	v2, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA2})
	if v2 == nil || v2.QPN == 0x777 {
		t.Fatalf("A2's VIF %+v: want a QPN other than 0x777", v2)
	}
	fp.waitState(t, "A1 alone", fastView{guests: map[ether.MAC]uint32{macA1: 0x777}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}})
}

// adoptingPort is a port that can take over a previous run's QPs
// (ipoib.QPAdopter), recording which QPNs each call asked for.
type adoptingPort struct {
	ipoib.Port
	mu             sync.Mutex
	allocs, adopts []uint32
}

func (p *adoptingPort) AllocQP(pkey ipoib.PKey, hint uint32) (uint32, error) {
	p.mu.Lock()
	p.allocs = append(p.allocs, hint)
	p.mu.Unlock()
	return p.Port.AllocQP(pkey, hint)
}

func (p *adoptingPort) AdoptQP(pkey ipoib.PKey, qpn uint32) (uint32, error) {
	p.mu.Lock()
	p.adopts = append(p.adopts, qpn)
	p.mu.Unlock()
	return p.Port.AllocQP(pkey, qpn)
}

// TestRestoreGuestsAdopt: on a port that can take over a previous run's
// QPs, a restored guest asks for its saved QPN with AdoptQP, and a new
// guest uses AllocQP (its hint, a hash of its MAC, must never take over
// a QP a restored guest's peers know).
func TestRestoreGuestsAdopt(t *testing.T) {
	var ap *adoptingPort
	a := newHV(t, memFab(t, 2048), "fe80::a", func(c *Config) {
		ap = &adoptingPort{Port: c.Port}
		c.Port = ap
	})
	if vifs, _, skipped := a.s.RestoreGuests([]state.Guest{{MAC: macA1, QPN: 0x777, Origin: mactrans.OriginLearned}}); vifs != 1 || len(skipped) != 0 {
		t.Fatalf("restored %d VIFs, skipped %v; want 1 and none", vifs, skipped)
	}
	if err := a.s.call(func() error {
		_, err := a.s.vif(a.s.byVLAN[0].Load(), macA2, mactrans.OriginLearned, a.clk.Now())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if len(ap.adopts) != 1 || ap.adopts[0] != 0x777 || len(ap.allocs) != 1 || ap.allocs[0] != mactrans.QPNHint(mactrans.VIFKey{MAC: macA2}) {
		t.Fatalf("AdoptQP asked for %#x, AllocQP for %#x; want AdoptQP for A1's 0x777 alone and AllocQP for A2's hint alone", ap.adopts, ap.allocs)
	}
}
