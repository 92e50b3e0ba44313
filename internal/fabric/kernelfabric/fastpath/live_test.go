package fastpath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// tunSetLink is TUNSETLINK, _IOW('T', 205, int) (include/uapi/linux/if_tun.h),
// which x/sys/unix does not define. tun_chr_ioctl accepts it only while the
// device is down.
const tunSetLink = 0x400454cd

// arphrdInfiniband is ARPHRD_INFINIBAND (include/uapi/linux/if_arp.h).
const arphrdInfiniband = 32

// openTun creates a TUN/TAP device in the calling thread's namespace
// (tun_chr_open takes current's) and returns its fd.
func openTun(t *testing.T, name string, flags uint16) int {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(flags | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		t.Fatalf("TUNSETIFF %s: %v", name, err)
	}
	// No IPv6 on the test links: nothing but the test's frames crosses them.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return fd
}

// readFrame waits up to 10 s for one frame on fd (the TUN or the TAP)
// and returns it.
func readFrame(t *testing.T, fd int) []byte {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 10_000); err != nil || n != 1 {
		t.Fatalf("no frame within 10 s (poll %d, %v)", n, err)
	}
	buf := make([]byte, 65536)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// virtio_net_hdr (include/uapi/linux/virtio_net.h), 10 bytes, native
// endian as the TUN and packet sockets use it without VERSION_1.
type vnetHdr struct {
	Flags, GSOType                         uint8
	HdrLen, GSOSize, CsumStart, CsumOffset uint16
}

