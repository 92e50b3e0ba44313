package kernelfabric

import (
	"bytes"
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

var testGID = testutil.GID("fe80::2:c903:0:1")

// TestSockaddrLLBytes: the 32-byte name for ifindex 7, IPv4, QPN 0x123456
// on fe80::2:c903:0:1, worked out from struct sockaddr_ll (little-endian
// host): family 17, protocol 0x0800 big-endian, ifindex, hatype 32,
// pkttype 0, halen 20, then the 20 address bytes running 12 past sll_addr.
func TestSockaddrLLBytes(t *testing.T) {
	var b [SockaddrLLIPoIBLen]byte
	n := PutSockaddrLL(&b, 7, 0x0800, ipoib.MakeHwAddr(0, 0x123456, testGID))
	want := []byte{
		17, 0, 0x08, 0x00, 7, 0, 0, 0, 32, 0, 0, 20,
		0, 0x12, 0x34, 0x56,
		0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x02, 0xc9, 0x03, 0, 0, 0, 0x01,
	}
	if n != 32 || !bytes.Equal(b[:n], want) {
		t.Fatalf("got %d % x\nwant % x", n, b[:n], want)
	}
	sa, err := ParseSockaddrLL(b[:], n)
	if err != nil || sa.Ifindex != 7 || sa.Protocol != 0x0800 || sa.Halen != 20 || !bytes.Equal(sa.Addr, want[12:]) {
		t.Fatalf("round trip %+v %v", sa, err)
	}
	// The same address with the 20-byte sizeof(struct sockaddr_ll) name
	// length claims more than it holds.
	if _, err := ParseSockaddrLL(b[:], SockaddrLLSize); err != ErrSockaddr {
		t.Fatalf("halen 20 in a 20-byte name: %v", err)
	}
}

// TestParseSockaddrLLReceived: what packet_recvmsg returns for IPoIB:
// sll_halen 0, name length padded to 20.
func TestParseSockaddrLLReceived(t *testing.T) {
	b := []byte{17, 0, 0x86, 0xdd, 3, 0, 0, 0, 32, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	sa, err := ParseSockaddrLL(b, 20)
	if err != nil || sa.Pkttype != PacketMulticast || sa.Protocol != 0x86dd || sa.Ifindex != 3 || len(sa.Addr) != 0 {
		t.Fatalf("%+v %v", sa, err)
	}
	for _, n := range []int{0, 19, 21} {
		if _, err := ParseSockaddrLL(b, n); err == nil {
			t.Errorf("length %d accepted", n)
		}
	}
}

// TestMreqBytes: packet_mreq_max for ff12:401b:ffff::ffff:ffff on
// ifindex 9: ifindex, type PACKET_MR_MULTICAST 0, alen 20, the address
// 00 ff ff ff + MGID, 12 zero bytes to MAX_ADDR_LEN.
func TestMreqBytes(t *testing.T) {
	var b [MreqMaxSize]byte
	PutMreq(&b, 9, ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal))
	want := []byte{9, 0, 0, 0, 0, 0, 20, 0,
		0, 0xff, 0xff, 0xff,
		0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("got  % x\nwant % x", b, want)
	}
	m, err := ParseMreq(b[:])
	if err != nil || m.Ifindex != 9 || m.Alen != 20 || !bytes.Equal(m.Addr, want[8:28]) {
		t.Fatalf("%+v %v", m, err)
	}
	if _, err := ParseMreq(b[:MreqSize]); err != ErrMreq {
		t.Fatalf("a 20-byte address in a 16-byte packet_mreq: %v", err)
	}
}

// TestGSOVnetHdrBytes: an IPv4 TCP super-packet with L4 at 24 (IPoIB 4 +
// IPv4 20) and a 32-byte TCP header, MSS 1400: csum_start 20+24 = 44 from
// the IPoIB hard header, csum_offset 16, hdr_len 76, all little-endian.
func TestGSOVnetHdrBytes(t *testing.T) {
	var b [VnetHdrLen]byte
	GSOVnetHdr(ipoib.GSO{Type: ipoib.GSOTCPv4, L4: 24, Size: 1400}, 32).Put(&b)
	want := []byte{1, 1, 76, 0, 0x78, 0x05, 44, 0, 16, 0}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("got % x want % x", b, want)
	}
	h, _ := ParseVnetHdr(b[:])
	if h != GSOVnetHdr(ipoib.GSO{Type: ipoib.GSOTCPv4, L4: 24, Size: 1400}, 32) {
		t.Fatalf("round trip %+v", h)
	}
	if GSOVnetHdr(ipoib.GSO{Type: ipoib.GSOTCPv6, L4: 44, Size: 1000}, 20).GSOType != VnetGSOTCPv6 {
		t.Fatal("IPv6 GSO type")
	}
}

