package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// PinBase is where eipoibd pins a TAP's fast path under --persist: in
// PinBase/<tap>.
const PinBase = "/sys/fs/bpf/eipoibd"

// The names of the link pins in a pin directory; the maps are pinned
// under their own names (eipoib_*).
const (
	txLinkPin   = "tx_link"
	rxLinkPin   = "rx_link_" // + the child's ifindex
	txFilter    = "eipoib_tx"
	rxFilter    = "eipoib_rx"
	rxGuestsPin = "eipoib_rx_guest" // the RX guests map, pinned under its name
	pinDirPerms = 0o700
)

// Options says how AttachWith attaches.
type Options struct {
	// Pin, if not empty, is a directory on a bpffs (made if missing)
	// where the maps and the tcx links are pinned: see AttachWith.
	Pin string
	// Log gets the one line saying that pinned objects were replaced;
	// nil: none.
	Log *slog.Logger

	// clsact attaches with clsact filters even where tcx attaches: the
	// fallback's test hook on kernels that have tcx.
	clsact bool
}

// AttachWith loads both programs and attaches TX at tc egress of the
// TAP with ifindex tap: with tcx (tcx_link_attach, kernel/bpf/tcx.c;
// tcx_run in include/net/tcx.h runs it from sch_handle_egress), or, on a
// kernel without tcx (link.AttachTCX reports ebpf.ErrNotSupported), with
// a clsact filter.
//
// With o.Pin, the maps and tcx links are pinned there, so that they
// outlive the process (Release), and what an earlier process left there
// is taken over: maps of the same layout with their content, the TAP's
// link if it is still attached to this TAP, and each child's link whose
// child still exists (the others' pins are removed). The programs are
// loaded afresh and swapped into the links and filters taken over, with
// no moment in which neither runs (tcx_link_update; cls_bpf_change).
// A map of another layout is made afresh, and o.Log told so once, as it
// is when a program taken over is not this binary's (its tag differs).
// clsact filters cannot be pinned: a filter stays on its device until it
// is deleted, so AttachWith finds ours (by priority and handle) and
// replaces its program, on the TAP and on each child the RX map names.
//
// When it fails after the pin directory was made, it removes what is
// pinned there (RemovePins): a TX program left at the TAP's egress over
// maps no control plane empties would redirect guests' frames to
// children that are gone, while eipoibd carries on without the fast
// path.
func AttachWith(tap int, o Options) (a *Attached, err error) {
	a = &Attached{children: map[int]attachment{}, pin: o.Pin}
	if o.Pin != "" {
		if err := pinDir(o.Pin); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, RemovePins(o.Pin, tap))
			}
		}()
	}
	var replaced, rxReplaced []string
	if a.TX, replaced, err = loadTXAt(o.Pin); err != nil {
		return nil, err
	}
	if a.RX, rxReplaced, err = loadRXAt(o.Pin); err != nil {
		a.closePrograms()
		return nil, err
	}
	replaced = append(replaced, rxReplaced...)
	if a.hook, err = a.attachTAP(tap, o.clsact, &replaced); err != nil {
		a.closePrograms()
		return nil, fmt.Errorf("fastpath: attach TX at egress of ifindex %d: %w", tap, err)
	}
	if o.Pin != "" {
		if err := a.adoptChildren(&replaced); err != nil {
			a.Release()
			return nil, err
		}
	}
	if len(replaced) > 0 && o.Log != nil {
		o.Log.Info("fast path: pinned objects did not match this binary's programs: replaced", "pin", o.Pin, "replaced", strings.Join(replaced, ","))
	}
	return a, nil
}

// attachTAP attaches TX at the TAP's egress, taking over what a pin or
// our filter there holds; it reports what it replaced.
func (a *Attached) attachTAP(tap int, clsact bool, replaced *[]string) (Hook, error) {
	pin := a.pinPath(txLinkPin)
	tag := progTagOf(a.TX.Program)
	if !clsact {
		if pin != "" {
			old, oldTag, err := pinnedTCX(pin, tap, ebpf.AttachTCXEgress)
			if err != nil {
				return TCX, err
			}
			if old != nil {
				if foreign(oldTag, tag) {
					*replaced = append(*replaced, txFilter)
				}
				if err := old.update(a.TX.Program); err != nil {
					old.release()
					return TCX, fmt.Errorf("swap in the TX program: %w", err)
				}
				a.tap = old
				return TCX, nil
			}
		}
		t, err := attachTCX(tap, ebpf.AttachTCXEgress, a.TX.Program, pin)
		if err == nil {
			a.tap = t
			return TCX, nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return TCX, err
		}
	}
	if pin != "" {
		// A link left by a run on tcx goes.
		if old, _, err := pinnedTCX(pin, tap, ebpf.AttachTCXEgress); err != nil || old != nil {
			if err == nil {
				err = old.detach()
			}
			if err != nil {
				return Clsact, err
			}
		}
	}
	if old := clsTag(tap, false); old != "" && old != tag {
		*replaced = append(*replaced, txFilter)
	}
	c, err := attachCls(tap, false, a.TX.Program, txFilter)
	if err != nil {
		return Clsact, err
	}
	a.tap = c
	return Clsact, nil
}