func (h vnetHdr) bytes() []byte {
	b := []byte{h.Flags, h.GSOType, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.NativeEndian.PutUint16(b[2:], h.HdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.GSOSize)
	binary.NativeEndian.PutUint16(b[6:], h.CsumStart)
	binary.NativeEndian.PutUint16(b[8:], h.CsumOffset)
	return b
}

func parseVnetHdr(b []byte) vnetHdr {
	return vnetHdr{b[0], b[1], binary.NativeEndian.Uint16(b[2:]), binary.NativeEndian.Uint16(b[4:]),
		binary.NativeEndian.Uint16(b[6:]), binary.NativeEndian.Uint16(b[8:])}
}

// TestTXLive attaches the program (tcx egress) to a real TAP and sends
// frames out of the TAP with a packet socket (packet_snd ->
// dev_queue_xmit -> tcx_run). It reads them from a TUN switched to
// ARPHRD_INFINIBAND with TUNSETLINK, the program's redirect target. The
// 24-byte IPoIB link header reaches the device whole (__bpf_redirect
// takes ARPHRD_INFINIBAND as a MAC-header device). A TSO super-frame
// arrives as one skb, its gso_size kept and its csum_start moved by the
// 10 bytes bpf_skb_change_head pushed. It runs with each hook: the
// program is attached with tcx, then as a clsact filter.
func TestTXLive(t *testing.T) {
	for _, h := range hooks(t) {
		t.Run(h.String(), func(t *testing.T) { testTXLive(t, h) })
	}
}

func testTXLive(t *testing.T, hook Hook) {
	tx := loadTX(t)
	ns := fmt.Sprintf("fptx%s%d", hook, os.Getpid())
	nstest.Add(t, ns)

	var tapFd, tunFd, sock int
	var tapIdx int
	nstest.Do(t, ns, func() {
		tapFd = openTun(t, "fptap", unix.IFF_TAP)
		tunFd = openTun(t, "fptun", unix.IFF_TUN|unix.IFF_VNET_HDR)
		if err := unix.IoctlSetInt(tunFd, tunSetLink, arphrdInfiniband); err != nil {
			t.Fatalf("TUNSETLINK: %v", err)
		}
		// TSO4 with checksum offload: validate_xmit_skb leaves a TCP
		// super-frame whole for tun_net_xmit.
		if err := unix.IoctlSetInt(tunFd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4); err != nil {
			t.Fatalf("TUNSETOFFLOAD: %v", err)
		}
	})
	nstest.Must(t, nstest.In(ns, "ip", "link", "set", "fptap", "up")...)
	nstest.Must(t, nstest.In(ns, "ip", "link", "set", "fptun", "up")...)
	if out := nstest.Must(t, nstest.In(ns, "ip", "-o", "link", "show", "fptun")...); !bytes.Contains([]byte(out), []byte("link/infiniband")) {
		t.Fatalf("TUN is not ARPHRD_INFINIBAND: %s", out)
	}
	nstest.Do(t, ns, func() {
		tap, err := net.InterfaceByName("fptap")
		if err != nil {
			t.Fatal(err)
		}
		tun, err := net.InterfaceByName("fptun")
		if err != nil {
			t.Fatal(err)
		}
		tapIdx = tap.Index
		if err := tx.PutGuest(guestMAC, Guest{Ifindex: uint32(tun.Index), MTU: childMTU}); err != nil {
			t.Fatal(err)
		}
		at, err := attachHook(hook, tap.Index, false, tx.Program)
		if err != nil {
			t.Fatalf("attach at egress: %v", err)
		}
		t.Cleanup(func() { at.detach() })
		sock, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(sock) })
		if err := unix.SetsockoptInt(sock, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			t.Fatal(err)
		}
	})
	// send sends frame out of the TAP with skb->protocol proto.
	send := func(h vnetHdr, proto uint16, frame []byte) {
		t.Helper()
		// sll_protocol is in network order; x/sys/unix copies it as is.
		to := &unix.SockaddrLinklayer{Ifindex: tapIdx, Protocol: binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, proto))}
		if err := unix.Sendto(sock, append(h.bytes(), frame...), 0, to); err != nil {
			t.Fatalf("send on the TAP: %v", err)
		}
	}

	t.Run("ipv6 tcp", func(t *testing.T) {
		l3 := ipv6(6, tcp(100))
		send(vnetHdr{}, 0x86dd, eth(remac, guestMAC, 0x86dd, l3))
		got := readFrame(t, tunFd)
		if want := append(vnetHdr{}.bytes(), ipoibFrame(0x86dd, l3)...); !bytes.Equal(got, want) {
			t.Errorf("TUN read\n%x\nwant\n%x", head(got), head(want))
		}
	})

	t.Run("tso super-frame", func(t *testing.T) {
		// 20 + 32 + 2900 bytes of TCP, segments of 1400: the guest's
		// view of a TSO send. Checksum start is the TCP header, 14 + 20
		// into the Ethernet frame, 24 + 20 into the IPoIB one.
		l3 := ipv4(0x4000, 6, tcp(2900))
		in := vnetHdr{Flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, GSOType: unix.VIRTIO_NET_HDR_GSO_TCPV4,
			HdrLen: 14 + 52, GSOSize: 1400, CsumStart: 14 + 20, CsumOffset: 16}
		send(in, 0x0800, eth(remac, guestMAC, 0x0800, l3))
		got := readFrame(t, tunFd)
		if len(got) < 10 {
			t.Fatalf("TUN read %d bytes", len(got))
		}
		h := parseVnetHdr(got)
		if h.GSOType != unix.VIRTIO_NET_HDR_GSO_TCPV4 || h.GSOSize != 1400 || h.CsumStart != 24+20 ||
			h.CsumOffset != 16 || h.Flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 {
			t.Errorf("vnet header %+v, want TCPV4, gso_size 1400, csum_start 44, csum_offset 16, NEEDS_CSUM", h)
		}
		if want := ipoibFrame(0x0800, l3); !bytes.Equal(got[10:], want) {
			t.Errorf("TUN read %d bytes after the vnet header, want %d:\n%x\nwant\n%x", len(got)-10, len(want), head(got[10:]), head(want))
		}
	})

	t.Run("tso super-frame segmented for a child without offloads", func(t *testing.T) {
		// A child whose HCA has no LSO: validate_xmit_skb segments the
		// redirected skb in software (skb_mac_gso_segment, mac_len 24),
		// and every segment must carry the 24-byte link header.
		if err := unix.IoctlSetInt(tunFd, unix.TUNSETOFFLOAD, 0); err != nil {
			t.Fatalf("TUNSETOFFLOAD 0: %v", err)
		}
		l3 := ipv4(0x4000, 6, tcp(2900))
		in := vnetHdr{Flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, GSOType: unix.VIRTIO_NET_HDR_GSO_TCPV4,
			HdrLen: 14 + 52, GSOSize: 1400, CsumStart: 14 + 20, CsumOffset: 16}
		send(in, 0x0800, eth(remac, guestMAC, 0x0800, l3))
		payload := l3[52:]
		for i, n := range []int{1400, 1400, 100} {
			got := readFrame(t, tunFd)
			if h := parseVnetHdr(got); h.GSOType != 0 {
				t.Errorf("segment %d: vnet header %+v, want no GSO", i, h)
			}
			seg := got[10:]
			if len(seg) != 24+52+n {
				t.Fatalf("segment %d: %d bytes, want %d", i, len(seg), 24+52+n)
			}
			if want := ipoibFrame(0x0800, nil); !bytes.Equal(seg[:24], want) {
				t.Errorf("segment %d: link header %x, want %x", i, seg[:24], want)
			}
			ip, tcpHdr := seg[24:44], seg[44:76]
			if got := binary.BigEndian.Uint16(ip[2:]); got != uint16(52+n) {
				t.Errorf("segment %d: IP total length %d, want %d", i, got, 52+n)
			}
			if got := binary.BigEndian.Uint32(tcpHdr[4:]); got != uint32(1400*i) {
				t.Errorf("segment %d: TCP sequence %d, want %d", i, got, 1400*i)
			}
			if !bytes.Equal(seg[76:], payload[1400*i:1400*i+n]) {
				t.Errorf("segment %d: payload differs", i)
			}
		}
	})

	// Fallbacks stay on the TAP, untouched, for the daemon to read.
	t.Run("unknown remac stays on the tap", func(t *testing.T) {
		frame := eth(strayMAC, guestMAC, 0x0800, ipv4(0x4000, 6, tcp(100)))
		send(vnetHdr{}, 0x0800, frame)
		if got := readFrame(t, tapFd); !bytes.Equal(got, frame) {
			t.Errorf("TAP read\n%x\nwant\n%x", head(got), head(frame))
		}
	})
	t.Run("skb protocol not the ethertype stays on the tap", func(t *testing.T) {
		frame := eth(remac, guestMAC, 0x0800, ipv4(0x4000, 6, tcp(100)))
		send(vnetHdr{}, 0x86dd, frame)
		if got := readFrame(t, tapFd); !bytes.Equal(got, frame) {
			t.Errorf("TAP read\n%x\nwant\n%x", head(got), head(frame))
		}
	})

	t.Run("udp tunnel super-frame stays on the tap", func(t *testing.T) {
		// A VXLAN device over the TAP, whose own MAC is the guest's:
		// a UDP_SEGMENT send of 2 x 2000 bytes through it leaves the
		// TAP as one SKB_GSO_UDP_TUNNEL | SKB_GSO_UDP_L4 skb with
		// gso_size 2000. Outer IPv4 + UDP + gso_size is 2028, within
		// the child's 2044, but every segment carries 50 more bytes of
		// VXLAN and inner Ethernet, IPv4 and UDP headers: 2078 bytes of
		// L3, which ipoib_send would drop. The frame must stay on the
		// TAP, where the kernel segments it for the TAP's reader.
		in := func(args ...string) { t.Helper(); nstest.Must(t, nstest.In(ns, args...)...) }
		in("ip", "link", "set", "fptap", "address", guestMAC.String(), "mtu", "9000")
		in("ip", "addr", "add", "192.168.77.1/24", "dev", "fptap")
		in("ip", "neigh", "add", "192.168.77.2", "lladdr", remac.String(), "dev", "fptap", "nud", "permanent")
		in("ip", "link", "add", "fpvx", "mtu", "4000", "type", "vxlan", "id", "42", "dstport", "4789",
			"local", "192.168.77.1", "remote", "192.168.77.2", "dev", "fptap")
		in("sysctl", "-qw", "net.ipv6.conf.fpvx.disable_ipv6=1")
		in("ip", "addr", "add", "10.77.0.1/24", "dev", "fpvx")
		in("ip", "neigh", "add", "10.77.0.2", "lladdr", "02:00:00:00:77:02", "dev", "fpvx", "nud", "permanent")
		in("ip", "link", "set", "fpvx", "up")
		nstest.Do(t, ns, func() {
			s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(s)
			if err := unix.SetsockoptInt(s, unix.SOL_UDP, unix.UDP_SEGMENT, 2000); err != nil {
				t.Fatalf("UDP_SEGMENT: %v", err)
			}
			to := &unix.SockaddrInet4{Port: 5000, Addr: [4]byte{10, 77, 0, 2}}
			if err := unix.Sendto(s, make([]byte, 4000), 0, to); err != nil {
				t.Fatalf("send through the VXLAN device: %v", err)
			}
		})
		for i := range 2 {
			got := readFrame(t, tapFd)
			if len(got) != 14+20+8+8+14+20+8+2000 {
				t.Fatalf("segment %d: %d bytes on the TAP, want %d", i, len(got), 14+20+8+8+14+20+8+2000)
			}
			if !bytes.Equal(got[:14], eth(remac, guestMAC, 0x0800, nil)) || got[14+9] != 17 || binary.BigEndian.Uint16(got[14+22:]) != 4789 {
				t.Errorf("segment %d: %x, want VXLAN from the guest to the REMAC", i, head(got))
			}
		}
	})

	got, err := tx.Counts()
	if err != nil {
		t.Fatal(err)
	}
	want := [NumReasons]uint64{Redirected: 3, FallbackUnknownREMAC: 1, FallbackMalformed: 1, FallbackTooBig: 1}
	if got != want {
		t.Errorf("counts %v, want %v", got, want)
	}
}