// TestNewChildRequestBytes: the RTM_NEWLINK for ib0.e3 (parent 2, P_Key
// 0x8001), worked out from nlmsghdr, ifinfomsg and the rtattr nesting.
func TestNewChildRequestBytes(t *testing.T) {
	req := newChildRequest(ChildSpec{Name: "ib0.e3", Parent: 2, PKey: 0x8001})
	req.Seq = 1
	got := req.Serialize()
	want := []byte{
		96, 0, 0, 0, // nlmsg_len
		16, 0, // RTM_NEWLINK
		0x05, 0x06, // NLM_F_REQUEST|NLM_F_ACK|NLM_F_EXCL|NLM_F_CREATE
		1, 0, 0, 0, // seq
		0, 0, 0, 0, // pid
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ifinfomsg
		11, 0, 3, 0, 'i', 'b', '0', '.', 'e', '3', 0, 0, // IFLA_IFNAME, padded
		8, 0, 5, 0, 2, 0, 0, 0, // IFLA_LINK 2
		44, 0, 18, 0, // IFLA_LINKINFO: 4 + 12 + 28
		9, 0, 1, 0, 'i', 'p', 'o', 'i', 'b', 0, 0, 0, // IFLA_INFO_KIND
		28, 0, 2, 0, // IFLA_INFO_DATA: 4 + 3 × 8
		6, 0, 1, 0, 0x01, 0x80, 0, 0, // IFLA_IPOIB_PKEY 0x8001 host order
		6, 0, 2, 0, 0, 0, 0, 0, // IFLA_IPOIB_MODE datagram
		6, 0, 3, 0, 0, 0, 0, 0, // IFLA_IPOIB_UMCAST 0
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got  % x\nwant % x", got, want)
	}
}

// TestNames: a parent of up to 8 bytes prefixes its children's names. A
// longer one, up to IFNAMSIZ - 1 (15), gives a hashed 8-byte stem, so
// that every child name, the largest index's included, fits 15 bytes.
// IsChildName recognises exactly what ChildName and GroupChildName give.
func TestNames(t *testing.T) {
	if n, _ := ChildName(ChildStem("ib0"), 3); n != "ib0.e3" {
		t.Fatal(n)
	}
	if n := GroupChildName(ChildStem("ib0"), 0x0001); n != "ib0.m8001" {
		t.Fatal(n)
	}
	for _, parent := range []string{"ib0", "ibp1s0f0", "ibp129s0f0", "ibp65s0f0np0", "ibp129s0f0np0xy"} {
		stem := ChildStem(parent)
		if (stem == parent) != (len(parent) <= 8) || len(stem) > 8 {
			t.Errorf("ChildStem(%q) = %q", parent, stem)
		}
		last, err := ChildName(stem, MaxChildIndex)
		if err != nil || len(last) > MaxNameLen || !IsChildName(stem, last) {
			t.Errorf("%s: ChildName(%d) = %q, %v", parent, MaxChildIndex, last, err)
		}
		if g := GroupChildName(stem, 0x7fff); len(g) > MaxNameLen || !IsChildName(stem, g) {
			t.Errorf("%s: GroupChildName = %q", parent, g)
		}
	}
	if a, b := ChildStem("ibp129s0f0"), ChildStem("ibp129s0f1"); a == b {
		t.Errorf("two parents share stem %q", a)
	}
	for _, n := range []int{0, -1, MaxChildIndex + 1} {
		if name, err := ChildName("ib0", n); err == nil {
			t.Errorf("ChildName(%d) = %q, want an error", n, name)
		}
	}
	for name, ours := range map[string]bool{"ib0.e3": true, "ib0.e99999": true, "ib0.m8001": true, "ib0.8001": false, "ib0.e": false,
		"ib1.e3": false, "ib0.ex": false, "ib0.e0": false, "ib0.e03": false, "ib0.e+3": false, "ib0.e100000": false, "ib0.m801": false, "ib0.m+801": false, "ib0.mFFFF": false, "ib0.m0001": false} {
		if IsChildName("ib0", name) != ours {
			t.Errorf("IsChildName(%q) = %v", name, !ours)
		}
	}
}
