package arpndp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// TestARPIndependentDecoders checks the ARP rewriting with decoders
// written apart from it: mdlayher/ethernet, and mdlayher/arp, which
// takes 20-byte hardware addresses. A guest's request, read out of its
// Ethernet frame, becomes IPoIB ARP: type 32, length 20, the guest's
// LIMAC, the same IP addresses, a zero target address. The remote's
// IPoIB reply becomes Ethernet ARP naming the REMAC and the guest's MAC.
func TestARPIndependentDecoders(t *testing.T) {
	tr := newTr()
	spa, tpa := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	req, err := arp.NewPacket(arp.OperationRequest, guestMAC[:], spa, ethernet.Broadcast, tpa)
	if err != nil {
		t.Fatal(err)
	}
	req.TargetHardwareAddr = make(net.HardwareAddr, 6)
	payload, _ := req.MarshalBinary()
	frame, err := (&ethernet.Frame{Destination: ethernet.Broadcast, Source: guestMAC[:], EtherType: ethernet.EtherTypeARP, Payload: payload}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil || f.EtherType != ethernet.EtherTypeARP {
		t.Fatalf("frame: %v, ethertype %v", err, f.EtherType)
	}
	ib, err := ARPToIB(roomy(f.Payload), tr)
	if err != nil {
		t.Fatal(err)
	}
	var got arp.Packet
	if err := got.UnmarshalBinary(ib); err != nil {
		t.Fatal(err)
	}
	if got.HardwareType != 32 || got.HardwareAddrLength != 20 || got.Operation != arp.OperationRequest ||
		!bytes.Equal(got.SenderHardwareAddr, guestHw[:]) || !bytes.Equal(got.TargetHardwareAddr, make([]byte, 20)) ||
		got.SenderIP != spa || got.TargetIP != tpa {
		t.Errorf("IPoIB request as mdlayher/arp reads it: %+v", got)
	}

	reply := arp.Packet{HardwareType: 32, ProtocolType: uint16(ethernet.EtherTypeIPv4), HardwareAddrLength: 20, IPLength: 4,
		Operation: arp.OperationReply, SenderHardwareAddr: remoteHw[:], SenderIP: tpa, TargetHardwareAddr: guestHw[:], TargetIP: spa}
	b, _ := reply.MarshalBinary()
	eth, err := ARPToEth(roomy(b), tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.UnmarshalBinary(eth); err != nil {
		t.Fatal(err)
	}
	if got.HardwareType != 1 || got.HardwareAddrLength != 6 || got.Operation != arp.OperationReply ||
		!bytes.Equal(got.SenderHardwareAddr, remoteMAC[:]) || !bytes.Equal(got.TargetHardwareAddr, guestMAC[:]) ||
		got.SenderIP != tpa || got.TargetIP != spa {
		t.Errorf("Ethernet reply as mdlayher/arp reads it: %+v", got)
	}
}
