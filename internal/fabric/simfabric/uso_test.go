package simfabric

import (
	"fmt"
	"testing"

	"github.com/eipoib/eipoibd/internal/gsotest"
	"github.com/eipoib/eipoibd/ipoib"
)

// udpSuper returns a UDP super-packet behind the IPoIB header, with
// 64 bytes of headroom and the port's tail room, and its metadata.
func udpSuper(tb testing.TB, v6 bool, payload []byte, size int, src, dst uint32, gid ipoib.GID) ([]byte, ipoib.TxMeta, []byte) {
	link := []byte{0x08, 0x00, 0, 0}
	if v6 {
		link[0], link[1] = 0x86, 0xdd
	}
	pkt, l4 := gsotest.SuperUDP(tb, link, v6, payload)
	m := ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, dst, gid), SrcQPN: src, PKey: 0xffff,
		GSO: ipoib.GSO{Type: ipoib.GSOUDPv4, L4: uint16(l4), Size: uint16(size)}}
	if v6 {
		m.GSO.Type = ipoib.GSOUDPv6
	}
	return append(make([]byte, 64, 64+len(pkt)+TailRoom), pkt...), m, link
}

// TestUDPSuperPackets: the port takes UDP super-packets (Offloads.USO).
// One is cut into its datagrams and sent as one UDP GSO train. They are
// exactly those a sender of one datagram at a time would have sent
// (lengths, IPv4 IDs, checksums). Write counts it as one packet, the
// port's counters the datagrams. One whose datagrams do not fit the
// IPoIB MTU is refused and counted as bad_gso, as is one for a port that
// would not take it.
func TestUDPSuperPackets(t *testing.T) {
	a, b, _, _ := pair(t, 9000)
	if !a.Offloads().USO {
		t.Fatal("the simulated fabric does not report USO")
	}
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := b.AllocQP(0xffff, 0)
	got := reader(b)
	for _, c := range []struct {
		v6          bool
		size, total int
	}{{false, 64, 64 * 32}, {true, 64, 64*32 - 5}, {false, 1400, 20000}} {
		payload := gsotest.Pattern(c.total)
		buf, m, link := udpSuper(t, c.v6, payload, c.size, qa, qb, b.LocalGID())
		st0 := a.Counters()
		before, trains, inTrains := st0.TxPackets, st0.Stats["tx_trains"], st0.Stats["tx_train_packets"]
		if n, err := a.Write([][]byte{buf}, []ipoib.TxMeta{m}, 64); n != 1 || err != nil {
			t.Fatalf("%+v: Write %d, %v; want 1 accepted (drops %v)", c, n, err, a.Counters().Drops)
		}
		want := (c.total + c.size - 1) / c.size
		var dgrams [][]byte
		for len(dgrams) < want {
			r := expect(t, got, fmt.Sprintf("%+v: datagram %d of %d", c, len(dgrams)+1, want))
			if r.meta.DstQPN != qb {
				t.Fatalf("%+v: datagram to %#x", c, r.meta.DstQPN)
			}
			dgrams = append(dgrams, r.payload)
		}
		none(t, got, "after the datagrams")
		gsotest.CheckUDPCut(t, dgrams, link, c.v6, payload, c.size)
		// One train holding every datagram, the last (shorter) one too.
		if st := a.Counters(); st.TxPackets-before != uint64(want) || st.Stats["tx_trains"]-trains != 1 || st.Stats["tx_train_packets"]-inTrains != uint64(want) {
			t.Fatalf("%+v: %d packets sent, %d of them in %d trains; want %d, all in 1", c, st.TxPackets-before,
				st.Stats["tx_train_packets"]-inTrains, st.Stats["tx_trains"]-trains, want)
		}
	}
	buf, m, _ := udpSuper(t, false, gsotest.Pattern(9000), 3000, qa, qb, b.LocalGID())
	if n, err := a.Write([][]byte{buf}, []ipoib.TxMeta{m}, 64); n != 0 || err != nil {
		t.Fatalf("datagrams beyond the MTU: Write %d, %v; want 0 accepted", n, err)
	}
	waitDrop(t, a, "bad_gso", 1)
	none(t, got, "a refused super-packet")
	m.GSO.Size = 1000
	if _, d := ipoib.CheckTxOffloads(&m, len(buf)-64, a.qps, ipoib.Offloads{TSO: true}); d != ipoib.DropBadGSO {
		t.Fatalf("a UDP super-packet to a port without USO: %v, want bad_gso", d)
	}
}

// BenchmarkSocketSuperUDP is the socket layer per UDP super-packet of 32
// datagrams of 64 bytes (what bin/udprate sends): cut by the port, sent
// as a UDP GSO train, received and handed out one packet each.
func BenchmarkSocketSuperUDP(b *testing.B) {
	a, p, _, _ := pair(b, 9000)
	qa, _ := a.AllocQP(0xffff, 0)
	qb, _ := p.AllocQP(0xffff, 0)
	buf, m, _ := udpSuper(b, false, gsotest.Pattern(64*32), 64, qa, qb, p.LocalGID())
	benchRoundTrip(b, a, p, [][]byte{buf}, []ipoib.TxMeta{m}, 32, 64*32)
}
