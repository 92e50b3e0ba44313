package emukernel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// fakeSock is the real socket under a Socket: Send records each
// datagram as the kernel would take it (Hdr, then Buf); Recv hands out
// rx, each as a SOCK_RAW socket on a veth receives it.
type fakeSock struct {
	sent [][]byte
	rx   []fakeDatagram
}

type fakeDatagram struct {
	name, data []byte
}

func (f *fakeSock) Send(msgs []kf.Msg) (int, error) {
	for i := range msgs {
		m := &msgs[i]
		f.sent = append(f.sent, append(append([]byte{}, m.Hdr...), m.Buf...))
		m.N = len(m.Hdr) + len(m.Buf)
	}
	return len(msgs), nil
}

func (f *fakeSock) Recv(msgs []kf.Msg) (int, error) {
	n := 0
	for ; n < len(msgs) && len(f.rx) > 0; n++ {
		d, m := f.rx[0], &msgs[n]
		f.rx = f.rx[1:]
		k := copy(m.Hdr, d.data)
		k += copy(m.Buf, d.data[k:])
		m.N = k
		m.NameLen = copy(m.Name, d.name)
	}
	return n, nil
}

func (f *fakeSock) AddMembership([]byte) error  { return errors.New("not on a veth") }
func (f *fakeSock) DropMembership([]byte) error { return errors.New("not on a veth") }
func (f *fakeSock) Drops() (uint64, error)      { return 0, nil }
func (f *fakeSock) Close() error                { return nil }

var (
	testGID = testutil.GID("fe80::ee:1")
	peer    = ipoib.MakeHwAddr(0, 0x100007, testutil.GID("fe80::ee:2"))
)

// TestSocketSend: each datagram leaves with ipoib_hard_header's link
// header (the destination from the name, the EtherType, 2 zero bytes)
// in front, N counting the datagram alone; a name without 20 address
// bytes is EINVAL, as packet_snd answers on IPoIB.
func TestSocketSend(t *testing.T) {
	f := &fakeSock{}
	s := &Socket{in: f, joined: map[membership]bool{}}
	var name [kf.SockaddrLLIPoIBLen]byte
	nl := kf.PutSockaddrLL(&name, 7, 0x0800, peer)
	msgs := []kf.Msg{{Name: name[:], NameLen: nl, Buf: []byte{0x45, 1, 2, 3}}}
	if n, err := s.Send(msgs); n != 1 || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	want := append(append(peer[:], 0x08, 0x00, 0, 0), 0x45, 1, 2, 3)
	if len(f.sent) != 1 || !bytes.Equal(f.sent[0], want) || msgs[0].N != 4 || msgs[0].Hdr != nil {
		t.Fatalf("sent %x (N %d, Hdr %x), want %x (N 4, no Hdr)", f.sent, msgs[0].N, msgs[0].Hdr, want)
	}
	msgs[0].NameLen = kf.SockaddrLLSize // 8 address bytes: enough for Ethernet, not IPoIB
	if n, err := s.Send(msgs); n != 0 || !errors.Is(err, unix.EINVAL) || len(f.sent) != 1 {
		t.Fatalf("Send with a 20-byte name: %d, %v, %d sent; want 0, EINVAL, none", n, err, len(f.sent)-1)
	}
}

// TestSocketRecv: the 24 bytes in front of L3 are taken off, and the
// name says what packet_rcv says on IPoIB: ARPHRD_INFINIBAND, no source
// address; the packet type stays the kernel's.
func TestSocketRecv(t *testing.T) {
	name := make([]byte, kf.SockaddrLLSize)
	binary.NativeEndian.PutUint16(name[0:2], unix.AF_PACKET)
	binary.BigEndian.PutUint16(name[2:4], 0x0806)
	binary.NativeEndian.PutUint16(name[8:10], unix.ARPHRD_ETHER)
	name[10], name[11] = kf.PacketMulticast, 6
	copy(name[12:], []byte{2, 0, 0, 0, 0, 9})
	// The wire's layout: Ethernet header, then the 10 bytes after it.
	frame := append(bytes.Repeat([]byte{0xaa}, kf.IPoIBHardLen), 0, 1, 8, 0)
	f := &fakeSock{rx: []fakeDatagram{{name, frame}}}
	s := &Socket{in: f, joined: map[membership]bool{}}
	var rname [kf.SockaddrLLIPoIBLen]byte
	msgs := []kf.Msg{{Name: rname[:], Buf: make([]byte, 100)}}
	if n, err := s.Recv(msgs); n != 1 || err != nil {
		t.Fatalf("Recv: %d, %v", n, err)
	}
	m := msgs[0]
	sa, err := kf.ParseSockaddrLL(m.Name, m.NameLen)
	if err != nil || !bytes.Equal(m.Buf[:m.N], []byte{0, 1, 8, 0}) || m.Hdr != nil ||
		sa.Hatype != kf.ARPHRDInfiniBand || sa.Halen != 0 || sa.Pkttype != kf.PacketMulticast || sa.Protocol != 0x0806 ||
		!bytes.Equal(m.Name[12:kf.SockaddrLLSize], make([]byte, 8)) {
		t.Fatalf("received %x (Hdr %x), name %+v %x (%v); want 00010800, ARPHRD_INFINIBAND, no address, PACKET_MULTICAST, ARP",
			m.Buf[:m.N], m.Hdr, sa, m.Name, err)
	}
}

