package fastpath

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/bpfasm"
)

// RXReason is the index of one RX verdict in the RX counters map:
// RXRedirected, or the reason a packet was left to eipoibd (or, for
// RXDropRewrite, dropped).
type RXReason uint32

// The RX program's verdicts.
const (
	// RXRedirected: re-framed as Ethernet and received on the guest's TAP.
	RXRedirected RXReason = iota
	// RXFallbackMalformed: shorter than its headers, an IP header whose
	// version or IHL is wrong, or an skb whose protocol is not the IPoIB
	// header's.
	RXFallbackMalformed
	// RXFallbackARP: ARP, which eipoibd translates and learns from.
	RXFallbackARP
	// RXFallbackNotIP: any other protocol in the IPoIB header.
	RXFallbackNotIP
	// RXFallbackMulticast: received as IB multicast (pkt_type not
	// PACKET_HOST), or an IPv4 destination in 224.0.0.0/3 or an IPv6
	// one in ff00::/8.
	RXFallbackMulticast
	// RXFallbackIPv6Ext: IPv6 with a hop-by-hop, routing, fragment or
	// destination options header, which the program does not walk.
	RXFallbackIPv6Ext
	// RXFallbackDHCP: UDP from or to port 67 or 68, which eipoibd
	// rewrites (RFC 4390).
	RXFallbackDHCP
	// RXFallbackDHCPv6: UDP from or to port 546 or 547.
	RXFallbackDHCPv6
	// RXFallbackND: ICMPv6 types 133-137, whose link-layer options
	// eipoibd translates.
	RXFallbackND
	// RXFallbackUnknownGuest: the receiving child is not in the guests map.
	RXFallbackUnknownGuest
	// RXFallbackUnknownSender: the source IP is not in the senders map
	// for this child, so no REMAC names the sender.
	RXFallbackUnknownSender
	// RXFallbackTooBig: a packet that is not GSO and is larger than the
	// TAP's MTU, which __dev_forward_skb (is_skb_forwardable) would drop.
	RXFallbackTooBig
	// RXFallbackShort: an IP packet less than 10 bytes longer than its
	// base header (IPv4 30, IPv6 50 bytes), which bpf_skb_adjust_room
	// refuses to shrink by 10.
	RXFallbackShort
	// RXFallbackShrink: bpf_skb_adjust_room failed (a GSO type it will
	// not touch, or no memory); the packet is unchanged.
	RXFallbackShrink
	// RXDropRewrite: writing the Ethernet header failed after
	// bpf_skb_adjust_room had removed 10 bytes; the packet is neither
	// IPoIB nor Ethernet any more, so it is dropped (TC_ACT_SHOT).
	RXDropRewrite

	// NumRXReasons is the number of RX counters.
	NumRXReasons
)

var rxReasonNames = [NumRXReasons]string{
	"redirected", "malformed", "arp", "not_ip", "multicast", "ipv6_ext",
	"dhcp", "dhcpv6", "nd", "unknown_guest", "unknown_sender", "too_big",
	"short", "shrink", "drop_rewrite",
}

// String names the reason as a metric label.
func (r RXReason) String() string {
	if r < NumRXReasons {
		return rxReasonNames[r]
	}
	return fmt.Sprintf("rx_reason(%d)", uint32(r))
}

// MaxSenders bounds the senders map: one entry per remote IP address a
// child receives from.
const MaxSenders = 65536

