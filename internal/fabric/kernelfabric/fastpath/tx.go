package fastpath

import (
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/bpfasm"

	"github.com/eipoib/eipoibd/ipoib"
)

// Reason is the index of one TX verdict in the counters map: Redirected,
// or the reason a frame was left to eipoibd (or, for DropRewrite, dropped).
type Reason uint32

// The TX program's verdicts.
const (
	// Redirected: rewritten to IPoIB framing and redirected to the child.
	Redirected Reason = iota
	// FallbackMalformed: shorter than its headers, an IP header whose
	// version or IHL is wrong, or an skb whose protocol is not the
	// frame's EtherType.
	FallbackMalformed
	// FallbackVLAN: 802.1Q/802.1ad tagged, in the frame or in the skb.
	FallbackVLAN
	// FallbackARP: ARP, which eipoibd translates.
	FallbackARP
	// FallbackNotIP: any other EtherType.
	FallbackNotIP
	// FallbackMulticast: group destination MAC (multicast or broadcast).
	FallbackMulticast
	// FallbackFragment: an IPv4 fragment (MF set or a fragment offset).
	FallbackFragment
	// FallbackIPv6Ext: IPv6 with a hop-by-hop, routing, fragment or
	// destination options header, which the program does not walk.
	FallbackIPv6Ext
	// FallbackDHCP: UDP from or to port 67 or 68, which eipoibd rewrites.
	FallbackDHCP
	// FallbackDHCPv6: UDP from or to port 546 or 547.
	FallbackDHCPv6
	// FallbackND: ICMPv6 types 133-137 (router/neighbour discovery,
	// redirect), which eipoibd translates.
	FallbackND
	// FallbackUnknownGuest: the source MAC is not in the guests map.
	FallbackUnknownGuest
	// FallbackUnknownREMAC: the destination MAC is not in the REMAC map.
	FallbackUnknownREMAC
	// FallbackTooBig: the L3 packet (or, for a TCP GSO skb, one segment)
	// is larger than the child's MTU; a UDP GSO skb (UDP segmentation,
	// UFO or a UDP tunnel, which the program cannot tell apart) whose
	// whole packet does not fit; or a GSO skb neither TCP nor UDP.
	FallbackTooBig
	// FallbackHeadroom: bpf_skb_change_head failed; the frame is unchanged.
	FallbackHeadroom
	// DropRewrite: the header write failed after change_head had grown
	// the frame; it is neither Ethernet nor IPoIB any more, so it is
	// dropped (TC_ACT_SHOT).
	DropRewrite

	// NumReasons is the number of counters.
	NumReasons
)

var reasonNames = [NumReasons]string{
	"redirected", "malformed", "vlan", "arp", "not_ip", "multicast",
	"fragment", "ipv6_ext", "dhcp", "dhcpv6", "nd", "unknown_guest",
	"unknown_remac", "too_big", "headroom", "drop_rewrite",
}

// String names the reason as a metric label.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint32(r))
}

// Map bounds. A host runs at most a few hundred guests; REMACs are one
// per remote endpoint that a guest talks to.
const (
	MaxGuests = 4096
	MaxREMACs = 65536
)

// Guest is what the TX program needs to know of one guest MAC: the IPoIB
// child that carries the guest's traffic and that child's MTU.
type Guest struct {
	Ifindex uint32
	MTU     uint32
}

// txGuest is Guest as the guests map holds it (16 bytes): then the count
// of frames the program redirected for the guest.
type txGuest struct {
	Guest
	Hits uint64
}

// txREMAC is the REMACs-map value (32 bytes): the 20-byte IPoIB address,
// 4 zero bytes, the count of frames the program redirected to it.
type txREMAC struct {
	Addr ipoib.HwAddr
	_    [4]byte
	Hits uint64
}

// Where the TX program's map values keep their hit counts.
const (
	txGuestHitsOff = 8  // txGuest.Hits
	txREMACHitsOff = 24 // txREMAC.Hits
)

// Frame layout constants.
const (
	ethHdrLen   = 14
	ipoibHdrLen = ipoib.HwAddrLen + 4 // pseudo header + IPoIB header
	headGrow    = ipoibHdrLen - ethHdrLen
)

