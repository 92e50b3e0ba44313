// Package emuib is an EMULATION of an IPoIB wire, for the fast path's
// end-to-end tests and make bench: it lets the two tc programs of package
// fastpath run between two hypervisors on a machine that has no
// InfiniBand; and, through package emukernel, eipoibd's own kernel
// backend. A release of eipoibd never uses it (only a build with the
// emuib tag does, for the tests).
//
// Each hypervisor's IPoIB child is one end of a veth pair; the other
// ends live in a "fabric" namespace. Two tc programs stand in for what
// the driver and the HCA do:
//
//   - The wire (Programs.Wire), at tcx ingress of every fabric end, reads
//     the 24-byte link header the TX program wrote,
//
//     [20-byte destination IPoIB address][EtherType 2][reserved 2][L3]
//
//     looks the destination up (QPN and GID: the address without its
//     flags byte) in the Ends map to find the destination child's fabric
//     end and the child's MAC, writes an Ethernet header addressed to
//     that MAC over the first 14 bytes, and redirects the frame to that
//     fabric end's egress. veth_xmit (drivers/net/veth.c) hands it to the
//     child, whose eth_type_trans (in __dev_forward_skb) sets
//     skb->protocol from the EtherType and pkt_type PACKET_HOST from the
//     MAC, as ipoib sets them from the IPoIB header and the GRH.
//
//   - The harness (Programs.Harness), at tcx ingress of every child,
//     before the RX program, removes the 10 bytes the wire left after
//     the Ethernet header and rebuilds the layout ipoib's receive path
//     leaves (ipoib_ib_handle_rx_wc, skb_add_pseudo_hdr): 20 zero bytes,
//     the IPoIB header, L3, with mac_len 24. tcx_run then runs the RX
//     program on it.
//
// The wire cannot shrink the link header itself: bpf_skb_adjust_room
// (net/core/filter.c) refuses an skb whose protocol is neither IPv4 nor
// IPv6, and the fabric end's eth_type_trans read the protocol from bytes
// 12-13 of the IPoIB address. At the child the protocol is right. A GSO
// super-frame crosses whole: veths take TSO, the redirects keep the skb,
// and the harness shrinks with BPF_F_ADJ_ROOM_FIXED_GSO, as the RX
// program does.
//
// What it does not emulate, and only hardware can confirm: ipoib's
// driver (its neighbour and path lookup, ipoib_start_xmit's queueing,
// connected mode), the HCA (LSO cutting a TSO super-frame into IB MTU
// packets, receive checksum flags, GRO in the driver's NAPI), the UD
// MTU, the subnet manager, loss. Between the programs, frames cross two
// veths and two redirects, whose cost make bench states apart.
//
// Package testbed builds two emulated hypervisors over this wire, with
// the fast path's maps filled through kernelfabric.FastPath.
//
// Package emukernel runs eipoibd's own kernel backend over this wire
// (an emulated kernelfabric.Kernel); it shares the wire with the
// hypervisors' eipoibd processes through Fabric (pinned in bpffs), and
// its children's group memberships go to the multicast program
// (mcast.go), which replicates frames to the multicast QPN.
package emuib

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/bpfasm"

	"github.com/eipoib/eipoibd/ipoib"
)

// Reason is the index of one verdict in the Counters map.
type Reason uint32

// The verdicts of the wire and the harness.
const (
	// Redirected: the wire sent the frame to its destination's child.
	Redirected Reason = iota
	// Short: a frame shorter than the 24-byte link header, or whose
	// header could not be rewritten; dropped.
	Short
	// Unknown: no child has the destination address; dropped.
	Unknown
	// HarnessRefused: the harness could not rebuild ipoib's layout (a
	// frame too short for its L3 header to lose 10 bytes, or no
	// memory); dropped.
	HarnessRefused

	// NumReasons is the number of counters.
	NumReasons
)

var reasonNames = [NumReasons]string{"redirected", "short", "unknown", "harness_refused"}

// String names the reason.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint32(r))
}

// Layout of the link headers and the helpers' arguments.
const (
	linkLen = ipoib.HwAddrLen + ipoib.HeaderLen // the TX program's link header
	ethLen  = 14
	strip   = linkLen - ethLen // what the harness removes and pushes again

	ctxProtocol       = 16 // struct __sk_buff protocol (include/uapi/linux/bpf.h)
	tcActShot         = 2  // TC_ACT_SHOT (include/uapi/linux/pkt_cls.h)
	tcxNext           = -1 // TCX_NEXT: the next program of the chain runs
	adjRoomMAC        = 1  // BPF_ADJ_ROOM_MAC
	adjRoomFixedGSO   = 1 << 0
	adjRoomNoCsumRset = 1 << 5
	maxEnds           = 1024
)

