package netns

import (
	"bytes"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// captureOn captures on iface in namespace ns with a capture filter
// (tcpdump: it has started listening when captureOn returns) and returns
// the capture file and a function that ends the capture. Immediate mode
// and -U write every packet as it comes: in buffered mode packets still
// in the kernel's ring when the capture ends are lost.
func captureOn(t *testing.T, ns, iface, filter string) (string, func()) {
	t.Helper()
	pcap := filepath.Join(t.TempDir(), iface+".pcap")
	return pcap, tcpdump(t, ns, nil, "--immediate-mode", "-U", "-Z", "root", "-i", iface, "-w", pcap, filter)
}

// TestFragmentReassembly: a guest behind a 9000-byte bridge sends a
// 6000-byte UDP datagram without DF, with IP options (record route, not
// copied; router alert, copied), to a guest on the other hypervisor. The
// shim fragments it to the IPoIB MTU. The receiving guest's kernel (a
// real receiver) reassembles it and delivers the payload byte for byte.
// The receiving hypervisor's TAP shows the fragments as the sending shim
// made them. Every fragment's header checksum is good, and the offsets
// tile the datagram exactly. The first fragment carries both options and
// the others only router alert (RFC 791 §3.2).
func TestFragmentReassembly(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	src, dst := h1.guests[0], h2.guests[0]
	for _, l := range []string{"vg1", "vg2", "br0"} {
		sh(t, in(h1.ns, "ip", "link", "set", l, "mtu", "9000")...)
	}
	sh(t, in(src.ns, "ip", "link", "set", "eth0", "mtu", "9000")...)
	// The receiving side is at the IPoIB MTU end to end, so its bridge
	// has no reason to refragment.
	for _, l := range []string{"vg1", "vg2"} {
		sh(t, in(h2.ns, "ip", "link", "set", l, "mtu", "4092")...)
	}
	sh(t, in(dst.ns, "ip", "link", "set", "eth0", "mtu", "4092")...)

	var conn *net.UDPConn
	nsDo(t, dst.ns, func() {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 7777})
		if err != nil {
			t.Fatal(err)
		}
	})
	defer conn.Close()
	// What the receiving shim writes into its TAP is exactly what the
	// sending shim put on the fabric.
	pcap, stop := captureOn(t, h2.ns, "eib0", "ip src "+src.ip4+" and ip dst "+dst.ip4+" and not icmp")

	payload := make([]byte, 6000)
	for i := range payload {
		payload[i] = byte(i*31 + i>>8)
	}
	// Record route (7, length 11, pointer 4, two slots), router alert
	// (0x94, length 4), one end-of-options byte: 16 bytes of options.
	opts := []byte{7, 11, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0x94, 4, 0, 0, 0}
	nsDo(t, src.ns, func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, string(opts)); err != nil {
			t.Fatalf("IP_OPTIONS: %v", err)
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT); err != nil {
			t.Fatal(err)
		}
		to := &unix.SockaddrInet4{Port: 7777, Addr: [4]byte(net.ParseIP(dst.ip4).To4())}
		if err := unix.Sendto(fd, payload, 0, to); err != nil {
			t.Fatalf("send: %v", err)
		}
	})
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 9000)
	n, _, err := conn.ReadFromUDP(got)
	if err != nil {
		t.Fatalf("datagram not received: %v\n%v", err, h1.metrics(t))
	}
	if !bytes.Equal(got[:n], payload) {
		t.Fatalf("reassembled datagram differs: %d bytes, want %d", n, len(payload))
	}
	stop()

	out := tshark(t, "-r", pcap, "-o", "ip.defragment:FALSE", "-o", "ip.check_checksum:TRUE", "-T", "fields", "-E", "separator=|",
		"-e", "ip.hdr_len", "-e", "ip.len", "-e", "ip.frag_offset", "-e", "ip.flags.mf", "-e", "ip.checksum.status", "-e", "ip.opt.type")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		t.Fatalf("%d fragments on the receiving TAP, want at least 2:\n%s", len(lines), out)
	}
	// The TAP may show them out of order (the shim writes one frame per
	// system call, from whichever CPU it runs on): check them by offset.
	type frag struct {
		hl, total, off int
		mf             bool
		status, opts   string
	}
	var frags []frag
	for _, l := range lines {
		f := strings.Split(l, "|")
		if len(f) != 6 {
			t.Fatalf("bad tshark line %q", l)
		}
		hl, _ := strconv.Atoi(f[0])
		total, _ := strconv.Atoi(f[1])
		off, _ := strconv.Atoi(f[2])
		frags = append(frags, frag{hl, total, off * 8, f[3] == "1" || f[3] == "True", f[4], f[5]}) // tshark shows 8-byte units
	}
	sort.Slice(frags, func(i, j int) bool { return frags[i].off < frags[j].off })
	next := 0 // the offset (bytes) the next fragment must start at
	for i, f := range frags {
		if f.status != "1" && f.status != "Good" {
			t.Errorf("fragment %d: header checksum status %q, want good", i, f.status)
		}
		if f.off != next {
			t.Errorf("fragment %d at offset %d, want %d", i, f.off, next)
		}
		next = f.off + f.total - f.hl
		if f.mf != (i < len(frags)-1) {
			t.Errorf("fragment %d: MF %v", i, f.mf)
		}
		if f.total > 4092 {
			t.Errorf("fragment %d of %d bytes exceeds the IPoIB MTU", i, f.total)
		}
		wantHL, wantOpts := 24, "148" // router alert only
		if i == 0 {
			wantHL, wantOpts = 36, "7,148,0"
		}
		if f.hl != wantHL || f.opts != wantOpts {
			t.Errorf("fragment %d: header %d bytes, options %q; want %d, %q", i, f.hl, f.opts, wantHL, wantOpts)
		}
	}
	if next != 8+len(payload) {
		t.Errorf("fragments carry %d bytes, want %d", next, 8+len(payload))
	}
}
