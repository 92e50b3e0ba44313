package fastpath

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// This file holds what the TX and RX programs share: the stack layout,
// the bounded header loads, the L3/L4 classification that decides which
// packets eipoibd must see, and the per-CPU verdict counters.

// TC verdicts (include/uapi/linux/pkt_cls.h). TC_ACT_OK is TCX_PASS under
// tcx (tcx_run), ending the chain for this frame as the daemon path wants.
const (
	tcActOK   = 0
	tcActShot = 2
)

// Stack slots of both programs (offsets from R10, the frame pointer).
const (
	stEth  = -16  // TX: 14 bytes, the guest's dst MAC, src MAC, EtherType
	stLink = -24  // RX: 24 bytes, the received pseudo header and IPoIB header
	stL3   = -64  // 40 bytes: the IPv4 (first 20) or IPv6 header
	stL4   = -80  // 16 bytes: ports, ICMPv6 type, TCP header to doff
	stOut  = -104 // 24 bytes: the link header being built
	stSKey = -124 // RX: 20 bytes, a senders-map key
	stKey  = -128 // 4 bytes: a map index
	stPtr  = -136 // 8 bytes: the second map value of a redirect (spilled)
)

// Offsets into struct __sk_buff (include/uapi/linux/bpf.h).
const (
	ctxLen            = 0
	ctxPktType        = 4
	ctxProtocol       = 16
	ctxVLANPresent    = 20
	ctxIngressIfindex = 36
	ctxGSOSize        = 176
)

// newMap creates one of the programs' maps, its error named. With pin
// set (a directory on bpffs) the map is pinned there under its name, and
// a map already pinned there is used instead if it has the same layout
// (type, key and value sizes, bound, flags); one that has not is
// unpinned and made afresh, which replaced reports.
func newMap(name string, typ ebpf.MapType, key, val, n uint32, pin string) (m *ebpf.Map, replaced bool, err error) {
	spec := &ebpf.MapSpec{Name: name, Type: typ, KeySize: key, ValueSize: val, MaxEntries: n}
	if pin == "" {
		m, err = ebpf.NewMap(spec)
	} else {
		spec.Pinning = ebpf.PinByName
		m, err = ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: pin})
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			replaced = true
			if err = removePin(filepath.Join(pin, name)); err == nil {
				m, err = ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: pin})
			}
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("fastpath: map %s: %w", name, err)
	}
	return m, replaced, nil
}

// maps creates a program's maps in turn, pinned under pin unless it is
// empty; after the first failure it makes no more, and err holds that
// failure. replaced names the pinned maps that did not match.
type maps struct {
	pin      string
	replaced []string
	err      error
}

// make is newMap, or nil once a map failed.
func (ms *maps) make(name string, typ ebpf.MapType, key, val, n uint32) *ebpf.Map {
	if ms.err != nil {
		return nil
	}
	m, replaced, err := newMap(name, typ, key, val, n, ms.pin)
	if replaced {
		ms.replaced = append(ms.replaced, name)
	}
	ms.err = err
	return m
}

// loadSchedCLS loads a tc (SchedCLS) program; what names it in errors.
func loadSchedCLS(name, what string, insns asm.Instructions) (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "Apache-2.0", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("fastpath: load %s program: %w", what, err)
	}
	return p, nil
}

// closeAll closes the program and the maps that exist.
func closeAll(p *ebpf.Program, ms ...*ebpf.Map) error {
	var errs []error
	if p != nil {
		errs = append(errs, p.Close())
	}
	for _, m := range ms {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// loadBytes copies n bytes at off (plus R7, the L3 header length, when
// afterL3) of the skb in R6 to the stack slot, with bpf_skb_load_bytes so
// that non-linear skbs are handled as linear ones; a frame too short
// jumps to fb_malformed. sym, when set, labels the first instruction.
func loadBytes(sym string, off int32, afterL3 bool, slot int16, n int32) asm.Instructions {
	ins := asm.Instructions{asm.Mov.Reg(asm.R1, asm.R6)}
	if sym != "" {
		ins[0] = ins[0].WithSymbol(sym)
	}
	if afterL3 {
		ins = append(ins, asm.Mov.Reg(asm.R2, asm.R7), asm.Add.Imm(asm.R2, off))
	} else {
		ins = append(ins, asm.Mov.Imm(asm.R2, off))
	}
	return append(ins,
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(slot)),
		asm.Mov.Imm(asm.R4, n),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "fb_malformed"),
	)
}