// end is an Ends value: the destination child's fabric end and MAC.
type end struct {
	Ifindex uint32
	MAC     [6]byte
	_       [2]byte
}

// Programs are the wire and the harness and their maps. Close releases
// them (attachments hold their own references).
type Programs struct {
	// Wire is the tc program for each fabric end's ingress.
	Wire *ebpf.Program
	// Harness is the tc program for each child's ingress, to run before
	// the RX program.
	Harness *ebpf.Program
	// Ends maps a destination address without its flags byte (20 bytes)
	// to its child's fabric end ifindex and the child's MAC (12 bytes).
	Ends *ebpf.Map
	// Counters is an array of uint64 indexed by Reason, added to
	// atomically by both programs.
	Counters *ebpf.Map
}

// Load loads both programs.
func Load() (p *Programs, err error) {
	p = &Programs{}
	defer func() {
		if err != nil {
			p.Close()
			p = nil
		}
	}()
	if p.Ends, err = newMap(&ebpf.MapSpec{Name: "emuib_ends", Type: ebpf.Hash, KeySize: ipoib.HwAddrLen, ValueSize: 12, MaxEntries: maxEnds}); err != nil {
		return
	}
	if p.Counters, err = newCounters("emuib_counters", int(NumReasons)); err != nil {
		return
	}
	if p.Wire, err = load("emuib_wire", wireInstructions(p.Ends.FD(), p.Counters.FD())); err != nil {
		return
	}
	p.Harness, err = load("emuib_harness", harnessInstructions(p.Counters.FD()))
	return
}

// newMap makes a map, its error naming it.
func newMap(spec *ebpf.MapSpec) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("emuib: map %s: %w", spec.Name, err)
	}
	return m, nil
}

// newCounters makes an array of n uint64 counters named name.
func newCounters(name string, n int) (*ebpf.Map, error) {
	return newMap(&ebpf.MapSpec{Name: name, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: uint32(n)})
}

func load(name string, insns asm.Instructions) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "Apache-2.0", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("emuib: load %s: %w", name, err)
	}
	return prog, nil
}

// closeAll closes the programs and maps that are not nil.
func closeAll(progs []*ebpf.Program, maps []*ebpf.Map) error {
	var errs []error
	for _, prog := range progs {
		if prog != nil {
			errs = append(errs, prog.Close())
		}
	}
	for _, m := range maps {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// Close releases the programs and maps.
func (p *Programs) Close() error {
	return closeAll([]*ebpf.Program{p.Wire, p.Harness}, []*ebpf.Map{p.Ends, p.Counters})
}

// PutEnd tells the wire that frames to addr (its flags byte ignored) go
// to the fabric end with ifindex fabricEnd, addressed to the child's MAC.
func (p *Programs) PutEnd(addr ipoib.HwAddr, fabricEnd int, child net.HardwareAddr) error {
	if len(child) != 6 {
		return fmt.Errorf("emuib: child MAC %v is not 6 bytes", child)
	}
	v := end{Ifindex: uint32(fabricEnd)}
	copy(v.MAC[:], child)
	k := addr.WithoutFlags()
	return p.Ends.Put(k[:], v)
}

// Counts reads the counters.
func (p *Programs) Counts() ([NumReasons]uint64, error) {
	var c [NumReasons]uint64
	for i := range c {
		if err := p.Counters.Lookup(uint32(i), &c[i]); err != nil {
			return c, fmt.Errorf("emuib: counter %s: %w", Reason(i), err)
		}
	}
	return c, nil
}

// LoadRedirect loads a program that redirects every frame to the egress
// of the device with ifindex to, as the wire does but without reading
// or rewriting anything: at the fabric ends of veths that join two
// bridges, it is the emulation's own cost, which make bench measures
// apart from the fast path's.
func LoadRedirect(to int) (*ebpf.Program, error) {
	return load("emuib_redirect", asm.Instructions{
		asm.Mov.Imm(asm.R1, int32(to)),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
	})
}

// Stack slots (offsets from R10).
const (
	stLink = -24 // the 24-byte link header; its first 20 bytes become the Ends key
	stEth  = -40 // the 14-byte Ethernet header being built
	stKey  = -44 // a counter index
)

// drop sets the TC_ACT_SHOT verdict and reason r, labelled sym.
func drop(sym string, r Reason) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R8, tcActShot).WithSymbol(sym),
		asm.Mov.Imm(asm.R9, int32(r)),
		asm.Ja.Label("count"),
	}
}