// newTestKernel is a Kernel with one child (ifindex 7, fabric end 17)
// and the multicast maps, for the membership tests (root: BPF maps).
func newTestKernel(t *testing.T) *Kernel {
	t.Helper()
	nstest.RequireRoot(t)
	mc, err := emuib.LoadMulticast()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	return &Kernel{gid: testGID, fab: &emuib.Fabric{Programs: &emuib.Programs{}, Multicast: mc},
		children: map[int]*emuChild{7: {fabricEnd: 17}}, members: map[ipoib.GID]map[int]int{}}
}

// members reads host 0's members of mgid from the wire's map.
func members(t *testing.T, k *Kernel, mgid ipoib.GID) emuib.Members {
	t.Helper()
	var v emuib.Members
	if err := k.fab.Groups.Lookup(emuib.GroupKey{MGID: mgid}, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	return v
}

// TestSocketMembership: a socket's join makes the child's fabric end a
// member on the wire, once however often it joins; the end stays a
// member until the last socket that joined drops or closes; bad
// requests are refused as packet_setsockopt and packet_mc_add refuse
// them.
func TestSocketMembership(t *testing.T) {
	k := newTestKernel(t)
	mgid := ipoib.BroadcastMGID(ipoib.DefaultPKey, ipoib.ScopeLinkLocal)
	var mreq [kf.MreqMaxSize]byte
	kf.PutMreq(&mreq, 7, mgid)
	a := &Socket{k: k, in: &fakeSock{}, joined: map[membership]bool{}}
	b := &Socket{k: k, in: &fakeSock{}, joined: map[membership]bool{}}
	for _, s := range []*Socket{a, a, b} {
		if err := s.AddMembership(mreq[:]); err != nil {
			t.Fatal(err)
		}
	}
	if v := members(t, k, mgid); v != (emuib.Members{17}) || k.members[mgid][17] != 2 {
		t.Fatalf("after 3 joins of 2 sockets: members %v, count %d; want [17], 2", v, k.members[mgid][17])
	}
	if err := a.DropMembership(mreq[:]); err != nil {
		t.Fatal(err)
	}
	if v := members(t, k, mgid); v != (emuib.Members{17}) {
		t.Fatalf("after one socket's drop: members %v, want [17]", v)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if v := members(t, k, mgid); v != (emuib.Members{}) || len(k.members) != 0 {
		t.Fatalf("after the last socket closed: members %v (%v), want none", v, k.members)
	}
	if err := a.DropMembership(mreq[:]); err != nil {
		t.Errorf("a drop of what was never joined: %v, want success", err)
	}

	short, alen6, other := mreq, mreq, mreq
	binary.NativeEndian.PutUint16(alen6[6:8], 6)
	binary.NativeEndian.PutUint32(other[0:4], 8)
	for _, c := range []struct {
		name string
		mreq []byte
		want error
	}{{"short", short[:kf.MreqSize-1], unix.EINVAL}, {"alen 6", alen6[:], unix.EINVAL}, {"no child", other[:], unix.ENODEV}} {
		if err := a.AddMembership(c.mreq); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzParseMreq: any option bytes give a membership of the known child
// with the address's GID, or an error; never a panic.
func FuzzParseMreq(f *testing.F) {
	var mreq [kf.MreqMaxSize]byte
	kf.PutMreq(&mreq, 7, ipoib.BroadcastMGID(ipoib.DefaultPKey, ipoib.ScopeLinkLocal))
	f.Add(mreq[:])
	f.Add(mreq[:kf.MreqSize])
	f.Add(mreq[:8+ipoib.HwAddrLen-1])
	f.Add([]byte{})
	s := &Socket{k: &Kernel{children: map[int]*emuChild{7: {fabricEnd: 17}}}}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, end, err := s.parseMreq(b)
		if err != nil {
			return
		}
		if m.child != 7 || end != 17 || m.mgid != ipoib.HwAddr(b[8:28]).GID() {
			t.Fatalf("%x: %+v, end %d", b, m, end)
		}
	})
}
