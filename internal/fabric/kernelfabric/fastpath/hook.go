package fastpath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Hook is how the programs are attached to a device.
//
// Both hooks give the programs' return codes the same meaning. The
// programs return TC_ACT_OK (0) and TC_ACT_REDIRECT (7) only
// (include/uapi/linux/pkt_cls.h). Under tcx, tcx_action_code
// (include/net/tcx.h) keeps TCX_PASS (0), TCX_DROP (2) and TCX_REDIRECT
// (7) and turns anything else into TCX_NEXT (-1, TC_ACT_UNSPEC): 0 ends
// the device's tcx chain and the clsact filters after it
// (sch_handle_egress and sch_handle_ingress, net/core/dev.c, go on to
// tc_run only on TCX_NEXT), and the frame goes on through the stack; 7
// hands it to skb_do_redirect. Under clsact, cls_bpf_classify
// (net/sched/cls_bpf.c) with direct action returns
// cls_bpf_exec_opcode of the program's code, which keeps 0 and 7 (and
// maps unknown codes to TC_ACT_UNSPEC, the only one that goes on to the
// next filter): 0 ends the filter chain and the frame goes on, 7 is
// skb_do_redirect's. Neither hook runs what comes after the programs
// for a frame they passed or redirected.
type Hook uint8

// The hooks.
const (
	// TCX: a BPF link per device (tcx_link_attach, kernel/bpf/tcx.c;
	// Linux 6.6), which can be pinned, so it outlives the process.
	TCX Hook = iota
	// Clsact: a direct-action cls_bpf filter under the device's clsact
	// qdisc (sch_ingress.c, cls_bpf.c), for kernels without tcx. A filter
	// stays on its device until it is deleted or the device goes: it
	// holds its program, which holds the maps, however the process ends.
	Clsact
)

func (h Hook) String() string {
	if h == Clsact {
		return "clsact"
	}
	return "tcx"
}

// Our cls_bpf filters: at this priority and handle on each device, so
// that a restart finds (and replaces) them, and a detach deletes only
// them, whatever other filters the device has. A filter at a lower
// priority runs before ours (tcf_classify walks the chain by priority).
const (
	clsPriority = 0xe1b0
	clsHandle   = 0xe1b0
)

// attachment is one program attached to one device.
type attachment interface {
	// update makes the attachment run p instead, with no moment in
	// which neither runs.
	update(p *ebpf.Program) error
	// detach removes it from the device, and its pin.
	detach() error
	// release lets go of it, leaving it on the device (a pinned link, a
	// filter), for a later process to find.
	release() error
}

// tcxAttachment is a tcx link, pinned at pin unless that is empty.
type tcxAttachment struct {
	l   link.Link
	pin string
}

func (t *tcxAttachment) update(p *ebpf.Program) error { return t.l.Update(p) }

// detach: tcx_link_release (kernel/bpf/tcx.c) detaches the link when its
// last reference goes, the pin's or the descriptor's.
func (t *tcxAttachment) detach() error {
	var err error
	if t.pin != "" {
		err = t.l.Unpin()
	}
	return errors.Join(err, t.l.Close())
}

func (t *tcxAttachment) release() error {
	if t.pin == "" {
		return t.detach()
	}
	return t.l.Close()
}

// clsAttachment is our cls_bpf filter on one device.
type clsAttachment struct {
	f netlink.BpfFilter
}

// clsFilter is our filter on the device, its program (Fd) not set.
func clsFilter(ifindex int, ingress bool, name string) netlink.BpfFilter {
	parent := uint32(netlink.HANDLE_MIN_EGRESS)
	if ingress {
		parent = netlink.HANDLE_MIN_INGRESS
	}
	return netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent, Handle: clsHandle, Priority: clsPriority, Protocol: unix.ETH_P_ALL},
		Name:        name, DirectAction: true,
	}
}