// Link header lengths and flags of the RX program.
const (
	// rxLinkLen is what ipoib leaves before L3 at tc ingress: the
	// 20-byte pseudo header skb_add_pseudo_hdr pushes (zeroed) and the
	// 4-byte IPoIB header.
	rxLinkLen = ipoibHdrLen
	// rxShrink is how much bpf_skb_adjust_room removes to turn that
	// into an Ethernet header.
	rxShrink = rxLinkLen - ethHdrLen

	bpfAdjRoomMAC          = 1      // BPF_ADJ_ROOM_MAC
	bpfFAdjRoomFixedGSO    = 1 << 0 // BPF_F_ADJ_ROOM_FIXED_GSO
	bpfFAdjRoomNoCsumReset = 1 << 5 // BPF_F_ADJ_ROOM_NO_CSUM_RESET
	bpfFIngress            = 1      // BPF_F_INGRESS
	ipv4MinForShrink       = 20 + rxShrink
	ipv6MinForShrink       = 40 + rxShrink
	rxGuestTAPOff          = 8  // rxGuest.TAP
	rxMTUOff               = 12 // rxGuest.MTU
	rxGuestHitsOff         = 16 // rxGuest.Hits
	senderHitsOff          = 8  // senderVal.Hits
)

// RXGuest is what the RX program needs to know of the guest behind one
// IPoIB child: its MAC (the rebuilt frame's destination), the TAP the
// frame is received on, and that TAP's MTU.
type RXGuest struct {
	MAC net.HardwareAddr
	TAP uint32
	MTU uint32
}

// rxGuest is RXGuest as the guests map holds it (24 bytes), then the
// count of packets the program redirected from the child.
type rxGuest struct {
	MAC  [6]byte
	_    [2]byte
	TAP  uint32
	MTU  uint32
	Hits uint64
}

// senderVal is the senders-map value (16 bytes): the sender's REMAC, 2
// zero bytes, the count of packets the program redirected from it.
type senderVal struct {
	REMAC [6]byte
	_     [2]byte
	Hits  uint64
}

// senderKey is the senders-map key: the receiving child and the source
// IP, IPv4 as an IPv4-mapped IPv6 address (20 bytes).
type senderKey struct {
	Child uint32
	Addr  [16]byte
}

// RX is the loaded RX program and its maps. Close releases them.
type RX struct {
	// Program is the tc (SchedCLS) program for each IPoIB child's ingress.
	Program *ebpf.Program
	// Guests maps a child's ifindex (uint32) to its guest (24 bytes:
	// MAC, 2 zero bytes, TAP ifindex, TAP MTU, hit count).
	Guests *ebpf.Map
	// Senders maps a child ifindex and source IP (20 bytes) to the
	// sender's REMAC (16 bytes: REMAC, 2 zero bytes, hit count).
	Senders *ebpf.Map
	// Counters is a per-CPU array of uint64, indexed by RXReason.
	Counters *ebpf.Map
	// LastRedirect is a per-CPU array of one uint32: the TAP ifindex of
	// the last packet this CPU redirected.
	LastRedirect *ebpf.Map
}

// LoadRX creates the maps and loads the RX program. It needs CAP_BPF and
// CAP_NET_ADMIN (root).
func LoadRX() (*RX, error) {
	r, _, err := loadRXAt("")
	return r, err
}

// loadRXAt is LoadRX with the maps pinned under pin (see newMap) unless
// it is empty; replaced names the pinned maps that did not match.
func loadRXAt(pin string) (_ *RX, replaced []string, _ error) {
	r := &RX{}
	ms := maps{pin: pin}
	mk := ms.make
	r.Guests = mk(rxGuestsPin, ebpf.Hash, 4, 24, MaxGuests)
	r.Senders = mk("eipoib_senders", ebpf.Hash, 20, 16, MaxSenders)
	r.Counters = mk("eipoib_rx_cnt", ebpf.PerCPUArray, 4, 8, uint32(NumRXReasons))
	r.LastRedirect = mk("eipoib_rx_last", ebpf.PerCPUArray, 4, 4, 1)
	if ms.err != nil {
		r.Close()
		return nil, nil, ms.err
	}
	var err error
	if r.Program, err = loadSchedCLS("eipoib_rx", "RX", rxInstructions(r.Guests.FD(), r.Senders.FD(), r.Counters.FD(), r.LastRedirect.FD())); err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, ms.replaced, nil
}

// Close releases the program and the maps.
func (r *RX) Close() error {
	return closeAll(r.Program, r.Guests, r.Senders, r.Counters, r.LastRedirect)
}

