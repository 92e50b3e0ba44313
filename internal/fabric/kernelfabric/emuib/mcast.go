package emuib

// The wire's multicast: a program attached at every fabric end's tcx
// ingress before the wire (Programs.Wire), which replicates a frame sent
// to the multicast QPN to the group's members and leaves unicast to the
// wire.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/eipoib/eipoibd/ipoib"
)

// MaxHosts and MaxMembers bound a group: each of up to MaxHosts
// emulated hypervisors (Kernel's Config.Host, 0 to MaxHosts-1) has up
// to MaxMembers children in it, as an HCA bounds the QPs attached to a
// group (max_mcast_qp_attach). The program's loops are unrolled to
// these bounds.
const (
	MaxHosts   = 4
	MaxMembers = 8
	maxGroups  = 1024
	gidLen     = 16
)

// McastReason indexes the Multicast counters.
type McastReason uint32

// The multicast program's counters.
const (
	// McastFrames counts the frames sent to the multicast QPN, each
	// taken by the program (and dropped after its copies went).
	McastFrames McastReason = iota
	// McastCopies counts the copies redirected to the members' fabric
	// ends (bpf_clone_redirect returned 0).
	McastCopies
	// McastShort counts multicast frames whose Ethernet header could not
	// be written; dropped.
	McastShort

	NumMcastReasons
)

// GroupKey is a Groups key: a group's MGID and the hypervisor whose
// members the value lists, so that each hypervisor writes only its own
// entries (no read-modify-write of a value another process writes).
type GroupKey struct {
	MGID ipoib.GID
	Host uint32
}

// Members is a Groups value: the fabric end ifindexes of one
// hypervisor's members of a group, 0 for an empty slot.
type Members [MaxMembers]uint32

// Multicast is the multicast program and its maps.
type Multicast struct {
	// Prog is the tc program, attached at each fabric end's ingress
	// before the wire.
	Prog *ebpf.Program
	// Groups maps a GroupKey to its Members.
	Groups *ebpf.Map
	// Counters is an array of uint64 indexed by McastReason.
	Counters *ebpf.Map
}

// LoadMulticast loads the multicast program.
func LoadMulticast() (m *Multicast, err error) {
	m = &Multicast{}
	defer func() {
		if err != nil {
			m.Close()
			m = nil
		}
	}()
	if m.Groups, err = newMap(&ebpf.MapSpec{Name: "emuib_groups", Type: ebpf.Hash, KeySize: gidLen + 4, ValueSize: 4 * MaxMembers, MaxEntries: maxGroups}); err != nil {
		return
	}
	if m.Counters, err = newCounters("emuib_mcounters", int(NumMcastReasons)); err != nil {
		return
	}
	m.Prog, err = load("emuib_mcast", mcastInstructions(m.Groups.FD(), m.Counters.FD()))
	return
}

// Close releases the program and maps.
func (m *Multicast) Close() error {
	return closeAll([]*ebpf.Program{m.Prog}, []*ebpf.Map{m.Groups, m.Counters})
}

