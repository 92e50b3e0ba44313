package tap

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestWriteSuper: a real TAP with offloads, MTU 1500, is written a run
// of 4 segments of 1000 bytes of one flow. A packet socket reads it as
// Open vSwitch's userspace datapath reads a port without
// userspace-tso-enable: no PACKET_VNET_HDR, a buffer of the MTU and an
// Ethernet header with a VLAN tag, MSG_TRUNC. Merging (the default), the
// reader gets one frame of 4 segments, truncated, and the TAP counts one
// frame written over the MTU. With SetWriteSuper(false) it gets the 4
// segments as they were, each whole, and the TAP counts none over the
// MTU and no super-frame.
func TestWriteSuper(t *testing.T) {
	nstest.Require(t)
	ns := fmt.Sprintf("tapw%d", os.Getpid())
	nstest.Add(t, ns)
	nstest.Do(t, ns, func() {
		const mtu = 1500
		tp, err := Create(Config{Name: "wtap0", MTU: mtu, Offload: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tp.Close()
		link, err := netlink.LinkByName("wtap0")
		if err != nil {
			t.Fatal(err)
		}
		// ETH_P_ALL, in network byte order, as a packet socket wants it.
		const all = unix.ETH_P_ALL<<8&0xff00 | unix.ETH_P_ALL>>8
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, all)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: all, Ifindex: link.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
			t.Fatal(err)
		}
		// recv returns the lengths of the frames of our flow the socket
		// reads until want of them came (other frames, such as the
		// kernel's own IPv6 on a new link, are skipped) and whether
		// each was truncated.
		buf := make([]byte, 18+mtu) // VLAN_ETH_HEADER_LEN + mtu
		recv := func(want int) (lens []int, trunc []bool) {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); len(lens) < want; {
				if time.Now().After(deadline) {
					t.Fatalf("read %d frames of the flow (%v), want %d", len(lens), lens, want)
				}
				n, _, flags, _, err := unix.Recvmsg(fd, buf, nil, unix.MSG_TRUNC)
				if err != nil {
					t.Fatalf("recvmsg after %v: %v", lens, err)
				}
				// The kernel takes the VLAN tag off before a packet
				// socket sees the frame (skb_vlan_untag in
				// __netif_receive_skb_core); Open vSwitch reads it
				// back from PACKET_AUXDATA.
				if n < 14+20 || buf[12] != 0x08 || buf[13] != 0 || buf[14+9] != unix.IPPROTO_TCP {
					continue
				}
				lens, trunc = append(lens, n), append(trunc, flags&unix.MSG_TRUNC != 0)
			}
			return lens, trunc
		}
		write := func() {
			t.Helper()
			segs := segments(t, false, 7, 4, 1000, 1000)
			if n, err := tp.Write(segs, Headroom); n != 4 || err != nil {
				t.Fatalf("wrote %d of 4 segments: %v", n, err)
			}
		}
		const seg = 14 + 20 + 32 + 1000 // Ethernet (the tag taken off), IPv4, TCP with timestamps, payload

		if !tp.WriteSuper() || tp.Counters()["gro"] != 1 {
			t.Fatalf("a TAP with offloads: WriteSuper %v, gro %d; want merging on", tp.WriteSuper(), tp.Counters()["gro"])
		}
		write()
		lens, trunc := recv(1)
		c := tp.Counters()
		if want := 14 + 20 + 32 + 4*1000; lens[0] != want || !trunc[0] || c["gro_frames_written"] != 1 || c["frames_over_mtu_written"] != 1 {
			t.Errorf("merging: the reader got a frame of %d bytes (truncated %v), want %d, truncated; gro_frames_written %d, frames_over_mtu_written %d, want 1 and 1",
				lens[0], trunc[0], want, c["gro_frames_written"], c["frames_over_mtu_written"])
		}

		tp.SetWriteSuper(false)
		if tp.WriteSuper() || tp.Counters()["gro"] != 0 {
			t.Fatalf("after SetWriteSuper(false): WriteSuper %v, gro %d", tp.WriteSuper(), tp.Counters()["gro"])
		}
		write()
		lens, trunc = recv(4)
		for i := range lens {
			if lens[i] != seg || trunc[i] {
				t.Errorf("not merging: frame %d of %d bytes (truncated %v), want %d whole", i, lens[i], trunc[i], seg)
			}
		}
		if c2 := tp.Counters(); c2["gro_frames_written"] != 1 || c2["frames_over_mtu_written"] != 1 {
			t.Errorf("not merging: gro_frames_written %d, frames_over_mtu_written %d; want both still 1", c2["gro_frames_written"], c2["frames_over_mtu_written"])
		}
	})
}