// attachCls makes sure the device has a clsact qdisc and puts our filter
// running p on it: a new one, or in place of ours already there
// (cls_bpf_change swaps the program of an existing handle, so frames
// see the old program or the new one, never none).
func attachCls(ifindex int, ingress bool, p *ebpf.Program, name string) (*clsAttachment, error) {
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("add a clsact qdisc: %w", err)
	}
	c := &clsAttachment{f: clsFilter(ifindex, ingress, name)}
	if err := c.update(p); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *clsAttachment) update(p *ebpf.Program) error {
	c.f.Fd = p.FD()
	if err := netlink.FilterReplace(&c.f); err != nil {
		return fmt.Errorf("put the %s filter: %w", c.f.Name, err)
	}
	return nil
}

// detach deletes our filter, and no other; one already gone is not an
// error: with its device (ENODEV), with the clsact qdisc
// (__tcf_qdisc_find, net/sched/cls_api.c: "Parent Qdisc doesn't exists",
// EINVAL), or alone (ENOENT). The clsact qdisc stays: other filters may
// hang from it.
func (c *clsAttachment) detach() error {
	err := netlink.FilterDel(&c.f)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	return fmt.Errorf("delete the %s filter of ifindex %d: %w", c.f.Name, c.f.LinkIndex, err)
}

func (c *clsAttachment) release() error { return nil }

// clsTag is the tag of the program our filter runs on the device, "" if
// it has none (or the device is gone).
func clsTag(ifindex int, ingress bool) string {
	want := clsFilter(ifindex, ingress, "")
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return ""
	}
	fs, err := netlink.FilterList(l, want.Parent)
	if err != nil {
		return ""
	}
	for _, f := range fs {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Handle == clsHandle && b.Priority == clsPriority {
			return b.Tag
		}
	}
	return ""
}

// attachTCX attaches p with a tcx link, pinned at pin unless it is
// empty.
func attachTCX(ifindex int, at ebpf.AttachType, p *ebpf.Program, pin string) (*tcxAttachment, error) {
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: p, Attach: at})
	if err != nil {
		return nil, err
	}
	t := &tcxAttachment{l: l}
	if pin != "" {
		if err := l.Pin(pin); err != nil {
			l.Close()
			return nil, fmt.Errorf("pin at %s: %w", pin, err)
		}
		t.pin = pin
	}
	return t, nil
}

// pinnedTCX is the tcx link pinned at pin if it is still attached to
// ifindex at at, with the tag of the program it runs; nil (and the pin
// removed) if it is not, nil and no error if there is no pin.
func pinnedTCX(pin string, ifindex int, at ebpf.AttachType) (*tcxAttachment, string, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		// Not a link (or not ours to read): out of the way.
		return nil, "", removePin(pin)
	}
	t := &tcxAttachment{l: l, pin: pin}
	info, err := l.Info()
	var tcx *link.TCXInfo
	if err == nil {
		tcx = info.TCX()
	}
	// A link whose device went is detached, its device gone: tcx_uninstall
	// clears it and tcx_link_fill_info (kernel/bpf/tcx.c) then reports
	// ifindex 0. A device made again under the same name has another
	// ifindex.
	if tcx == nil || int(tcx.Ifindex) != ifindex || uint32(tcx.AttachType) != uint32(at) {
		return nil, "", t.detach()
	}
	return t, progTag(info.Program), nil
}

// progTag is the tag of the program with this ID, "" if unknown: opening
// a program by ID (BPF_PROG_GET_FD_BY_ID) needs CAP_SYS_ADMIN
// (bpf_prog_get_fd_by_id, kernel/bpf/syscall.c), which the systemd unit
// does not grant; foreign takes an unknown tag for no evidence.
func progTag(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Tag
}

// removePin removes a pin that is no longer wanted; one already gone is
// not an error.
func removePin(pin string) error {
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fastpath: remove pin: %w", err)
	}
	return nil
}
