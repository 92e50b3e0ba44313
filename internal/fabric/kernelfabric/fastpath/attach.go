package fastpath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eipoib/eipoibd/ipoib"
)

// Attached is both programs loaded and attached with tcx: TX at the
// TAP's egress, RX at the ingress of each child PutChild names. Its map
// calls are those kernelfabric.FastPath makes; a delete of an entry
// that is not there succeeds. Close detaches the programs and releases
// them and their maps: the links are not pinned, so the fast path ends
// with the process (tcx_link_release, kernel/bpf/tcx.c, detaches a link
// when its last file descriptor closes).
type Attached struct {
	TX *TX
	RX *RX

	tap      link.Link
	children map[int]link.Link
}

// Attach loads both programs and attaches TX at tc egress of the TAP
// with ifindex tap (tcx_link_attach, kernel/bpf/tcx.c; tcx_run in
// include/net/tcx.h runs it from sch_handle_egress).
func Attach(tap int) (*Attached, error) {
	a := &Attached{children: map[int]link.Link{}}
	var err error
	if a.TX, err = LoadTX(); err != nil {
		return nil, err
	}
	if a.RX, err = LoadRX(); err != nil {
		a.Close()
		return nil, err
	}
	if a.tap, err = link.AttachTCX(link.TCXOptions{Interface: tap, Program: a.TX.Program, Attach: ebpf.AttachTCXEgress}); err != nil {
		a.Close()
		return nil, fmt.Errorf("fastpath: attach TX at egress of ifindex %d: %w", tap, err)
	}
	return a, nil
}

// Close detaches and releases everything.
func (a *Attached) Close() error {
	var errs []error
	for i, l := range a.children {
		errs = append(errs, l.Close())
		delete(a.children, i)
	}
	if a.tap != nil {
		errs = append(errs, a.tap.Close())
	}
	if a.RX != nil {
		errs = append(errs, a.RX.Close())
	}
	if a.TX != nil {
		errs = append(errs, a.TX.Close())
	}
	return errors.Join(errs...)
}

// PutGuest puts a guest MAC's child in the TX map.
func (a *Attached) PutGuest(mac net.HardwareAddr, g Guest) error { return a.TX.PutGuest(mac, g) }

// DeleteGuest removes a guest MAC from the TX map.
func (a *Attached) DeleteGuest(mac net.HardwareAddr) error { return absent(a.TX.DeleteGuest(mac)) }

// PutREMAC puts a REMAC's address in the TX map.
func (a *Attached) PutREMAC(mac net.HardwareAddr, addr ipoib.HwAddr) error {
	return a.TX.PutREMAC(mac, addr)
}

// DeleteREMAC removes a REMAC from the TX map.
func (a *Attached) DeleteREMAC(mac net.HardwareAddr) error { return absent(a.TX.DeleteREMAC(mac)) }

// PutChild attaches RX at tc ingress of the child (once; tcx_run runs it
// from sch_handle_ingress, after __netif_receive_skb_core has delivered
// the packet to ptype_all sockets) and puts its guest in the RX map.
func (a *Attached) PutChild(child int, g RXGuest) error {
	if _, ok := a.children[child]; !ok {
		l, err := link.AttachTCX(link.TCXOptions{Interface: child, Program: a.RX.Program, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("fastpath: attach RX at ingress of ifindex %d: %w", child, err)
		}
		a.children[child] = l
	}
	return a.RX.PutGuest(uint32(child), g)
}

// DeleteChild removes the child's guest from the RX map and detaches RX
// from it.
func (a *Attached) DeleteChild(child int) error {
	err := absent(a.RX.DeleteGuest(uint32(child)))
	if l, ok := a.children[child]; ok {
		delete(a.children, child)
		err = errors.Join(err, l.Close())
	}
	return err
}

// PutSender puts a (child, source IP) → REMAC entry in the RX map.
func (a *Attached) PutSender(child uint32, ip netip.Addr, remac net.HardwareAddr) error {
	return a.RX.PutSender(child, ip, remac)
}

// DeleteSender removes a (child, source IP) entry from the RX map.
func (a *Attached) DeleteSender(child uint32, ip netip.Addr) error {
	return absent(a.RX.DeleteSender(child, ip))
}

// Counts sums both programs' per-CPU verdict counters.
func (a *Attached) Counts() (tx [NumReasons]uint64, rx [NumRXReasons]uint64, err error) {
	tx, err = a.TX.Counts()
	if err != nil {
		return tx, rx, err
	}
	rx, err = a.RX.Counts()
	return tx, rx, err
}

// absent makes the delete of an entry that is not there a success.
func absent(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// GuestHits sums the hit counts of the guest's TX entry and of its
// child's RX entry.
func (a *Attached) GuestHits(mac net.HardwareAddr, child int) (uint64, error) {
	tx, err := a.TX.GuestHits(mac)
	if err != nil {
		return 0, err
	}
	rx, err := a.RX.ChildHits(uint32(child))
	return tx + rx, err
}

// REMACHits is the hit count of the REMAC's TX entry.
func (a *Attached) REMACHits(mac net.HardwareAddr) (uint64, error) { return a.TX.REMACHits(mac) }

// SenderHits is the hit count of the sender's RX entry for the child.
func (a *Attached) SenderHits(child uint32, ip netip.Addr) (uint64, error) {
	return a.RX.SenderHits(child, ip)
}