// classifyL3 reads the IP header at l3 (the link header's length) and the
// start of the L4 header, for R7 holding the EtherType in host order. It
// jumps to l4done with R7 the L3 header length and R8 the L4 protocol, or
// to the fallback of a packet eipoibd must handle itself: fb_not_ip,
// fb_malformed, fb_fragment (when fragments is set), fb_ipv6_ext, fb_dhcp,
// fb_dhcpv6 or fb_nd. Multi-byte fields are converted from network order
// with asm.HostTo, so the program is right on either byte order.
func classifyL3(l3 int32, fragments bool) asm.Instructions {
	var p asm.Instructions
	add := func(ins ...asm.Instruction) { p = append(p, ins...) }
	addAll := func(ins asm.Instructions) { p = append(p, ins...) }

	add(
		asm.JEq.Imm(asm.R7, 0x86dd, "ipv6"),
		asm.JNE.Imm(asm.R7, 0x0800, "fb_not_ip"),
	)
	// IPv4.
	addAll(loadBytes("", l3, false, stL3, 20))
	add(
		asm.LoadMem(asm.R1, asm.RFP, stL3, asm.Byte),
		asm.Mov.Reg(asm.R2, asm.R1),
		asm.RSh.Imm(asm.R2, 4),
		asm.JNE.Imm(asm.R2, 4, "fb_malformed"),
		asm.And.Imm(asm.R1, 0xf),
		asm.JLT.Imm(asm.R1, 5, "fb_malformed"),
		asm.LSh.Imm(asm.R1, 2),
		asm.Mov.Reg(asm.R7, asm.R1),
	)
	if fragments {
		add(
			// Flags and fragment offset, in host order after the swap:
			// MF is 0x2000, the offset the low 13 bits.
			asm.LoadMem(asm.R1, asm.RFP, stL3+6, asm.Half),
			asm.HostTo(asm.BE, asm.R1, asm.Half),
			asm.And.Imm(asm.R1, 0x3fff),
			asm.JNE.Imm(asm.R1, 0, "fb_fragment"),
		)
	}
	add(
		asm.LoadMem(asm.R8, asm.RFP, stL3+9, asm.Byte),
		asm.JNE.Imm(asm.R8, 17, "l4done"),
	)
	addAll(loadBytes("", l3, true, stL4, 4))
	addAll(ports(67, 68, "fb_dhcp"))
	add(asm.Ja.Label("l4done"))

	// IPv6.
	addAll(loadBytes("ipv6", l3, false, stL3, 40))
	add(
		asm.LoadMem(asm.R1, asm.RFP, stL3, asm.Byte),
		asm.RSh.Imm(asm.R1, 4),
		asm.JNE.Imm(asm.R1, 6, "fb_malformed"),
		asm.Mov.Imm(asm.R7, 40),
		asm.LoadMem(asm.R8, asm.RFP, stL3+6, asm.Byte),
		asm.JEq.Imm(asm.R8, 0, "fb_ipv6_ext"),
		asm.JEq.Imm(asm.R8, 43, "fb_ipv6_ext"),
		asm.JEq.Imm(asm.R8, 44, "fb_ipv6_ext"),
		asm.JEq.Imm(asm.R8, 60, "fb_ipv6_ext"),
		asm.JEq.Imm(asm.R8, 17, "v6udp"),
		asm.JNE.Imm(asm.R8, 58, "l4done"),
	)
	addAll(loadBytes("", l3+40, false, stL4, 1))
	add(
		asm.LoadMem(asm.R1, asm.RFP, stL4, asm.Byte),
		asm.JLT.Imm(asm.R1, 133, "l4done"),
		asm.JGT.Imm(asm.R1, 137, "l4done"),
		asm.Ja.Label("fb_nd"),
	)
	addAll(loadBytes("v6udp", l3+40, false, stL4, 4))
	addAll(ports(546, 547, "fb_dhcpv6"))
	add(asm.Ja.Label("l4done"))
	return p
}

// ports jumps to label when the UDP source or destination port at stL4
// is a or b.
func ports(a, b int32, label string) asm.Instructions {
	var ins asm.Instructions
	for _, off := range []int16{stL4, stL4 + 2} {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.RFP, off, asm.Half),
			asm.HostTo(asm.BE, asm.R1, asm.Half),
			asm.JEq.Imm(asm.R1, a, label),
			asm.JEq.Imm(asm.R1, b, label),
		)
	}
	return ins
}

// fallbacks emits, for each name, the block labelled fb_<name> that
// returns TC_ACT_OK and counts the reason of that index in first+i.
func fallbacks(names []string, first int32) asm.Instructions {
	var ins asm.Instructions
	for i, n := range names {
		ins = append(ins,
			asm.Mov.Imm(asm.R8, tcActOK).WithSymbol("fb_"+n),
			asm.Mov.Imm(asm.R9, first+int32(i)),
			asm.Ja.Label("count"),
		)
	}
	return ins
}

// countHits adds one to the hit count of both map values a redirect
// used: R9's at guestOff and the one spilled at stPtr at otherOff
// (package kernelfabric reads them back when the shim is about to age
// or evict what they name). It runs only once the frame is rewritten,
// so fallbacks count no hit.
//
// BPF_ATOMIC BPF_ADD is a lock-prefixed add on x86 (kernel/bpf/core.c,
// ___bpf_prog_run's STX_ATOMIC_DW: atomic64_add), so the CPUs running
// the program at once lose no hit. The verifier (kernel/bpf/verifier.c,
// check_atomic, check_atomic_rmw since 6.13) takes it into a map value
// with a size of W or DW, checked as a read and a write with strict
// alignment: both offsets are multiples of 8 in 8-aligned hash values.
// A spilled map-value pointer keeps its type through the stack
// (save_register_state), so it needs no second lookup.
func countHits(guestOff, otherOff int16) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R9, asm.R1, asm.DWord, guestOff),
		asm.LoadMem(asm.R2, asm.RFP, stPtr, asm.DWord),
		asm.AddAtomic.Mem(asm.R2, asm.R1, asm.DWord, otherOff),
	}
}

// recordTarget stores R7, the redirect target, in the one-entry per-CPU
// array last, for tests: BPF_PROG_TEST_RUN reports the verdict but not
// the target. It ends at the label redirect.
func recordTarget(last int) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, stKey, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, last),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "redirect"),
		asm.StoreMem(asm.R0, 0, asm.R7, asm.Word),
	}
}

// lookupAbsent looks k up in m into v, leaving v as it was (zero) and
// returning nil when m has no such key.
func lookupAbsent(m *ebpf.Map, k, v any) error {
	if err := m.Lookup(k, v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// sumPerCPU sums a per-CPU counters array of n uint64 entries.
func sumPerCPU(m *ebpf.Map, n int, name func(int) string) ([]uint64, error) {
	sum := make([]uint64, n)
	for i := range n {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("fastpath: counter %s: %w", name(i), err)
		}
		for _, v := range per {
			sum[i] += v
		}
	}
	return sum, nil
}
