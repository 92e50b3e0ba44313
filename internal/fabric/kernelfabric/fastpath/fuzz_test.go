package fastpath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/bpfasm"
)

// FuzzTX runs arbitrary frames through the TX program and checks its
// contract. A frame is either redirected or returned TC_ACT_OK
// untouched. It is redirected, and rewritten exactly to the IPoIB
// layout, only when it is IP from the known guest to the known REMAC
// within the MTU. Exactly one counter moves by one.
func FuzzTX(f *testing.F) {
	tcp4 := ipv4(0x4000, 6, tcp(100))
	for _, seed := range [][]byte{
		eth(remac, guestMAC, 0x0800, tcp4),
		eth(remac, guestMAC, 0x86dd, ipv6(6, tcp(100))),
		eth(remac, guestMAC, 0x86dd, ipv6(58, icmpv6(135))),
		eth(remac, guestMAC, 0x0800, ipv4(0, 17, udp(68, 67, 300))),
		eth(remac, guestMAC, 0x86dd, ipv6(17, udp(546, 547, 40))),
		eth(remac, guestMAC, 0x0806, make([]byte, 28)),
		eth(remac, guestMAC, 0x8100, append([]byte{0, 5, 8, 0}, tcp4...)),
		eth(remac, guestMAC, 0x0800, ipv4(0x2000, 6, tcp(8))),
		eth(remac, guestMAC, 0x0800, ipv4(0, 17, udp(1, 2, childMTU-28))),
	} {
		f.Add(seed)
	}
	tx := loadTX(f)
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !bpfasm.TestRunTakes(frame) {
			return
		}
		typ := binary.BigEndian.Uint16(frame[12:])
		before, err := tx.Counts()
		if err != nil {
			t.Fatal(err)
		}
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}
		ret, err := tx.Program.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		after, err := tx.Counts()
		if err != nil {
			t.Fatal(err)
		}
		moved := Reason(NumReasons)
		for r := range NumReasons {
			switch d := after[r] - before[r]; {
			case d == 1 && moved == NumReasons:
				moved = r
			case d != 0:
				t.Fatalf("counter %s moved by %d (after %s)", r, d, moved)
			}
		}
		known := bytes.Equal(frame[0:6], remac) && bytes.Equal(frame[6:12], guestMAC) &&
			(typ == 0x0800 || typ == 0x86dd) && len(frame)-ethHdrLen <= childMTU
		switch {
		case ret == tcActRedir && moved == Redirected:
			if !known {
				t.Fatalf("redirected a frame that is not unicast IP from the guest to the REMAC within the MTU: %x", head(frame))
			}
			if want := ipoibFrame(typ, frame[ethHdrLen:]); !bytes.Equal(opts.DataOut, want) {
				t.Fatalf("rewrote\n%x\nto\n%x\nwant\n%x", head(frame), head(opts.DataOut), head(want))
			}
		case ret == tcActOK && moved > Redirected && moved < DropRewrite:
			if !bytes.Equal(opts.DataOut, frame) {
				t.Fatalf("fallback %s changed the frame", moved)
			}
		default:
			t.Fatalf("verdict %d with counter %s", ret, moved)
		}
	})
}

// FuzzRX runs arbitrary packets, laid out as the RX program sees them at
// an IPoIB child's ingress (see ipoibRX), through the RX program and
// checks its contract: a packet is either redirected to the TAP,
// rewritten exactly to the Ethernet frame from the sender's REMAC to the
// guest, and only when it is unicast IP from a known sender that fits
// the TAP's MTU and can be shrunk; or returned TC_ACT_OK untouched; and
// exactly one counter moves by one.
func FuzzRX(f *testing.F) {
	tcp4 := ipv4(0x4000, 6, tcp(100))
	for _, seed := range [][]byte{
		ipoibRX(nil, 0x0800, tcp4),
		ipoibRX(nil, 0x86dd, ipv6(6, tcp(100))),
		ipoibRX(nil, 0x86dd, ipv6(58, append(icmpv6(135), make([]byte, 16)...))),
		ipoibRX(nil, 0x0800, ipv4(0, 17, udp(67, 68, 300))),
		ipoibRX(nil, 0x86dd, ipv6(17, udp(547, 546, 40))),
		ipoibRX(nil, 0x0806, make([]byte, 56)),
		ipoibRX([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0800, tcp4),
		ipoibRX(nil, 0x0800, ipv4(0, 1, make([]byte, 9))),
		ipoibRX(nil, 0x0800, ipv4(0, 17, udp(1, 2, rxTAPMTU-28))),
		ipoibRX(nil, 0x0800, withSrc(tcp4, otherSender)),
	} {
		f.Add(seed)
	}
	rx := loadRX(f)
	ctx := rxCtx(rxChild, 0)
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !bpfasm.TestRunTakes(frame) {
			return
		}
		typ := binary.BigEndian.Uint16(frame[12:])
		before, err := rx.Counts()
		if err != nil {
			t.Fatal(err)
		}
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64), Context: ctx}
		ret, err := rx.Program.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		after, err := rx.Counts()
		if err != nil {
			t.Fatal(err)
		}
		moved := RXReason(NumRXReasons)
		for r := range NumRXReasons {
			switch d := after[r] - before[r]; {
			case d == 1 && moved == NumRXReasons:
				moved = r
			case d != 0:
				t.Fatalf("counter %s moved by %d (after %s)", r, d, moved)
			}
		}
		switch {
		case ret == tcActRedir && moved == RXRedirected:
			if !rxFastPathTakes(frame) {
				t.Fatalf("redirected a packet that is not unicast IP from a known sender within the MTU: %x", head(frame))
			}
			if want := eth(guestMAC, remac, typ, frame[rxLinkLen:]); !bytes.Equal(opts.DataOut, want) {
				t.Fatalf("rewrote\n%x\nto\n%x\nwant\n%x", head(frame), head(opts.DataOut), head(want))
			}
		case ret == tcActOK && moved > RXRedirected && moved < RXDropRewrite:
			if !bytes.Equal(opts.DataOut, frame) {
				t.Fatalf("fallback %s changed the packet", moved)
			}
		default:
			t.Fatalf("verdict %d with counter %s", ret, moved)
		}
	})
}

// rxFastPathTakes is the RX contract's necessary conditions, written
// apart from the program: PACKET_HOST (a zero first byte's I/G bit and
// not OTHERHOST: all six zero), an IP protocol agreeing with
// skb->protocol, a unicast destination, a sender in loadRX's map, the
// TAP's MTU and bpf_skb_adjust_room's minimum length.
func rxFastPathTakes(frame []byte) bool {
	if len(frame) < rxLinkLen || !bytes.Equal(frame[:6], make([]byte, 6)) || !bytes.Equal(frame[12:14], frame[20:22]) {
		return false
	}
	l3 := frame[rxLinkLen:]
	if len(l3) > rxTAPMTU {
		return false
	}
	switch binary.BigEndian.Uint16(frame[20:]) {
	case 0x0800:
		src, _ := netip.AddrFromSlice(l3[12:16])
		return len(l3) >= ipv4MinForShrink && l3[16] < 224 && src == sender4
	case 0x86dd:
		src, _ := netip.AddrFromSlice(l3[8:24])
		return len(l3) >= ipv6MinForShrink && l3[24] != 0xff && src == sender6
	}
	return false
}