// adoptChildren takes over the RX attachments an earlier process left:
// under tcx the pinned links of children that still exist (removing the
// others' pins), under clsact our filters on the children the RX map
// names. It reports an RX program of another tag as replaced.
func (a *Attached) adoptChildren(replaced *[]string) error {
	tag := progTagOf(a.RX.Program)
	swapped := false
	adopt := func(child int, at attachment, oldTag string) error {
		if foreign(oldTag, tag) && !swapped {
			*replaced = append(*replaced, rxFilter)
			swapped = true
		}
		if err := at.update(a.RX.Program); err != nil {
			return errors.Join(fmt.Errorf("fastpath: swap in the RX program at ifindex %d: %w", child, err), at.release())
		}
		a.children[child] = at
		return nil
	}
	if a.hook == Clsact {
		children, err := rxChildren(a.RX.Guests)
		if err != nil {
			return err
		}
		for _, c := range children {
			if old := clsTag(c, true); old != "" {
				at := &clsAttachment{f: clsFilter(c, true, rxFilter)}
				if err := adopt(c, at, old); err != nil {
					return err
				}
			}
		}
		return nil
	}
	pins, err := filepath.Glob(a.pinPath(rxLinkPin + "*"))
	if err != nil {
		return err
	}
	for _, pin := range pins {
		child, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(pin), rxLinkPin))
		if err != nil {
			if err := removePin(pin); err != nil {
				return err
			}
			continue
		}
		old, oldTag, err := pinnedTCX(pin, child, ebpf.AttachTCXIngress)
		if err != nil {
			return err
		}
		if old != nil {
			if err := adopt(child, old, oldTag); err != nil {
				return err
			}
		}
	}
	return nil
}

// attach attaches RX at the child's ingress (ingress) or TX at the TAP's
// egress with the hook in use, pinning a tcx link under the pin
// directory.
func (a *Attached) attach(ifindex int, ingress bool) (attachment, error) {
	p, at, name, pin := a.TX.Program, ebpf.AttachTCXEgress, txFilter, txLinkPin
	if ingress {
		p, at, name, pin = a.RX.Program, ebpf.AttachTCXIngress, rxFilter, rxLinkPin+strconv.Itoa(ifindex)
	}
	if a.hook == Clsact {
		return attachCls(ifindex, ingress, p, name)
	}
	return attachTCX(ifindex, at, p, a.pinPath(pin))
}

// pinPath is name in the pin directory, "" without one.
func (a *Attached) pinPath(name string) string {
	if a.pin == "" {
		return ""
	}
	return filepath.Join(a.pin, name)
}

// unpinMaps removes the maps' pins.
func (a *Attached) unpinMaps() error {
	var errs []error
	for _, m := range []*ebpf.Map{a.TX.Guests, a.TX.REMACs, a.TX.Counters, a.TX.LastRedirect, a.RX.Guests, a.RX.Senders, a.RX.Counters, a.RX.LastRedirect} {
		errs = append(errs, m.Unpin())
	}
	return errors.Join(errs...)
}

// foreign reports whether a pinned link runs another binary's program:
// its tag is known (progTag) and is not ours. An unknown tag is no
// evidence either way; the program is swapped in all the same.
func foreign(oldTag, ours string) bool { return oldTag != "" && oldTag != ours }

// progTagOf is the program's tag (bpf_prog_calc_tag, kernel/bpf/core.c:
// a hash of its instructions with map file descriptors zeroed, so the
// same program over other maps has the same tag); "" if unknown.
func progTagOf(p *ebpf.Program) string {
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Tag
}

// RemovePins undoes what an earlier run that pinned the fast path of the
// TAP with ifindex tap at dir left, for a start that does not pin it:
// the pinned links (detached with their last reference,
// tcx_link_release), our clsact filters on the TAP and on the children
// the pinned RX map names (a --persist restart keeps the children, so
// theirs would not go with them), the maps' pins and dir itself. A dir
// that does not exist is no error: only the TAP's filter can be left
// then (pins removed by hand), and it is removed.
func RemovePins(dir string, tap int) error {
	tapFilter := &clsAttachment{f: clsFilter(tap, false, txFilter)}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		if tap <= 0 {
			return nil
		}
		return tapFilter.detach()
	}
	if err != nil {
		return fmt.Errorf("fastpath: read %s: %w", dir, err)
	}
	errs := []error{detachChildFilters(filepath.Join(dir, rxGuestsPin))}
	for _, e := range ents {
		pin := filepath.Join(dir, e.Name())
		if e.Name() == txLinkPin || strings.HasPrefix(e.Name(), rxLinkPin) {
			if old, _, err := pinnedTCX(pin, -1, ebpf.AttachTCXEgress); err != nil || old != nil {
				errs = append(errs, err)
			}
		}
		errs = append(errs, removePin(pin))
	}
	if tap > 0 {
		errs = append(errs, tapFilter.detach())
	}
	errs = append(errs, removePin(dir))
	return errors.Join(errs...)
}

