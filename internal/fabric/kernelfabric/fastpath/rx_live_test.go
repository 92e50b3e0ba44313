package fastpath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// wired is the frame the emulated wire (package emuib) hands a child:
// an Ethernet header addressed to it, then the 10 bytes of the IPoIB
// link header the wire leaves (here the last GID bytes of some address,
// the EtherType and the reserved bytes), then L3.
func wired(dst, src net.HardwareAddr, typ uint16, l3 []byte) []byte {
	f := append(eth(dst, src, typ, nil), 0xfe, 0x80, 0, 0, 0, 2, byte(typ>>8), byte(typ), 0, 0)
	return append(f, l3...)
}

// csum is the Internet checksum of b.
func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// echo4 is an ICMP echo request from 10.0.0.1 to 10.0.0.2 with valid
// checksums and 56 payload bytes.
func echo4(id, seq uint16) []byte {
	icmp := make([]byte, 8+56)
	icmp[0] = 8
	binary.BigEndian.PutUint16(icmp[4:], id)
	binary.BigEndian.PutUint16(icmp[6:], seq)
	for i := 8; i < len(icmp); i++ {
		icmp[i] = byte(i)
	}
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp))
	p := ipv4(0x4000, 1, icmp)
	binary.BigEndian.PutUint16(p[10:], csum(p[:20]))
	return p
}

// echo6 is an ICMPv6 echo request from fd00::1 to fd00::2 with a valid
// checksum and 56 payload bytes.
func echo6(id, seq uint16) []byte {
	icmp := make([]byte, 8+56)
	icmp[0] = 128
	binary.BigEndian.PutUint16(icmp[4:], id)
	binary.BigEndian.PutUint16(icmp[6:], seq)
	for i := 8; i < len(icmp); i++ {
		icmp[i] = byte(i)
	}
	p := ipv6(58, icmp)
	pseudo := append(append([]byte{}, p[8:40]...), 0, 0, byte(len(icmp)>>8), byte(len(icmp)), 0, 0, 0, 58)
	binary.BigEndian.PutUint16(p[42:], csum(append(pseudo, icmp...)))
	return p
}

// readMatching reads frames from fd (the TAP's) until one satisfies
// match, for up to 10 s: the kernel also sends the TAP its own IPv6
// router solicitations and MLD reports.
func readMatching(t *testing.T, fd int, match func([]byte) bool) []byte {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 65536)
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 1000); err != nil || n != 1 {
			continue
		}
		n, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		if match(buf[:n]) {
			return append([]byte{}, buf[:n]...)
		}
	}
	t.Fatal("no matching frame within 10 s")
	return nil
}

// TestRXLive runs the RX program at tcx ingress of a child whose
// harness program (emuib's) rebuilds ipoib's receive layout from what
// the emulated wire delivers, and redirects to a TAP that carries the
// guest's address and MAC. The child is a TAP too, written through its
// fd: a packet socket's GSO frame would be checked (SKB_GSO_DODGY,
// tcp_gso_segment) at the sending veth's egress against a network header
// that eth_type_trans put after the Ethernet header, where the wire's
// frame still has 10 bytes of IPoIB link header, while tun_get_user
// receives it as the child receives the wire's frame from its veth.
// package testbed's end-to-end test runs the veth and the wire.
//
//   - an ICMP or ICMPv6 echo request written to the child is received on the TAP,
//     answered by the kernel, and the reply read from the TAP's fd, as
//     eipoibd reads it, is addressed to the sender's REMAC: the rebuilt
//     frame went through dev_forward_skb and the IP stack whole;
//   - a TSO super-frame arrives on the TAP as one skb, gso_size kept
//     (BPF_F_ADJ_ROOM_FIXED_GSO) and csum_start 34, the TCP header in
//     the Ethernet frame.
//
// It runs with each hook for the RX program: after the harness on tcx,
// then as a clsact filter, which the harness's TCX_NEXT passes the
// packet on to (sch_handle_ingress runs tc_run after tcx_run); on a
// kernel without tcx, with the harness a filter before it.
func TestRXLive(t *testing.T) {
	for _, h := range hooks(t) {
		t.Run(h.String(), func(t *testing.T) { testRXLive(t, h) })
	}
}