// TX is the loaded TX program and its maps. Close releases them.
type TX struct {
	// Program is the tc (SchedCLS) program for the TAP's egress.
	Program *ebpf.Program
	// Guests maps a guest MAC (6 bytes) to its Guest and hit count (16
	// bytes: ifindex, MTU, hits).
	Guests *ebpf.Map
	// REMACs maps a REMAC (6 bytes) to its 20-byte IPoIB address and hit
	// count (32 bytes: address, 4 zero bytes, hits).
	REMACs *ebpf.Map
	// Counters is a per-CPU array of uint64, indexed by Reason.
	Counters *ebpf.Map
	// LastRedirect is a per-CPU array of one uint32: the child ifindex of
	// the last frame this CPU redirected (BPF_PROG_TEST_RUN reports the
	// verdict but not the target).
	LastRedirect *ebpf.Map
}

// LoadTX creates the maps and loads the TX program. It needs
// CAP_BPF and CAP_NET_ADMIN (root).
func LoadTX() (*TX, error) {
	t, _, err := loadTXAt("")
	return t, err
}

// loadTXAt is LoadTX with the maps pinned under pin (see newMap) unless
// it is empty; replaced names the pinned maps that did not match.
func loadTXAt(pin string) (_ *TX, replaced []string, _ error) {
	t := &TX{}
	ms := maps{pin: pin}
	mk := ms.make
	t.Guests = mk("eipoib_guests", ebpf.Hash, 6, 16, MaxGuests)
	t.REMACs = mk("eipoib_remacs", ebpf.Hash, 6, 32, MaxREMACs)
	t.Counters = mk("eipoib_tx_cnt", ebpf.PerCPUArray, 4, 8, uint32(NumReasons))
	t.LastRedirect = mk("eipoib_tx_last", ebpf.PerCPUArray, 4, 4, 1)
	if ms.err != nil {
		t.Close()
		return nil, nil, ms.err
	}
	var err error
	if t.Program, err = loadSchedCLS("eipoib_tx", "TX", txInstructions(t.Guests.FD(), t.REMACs.FD(), t.Counters.FD(), t.LastRedirect.FD())); err != nil {
		t.Close()
		return nil, nil, err
	}
	return t, ms.replaced, nil
}

// Close releases the program and the maps.
func (t *TX) Close() error {
	return closeAll(t.Program, t.Guests, t.REMACs, t.Counters, t.LastRedirect)
}

// PutGuest adds or replaces a guest MAC's entry; its hit count starts at 0.
func (t *TX) PutGuest(mac net.HardwareAddr, g Guest) error {
	k, err := macKey(mac)
	if err != nil {
		return err
	}
	return t.Guests.Put(k, txGuest{Guest: g})
}

// PutREMAC adds or replaces a REMAC's 20-byte destination address; its
// hit count starts at 0.
func (t *TX) PutREMAC(mac net.HardwareAddr, addr ipoib.HwAddr) error {
	k, err := macKey(mac)
	if err != nil {
		return err
	}
	return t.REMACs.Put(k, txREMAC{Addr: addr})
}

// GuestHits is how many frames the program redirected for the guest
// since its entry was put; 0 when it has none.
func (t *TX) GuestHits(mac net.HardwareAddr) (uint64, error) {
	k, err := macKey(mac)
	if err != nil {
		return 0, err
	}
	var v txGuest
	err = lookupAbsent(t.Guests, k, &v)
	return v.Hits, err
}

// REMACHits is how many frames the program redirected to the REMAC since
// its entry was put; 0 when it has none.
func (t *TX) REMACHits(mac net.HardwareAddr) (uint64, error) {
	k, err := macKey(mac)
	if err != nil {
		return 0, err
	}
	var v txREMAC
	err = lookupAbsent(t.REMACs, k, &v)
	return v.Hits, err
}

// DeleteGuest removes a guest MAC's entry.
func (t *TX) DeleteGuest(mac net.HardwareAddr) error {
	k, err := macKey(mac)
	if err != nil {
		return err
	}
	return t.Guests.Delete(k)
}