// detachChildFilters removes our clsact filter from each child the RX
// guests map pinned at pin names (none under tcx, whose links are
// pinned; no pin, nothing to do).
func detachChildFilters(pin string) error {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fastpath: open %s: %w", pin, err)
	}
	defer m.Close()
	children, err := rxChildren(m)
	errs := []error{err}
	for _, c := range children {
		errs = append(errs, (&clsAttachment{f: clsFilter(c, true, rxFilter)}).detach())
	}
	return errors.Join(errs...)
}

// pinDir makes dir, which must be on a bpffs: the nearest directory that
// exists above it must be one.
func pinDir(dir string) error {
	d := dir
	for {
		if _, err := os.Stat(d); err == nil || filepath.Dir(d) == d {
			break
		}
		d = filepath.Dir(d)
	}
	if !isBPFFS(d) {
		return fmt.Errorf("fastpath: %s is not on a bpffs, so the fast path cannot be pinned there (mount -t bpf bpf %s)", dir, d)
	}
	if err := os.MkdirAll(dir, pinDirPerms); err != nil {
		return fmt.Errorf("fastpath: pin directory: %w", err)
	}
	return nil
}

// isBPFFS reports whether dir is on a bpffs.
func isBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

// bpffsRoot is where a bpffs is mounted by convention (systemd mounts
// one there; a bare system may not have); a variable for the tests.
var bpffsRoot = "/sys/fs/bpf"

// MountBPFFS makes sure that dir, which need not exist yet, is on a
// bpffs: nothing when the nearest directory that exists at or above it
// is on one; else a bpffs is mounted at /sys/fs/bpf when dir is under
// it, or at dir itself (made if need be) when it is elsewhere.
func MountBPFFS(dir string) error {
	d := dir
	for {
		if _, err := os.Stat(d); err == nil || filepath.Dir(d) == d {
			break
		}
		d = filepath.Dir(d)
	}
	if isBPFFS(d) {
		return nil
	}
	at := dir
	if dir == bpffsRoot || strings.HasPrefix(dir, bpffsRoot+"/") {
		at = bpffsRoot
	} else if err := os.MkdirAll(dir, pinDirPerms); err != nil {
		return fmt.Errorf("fastpath: no bpffs at %s, and making it failed: %w", dir, err)
	}
	if err := unix.Mount("bpf", at, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("fastpath: no bpffs at %s, and mounting one at %s failed: %w", dir, at, err)
	}
	return nil
}

// Entries is what the maps hold, for a control plane that takes over
// maps an earlier process filled.
type Entries struct {
	// Guests: guest MAC → its child and MTU (TX).
	Guests map[[6]byte]Guest
	// REMACs: REMAC → its 20-byte address (TX).
	REMACs map[[6]byte]ipoib.HwAddr
	// Children: child ifindex → its guest (RX).
	Children map[int]RXGuest
	// Senders: (child ifindex, source IP) → the sender's REMAC (RX).
	Senders map[Sender][6]byte
}

// Sender is a senders-map key: a child's ifindex and a source IP.
type Sender struct {
	Child int
	IP    netip.Addr
}

// Entries reads the four maps.
func (a *Attached) Entries() (Entries, error) {
	e := Entries{Guests: map[[6]byte]Guest{}, REMACs: map[[6]byte]ipoib.HwAddr{}, Children: map[int]RXGuest{}, Senders: map[Sender][6]byte{}}
	var mac [6]byte
	var g txGuest
	it := a.TX.Guests.Iterate()
	for it.Next(&mac, &g) {
		e.Guests[mac] = g.Guest
	}
	errs := []error{it.Err()}
	var r txREMAC
	it = a.TX.REMACs.Iterate()
	for it.Next(&mac, &r) {
		e.REMACs[mac] = r.Addr
	}
	errs = append(errs, it.Err())
	var child uint32
	var rg rxGuest
	it = a.RX.Guests.Iterate()
	for it.Next(&child, &rg) {
		e.Children[int(child)] = RXGuest{MAC: append(net.HardwareAddr(nil), rg.MAC[:]...), TAP: rg.TAP, MTU: rg.MTU}
	}
	errs = append(errs, it.Err())
	var sk senderKey
	var sv senderVal
	it = a.RX.Senders.Iterate()
	for it.Next(&sk, &sv) {
		e.Senders[Sender{Child: int(sk.Child), IP: netip.AddrFrom16(sk.Addr).Unmap()}] = sv.REMAC
	}
	errs = append(errs, it.Err())
	if err := errors.Join(errs...); err != nil {
		return Entries{}, fmt.Errorf("fastpath: read the maps: %w", err)
	}
	return e, nil
}

// rxChildren returns the children (ifindexes) the RX guests map m names.
func rxChildren(m *ebpf.Map) ([]int, error) {
	var children []int
	var child uint32
	var g rxGuest
	it := m.Iterate()
	for it.Next(&child, &g) {
		children = append(children, int(child))
	}
	if err := it.Err(); err != nil {
		return children, fmt.Errorf("fastpath: read the RX guests: %w", err)
	}
	return children, nil
}
