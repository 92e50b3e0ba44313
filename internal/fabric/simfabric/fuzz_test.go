package simfabric

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// refICRC computes the ICRC of datagram b (BTH to pad, ICRC excluded)
// straight from the docs/architecture.md text, independently of
// Codec.ICRC. It is a CRC-32 over 8 bytes of 0xFF, the masked IPv6 and
// UDP headers and b with BTH byte 4 set to 0xFF.
func refICRC(b []byte, src, dst *[16]byte, sport, dport uint16) uint32 {
	udpLen := uint16(8 + len(b) + ICRCLen)
	p := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x6f, 0xff, 0xff, 0xff}
	p = binary.BigEndian.AppendUint16(p, udpLen)
	p = append(p, 17, 0xff)
	p = append(append(p, src[:]...), dst[:]...)
	p = binary.BigEndian.AppendUint16(p, sport)
	p = binary.BigEndian.AppendUint16(p, dport)
	p = binary.BigEndian.AppendUint16(p, udpLen)
	p = append(append(p, 0xff, 0xff), b...)
	if len(b) > 4 {
		p[len(p)-len(b)+4] = 0xff
	}
	return crc32.ChecksumIEEE(p)
}

// fixICRC writes the right ICRC into the last 4 bytes of datagram b.
func fixICRC(b []byte, src, dst *[16]byte, sport uint16) {
	if len(b) >= ICRCLen {
		n := len(b) - ICRCLen
		binary.LittleEndian.PutUint32(b[n:], refICRC(b[:n], src, dst, sport, UDPPort))
	}
}

func u16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }

var (
	qpFull    = uint32(0x49) // in the default partition 0xffff
	qpVLAN    = uint32(0x4a) // full member of 0x800a
	qpLimited = uint32(0x4b) // limited member of 0x000a
	mgFull    = ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	mgVLAN    = ipoib.BroadcastMGID(0x800a, ipoib.ScopeLinkLocal)
	mgLimited = func() ipoib.GID { g := mgVLAN; g[4] &^= 0x80; return g }() // an MGID with a limited P_Key
	mgSend    = ipoib.IPv4MGID(netip.AddrFrom4([4]byte{239, 1, 1, 1}), 0xffff, ipoib.ScopeLinkLocal)
)

