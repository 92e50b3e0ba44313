package vswitch

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// packetDiagReply builds a packet_diag reply as the kernel sends it
// (sk_diag_fill): struct packet_diag_msg, then PACKET_DIAG_INFO with
// ifindex and flags and a PACKET_DIAG_UID (first with uidFirst), in the
// host's byte order.
func packetDiagReply(ifindex, flags uint32, uidFirst bool) []byte {
	b := make([]byte, packetDiagMsgLen, 64)
	b[0], b[1] = unix.AF_PACKET, unix.SOCK_RAW
	info := binary.NativeEndian.AppendUint16(nil, unix.SizeofNlAttr+packetDiagInfoLen)
	info = binary.NativeEndian.AppendUint16(info, packetDiagInfo)
	info = binary.NativeEndian.AppendUint32(info, ifindex)
	info = append(info, make([]byte, 16)...) // version, reserve, copy_thresh, tstamp
	info = binary.NativeEndian.AppendUint32(info, flags)
	uid := binary.NativeEndian.AppendUint16(nil, unix.SizeofNlAttr+4)
	uid = binary.NativeEndian.AppendUint16(uid, 5) // PACKET_DIAG_UID
	uid = binary.NativeEndian.AppendUint32(uid, 0)
	if uidFirst {
		return append(append(b, uid...), info...)
	}
	return append(append(b, info...), uid...)
}

// TestParsePacketDiag: a reply gives the socket's interface and whether
// it has a vnet header (PDI_VNETHDR among other flags), wherever
// PACKET_DIAG_INFO is among the attributes; a short reply, another
// family, a reply without PACKET_DIAG_INFO, a short one, and an
// attribute longer than the reply are errors.
func TestParsePacketDiag(t *testing.T) {
	for _, c := range []struct {
		b    []byte
		want packetSocket
	}{
		{packetDiagReply(3, 0x2, false), packetSocket{ifindex: 3}},
		{packetDiagReply(3, 0x8|0x2|0x1, false), packetSocket{ifindex: 3, vnetHdr: true}},
		{packetDiagReply(0, 0x8, false), packetSocket{vnetHdr: true}},
		{packetDiagReply(7, 0x8|0x2, true), packetSocket{ifindex: 7, vnetHdr: true}},
		{packetDiagReply(7, 0x10, true), packetSocket{ifindex: 7}},
	} {
		if s, err := parsePacketDiag(c.b); err != nil || s != c.want {
			t.Errorf("% x: %+v, %v; want %+v", c.b, s, err, c.want)
		}
	}
	ok := packetDiagReply(3, 0x8, false)
	noInfo := slices.Clone(ok[:packetDiagMsgLen])
	shortInfo := slices.Clone(ok[:packetDiagMsgLen+unix.SizeofNlAttr+8])
	binary.NativeEndian.PutUint16(shortInfo[packetDiagMsgLen:], unix.SizeofNlAttr+8)
	tooLong := slices.Clone(ok)
	binary.NativeEndian.PutUint16(tooLong[packetDiagMsgLen:], 200)
	inet := slices.Clone(ok)
	inet[0] = unix.AF_INET
	for _, b := range [][]byte{nil, ok[:packetDiagMsgLen-1], inet, noInfo, shortInfo, tooLong, ok[:packetDiagMsgLen+unix.SizeofNlAttr+4]} {
		if s, err := parsePacketDiag(b); err == nil {
			t.Errorf("% x: %+v, want an error", b, s)
		}
	}
}

// FuzzPacketDiag: any reply, however garbled, gives a socket or an
// error without a panic, and an error gives the zero socket.
func FuzzPacketDiag(f *testing.F) {
	f.Add(packetDiagReply(3, 0x8|0x2, false))
	f.Add(packetDiagReply(1, 0, true))
	f.Add(packetDiagReply(1, 0, false)[:packetDiagMsgLen+2])
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parsePacketDiag(b)
		if err != nil && s != (packetSocket{}) {
			t.Fatalf("error %v with a socket %+v", err, s)
		}
	})
}

// TestPacketSocketsKernel lists the packet sockets of a fresh network
// namespace in which the test opens three, as ovs-vswitchd's
// netdev_linux_rxq_construct does one (SOCK_RAW, bound to an interface
// with ETH_P_ALL): on lo with PACKET_VNET_HDR, on lo without, and one
// bound to no interface with it. The kernel lists exactly these, each
// with its interface and vnet header.
func TestPacketSocketsKernel(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("vsp%d", os.Getpid())
	nstest.Add(t, ns)
	var got []packetSocket
	nstest.Do(t, ns, func() {
		open := func(ifindex int, vnet bool) {
			t.Helper()
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(fd) })
			if vnet {
				if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
					t.Fatal(err)
				}
			}
			if ifindex != 0 {
				if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
					t.Fatal(err)
				}
			}
		}
		open(1, true)
		open(1, false)
		open(0, true)
		var err error
		if got, err = packetSockets(); err != nil {
			t.Fatal(err)
		}
	})
	want := []packetSocket{{ifindex: 0, vnetHdr: true}, {ifindex: 1}, {ifindex: 1, vnetHdr: true}}
	slices.SortFunc(got, func(a, b packetSocket) int {
		return cmp.Or(cmp.Compare(a.ifindex, b.ifindex), cmp.Compare(boolInt(a.vnetHdr), boolInt(b.vnetHdr)))
	})
	if !slices.Equal(got, want) {
		t.Errorf("packet sockets %+v, want %+v", got, want)
	}
	if !hasVnetSocket(got, 1) || hasVnetSocket(got, 2) {
		t.Errorf("%+v: a vnet socket on lo %v, on ifindex 2 %v; want true, false", got, hasVnetSocket(got, 1), hasVnetSocket(got, 2))
	}
}

// boolInt is 1 for true, 0 for false.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// htons is v in network byte order, as sockaddr_ll's protocol takes it.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
