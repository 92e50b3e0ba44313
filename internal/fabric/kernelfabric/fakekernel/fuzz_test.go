package fakekernel

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib"
)

// FuzzSend: any name, name length, header and data given to a packet
// socket's Send (with and without PACKET_VNET_HDR) are sent or refused
// with an errno, as packet_snd does, and never crash the fake.
func FuzzSend(f *testing.F) {
	var name [kf.SockaddrLLIPoIBLen]byte
	dst := ipoib.MakeHwAddr(0x80, 0x48, ipoib.GID(netip.MustParseAddr("fe80::b").As16()))
	n := kf.PutSockaddrLL(&name, 1, 0x0800, dst)
	var vh [kf.VnetHdrLen]byte
	kf.VnetHdr{Flags: kf.VnetNeedsCsum, GSOType: kf.VnetGSOTCPv4, HdrLen: 64, GSOSize: 1000, CsumStart: 44, CsumOffset: 16}.Put(&vh)
	f.Add(name[:], n, []byte(nil), []byte{0x45, 0, 0, 20}, false)
	f.Add(name[:], kf.SockaddrLLSize, vh[:], make([]byte, 3000), true)
	f.Add(name[:12], 12, vh[:5], []byte(nil), true)
	f.Fuzz(func(t *testing.T, name []byte, namelen int, hdr, buf []byte, vnet bool) {
		fab := NewFabric()
		a := fab.NewHost(ipoib.GID(netip.MustParseAddr("fe80::a").As16()), "ib0", 2044)
		fab.NewHost(ipoib.GID(netip.MustParseAddr("fe80::b").As16()), "ib0", 2044)
		s, err := a.OpenPacketWith(1, kf.PacketOptions{Vnet: vnet})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		n, err := s.Send([]kf.Msg{{Name: name, NameLen: namelen, Hdr: hdr, Buf: buf}})
		var errno unix.Errno
		if !(n == 1 && err == nil || n == 0 && errors.As(err, &errno)) {
			t.Fatalf("Send: %d, %v", n, err)
		}
	})
}

// FuzzWriteSysctl: any path is written or refused, never crashes.
func FuzzWriteSysctl(f *testing.F) {
	f.Add("net/ipv4/conf/ib0/forwarding")
	f.Add("net/ipv4")
	f.Add("net/ipv6/conf/ib0/")
	f.Fuzz(func(t *testing.T, path string) {
		k := NewFabric().NewHost(ipoib.GID{}, "ib0", 2044)
		if k.WriteSysctl(path, "1") == nil && k.Sysctl(path) != "1" {
			t.Fatalf("%q accepted and not recorded", path)
		}
	})
}
