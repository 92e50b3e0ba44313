package kernelfabric_test

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
	kf "github.com/eipoib/eipoibd/ipoib/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib/kernelfabric/fakekernel"
)

func gid(s string) ipoib.GID { return ipoib.GID(netip.MustParseAddr(s).As16()) }

func open(t *testing.T, k *fakekernel.Kernel) *kf.Port {
	t.Helper()
	p, err := kf.New(kf.Config{Kernel: k, Parent: "ib0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestFakeRefusesShortName: a 20-byte address in a name of
// sizeof(struct sockaddr_ll) is refused with EINVAL, as packet_snd does.
func TestFakeRefusesShortName(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(gid("fe80::a"), "ib0", 2044)
	s, err := k.OpenPacket(1, false)
	if err != nil {
		t.Fatal(err)
	}
	var b [kf.SockaddrLLIPoIBLen]byte
	kf.PutSockaddrLL(&b, 1, 0x0800, ipoib.MakeHwAddr(0, 0x100, gid("fe80::b")))
	if _, err := s.Send([]kf.Msg{{Name: b[:], NameLen: kf.SockaddrLLSize, Buf: []byte{0x45}}}); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("got %v, want EINVAL", err)
	}
	if n, err := s.Send([]kf.Msg{{Name: b[:], NameLen: kf.SockaddrLLIPoIBLen, Buf: []byte{0x45}}}); n != 1 || err != nil {
		t.Fatalf("full name: %d %v", n, err)
	}
}

// TestChildLifecycle: leftovers are reclaimed; children share a P_Key,
// get the host-off settings before coming up, and go with FreeQP and
// Close; the parent's carrier is followed.
func TestChildLifecycle(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(gid("fe80::a"), "ib0", 2044)
	if err := k.AddChild(kf.ChildSpec{Name: "ib0.e7", Parent: 1, PKey: 0xffff}); err != nil {
		t.Fatal(err)
	}
	p := open(t, k)
	if _, ok := k.Link("ib0.e7"); ok || p.Counters().Stats[kf.StatReclaimed] != 1 {
		t.Fatal("leftover child not reclaimed")
	}
	q1, err1 := p.AllocQP(0x8001, 0)
	q2, err2 := p.AllocQP(0x8001, 0)
	if err1 != nil || err2 != nil || q1 == q2 {
		t.Fatalf("two children of P_Key 0x8001: %#x %v, %#x %v", q1, err1, q2, err2)
	}
	for _, name := range []string{"ib0.e1", "ib0.e2", "ib0.m8001", "ib0.mffff"} {
		st, ok := k.Link(name)
		if !ok || !st.Up || !st.NoARP || st.GRO {
			t.Fatalf("%s: %+v %v", name, st, ok)
		}
		for path, v := range map[string]string{"ipv6/conf/%s/disable_ipv6": "1", "ipv6/conf/%s/addr_gen_mode": "1", "ipv4/conf/%s/arp_ignore": "8", "ipv4/conf/%s/forwarding": "0", "ipv4/conf/%s/rp_filter": "1"} {
			if got := k.Sysctl("net/" + strings.Replace(path, "%s", name, 1)); got != v {
				t.Errorf("%s %s = %q", name, path, got)
			}
		}
	}
	if st, _ := k.Link("ib0.e2"); st.PKey != 0x8001 {
		t.Fatalf("P_Key %s", st.PKey)
	}
	if err := p.FreeQP(q1); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Link("ib0.e1"); ok {
		t.Fatal("freed child still there")
	}
	k.SetCarrier(false)
	waitFor(t, func() bool { return p.IsDown() })
	k.SetCarrier(true)
	waitFor(t, func() bool { return !p.IsDown() })
	p.Close()
	if links, _ := k.Links(); len(links) != 1 {
		t.Fatalf("links after Close: %v", links)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConnectedModeRefused: the one-line message names the sysfs switch.
func TestConnectedModeRefused(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(gid("fe80::a"), "ib0", 2044)
	k.ModeOf = "connected"
	_, err := kf.New(kf.Config{Kernel: k, Parent: "ib0"})
	if err == nil || !strings.Contains(err.Error(), "/sys/class/net/ib0/mode") {
		t.Fatalf("got %v", err)
	}
}

// TestBroadcastOnce: a broadcast reaches every child of the receiving
// host, and Read returns it once, from the group child, with no source.
func TestBroadcastOnce(t *testing.T) {
	f := fakekernel.NewFabric()
	a, b := open(t, f.NewHost(gid("fe80::a"), "ib0", 2044)), open(t, f.NewHost(gid("fe80::b"), "ib0", 2044))
	bc := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	if err := b.Join(bc); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := b.AllocQP(0xffff, 0); err != nil {
			t.Fatal(err)
		}
	}
	qa, _ := a.AllocQP(0xffff, 0)
	buf := append(make([]byte, ipoib.Headroom), 0x08, 0x06, 0, 0, 1, 2, 3)
	if n, _ := a.Write([][]byte{buf}, []ipoib.TxMeta{{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, bc), SrcQPN: qa, PKey: 0xffff}}, ipoib.Headroom); n != 1 {
		t.Fatalf("sent %d (%v)", n, a.Counters().Drops)
	}
	bufs, sizes, meta := [][]byte{make([]byte, 4200), make([]byte, 4200)}, make([]int, 2), make([]ipoib.RxMeta, 2)
	n, err := b.Read(bufs, sizes, meta, 64)
	if err != nil || n != 1 || sizes[0] != 7 || !meta[0].SrcUnknown || meta[0].MGID != bc || meta[0].DstQPN != ipoib.MulticastQPN {
		t.Fatalf("read %d %v %v %+v", n, err, sizes, meta[0])
	}
	waitFor(t, func() bool { return b.Counters().Stats[kf.StatMcastCopies] == 3 })
}

// TestSuperPacketHandedWhole: with TSO on the children, a super-packet
// goes to the kernel with its virtio_net_hdr.
func TestSuperPacketHandedWhole(t *testing.T) {
	f := fakekernel.NewFabric()
	k := f.NewHost(gid("fe80::a"), "ib0", 2044)
	k.TSOOn = true
	a := open(t, k)
	if o := a.Offloads(); !o.TSO {
		t.Fatal("no TSO")
	}
	q, _ := a.AllocQP(0xffff, 0)
	pkt := make([]byte, ipoib.Headroom+4+20+20+3000)
	pkt[ipoib.Headroom], pkt[ipoib.Headroom+4] = 0x08, 0x45
	pkt[ipoib.Headroom+4+20+12] = 5 << 4
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, 0x200, gid("fe80::b")), SrcQPN: q, PKey: 0xffff, GSO: ipoib.GSO{Type: ipoib.GSOTCPv4, L4: 24, Size: 1400}}
	if n, _ := a.Write([][]byte{pkt}, []ipoib.TxMeta{m}, ipoib.Headroom); n != 1 {
		t.Fatalf("drops %v", a.Counters().Drops)
	}
	sp := k.SuperPackets()
	if len(sp) != 1 || sp[0].Hdr != kf.GSOVnetHdr(m.GSO, 20) || sp[0].Len != 3040 {
		t.Fatalf("%+v", sp)
	}
}
