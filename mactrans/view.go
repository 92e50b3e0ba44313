package mactrans

import (
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

// View is one partition's (VLAN's) window on both tables. It translates
// addresses for the ARP/NDP rewriters (it satisfies arpndp.Translator):
// local guests map LEMAC ↔ LIMAC through the VIF table, remote endpoints
// REMAC ↔ RIMAC through the neighbour table. Create one per partition and
// reuse it; its methods do not allocate on known entries.
type View struct {
	VIFs  *VIFTable
	Neigh *NeighTable
	// Clock tells the time a learnt endpoint is stamped with
	// (internal/clock's, in eipoibd).
	Clock interface{ Now() time.Time }
	GID   ipoib.GID // local port GID
	VLAN  uint16
	PKey  ipoib.PKey
}

// EthToIB translates a MAC seen in a guest's ARP/NDP payload: a local
// guest's LEMAC to its LIMAC, a REMAC to its RIMAC.
func (v *View) EthToIB(mac ether.MAC) (ipoib.HwAddr, bool) {
	if vif, ok := v.VIFs.Lookup(VIFKey{mac, v.VLAN}); ok {
		return vif.LIMAC, true
	}
	if n, ok := v.Neigh.LookupREMAC(v.PKey, mac); ok {
		return n.RIMAC, true
	}
	return ipoib.HwAddr{}, false
}

// IBToEth translates a 20-byte address from the fabric: one of our own
// VIFs in this partition to its LEMAC, anything else to a REMAC, learning
// the endpoint when new.
func (v *View) IBToEth(hw ipoib.HwAddr) (ether.MAC, bool) {
	if hw.GID() == v.GID {
		if vif, ok := v.VIFs.LookupQPN(hw.QPN()); ok && vif.Key.VLAN == v.VLAN {
			return vif.Key.MAC, true
		}
	}
	n, err := v.Neigh.Learn(v.PKey, hw, v.Clock.Now())
	if err != nil {
		return ether.MAC{}, false
	}
	return n.REMAC, true
}
