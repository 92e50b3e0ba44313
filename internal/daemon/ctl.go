package daemon

// The control socket's handler: the typed commands of package ctl,
// answered from the shim's snapshots.

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/mactrans"
)

// ctlHandler answers the control socket from the shim. With --persist,
// saver writes the state before vif-add or vif-del is answered. A client
// told that a declared guest is kept or freed (the CNI plugin's DEL)
// must find it so after a crash that follows at once; the saver's
// once-a-second round alone does not give that.
type ctlHandler struct {
	sh             *shim.Shim
	name, fab, dev string
	saver          *stateSaver // nil without --persist
}

// saved writes the state now, if the daemon keeps one. A request whose
// change could not be written is refused with why (the change stands:
// the client may ask again), so that a client is never told a guest
// survives a crash when it would not.
func (h *ctlHandler) saved() error {
	if h.saver == nil {
		return nil
	}
	if err := h.saver.save(); err != nil {
		return fmt.Errorf("done, but the state file (--persist) was not written, so a crash now would undo it: %w", err)
	}
	return nil
}

var _ ctl.Handler = (*ctlHandler)(nil)

// vif parses a vif-add or vif-del request's MAC.
func (h *ctlHandler) vif(v ctl.VIFRequest) (ether.MAC, uint16, error) {
	mac, err := ether.ParseMAC(v.MAC)
	if err != nil {
		return mac, 0, fmt.Errorf("MAC %q: %v", v.MAC, err)
	}
	return mac, uint16(v.VLAN), nil
}

// AddVIF declares a guest (vif-add).
func (h *ctlHandler) AddVIF(v ctl.VIFRequest) error {
	mac, vlan, err := h.vif(v)
	if err != nil {
		return err
	}
	if err := h.sh.DeclareVIF(mac, vlan, mactrans.OriginDeclared); err != nil {
		return err
	}
	return h.saved()
}

// DelVIF removes a guest's VIF (vif-del).
func (h *ctlHandler) DelVIF(v ctl.VIFRequest) error {
	mac, vlan, err := h.vif(v)
	if err != nil {
		return err
	}
	if _, err = h.sh.RemoveVIF(mac, vlan, mactrans.OriginDeclared); err != nil {
		return err
	}
	return h.saved()
}

// FlushNeighbours forgets the remote endpoints (neigh-flush).
func (h *ctlHandler) FlushNeighbours() ctl.Flushed {
	return ctl.Flushed{Flushed: h.sh.FlushNeighbours()}
}

func secs(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

// Port answers show port.
func (h *ctlHandler) Port() ctl.Port {
	pi := h.sh.Port()
	p := ctl.Port{Name: h.name, Backend: h.fab, Device: h.dev, GID: pi.GID.String(), IBMTU: pi.IBMTU, IPoIBMTU: pi.IPoIBMTU, Link: "down"}
	if pi.Up {
		p.Link = "up"
	}
	for vlan, pk := range pi.Partitions {
		p.Partitions = append(p.Partitions, ctl.Partition{VLAN: vlan, PKey: pk.String()})
	}
	sort.Slice(p.Partitions, func(i, j int) bool { return p.Partitions[i].VLAN < p.Partitions[j].VLAN })
	return p
}

// VIFs answers show vifs.
func (h *ctlHandler) VIFs() []ctl.VIF {
	out := []ctl.VIF{}
	for _, v := range h.sh.VIFs() {
		out = append(out, ctl.VIF{MAC: v.MAC.String(), VLAN: v.VLAN, PKey: v.PKey.String(), QPN: fmt.Sprintf("%#06x", v.QPN),
			Address: v.Addr.String(), Origin: v.Origin.String(), IdleS: secs(v.Idle),
			TxPackets: v.TxPackets, TxBytes: v.TxBytes, RxPackets: v.RxPackets, RxBytes: v.RxBytes})
	}
	return out
}

// Neighbours answers show neigh.
func (h *ctlHandler) Neighbours() []ctl.Neigh {
	out := []ctl.Neigh{}
	for _, n := range h.sh.Neighbours() {
		j := ctl.Neigh{REMAC: n.REMAC.String(), RIMAC: n.RIMAC.String(), PKey: n.PKey.String(), IPs: []string{}, AgeS: secs(n.Age)}
		for _, ip := range n.IPs {
			j.IPs = append(j.IPs, ip.String())
		}
		out = append(out, j)
	}
	return out
}

// Groups answers show groups.
func (h *ctlHandler) Groups() []ctl.Group {
	out := []ctl.Group{}
	for _, g := range h.sh.Groups() {
		j := ctl.Group{MGID: g.MGID.String(), SendOnly: g.SendOnly, Members: []ctl.Member{}}
		for _, m := range g.Groups {
			j.Members = append(j.Members, ctl.Member{VLAN: m.VLAN, Group: m.Group.String(), ExpiresS: secs(m.Expires), QueriesLeft: m.QueriesLeft, LastReporter: m.LastReporter.String()})
		}
		out = append(out, j)
	}
	return out
}

// Stats answers show stats.
func (h *ctlHandler) Stats() ctl.Stats { return h.sh.Counters() }

// Capture streams a pcap of the capture's side until count packets, the
// client's hang-up or the server's close.
func (h *ctlHandler) Capture(r ctl.CaptureRequest, w io.Writer, gone <-chan struct{}) error {
	// The wire's side names are the protocol's, the shim's its own API.
	side, lt, snap := shim.CaptureTAP, layers.LinkTypeEthernet, uint32(shim.CaptureSnap)
	if r.Side == ctl.SideFabric {
		side, lt, snap = shim.CaptureFabric, layers.LinkType(242), shim.CaptureSnap+shim.CaptureHeader // LINKTYPE_IPOIB
	}
	c, err := h.sh.StartCapture(side, 1024)
	if err != nil {
		return err
	}
	defer c.Stop()
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(snap, lt); err != nil {
		return err
	}
	for n := 0; r.Count == 0 || n < r.Count; n++ {
		select {
		case <-gone:
			return nil
		case p := <-c.Packets():
			err := pw.WritePacket(gopacket.CaptureInfo{Timestamp: p.At, CaptureLength: len(p.Data), Length: p.Len}, p.Data)
			c.Release(p)
			if err != nil {
				return err
			}
		}
	}
	return nil
}
