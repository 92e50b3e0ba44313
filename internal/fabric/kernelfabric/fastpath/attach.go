package fastpath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/ipoib"
)

// Attached is both programs loaded and attached: TX at the TAP's egress,
// RX at the ingress of each child PutChild names, with tcx links or,
// where the kernel has no tcx, clsact filters (Hook). Its map calls are
// those kernelfabric.FastPath makes; a delete of an entry that is not
// there succeeds.
//
// Without a pin directory (Options.Pin), the attachments and maps live
// as long as the process: Close (and Release) detach the programs, and
// a tcx link also detaches when its last file descriptor closes
// (tcx_link_release, kernel/bpf/tcx.c), so a process that dies takes its
// links with it. With one, see AttachWith.
type Attached struct {
	TX *TX
	RX *RX

	hook     Hook
	pin      string
	tap      attachment
	children map[int]attachment
}

// Attach loads both programs and attaches TX at tc egress of the TAP
// with ifindex tap, nothing pinned: AttachWith with no Options.
func Attach(tap int) (*Attached, error) { return AttachWith(tap, Options{}) }

// Hook is how the programs are attached.
func (a *Attached) Hook() Hook { return a.hook }

// Close detaches and releases everything, and with a pin directory
// removes every pin and the directory, leaving nothing in bpffs.
func (a *Attached) Close() error {
	var errs []error
	for i, at := range a.children {
		errs = append(errs, at.detach())
		delete(a.children, i)
	}
	if a.tap != nil {
		errs = append(errs, a.tap.detach())
		a.tap = nil
	}
	if a.pin != "" {
		errs = append(errs, a.unpinMaps())
	}
	errs = append(errs, a.closePrograms())
	if a.pin != "" {
		errs = append(errs, removePin(a.pin))
	}
	return errors.Join(errs...)
}

// Release ends this process's hold on the fast path. With a pin
// directory it leaves it running for the next process: the programs stay
// attached (tcx links pinned, clsact filters on their devices) with the
// maps pinned and their content kept; AttachWith with the same directory
// takes them over. Without one it is Close.
func (a *Attached) Release() error {
	if a.pin == "" {
		return a.Close()
	}
	var errs []error
	for i, at := range a.children {
		errs = append(errs, at.release())
		delete(a.children, i)
	}
	if a.tap != nil {
		errs = append(errs, a.tap.release())
		a.tap = nil
	}
	return errors.Join(append(errs, a.closePrograms())...)
}

// closePrograms closes the programs and maps this process holds.
func (a *Attached) closePrograms() error {
	var errs []error
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
// the packet to ptype_all sockets; a clsact filter runs from the same
// place) and puts its guest in the RX map.
func (a *Attached) PutChild(child int, g RXGuest) error {
	if _, ok := a.children[child]; !ok {
		at, err := a.attach(child, true)
		if err != nil {
			return fmt.Errorf("fastpath: attach RX at ingress of ifindex %d: %w", child, err)
		}
		a.children[child] = at
	}
	return a.RX.PutGuest(uint32(child), g)
}

// DeleteChild removes the child's guest from the RX map and detaches RX
// from it.
func (a *Attached) DeleteChild(child int) error {
	err := absent(a.RX.DeleteGuest(uint32(child)))
	if at, ok := a.children[child]; ok {
		delete(a.children, child)
		err = errors.Join(err, at.detach())
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