// checkPort is a Port without a socket, with what check needs (a receive lane): QPs in
// three partitions, two full and one send-only membership.
func checkPort(t testing.TB) *Port {
	p := &Port{gid: ipoib.GID(gidB), mtu: 2048, qps: ipoib.NewQPTable(0x100), groups: ipoib.NewGroupTable()}
	p.rx = []*rxLane{{p: p}}
	for _, q := range []struct {
		pkey ipoib.PKey
		qpn  uint32
	}{{0xffff, qpFull}, {0x800a, qpVLAN}, {0x000a, qpLimited}} {
		if got, err := p.qps.Alloc(q.pkey, q.qpn); err != nil || got != q.qpn {
			t.Fatalf("QP %#x: %#x, %v", q.qpn, got, err)
		}
	}
	for _, g := range []ipoib.GID{mgFull, mgVLAN, mgLimited} {
		if err := p.groups.Join(g, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.groups.JoinSendOnly(mgSend); err != nil {
		t.Fatal(err)
	}
	return p
}

// datagram builds a well-formed UD SEND-only with a correct ICRC.
func datagram(pkey uint16, dqpn, sqpn, qkey uint32, payload []byte, src, dst *[16]byte) []byte {
	buf := append(make([]byte, HeaderLen), payload...)
	buf = append(buf, make([]byte, TailRoom)...)[:HeaderLen+len(payload)]
	p := Packet{PKey: pkey, DestQPN: dqpn, PSN: 7, QKey: qkey, SrcQPN: sqpn}
	return new(Codec).Encode(buf, HeaderLen, &p, src, dst, 0xc000, UDPPort)
}

// to16 makes a 16-byte address of the fuzzer's bytes.
func to16(b []byte) [16]byte {
	var a [16]byte
	copy(a[:], b)
	return a
}

// FuzzCheck runs the receive checks on arbitrary datagrams, with the
// ICRC made right when fix is set so that the later checks are reached.
// Each datagram is either accepted, with metadata that matches its
// bytes, or counted in exactly one drop counter; and it is accepted
// exactly when docs/architecture.md's rules say so.
func FuzzCheck(f *testing.F) {
	up := []byte{8, 0, 0, 0, 0x45, 0, 0, 20}
	seed := func(src, dst [16]byte, pkey uint16, dqpn, qkey uint32, payload []byte) {
		f.Add(src[:], dst[:], uint16(0xc000), datagram(pkey, dqpn, 0x77, qkey, payload, &src, &dst), false)
	}
	gid := ipoib.GID(gidB)
	seed(gidA, gid, 0xffff, qpFull, ipoib.QKey, up)
	seed(gidA, gid, 0x8001, qpFull, ipoib.QKey, up[:5])
	seed(gidA, gid, 0x000a, qpVLAN, ipoib.QKey, up[:6])
	seed(gidA, gid, 0x000a, qpLimited, ipoib.QKey, up[:7])
	seed(gidA, gid, 0xffff, 0x4c, ipoib.QKey, up)
	seed(gidA, gid, 0xffff, qpFull, 0x80010000, up)
	seed(gidA, mgFull, 0xffff, ipoib.MulticastQPN, ipoib.QKey, up)
	seed(gidA, mgVLAN, 0x000a, ipoib.MulticastQPN, ipoib.QKey, up)
	seed(gidA, mgLimited, 0x000a, ipoib.MulticastQPN, ipoib.QKey, up)
	seed(gidA, mgSend, 0xffff, ipoib.MulticastQPN, ipoib.QKey, up)
	seed(gidA, mgFull, 0xffff, qpFull, ipoib.QKey, up)
	seed(gidA, gid, 0xffff, ipoib.MulticastQPN, ipoib.QKey, up)
	seed(gidA, gid, 0xffff, qpFull, ipoib.QKey, make([]byte, 2048))
	seed(gidA, gid, 0xffff, qpFull, ipoib.QKey, make([]byte, 2049))
	f.Add(gidA[:], gidB[:], uint16(UDPPort), []byte{0x64, 0x30, 0xff, 0xff, 0, 0, 0, 0x49, 0, 0, 0, 0, 0, 0, 0x0b, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0}, true)
	p := checkPort(f)
	f.Fuzz(func(t *testing.T, srcb, dstb []byte, sport uint16, b []byte, fix bool) {
		src, dst := to16(srcb), to16(dstb)
		if fix {
			fixICRC(b, &src, &dst, sport)
		}
		before := p.Counters()
		var rm ipoib.RxMeta
		payload, ok := p.rx[0].check(b, &src, &dst, sport, &rm, p.mtu)
		n := len(payload)
		after := p.Counters()

		// What docs/architecture.md says of this datagram.
		want, why := true, ""
		nope := func(reason string) {
			if want {
				want, why = false, reason
			}
		}
		if len(b) < HeaderLen+ICRCLen || len(b)%4 != 0 {
			nope("truncated")
		} else {
			body := b[:len(b)-ICRCLen]
			pad := int(b[1]>>4) & 3
			pk := ipoib.PKey(u16(b[2:4]))
			dqpn := uint32(b[5])<<16 | uint32(u16(b[6:8]))
			switch {
			case b[0] != OpUDSendOnly:
				nope("bad_opcode")
			case b[1]&0x0f != 0:
				nope("bad_tver")
			case binary.LittleEndian.Uint32(b[len(body):]) != refICRC(body, &src, &dst, sport, UDPPort):
				nope("bad_icrc")
			case len(body)-HeaderLen < pad:
				nope("bad_pad")
			case binary.BigEndian.Uint32(b[12:16]) != ipoib.QKey:
				nope("qkey_mismatch")
			case len(body)-HeaderLen-pad > p.mtu:
				nope("oversize")
			}
			if (dqpn == ipoib.MulticastQPN) != ipoib.GID(dst).IsMulticast() {
				nope("bad_dest_qpn")
			}
			if dqpn == ipoib.MulticastQPN {
				if !p.groups.Full(dst) {
					nope("not_joined")
				}
				if !ipoib.CanTalk(pk, ipoib.MGIDPKey(dst)) {
					nope("pkey_mismatch")
				}
			} else {
				qpk, ok := p.qps.PKey(dqpn)
				if !ok {
					nope("unknown_qpn")
				}
				if !ipoib.CanTalk(pk, qpk) {
					nope("pkey_mismatch")
				}
			}
			if want {
				wantMeta := ipoib.RxMeta{Src: ipoib.MakeHwAddr(0, uint32(b[17])<<16|uint32(u16(b[18:20])), src), DstQPN: dqpn, PKey: pk}
				if dqpn == ipoib.MulticastQPN {
					wantMeta.MGID = dst
				}
				if ok && (rm != wantMeta || n != len(body)-HeaderLen-pad) {
					t.Fatalf("accepted as %d bytes %+v, want %d bytes %+v", n, rm, len(body)-HeaderLen-pad, wantMeta)
				}
			}
		}
		if ok != want {
			t.Fatalf("accepted %v, want %v (%s); drops %v", ok, want, why, after.Drops)
		}
		if ok {
			if after.RxPackets != before.RxPackets+1 || after.RxBytes != before.RxBytes+uint64(n) || len(after.Drops) != len(before.Drops) {
				t.Fatalf("accepted but counted %+v → %+v", before, after)
			}
			return
		}
		var moved []string
		for k, v := range after.Drops {
			if v != before.Drops[k] {
				moved = append(moved, k)
				if v != before.Drops[k]+1 {
					t.Fatalf("drop %s counted %d times", k, v-before.Drops[k])
				}
			}
		}
		if len(moved) != 1 || after.RxPackets != before.RxPackets {
			t.Fatalf("rejected (%s) but counted in %v", why, moved)
		}
		// The first broken rule is the one counted, except that the
		// destination and its P_Key are checked in either order.
		late := []string{"not_joined", "unknown_qpn", "pkey_mismatch"}
		if moved[0] != why && !(slices.Contains(late, why) && slices.Contains(late, moved[0])) {
			t.Fatalf("counted as %s, want %s", moved[0], why)
		}
	})
}

// cmsg appends one control message (header, data, alignment padding).
func cmsg(b []byte, level, typ int32, data []byte) []byte {
	off := len(b)
	b = append(b, make([]byte, unix.CmsgSpace(len(data)))...)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[off]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[off+unix.CmsgLen(0):], data)
	return b
}

// FuzzParseOOB feeds parseOOB arbitrary control data (it must not panic
// or loop), then well-formed control data built around the fuzzer's
// bytes: an IPV6_PKTINFO must be found with its address, an SO_RXQ_OVFL
// with its count, wherever they sit among other messages.
func FuzzParseOOB(f *testing.F) {
	var pi unix.Inet6Pktinfo
	pi.Addr = gidB
	pi.Ifindex = 3
	good := cmsg(cmsg(nil, unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, (*[unix.SizeofInet6Pktinfo]byte)(unsafe.Pointer(&pi))[:]),
		unix.SOL_SOCKET, unix.SO_RXQ_OVFL, []byte{5, 0, 0, 0})
	f.Add(good, gidB[:], uint32(5), uint8(1), []byte{})
	f.Add(good[:20], gidA[:], uint32(0), uint8(2), []byte{1, 2, 3})
	f.Add([]byte{}, gidA[:], uint32(1<<31), uint8(7), make([]byte, 20))
	f.Add(make([]byte, 16), gidA[:], uint32(1), uint8(4), []byte{0})
	f.Fuzz(func(t *testing.T, raw, addr []byte, ovfl uint32, mode uint8, other []byte) {
		parseOOB(raw)

		// The receive buffer holds 48 bytes of control data: a longer
		// message teaches nothing more and makes the cut-short loop
		// below (and minimizing) slow.
		other = other[:min(len(other), 64)]
		a := to16(addr)
		pi := unix.Inet6Pktinfo{Addr: a, Ifindex: 2}
		var b []byte
		extra := func() {
			if mode&2 != 0 { // another message, e.g. a hop limit
				b = cmsg(b, unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT, other)
			}
		}
		if mode&4 != 0 {
			extra()
		}
		if mode&1 != 0 {
			b = cmsg(b, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, binary.NativeEndian.AppendUint32(nil, ovfl))
		}
		b = cmsg(b, unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, (*[unix.SizeofInet6Pktinfo]byte)(unsafe.Pointer(&pi))[:])
		if mode&4 == 0 {
			extra()
		}
		r := parseOOB(b)
		if !r.ok || r.dst != a || r.hasOvfl != (mode&1 != 0) || (r.hasOvfl && r.ovfl != ovfl) {
			t.Fatalf("parseOOB(%x) = %+v; want %x, overflow %d %v", b, r, a, ovfl, mode&1 != 0)
		}
		// Cut short anywhere: never a panic, and a truncated PKTINFO is
		// not used.
		for n := range b {
			if r := parseOOB(b[:n]); r.ok && r.dst != a {
				t.Fatalf("parseOOB(%x) found %x", b[:n], r.dst)
			}
		}
	})
}

// TestDestQPNRule: a packet to an MGID must carry destination QPN
// 0xFFFFFF and a unicast one must not (IBA 9.8.1); either mix-up is
// dropped as bad_dest_qpn, even to a joined group or an existing QP.
func TestDestQPNRule(t *testing.T) {
	p := checkPort(t)
	up := []byte{8, 0, 0, 0, 0x45, 0, 0, 20}
	gid := [16]byte(gidB)
	var rm ipoib.RxMeta
	for _, c := range []struct {
		dst  [16]byte
		dqpn uint32
	}{{mgFull, qpFull}, {gid, ipoib.MulticastQPN}} {
		if _, ok := p.rx[0].check(datagram(0xffff, c.dqpn, 0x77, ipoib.QKey, up, &gidA, &c.dst), &gidA, &c.dst, 0xc000, &rm, p.mtu); ok {
			t.Errorf("to %x with QPN %#x accepted", c.dst, c.dqpn)
		}
	}
	if got := p.Counters().Drops["bad_dest_qpn"]; got != 2 {
		t.Fatalf("bad_dest_qpn %d, want 2 (%v)", got, p.Counters().Drops)
	}
}
