package fastpath

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
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
		// bpf_prog_test_run_skb refuses frames shorter than Ethernet
		// or than their IP header, and longer than a page's room.
		if len(frame) < ethHdrLen || len(frame) > 3000 {
			return
		}
		typ := binary.BigEndian.Uint16(frame[12:])
		if typ == 0x0800 && len(frame) < ethHdrLen+20 || typ == 0x86dd && len(frame) < ethHdrLen+40 {
			return
		}
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