func testRXLive(t *testing.T, hook Hook) {
	nstest.Require(t)
	rx := loadRX(t)
	emu, err := emuib.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	ns := fmt.Sprintf("fprx%s%d", hook, os.Getpid())
	nstest.Add(t, ns)

	var tapFd, childFd int
	nstest.Do(t, ns, func() {
		tapFd = openTun(t, "fprxtap", unix.IFF_TAP)
		childFd = openTun(t, "fprxc", unix.IFF_TAP|unix.IFF_VNET_HDR)
	})
	in := func(args ...string) { t.Helper(); nstest.Must(t, nstest.In(ns, args...)...) }
	in("ip", "link", "set", "fprxtap", "address", guestMAC.String())
	in("ip", "addr", "add", "10.0.0.2/24", "dev", "fprxtap")
	in("ip", "link", "set", "fprxtap", "up")
	in("ip", "neigh", "add", "10.0.0.1", "lladdr", remac.String(), "dev", "fprxtap", "nud", "permanent")
	// openTun turned IPv6 off on the TAP; the guest needs it here.
	in("sysctl", "-qw", "net.ipv6.conf.fprxtap.disable_ipv6=0")
	in("ip", "addr", "add", "fd00::2/64", "dev", "fprxtap", "nodad")
	in("ip", "-6", "neigh", "add", "fd00::1", "lladdr", remac.String(), "dev", "fprxtap", "nud", "permanent")
	in("ip", "link", "set", "fprxc", "up")

	var child, tap *net.Interface
	var watch int
	nstest.Do(t, ns, func() {
		var err error
		if child, err = net.InterfaceByName("fprxc"); err != nil {
			t.Fatal(err)
		}
		if tap, err = net.InterfaceByName("fprxtap"); err != nil {
			t.Fatal(err)
		}
		if err := rx.PutGuest(uint32(child.Index), RXGuest{MAC: guestMAC, TAP: uint32(tap.Index), MTU: uint32(tap.MTU)}); err != nil {
			t.Fatal(err)
		}
		for _, ip := range []netip.Addr{sender4, sender6} {
			if err := rx.PutSender(uint32(child.Index), ip, remac); err != nil {
				t.Fatal(err)
			}
		}
		if haveTCX(t) {
			hl, err := link.AttachTCX(link.TCXOptions{Interface: child.Index, Program: emu.Harness, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				t.Fatalf("attach the harness: %v", err)
			}
			t.Cleanup(func() { hl.Close() })
		} else {
			// Without tcx the harness is a filter before ours; its
			// TCX_NEXT is TC_ACT_UNSPEC, on to the next filter
			// (tcf_classify).
			firstFilter(t, child.Index, true, emu.Harness)
		}
		// After the harness: tcx appends a link with no anchor last
		// (bpf_mprog_attach), cls_bpf runs the filters by priority.
		rl, err := attachHook(hook, child.Index, true, rx.Program)
		if err != nil {
			t.Fatalf("attach the RX program: %v", err)
		}
		t.Cleanup(func() { rl.detach() })
		// watch sees what the TAP receives (ptype_all), with GSO
		// metadata.
		if watch, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(watch) })
		if err := unix.SetsockoptInt(watch, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(watch, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: tap.Index}); err != nil {
			t.Fatal(err)
		}
	})
	send := func(h vnetHdr, frame []byte) {
		t.Helper()
		if _, err := unix.Write(childFd, append(h.bytes(), frame...)); err != nil {
			t.Fatalf("write to the child: %v", err)
		}
	}
	// received returns the next frame the TAP received (not one it
	// sent), with its vnet header.
	received := func() (vnetHdr, []byte) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		buf := make([]byte, 65536)
		for time.Now().Before(deadline) {
			pfd := []unix.PollFd{{Fd: int32(watch), Events: unix.POLLIN}}
			if n, err := unix.Poll(pfd, 1000); err != nil || n != 1 {
				continue
			}
			n, from, err := unix.Recvfrom(watch, buf, 0)
			if err != nil {
				t.Fatal(err)
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype != unix.PACKET_OUTGOING && n >= 10 {
				return parseVnetHdr(buf), append([]byte{}, buf[10:n]...)
			}
		}
		t.Fatal("the TAP received nothing within 10 s")
		return vnetHdr{}, nil
	}

	t.Run("icmp echo answered through the tap", func(t *testing.T) {
		req := echo4(0x4242, 1)
		send(vnetHdr{}, wired(child.HardwareAddr, remac, 0x0800, req))
		if _, got := received(); !bytes.Equal(got, eth(guestMAC, remac, 0x0800, req)) {
			t.Errorf("TAP received\n%x\nwant\n%x", head(got), head(eth(guestMAC, remac, 0x0800, req)))
		}
		reply := readMatching(t, tapFd, func(f []byte) bool {
			return len(f) >= 14+20+8 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && f[14+9] == 1 && f[14+20] == 0
		})
		if len(reply) != 14+len(req) {
			t.Fatalf("echo reply of %d bytes, want %d", len(reply), 14+len(req))
		}
		if !bytes.Equal(reply[:14], eth(remac, guestMAC, 0x0800, nil)) {
			t.Errorf("reply Ethernet header %x, want to the REMAC from the guest", reply[:14])
		}
		ip, icmp := reply[14:34], reply[34:]
		if !bytes.Equal(ip[12:20], []byte{10, 0, 0, 2, 10, 0, 0, 1}) || ip[9] != 1 {
			t.Errorf("reply IP header %x, want ICMP from 10.0.0.2 to 10.0.0.1", ip)
		}
		if icmp[0] != 0 || !bytes.Equal(icmp[4:], req[24:]) {
			t.Errorf("reply ICMP %x, want an echo reply with the request's id, sequence and data", head(icmp))
		}
	})

	t.Run("icmpv6 echo answered through the tap", func(t *testing.T) {
		req := echo6(0x4343, 1)
		send(vnetHdr{}, wired(child.HardwareAddr, remac, 0x86dd, req))
		if _, got := received(); !bytes.Equal(got, eth(guestMAC, remac, 0x86dd, req)) {
			t.Errorf("TAP received\n%x\nwant\n%x", head(got), head(eth(guestMAC, remac, 0x86dd, req)))
		}
		reply := readMatching(t, tapFd, func(f []byte) bool {
			return len(f) >= 14+40+8 && binary.BigEndian.Uint16(f[12:]) == 0x86dd && f[14+6] == 58 && f[14+40] == 129
		})
		if len(reply) != 14+len(req) {
			t.Fatalf("echo reply of %d bytes, want %d", len(reply), 14+len(req))
		}
		if !bytes.Equal(reply[:14], eth(remac, guestMAC, 0x86dd, nil)) {
			t.Errorf("reply Ethernet header %x, want to the REMAC from the guest", reply[:14])
		}
		if ip := reply[14:54]; !bytes.Equal(ip[8:24], req[24:40]) || !bytes.Equal(ip[24:40], req[8:24]) {
			t.Errorf("reply IPv6 header %x, want from fd00::2 to fd00::1", ip)
		}
		if icmp := reply[54:]; !bytes.Equal(icmp[4:], req[44:]) {
			t.Errorf("reply ICMPv6 %x, want the request's id, sequence and data", head(icmp))
		}
	})

	t.Run("tso super-frame kept whole", func(t *testing.T) {
		// To 10.0.0.9, which nothing in the namespace answers.
		l3 := withDst(ipv4(0x4000, 6, tcp(2900)), netip.MustParseAddr("10.0.0.9"))
		h := vnetHdr{Flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, GSOType: unix.VIRTIO_NET_HDR_GSO_TCPV4,
			HdrLen: 24 + 52, GSOSize: 1400, CsumStart: 24 + 20, CsumOffset: 16}
		send(h, wired(child.HardwareAddr, remac, 0x0800, l3))
		gh, got := received()
		if gh.GSOType != unix.VIRTIO_NET_HDR_GSO_TCPV4 || gh.GSOSize != 1400 || gh.CsumStart != 14+20 || gh.CsumOffset != 16 {
			t.Errorf("vnet header %+v, want TCPV4, gso_size 1400, csum_start 34, csum_offset 16", gh)
		}
		if want := eth(guestMAC, remac, 0x0800, l3); !bytes.Equal(got, want) {
			t.Errorf("TAP received %d bytes, want %d:\n%x\nwant\n%x", len(got), len(want), head(got), head(want))
		}
	})

	got, err := rx.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if want := [NumRXReasons]uint64{RXRedirected: 3}; got != want {
		t.Errorf("counts %v, want %v", got, want)
	}
}

// htons is a 16-bit value in network order, as sockaddr_ll and the
// packet socket protocol take it.
func htons(v uint16) uint16 {
	return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v))
}
