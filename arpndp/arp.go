package arpndp

// ARP/RARP rewriting. Ethernet ARP (RFC 826) is hardware type 1 with 6-byte
// addresses, 28 bytes for IPv4; IPoIB ARP (RFC 4391 §9.2) is hardware type 32
// with 20-byte addresses, 56 bytes. Both carry IPv4 only.

import (
	"encoding/binary"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

// ARP constants.
const (
	HwTypeEthernet   = 1
	HwTypeInfiniBand = 32
	ARPEthLen        = 8 + 2*(6+4)  // 28
	ARPIBLen         = 8 + 2*(20+4) // 56

	OpRequest     = 1
	OpReply       = 2
	OpRARPRequest = 3
	OpRARPReply   = 4
)

// ARP is a zero-copy view of an ARP/RARP packet of either link layer.
type ARP []byte

// Validate checks the fixed header and that the packet holds all four
// addresses. It accepts hardware type 1 with length 6 and type 32 with 20.
func (a ARP) Validate() error {
	if len(a) < 8 {
		return ErrTruncated
	}
	ht, hl := a.HwType(), int(a[4])
	if hl != 6 && hl != ipoib.HwAddrLen {
		return ErrBadHwLen
	}
	switch {
	case ht == HwTypeEthernet && hl == 6, ht == HwTypeInfiniBand && hl == ipoib.HwAddrLen:
	case ht == HwTypeEthernet || ht == HwTypeInfiniBand:
		return ErrBadHwLen
	default:
		return ErrBadHwType
	}
	if binary.BigEndian.Uint16(a[2:4]) != ether.TypeIPv4 || a[5] != 4 {
		return ErrBadProto
	}
	if op := a.Op(); op < OpRequest || op > OpRARPReply {
		return ErrBadOp
	}
	if len(a) < 8+2*(hl+4) {
		return ErrTruncated
	}
	return nil
}

// HwType returns the hardware type.
func (a ARP) HwType() uint16 { return binary.BigEndian.Uint16(a[0:2]) }

// Op returns the opcode.
func (a ARP) Op() uint16 { return binary.BigEndian.Uint16(a[6:8]) }

// Len returns the length of the packet proper (without trailing padding).
func (a ARP) Len() int { return 8 + 2*(int(a[4])+4) }

// SenderIP returns the sender protocol address.
func (a ARP) SenderIP() [4]byte { hl := int(a[4]); return [4]byte(a[8+hl : 12+hl]) }

// TargetIP returns the target protocol address.
func (a ARP) TargetIP() [4]byte { hl := int(a[4]); return [4]byte(a[12+2*hl : 16+2*hl]) }

// SenderHw returns the sender hardware address (6 or 20 bytes).
func (a ARP) SenderHw() []byte { return a[8 : 8+int(a[4])] }

// TargetHw returns the target hardware address (6 or 20 bytes).
func (a ARP) TargetHw() []byte { hl := int(a[4]); return a[12+hl : 12+2*hl] }

func isRequest(op uint16) bool { return op == OpRequest || op == OpRARPRequest }

func writeARP(b []byte, htype uint16, op uint16, sha []byte, spa [4]byte, tha []byte, tpa [4]byte) {
	hl := len(sha)
	binary.BigEndian.PutUint16(b[0:2], htype)
	binary.BigEndian.PutUint16(b[2:4], ether.TypeIPv4)
	b[4], b[5] = byte(hl), 4
	binary.BigEndian.PutUint16(b[6:8], op)
	copy(b[8:], sha)
	copy(b[8+hl:], spa[:])
	copy(b[12+hl:], tha)
	copy(b[12+2*hl:], tpa[:])
}

// ARPToIB rewrites an Ethernet ARP/RARP packet from a guest into IPoIB ARP
// in place and returns pkt[:56]; pkt needs a capacity of 56. The sender MAC
// must translate; the target MAC of a request (zero or broadcast, or any
// MAC not known) becomes the zero address, that of a reply must translate.
func ARPToIB(pkt []byte, tr Translator) ([]byte, error) {
	a := ARP(pkt)
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if a.HwType() != HwTypeEthernet {
		return nil, ErrBadHwType
	}
	if cap(pkt) < ARPIBLen {
		return nil, ErrNoRoom
	}
	op := a.Op()
	sha, ok := tr.EthToIB(ether.MAC(a.SenderHw()))
	if !ok {
		return nil, ErrUnknownAddr
	}
	var tha ipoib.HwAddr
	if tm := ether.MAC(a.TargetHw()); !tm.IsZero() && !tm.IsBroadcast() {
		t, ok := tr.EthToIB(tm)
		switch {
		case ok:
			tha = t
		case !isRequest(op):
			return nil, ErrUnknownAddr
		}
	}
	spa, tpa := a.SenderIP(), a.TargetIP()
	out := pkt[:ARPIBLen]
	writeARP(out, HwTypeInfiniBand, op, sha[:], spa, tha[:], tpa)
	return out, nil
}

// ARPToEth rewrites an IPoIB ARP/RARP packet from the fabric into Ethernet
// ARP in place and returns pkt[:28]. A zero target address stays zero.
func ARPToEth(pkt []byte, tr Translator) ([]byte, error) {
	a := ARP(pkt)
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if a.HwType() != HwTypeInfiniBand {
		return nil, ErrBadHwType
	}
	op := a.Op()
	sha, ok := tr.IBToEth(ipoib.HwAddr(a.SenderHw()))
	if !ok {
		return nil, ErrUnknownAddr
	}
	var tha ether.MAC
	if th := ipoib.HwAddr(a.TargetHw()); !th.IsZero() {
		t, ok := tr.IBToEth(th)
		switch {
		case ok:
			tha = t
		case !isRequest(op):
			return nil, ErrUnknownAddr
		}
	}
	spa, tpa := a.SenderIP(), a.TargetIP()
	out := pkt[:ARPEthLen]
	writeARP(out, HwTypeEthernet, op, sha[:], spa, tha[:], tpa)
	return out, nil
}