// PutGuest adds or replaces the guest behind the child with ifindex child;
// its hit count starts at 0.
// The program delivers untagged frames, so only a child of the partition
// that maps to untagged frames (the default P_Key) belongs here.
func (r *RX) PutGuest(child uint32, g RXGuest) error {
	k, err := macKey(g.MAC)
	if err != nil {
		return err
	}
	return r.Guests.Put(child, rxGuest{MAC: k, TAP: g.TAP, MTU: g.MTU})
}

// DeleteGuest removes the child's guest.
func (r *RX) DeleteGuest(child uint32) error {
	return r.Guests.Delete(child)
}

// PutSender adds or replaces the REMAC of the sender with address ip as
// the child with ifindex child receives it; its hit count starts at 0.
func (r *RX) PutSender(child uint32, ip netip.Addr, remac net.HardwareAddr) error {
	k, err := sender(child, ip)
	if err != nil {
		return err
	}
	v, err := macKey(remac)
	if err != nil {
		return err
	}
	return r.Senders.Put(k, senderVal{REMAC: v})
}

// DeleteSender removes the sender with address ip from the child's view.
func (r *RX) DeleteSender(child uint32, ip netip.Addr) error {
	k, err := sender(child, ip)
	if err != nil {
		return err
	}
	return r.Senders.Delete(k)
}

// ChildHits is how many packets the program redirected from the child
// since its guest was put; 0 when it has none.
func (r *RX) ChildHits(child uint32) (uint64, error) {
	var v rxGuest
	err := lookupAbsent(r.Guests, child, &v)
	return v.Hits, err
}

// SenderHits is how many packets from ip the program redirected from the
// child since the sender was put; 0 when it has none.
func (r *RX) SenderHits(child uint32, ip netip.Addr) (uint64, error) {
	k, err := sender(child, ip)
	if err != nil {
		return 0, err
	}
	var v senderVal
	err = lookupAbsent(r.Senders, k, &v)
	return v.Hits, err
}

// Counts sums the per-CPU counters.
func (r *RX) Counts() ([NumRXReasons]uint64, error) {
	var sum [NumRXReasons]uint64
	got, err := sumPerCPU(r.Counters, int(NumRXReasons), func(i int) string { return RXReason(i).String() })
	copy(sum[:], got)
	return sum, err
}

func sender(child uint32, ip netip.Addr) (senderKey, error) {
	if !ip.IsValid() || ip.Zone() != "" {
		return senderKey{}, fmt.Errorf("fastpath: %v is not an IP address without zone", ip)
	}
	return senderKey{Child: child, Addr: ip.Unmap().As16()}, nil
}