// wireInstructions is the wire. bpf_skb_load_bytes and
// bpf_skb_store_bytes handle non-linear skbs. bpf_redirect without
// BPF_F_INGRESS (__bpf_redirect, net/core/filter.c) queues the skb on
// the fabric end's egress as it is, GSO metadata included
// (__bpf_tx_skb, dev_queue_xmit); veth_xmit passes it to the peer, the
// child, through __dev_forward_skb, whose eth_type_trans reads the new
// Ethernet header. No checksum changes: the link header is outside
// every checksum.
func wireInstructions(ends, counters int) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stLink),
		asm.Mov.Imm(asm.R4, linkLen),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "short"),
		// The key: the address without its flags byte.
		asm.StoreImm(asm.RFP, stLink, 0, asm.Byte),
		asm.LoadMapPtr(asm.R1, ends),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stLink),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "unknown"),
		asm.Mov.Reg(asm.R7, asm.R0),
		// [child MAC 6][zero 6][EtherType 2], in aligned stores.
		asm.LoadMem(asm.R1, asm.R7, 4, asm.Word),
		asm.StoreMem(asm.RFP, stEth, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, 8, asm.Half),
		asm.StoreMem(asm.RFP, stEth+4, asm.R1, asm.Half),
		asm.StoreImm(asm.RFP, stEth+6, 0, asm.Half),
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
		asm.JNE.Imm(asm.R0, 0, "short"),
		asm.LoadMem(asm.R1, asm.R7, 0, asm.Word),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Imm(asm.R9, int32(Redirected)),
		asm.Ja.Label("count"),
	}
	ins = append(ins, drop("short", Short)...)
	ins = append(ins, drop("unknown", Unknown)...)
	return append(ins, bpfasm.CountAndExit(counters, stKey)...)
}

// harnessInstructions is the harness, for a frame the wire sent:
//
//	[child MAC 6][6][EtherType 2][10 bytes][L3]
//
// eth_type_trans set skb->protocol and pkt_type; __netif_receive_skb_core
// set the network header and mac_len 14 (skb_reset_mac_len), which
// tcx_run (include/net/tcx.h, from sch_handle_ingress) pushed back.
//
//  1. bpf_skb_adjust_room(-10, BPF_ADJ_ROOM_MAC) removes the 10 bytes
//     after the Ethernet header (bpf_skb_net_hdr_pop moves the 14 bytes
//     up over them and the MAC and network headers with them);
//     BPF_F_ADJ_ROOM_FIXED_GSO keeps gso_size and NO_CSUM_RESET the
//     checksum state, as the RX program does.
//  2. bpf_skb_change_head(10) pushes 10 zero bytes and resets the MAC
//     header and mac_len (24 now, as skb_add_pseudo_hdr leaves it).
//  3. The 24 bytes become 20 zero bytes and the IPoIB header, whose
//     EtherType is skb->protocol.
//
// bpf_skb_adjust_room refuses any protocol but IPv4 and IPv6
// (-ENOTSUPP). An ARP or RARP frame gets step 3 alone: the wire's 14 +
// 10 bytes are as long as ipoib's 24, so the RX program and a SOCK_RAW
// socket (which reads from the MAC header) see ipoib's layout, only
// mac_len stays 14. Dropped instead, the unicast ARP answers to a VIF
// child, which eipoibd reads after tc (ETH_P_ARP) under the fast path,
// never arrived.
//
// skb->protocol and pkt_type stay as eth_type_trans set them, as ipoib
// sets them from the IPoIB header and the GRH. It returns TCX_NEXT so
// the RX program, attached after it, runs on the rebuilt packet. What a
// real HCA and ipoib do around it (GRO, checksum flags, headroom) only
// hardware shows.
func harnessInstructions(counters int) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// ARP and RARP: rewrite only (see above).
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.JEq.Imm(asm.R1, 0x0008, "ip"), // htons(ETH_P_IP), read little-endian
		asm.JNE.Imm(asm.R1, 0xdd86, "rewrite"),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("ip"),
		asm.Mov.Imm(asm.R2, -strip),
		asm.Mov.Imm(asm.R3, adjRoomMAC),
		asm.Mov.Imm(asm.R4, adjRoomFixedGSO|adjRoomNoCsumRset),
		asm.FnSkbAdjustRoom.Call(),
		asm.JNE.Imm(asm.R0, 0, "refused"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, strip),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnSkbChangeHead.Call(),
		asm.JNE.Imm(asm.R0, 0, "refused"),
		asm.Mov.Imm(asm.R1, 0).WithSymbol("rewrite"),
		asm.StoreMem(asm.RFP, stLink, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, stLink+8, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, stLink+16, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.StoreMem(asm.RFP, stLink+ipoib.HwAddrLen, asm.R1, asm.Half),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stLink),
		asm.Mov.Imm(asm.R4, linkLen),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "refused"),
		asm.Mov.Imm(asm.R0, tcxNext),
		asm.Return(),
	}
	ins = append(ins, drop("refused", HarnessRefused)...)
	return append(ins, bpfasm.CountAndExit(counters, stKey)...)
}