// PutMembers sets host's members of group mgid to the fabric ends ends
// (at most MaxMembers), or deletes the entry when there are none.
func (m *Multicast) PutMembers(mgid ipoib.GID, host int, ends []int) error {
	if host < 0 || host >= MaxHosts {
		return fmt.Errorf("emuib: host %d: want 0 to %d", host, MaxHosts-1)
	}
	if len(ends) > MaxMembers {
		return fmt.Errorf("emuib: group %s: %d members of host %d, at most %d", mgid, len(ends), host, MaxMembers)
	}
	k := GroupKey{MGID: mgid, Host: uint32(host)}
	if len(ends) == 0 {
		err := m.Groups.Delete(k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return err
	}
	var v Members
	sorted := slices.Sorted(slices.Values(ends))
	for i, e := range sorted {
		v[i] = uint32(e)
	}
	return m.Groups.Put(k, v)
}

// Counts reads the counters.
func (m *Multicast) Counts() ([NumMcastReasons]uint64, error) {
	var c [NumMcastReasons]uint64
	for i := range c {
		if err := m.Counters.Lookup(uint32(i), &c[i]); err != nil {
			return c, fmt.Errorf("emuib: multicast counter %d: %w", i, err)
		}
	}
	return c, nil
}

// Stack slots of the multicast program (offsets from R10), besides
// stLink and stEth.
const (
	stGroup = -64 // the GroupKey: MGID (16 bytes), host (4)
	stMKey  = -72 // a counter index
)

// ctxIfindex is struct __sk_buff's ifindex (include/uapi/linux/bpf.h):
// at tc ingress, the device the frame arrived on, the sender's fabric
// end.
const ctxIfindex = 40

// mcastInstructions is the multicast program. For a frame whose 24-byte
// link header names the multicast QPN (0xFFFFFF):
//
//  1. It writes an Ethernet header over the first 14 bytes: the
//     destination ff:ff:ff:ff:ff:ff for the partition's broadcast group
//     (an MGID ending in ffff:ffff) and 33:33 + the MGID's last 4 bytes
//     for any other group, so that the receiving child's eth_type_trans
//     sets pkt_type PACKET_BROADCAST or PACKET_MULTICAST as
//     ipoib_ib_handle_rx_wc sets it from the GRH's destination; a zero
//     source; the link header's EtherType.
//  2. For each hypervisor (0 to MaxHosts-1) it looks the group's
//     Members up and bpf_clone_redirect()s (net/core/filter.c; the
//     clone goes to the member's fabric end's egress, as the wire's
//     unicast redirect does) a copy to each, except to the fabric end
//     the frame came from: ipoib_ib_handle_rx_wc drops only what the
//     receiving QP itself sent.
//  3. It drops the original (TC_ACT_SHOT) and counts the frame and its
//     copies.
//
// Any other frame goes on to the wire (TCX_NEXT), as does one too short
// for the link header, which the wire counts.
func mcastInstructions(groups, counters int) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stLink),
		asm.Mov.Imm(asm.R4, linkLen),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "next"),
		// [flags][QPN 3] read little-endian: the QPN is the top 24 bits.
		asm.LoadMem(asm.R1, asm.RFP, stLink, asm.Word),
		asm.And.Imm32(asm.R1, -0x100),
		asm.JNE.Imm32(asm.R1, -0x100, "next"),

		// The Ethernet header: destination, zero source, EtherType.
		asm.LoadMem(asm.R1, asm.RFP, stLink+ipoib.HwAddrLen-4, asm.Word), // the MGID's last 4 bytes
		asm.JNE.Imm32(asm.R1, -1, "group"),
		asm.StoreImm(asm.RFP, stEth, -1, asm.Word),
		asm.StoreImm(asm.RFP, stEth+4, -1, asm.Half),
		asm.Ja.Label("src"),
		asm.StoreImm(asm.RFP, stEth, 0x3333, asm.Half).WithSymbol("group"),
		asm.LoadMem(asm.R1, asm.RFP, stLink+ipoib.HwAddrLen-4, asm.Half),
		asm.StoreMem(asm.RFP, stEth+2, asm.R1, asm.Half),
		asm.LoadMem(asm.R1, asm.RFP, stLink+ipoib.HwAddrLen-2, asm.Half),
		asm.StoreMem(asm.RFP, stEth+4, asm.R1, asm.Half),
		asm.StoreImm(asm.RFP, stEth+6, 0, asm.Half).WithSymbol("src"),
		asm.StoreImm(asm.RFP, stEth+8, 0, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, stLink+ipoib.HwAddrLen, asm.Half),
		asm.StoreMem(asm.RFP, stEth+12, asm.R1, asm.Half),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stEth),
		asm.Mov.Imm(asm.R4, ethLen),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "mshort"),
	}
	// The group key's MGID: the link header's bytes 4-19.
	for off := int16(0); off < gidLen; off += 4 {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.RFP, stLink+4+off, asm.Word),
			asm.StoreMem(asm.RFP, stGroup+off, asm.R1, asm.Word))
	}
	ins = append(ins,
		asm.LoadMem(asm.R8, asm.R6, ctxIfindex, asm.Word),
		asm.Mov.Imm(asm.R9, 0),
	)
	// Labels: host h's block is "hostH", its member m's "hHmM"; the
	// block after the last host's is "host<MaxHosts>".
	host := func(h int) string { return fmt.Sprintf("host%d", h) }
	member := func(h, m int) string {
		if m == MaxMembers {
			return host(h + 1)
		}
		return fmt.Sprintf("h%dm%d", h, m)
	}
	for h := range MaxHosts {
		ins = append(ins,
			asm.StoreImm(asm.RFP, stGroup+gidLen, int64(h), asm.Word).WithSymbol(host(h)),
			asm.LoadMapPtr(asm.R1, groups),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, stGroup),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, host(h+1)),
			asm.Mov.Reg(asm.R7, asm.R0),
		)
		for m := range MaxMembers {
			next := member(h, m+1)
			ins = append(ins,
				asm.LoadMem(asm.R2, asm.R7, int16(4*m), asm.Word).WithSymbol(member(h, m)),
				asm.JEq.Imm(asm.R2, 0, next),
				asm.JEq.Reg(asm.R2, asm.R8, next),
				asm.Mov.Reg(asm.R1, asm.R6),
				asm.Mov.Imm(asm.R3, 0),
				asm.FnCloneRedirect.Call(),
				asm.JNE.Imm(asm.R0, 0, next),
				asm.Add.Imm(asm.R9, 1),
			)
		}
	}
	// Count the frame and its copies, and drop the original.
	ins = append(ins, asm.Mov.Reg(asm.R7, asm.R9).WithSymbol(host(MaxHosts)))
	ins = append(ins, madd(counters, McastCopies, asm.R7)...)
	ins = append(ins, asm.Mov.Imm(asm.R7, 1))
	ins = append(ins, madd(counters, McastFrames, asm.R7)...)
	ins = append(ins,
		asm.Mov.Imm(asm.R0, tcActShot),
		asm.Return(),
		asm.Mov.Imm(asm.R7, 1).WithSymbol("mshort"))
	ins = append(ins, madd(counters, McastShort, asm.R7)...)
	return append(ins,
		asm.Mov.Imm(asm.R0, tcActShot),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("next"),
		asm.Return(),
	)
}

// madd adds register n (callee-saved, R6-R9) to counter r.
func madd(counters int, r McastReason, n asm.Register) asm.Instructions {
	done := fmt.Sprintf("madd%d", r)
	return asm.Instructions{
		asm.StoreImm(asm.RFP, stMKey, int64(r), asm.Word),
		asm.LoadMapPtr(asm.R1, counters),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stMKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, done),
		asm.StoreXAdd(asm.R0, n, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol(done),
	}
}