// rxInstructions is the RX program, for tc ingress of an IPoIB child.
//
// What it sees: ipoib_ib_handle_rx_wc (datagram mode) and
// ipoib_cm_handle_rx_wc (connected mode), in
// drivers/infiniband/ulp/ipoib, pull the GRH, set skb->protocol from the
// 4-byte IPoIB header and call skb_add_pseudo_hdr, which pushes 20 zero
// bytes, resets the MAC header there and pulls all 24; the datagram path
// sets pkt_type from the GRH's destination GID (multicast when it starts
// with 0xff). __netif_receive_skb_core resets the network header to L3,
// so mac_len is 24, and tcx_run pushes it back before the program runs:
//
//	[20-byte pseudo header][EtherType 2][reserved 2][L3]
//
// Nothing in it names the sender (the pseudo header is zero), so the
// source REMAC comes from the senders map, keyed by the child's ifindex
// (skb->skb_iif, set to the receiving device in
// __netif_receive_skb_core) and the IP source address, which eipoibd
// fills from ARP and NDP as its user-space path does.
//
// The rewrite: bpf_skb_adjust_room(-10, BPF_ADJ_ROOM_MAC) ends in
// bpf_skb_net_hdr_pop (net/core/filter.c), which removes the 10 bytes
// at skb_mac_header_len (that is, L3 bytes 0-9) and moves the 24-byte
// link header up over them; then the program writes the Ethernet header
// and L3 bytes 0-9 (saved on the stack) over those 24 bytes. The skb's
// network header is left 24 bytes in, which is only right after a
// re-receive: bpf_redirect(tap, BPF_F_INGRESS) goes through
// __bpf_rx_skb and __dev_forward_skb, whose eth_type_trans resets the
// MAC header and skb->protocol, and netif_rx, whose
// __netif_receive_skb_core resets the network header. FIXED_GSO keeps
// gso_size (bpf_skb_net_shrink would otherwise raise it by 10) and
// NO_CSUM_RESET keeps CHECKSUM_UNNECESSARY from the HCA. The shrink
// comes before any write, so a refused shrink leaves the packet as it
// was for eipoibd.
//
// Registers: R6 the skb, R7 the L3 header length (then the TAP
// ifindex), R8 the L4 protocol (then the return value), R9 the guest
// entry (then the reason); the sender entry is spilled to the stack
// (stPtr).
func rxInstructions(guests, senders, counters, last int) asm.Instructions {
	var p asm.Instructions
	add := func(ins ...asm.Instruction) { p = append(p, ins...) }
	addAll := func(ins asm.Instructions) { p = append(p, ins...) }
	// proto loads the IPoIB header's EtherType, in host order, into dst.
	proto := func(dst asm.Register) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(dst, asm.RFP, stLink+ipoibHdrLen-4, asm.Half),
			asm.HostTo(asm.BE, dst, asm.Half),
		}
	}

	add(asm.Mov.Reg(asm.R6, asm.R1))
	addAll(loadBytes("", 0, false, stLink, rxLinkLen))
	addAll(proto(asm.R7))
	add(
		asm.JEq.Imm(asm.R7, 0x0806, "fb_arp"),
		// skb->protocol is the IPoIB header's (ipoib sets it from
		// there), and bpf_skb_adjust_room works only on IP skbs. Both
		// are in network order, so no swap.
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, stLink+ipoibHdrLen-4, asm.Half),
		asm.JNE.Reg(asm.R1, asm.R2, "fb_malformed"),
		// PACKET_HOST is 0.
		asm.LoadMem(asm.R1, asm.R6, ctxPktType, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "fb_multicast"),
	)
	addAll(classifyL3(rxLinkLen, false))

	// Per family: a group destination, the sender key (the source
	// address after the child's ifindex), the shortest packet
	// bpf_skb_adjust_room shrinks (its len_min, bpf_skb_net_base_len).
	add(asm.LoadMem(asm.R1, asm.R6, ctxIngressIfindex, asm.Word).WithSymbol("l4done"))
	add(
		asm.StoreMem(asm.RFP, stSKey, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, stKey, asm.R1, asm.Word),
	)
	addAll(proto(asm.R1))
	add(
		asm.JEq.Imm(asm.R1, 0x86dd, "v6"),
		asm.LoadMem(asm.R1, asm.RFP, stL3+16, asm.Byte),
		asm.JGE.Imm(asm.R1, 224, "fb_multicast"),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.RFP, stSKey+4, asm.R1, asm.DWord),
		asm.StoreImm(asm.RFP, stSKey+12, 0, asm.Half),
		asm.StoreImm(asm.RFP, stSKey+14, 0xffff, asm.Half),
		asm.LoadMem(asm.R1, asm.RFP, stL3+12, asm.Word),
		asm.StoreMem(asm.RFP, stSKey+16, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R6, ctxLen, asm.Word),
		asm.JLT.Imm(asm.R1, rxLinkLen+ipv4MinForShrink, "fb_short"),
		asm.Ja.Label("lookup"),

		asm.LoadMem(asm.R1, asm.RFP, stL3+24, asm.Byte).WithSymbol("v6"),
		asm.JEq.Imm(asm.R1, 0xff, "fb_multicast"),
		asm.LoadMem(asm.R1, asm.RFP, stL3+8, asm.DWord),
		asm.StoreMem(asm.RFP, stSKey+4, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.RFP, stL3+16, asm.DWord),
		asm.StoreMem(asm.RFP, stSKey+12, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R6, ctxLen, asm.Word),
		asm.JLT.Imm(asm.R1, rxLinkLen+ipv6MinForShrink, "fb_short"),

		asm.LoadMapPtr(asm.R1, guests).WithSymbol("lookup"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "fb_unknown_guest"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.LoadMapPtr(asm.R1, senders),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stSKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "fb_unknown_sender"),
		asm.StoreMem(asm.RFP, stPtr, asm.R0, asm.DWord),

		// The Ethernet header and L3 bytes 0-9, built on the stack in
		// aligned half-words (the verifier wants aligned stack access):
		// the guest's MAC, the sender's REMAC, the EtherType.
		asm.LoadMem(asm.R1, asm.R9, 0, asm.Word),
		asm.StoreMem(asm.RFP, stOut, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R9, 4, asm.Half),
		asm.StoreMem(asm.RFP, stOut+4, asm.R1, asm.Half),
	)
	for i := int16(0); i < 6; i += 2 {
		add(
			asm.LoadMem(asm.R1, asm.R0, i, asm.Half),
			asm.StoreMem(asm.RFP, stOut+6+i, asm.R1, asm.Half),
		)
	}
	add(
		asm.LoadMem(asm.R1, asm.RFP, stLink+ipoibHdrLen-4, asm.Half),
		asm.StoreMem(asm.RFP, stOut+12, asm.R1, asm.Half),
	)
	for i := int16(0); i < rxShrink; i += 2 {
		add(
			asm.LoadMem(asm.R1, asm.RFP, stL3+i, asm.Half),
			asm.StoreMem(asm.RFP, stOut+ethHdrLen+i, asm.R1, asm.Half),
		)
	}
	add(
		// The TAP's MTU, for a packet that is not GSO: a GSO skb
		// passes is_skb_forwardable whatever its length.
		asm.LoadMem(asm.R1, asm.R6, ctxGSOSize, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "shrink"),
		asm.LoadMem(asm.R1, asm.R6, ctxLen, asm.Word),
		asm.Sub.Imm(asm.R1, rxLinkLen),
		asm.LoadMem(asm.R2, asm.R9, rxMTUOff, asm.Word),
		asm.JGT.Reg(asm.R1, asm.R2, "fb_too_big"),

		asm.LoadMem(asm.R7, asm.R9, rxGuestTAPOff, asm.Word).WithSymbol("shrink"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, -rxShrink),
		asm.Mov.Imm(asm.R3, bpfAdjRoomMAC),
		asm.Mov.Imm(asm.R4, bpfFAdjRoomFixedGSO|bpfFAdjRoomNoCsumReset),
		asm.FnSkbAdjustRoom.Call(),
		asm.JNE.Imm(asm.R0, 0, "fb_shrink"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stOut),
		asm.Mov.Imm(asm.R4, rxLinkLen),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop_rewrite"),
	)
	addAll(countHits(rxGuestHitsOff, senderHitsOff))
	addAll(recordTarget(last))
	add(
		// Received on the TAP as if eipoibd had written the frame to
		// it: __bpf_redirect -> __bpf_rx_skb -> dev_forward_skb.
		asm.Mov.Reg(asm.R1, asm.R7).WithSymbol("redirect"),
		asm.Mov.Imm(asm.R2, bpfFIngress),
		asm.FnRedirect.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Imm(asm.R9, int32(RXRedirected)),
		asm.Ja.Label("count"),

		asm.Mov.Imm(asm.R8, tcActShot).WithSymbol("drop_rewrite"),
		asm.Mov.Imm(asm.R9, int32(RXDropRewrite)),
		asm.Ja.Label("count"),
	)
	addAll(fallbacks(rxReasonNames[RXFallbackMalformed:RXDropRewrite], int32(RXFallbackMalformed)))
	addAll(bpfasm.CountAndExit(counters, stKey))
	return p
}
