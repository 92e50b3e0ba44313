package netns

import (
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/udprate"
)

// kernelTakesUSO reports whether the kernel's TUN driver takes the UDP
// offloads (Linux 6.2 and later). It asks a TAP of its own in namespace
// ns, apart from the daemon's code. drivers/net/tun.c set_offload takes
// TUN_F_USO4|TUN_F_USO6 along with TUN_F_CSUM, and refuses any flag it
// does not know with EINVAL ("a way to test for new features").
func kernelTakesUSO(t *testing.T, ns string) bool {
	t.Helper()
	var takes bool
	var err error
	nsDo(t, ns, func() {
		var fd int
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		defer unix.Close(fd)
		var ifr *unix.Ifreq
		if ifr, err = unix.NewIfreq("usoprobe"); err != nil {
			return
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return
		}
		switch e := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_USO4|unix.TUN_F_USO6); e {
		case nil:
			takes = true
		case unix.EINVAL:
		default:
			err = e
		}
	})
	if err != nil {
		t.Fatalf("probing the TUN driver for USO: %v", err)
	}
	return takes
}

// udpGSO sends count datagrams of size bytes from guest src to guest dst
// (IPv4 or IPv6) in UDP_SEGMENT buffers of up to gso datagrams. It uses
// internal/udprate with two flows, paced at rate per second (0 for as
// fast as it can). It returns what dst's receiver counted.
func udpGSO(t *testing.T, src, dst *guest, v6 bool, count uint64, size, gso int, rate float64) udprate.RecvResult {
	t.Helper()
	to := dst.ip4
	if v6 {
		to = dst.ip6
	}
	ap := netip.AddrPortFrom(netip.MustParseAddr(to), 5301)
	var rcv *udprate.Receiver
	var err error
	nsDo(t, dst.ns, func() {
		rcv, err = udprate.Listen(udprate.RecvConfig{Listen: ap, Duration: 60 * time.Second, Idle: 3 * time.Second, Batch: 64, SockBuf: 8 << 20})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	type recv struct {
		r   udprate.RecvResult
		err error
	}
	done := make(chan recv, 1)
	go func() {
		r, err := rcv.Run()
		done <- recv{r, err}
	}()
	var sent udprate.SendResult
	nsDo(t, src.ns, func() {
		sent, err = udprate.Send(udprate.SendConfig{To: ap, Rate: rate, Size: size, Flows: 2, Count: count, Batch: 64, GSO: gso, SockBuf: 4 << 20})
	})
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if sent.Sent != count {
		t.Fatalf("udprate sent %d datagrams, want %d", sent.Sent, count)
	}
	return r.r
}

// TestUDPOffloads: the TAP's offloads are on and off (the suite's
// EIPOIB_NETNS_OFFLOAD, else the default: on). Guest g1 sends UDP in
// UDP_SEGMENT buffers across two hypervisors: 64-byte datagrams 32 to a
// buffer, 1,000-byte ones 16 to a buffer, IPv4 and IPv6. g2 receives
// every datagram, once, with exactly the bytes sent. Neither guest's
// kernel counts a UDP checksum error (nstat UdpInCsumErrors,
// Udp6InCsumErrors), so a datagram cut or merged with a wrong checksum
// cannot hide. No drop counter rises.
//
// The daemons' tap_uso is 1 where offloads are on and the kernel takes
// USO (Linux 6.2 and later: the test asks the TUN driver itself), else
// 0. With USO on, the super-frame paths really ran. The TAP handed UDP
// super-frames over (tap_uso_frames_read). They crossed the shim whole
// to the port, which takes them (tx_super, no tx_super_cut, no datagram
// cut by the TAP). g2's TAP was written merged ones
// (tap_uso_frames_written). With offloads off none of that moved.
func TestUDPOffloads(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g1, g2 := h1.guests[0], h2.guests[0]
	// A UDP sender has no retransmission to make up for a daemon held
	// off a busy machine's CPU: the TAPs' queues (tun's ring, 500 by
	// default) get room for a 100 ms stall at the rates below.
	for _, h := range tp.hvs {
		sh(t, in(h.ns, "ip", "link", "set", "eib0", "txqueuelen", "10000")...)
	}
	ping(t, g1, g2.ip4)
	ping(t, g1, g2.ip6)
	drops := watchDrops(t, h1, h2)
	csums := watchCsumErrors(t, g1, g2)
	for _, v6 := range []bool{false, true} {
		// Paced, so that every queue on the way keeps up on a busy
		// machine; udprate then fills a buffer with the 100 µs of its
		// rate, 2 datagrams at 20,000 per flow. And one burst of full
		// buffers: fewer datagrams than the TAP's queue holds, even if
		// none went whole.
		for _, c := range []struct {
			size, gso int
			count     uint64
			rate      float64
		}{{64, 32, 64000, 40000}, {1000, 16, 16000, 40000}, {64, 32, 448, 0}} {
			r := udpGSO(t, g1, g2, v6, c.count, c.size, c.gso, c.rate)
			if r.Sent != c.count || r.Received != c.count || r.Bytes != c.count*uint64(c.size) || r.Lost+r.Duplicates+r.Stale+r.Invalid != 0 {
				t.Errorf("v6 %v, %d-byte datagrams: received %d of %d (%d bytes, want %d); lost %d, duplicates %d, stale %d, invalid %d",
					v6, c.size, r.Received, c.count, r.Bytes, c.count*uint64(c.size), r.Lost, r.Duplicates, r.Stale, r.Invalid)
			}
		}
	}
	csums.check(t)
	drops.check(t)
	// Whether USO is on is decided here, not read from the daemon: the
	// suite's offload setting, and what the kernel takes.
	offload := true
	if v := os.Getenv("EIPOIB_NETNS_OFFLOAD"); v != "" {
		var err error
		if offload, err = strconv.ParseBool(v); err != nil {
			t.Fatalf("EIPOIB_NETNS_OFFLOAD=%q: %v", v, err)
		}
	}
	kernel := kernelTakesUSO(t, h1.ns)
	uso := offload && kernel
	want := 0.0
	if uso {
		want = 1
	}
	m1, m2 := h1.metrics(t), h2.metrics(t)
	if m1["tap_uso"] != want || m2["tap_uso"] != want {
		t.Fatalf("tap_uso %v on %s, %v on %s; want %v (offloads %v, the kernel takes USO: %v)", m1["tap_uso"], h1.name, m2["tap_uso"], h2.name, want, offload, kernel)
	}
	read, cut, written := m1["tap_uso_frames_read"], m1["tap_gso_segments_cut"], m2["tap_uso_frames_written"]
	switch {
	case uso && (read < 1 || m1["tx_super"] < read || m1["tx_super_cut"] != 0 || cut != 0 || written < 1 || m2["tap_uso_datagrams_merged"] < 2*written):
		t.Errorf("USO on, but %s read %v UDP super-frames (%v super-frames to the port, %v cut by the shim, %v segments by the TAP); %s wrote %v (of %v datagrams)",
			h1.name, read, m1["tx_super"], m1["tx_super_cut"], cut, h2.name, written, m2["tap_uso_datagrams_merged"])
	case !uso && read+written+m1["tx_super"]+m1["tx_super_cut"]+m2["tap_uso_datagrams_merged"] != 0:
		t.Errorf("USO off, but the UDP super-frame counters moved: read %v, written %v, to the port %v, cut %v", read, written, m1["tx_super"], m1["tx_super_cut"])
	}
	t.Logf("offloads %v, the kernel takes USO %v; %s: UDP super-frames read %v; %s: written %v", offload, kernel, h1.name, read, h2.name, written)
}