// DeleteREMAC removes a REMAC's entry.
func (t *TX) DeleteREMAC(mac net.HardwareAddr) error {
	k, err := macKey(mac)
	if err != nil {
		return err
	}
	return t.REMACs.Delete(k)
}

// Counts sums the per-CPU counters.
func (t *TX) Counts() ([NumReasons]uint64, error) {
	var sum [NumReasons]uint64
	got, err := sumPerCPU(t.Counters, int(NumReasons), func(i int) string { return Reason(i).String() })
	copy(sum[:], got)
	return sum, err
}

func macKey(mac net.HardwareAddr) ([6]byte, error) {
	var k [6]byte
	if len(mac) != len(k) {
		return k, fmt.Errorf("fastpath: %q is not a 6-byte MAC", mac)
	}
	copy(k[:], mac)
	return k, nil
}

// txInstructions is the TX program. Registers: R6 the skb, R7 the L3
// header length (then the child ifindex), R8 the L4 protocol (then the
// return value), R9 the guest entry (then the reason); the REMAC entry is
// spilled to the stack (stPtr). Headers are copied
// to the stack with bpf_skb_load_bytes, so non-linear skbs are handled
// the same as linear ones.
func txInstructions(guests, remacs, counters, last int) asm.Instructions {
	var p asm.Instructions
	add := func(ins ...asm.Instruction) { p = append(p, ins...) }
	addAll := func(ins asm.Instructions) { p = append(p, ins...) }

	add(
		asm.Mov.Reg(asm.R6, asm.R1),
		// A tag the stack put in the skb rather than in the frame.
		asm.LoadMem(asm.R1, asm.R6, ctxVLANPresent, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "fb_vlan"),
	)
	addAll(loadBytes("", 0, false, stEth, ethHdrLen))
	add(
		asm.LoadMem(asm.R7, asm.RFP, stEth+12, asm.Half),
		asm.HostTo(asm.BE, asm.R7, asm.Half),
		asm.JEq.Imm(asm.R7, 0x8100, "fb_vlan"),
		asm.JEq.Imm(asm.R7, 0x88a8, "fb_vlan"),
		asm.JEq.Imm(asm.R7, 0x0806, "fb_arp"),
		// The I/G bit: multicast and broadcast.
		asm.LoadMem(asm.R1, asm.RFP, stEth, asm.Byte),
		asm.And.Imm(asm.R1, 1),
		asm.JNE.Imm(asm.R1, 0, "fb_multicast"),
		// skb->protocol must agree with the EtherType: GSO
		// (skb_mac_gso_segment) and the child's offloads go by the
		// former, ipoib_start_xmit by the IPoIB header built from the
		// latter. Both are in network order, so no swap.
		asm.LoadMem(asm.R1, asm.R6, ctxProtocol, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, stEth+12, asm.Half),
		asm.JNE.Reg(asm.R1, asm.R2, "fb_malformed"),
	)
	addAll(classifyL3(ethHdrLen, true))

	// Both families: R7 = L3 header length, R8 = L4 protocol.
	add(
		asm.LoadMapPtr(asm.R1, guests).WithSymbol("l4done"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stEth+6),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "fb_unknown_guest"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.LoadMapPtr(asm.R1, remacs),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stEth),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "fb_unknown_remac"),
		asm.StoreMem(asm.RFP, stPtr, asm.R0, asm.DWord),
		// The link header: 20-byte address, EtherType (already in
		// network order on the stack), 2 reserved zero bytes.
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.StoreMem(asm.RFP, stOut, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.DWord),
		asm.StoreMem(asm.RFP, stOut+8, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 16, asm.Word),
		asm.StoreMem(asm.RFP, stOut+16, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, stEth+12, asm.Half),
		asm.StoreMem(asm.RFP, stOut+20, asm.R1, asm.Half),
		asm.StoreImm(asm.RFP, stOut+22, 0, asm.Half),

		// MTU: R3 is the largest packet the child will send, the L3
		// packet or for a GSO skb its largest segment (below).
		asm.LoadMem(asm.R2, asm.R6, ctxGSOSize, asm.Word),
		asm.JNE.Imm(asm.R2, 0, "gso"),
		asm.LoadMem(asm.R3, asm.R6, ctxLen, asm.Word),
		asm.Sub.Imm(asm.R3, ethHdrLen),
		asm.LoadMem(asm.R1, asm.R9, 4, asm.Word).WithSymbol("mtu"),
		asm.JGT.Reg(asm.R3, asm.R1, "fb_too_big"),
		asm.Ja.Label("push"),

		// TCP GSO: a segment is the L3 header, the TCP header and
		// gso_size, skb_gso_network_seglen's measure for an skb that is
		// not encapsulated (net/core/gso.c, skb_gso_transport_seglen).
		// An outer TCP header means no UDP tunnel: IPIP, SIT and GRE
		// have their own protocol numbers and fall back.
		asm.JEq.Imm(asm.R8, 17, "gsoudp").WithSymbol("gso"),
		asm.JNE.Imm(asm.R8, 6, "fb_too_big"),
	)
	addAll(loadBytes("", ethHdrLen, true, stL4, 13))
	add(
		asm.LoadMem(asm.R3, asm.RFP, stL4+12, asm.Byte),
		asm.RSh.Imm(asm.R3, 4),
		asm.LSh.Imm(asm.R3, 2),
		asm.Add.Reg(asm.R3, asm.R7),
		asm.LoadMem(asm.R2, asm.R6, ctxGSOSize, asm.Word),
		asm.Add.Reg(asm.R3, asm.R2),
		asm.Ja.Label("mtu"),

		// UDP GSO: the skb may be SKB_GSO_UDP_L4 (a segment is L3 + 8 +
		// gso_size), UFO, or SKB_GSO_UDP_TUNNEL[_CSUM] from a guest's
		// VXLAN or Geneve, whose gso_size counts only the inner payload:
		// skb_gso_transport_seglen adds the tunnel and inner headers
		// (skb_inner_transport_header - skb_transport_header, plus the
		// inner TCP header). struct __sk_buff shows neither gso_type
		// nor skb->encapsulation, so no segment size computed here is
		// safe. Every segment is at most the whole packet, and ipoib
		// has no hw_enc_features, so validate_xmit_skb segments a
		// tunnel skb in software before ipoib_start_xmit, whose
		// ipoib_send drops any segment over the MTU ("packet len %d
		// (> %d) too long to send"). So the whole packet must fit,
		// plus, for IPv6, the 8-byte fragment header udp6_ufo_fragment
		// adds to each fragment of a UFO skb.
		asm.LoadMem(asm.R3, asm.R6, ctxLen, asm.Word).WithSymbol("gsoudp"),
		asm.Sub.Imm(asm.R3, ethHdrLen),
		asm.LoadMem(asm.R1, asm.RFP, stEth+12, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.JNE.Imm(asm.R1, 0x86dd, "mtu"),
		asm.Add.Imm(asm.R3, 8),
		asm.Ja.Label("mtu"),

		// Grow the head by 10 bytes: __bpf_skb_change_head keeps the
		// network header, csum_start and gso_size, and resets the MAC
		// header to the new start.
		asm.LoadMem(asm.R7, asm.R9, 0, asm.Word).WithSymbol("push"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, headGrow),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnSkbChangeHead.Call(),
		asm.JNE.Imm(asm.R0, 0, "fb_headroom"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stOut),
		asm.Mov.Imm(asm.R4, ipoibHdrLen),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop_rewrite"),
	)
	addAll(countHits(txGuestHitsOff, txREMACHitsOff))
	addAll(recordTarget(last))
	add(
		// __bpf_redirect: ARPHRD_INFINIBAND is a MAC-header device, so
		// the 24-byte link header reaches ipoib_start_xmit as skb->data.
		asm.Mov.Reg(asm.R1, asm.R7).WithSymbol("redirect"),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Imm(asm.R9, int32(Redirected)),
		asm.Ja.Label("count"),

		asm.Mov.Imm(asm.R8, tcActShot).WithSymbol("drop_rewrite"),
		asm.Mov.Imm(asm.R9, int32(DropRewrite)),
		asm.Ja.Label("count"),
	)
	addAll(fallbacks(reasonNames[FallbackMalformed:DropRewrite], int32(FallbackMalformed)))
	addAll(bpfasm.CountAndExit(counters, stKey))
	return p
}
