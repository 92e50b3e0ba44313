// Package fabrictest is the conformance suite of the checks every fabric
// backend shares (ipoib.CheckTx, ipoib.CheckRx). Each backend's tests
// run it over their port. So a packet refused or dropped for one reason
// is refused or dropped, and counted under the same name, by every
// backend.
package fabrictest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// Backend is a port under test and the ways to hand it packets.
type Backend struct {
	// Port is the port under test; the suite allocates a QP in the
	// default partition and joins a group on it.
	Port ipoib.Port
	// Peer is another port of the same fabric, which the suite gives a
	// QP for Port to send to.
	Peer ipoib.Port
	// Inject hands the port's receive path one packet (IPoIB header
	// first) with metadata m as its fabric would, bypassing the fabric's
	// routing. It reports whether it could. A backend whose fabric
	// cannot carry such a packet to it at all says false, and that case
	// is not asked of it: the kernel's socket per child cannot receive
	// for another QPN or P_Key.
	Inject func(payload []byte, m ipoib.RxMeta) bool
}

// packet is an IPoIB-encapsulated IPv4 packet of n bytes to dst (the
// group's address for a multicast one).
func packet(n int, dst [4]byte) []byte {
	b := make([]byte, n)
	ipoib.PutHeader(b, 0x0800)
	ip := b[ipoib.HeaderLen:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	ip[2], ip[3] = byte((n-ipoib.HeaderLen)>>8), byte(n-ipoib.HeaderLen)
	copy(ip[12:16], []byte{10, 0, 0, 1})
	copy(ip[16:20], dst[:])
	return b
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	t.Helper()
	p := b.Port
	qpn, err := p.AllocQP(ipoib.DefaultPKey, 0)
	if err != nil {
		t.Fatalf("AllocQP: %v", err)
	}
	peer, err := b.Peer.AllocQP(ipoib.DefaultPKey, 0)
	if err != nil {
		t.Fatalf("AllocQP on the peer: %v", err)
	}
	joined := ipoib.IPv4MGID(netip.AddrFrom4([4]byte{239, 1, 1, 1}), ipoib.DefaultPKey, ipoib.ScopeLinkLocal)
	if err := p.Join(joined); err != nil {
		t.Fatalf("Join: %v", err)
	}
	t.Run("tx", func(t *testing.T) { runTx(t, p, qpn, ipoib.MakeHwAddr(0, peer, b.Peer.LocalGID())) })
	t.Run("rx", func(t *testing.T) { runRx(t, p, qpn, joined, b.Inject) })
}

// write writes one packet with headroom and returns what Write took and
// the counters after.
func write(t *testing.T, p ipoib.Port, pkt []byte, m ipoib.TxMeta) (int, ipoib.PortCounters) {
	buf := make([]byte, ipoib.Headroom+len(pkt))
	copy(buf[ipoib.Headroom:], pkt)
	n, err := p.Write([][]byte{buf}, []ipoib.TxMeta{m}, ipoib.Headroom)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return n, p.Counters()
}

// runTx: each refused packet is counted once under its reason and not
// sent; a good one is sent (the cases can fail).
func runTx(t *testing.T, p ipoib.Port, qpn uint32, dst ipoib.HwAddr) {
	mc := ipoib.MakeHwAddr(0, ipoib.MulticastQPN, ipoib.BroadcastMGID(ipoib.DefaultPKey, ipoib.ScopeLinkLocal))
	good := ipoib.TxMeta{Dst: dst, SrcQPN: qpn, PKey: ipoib.DefaultPKey}
	for _, c := range []struct {
		name string
		m    ipoib.TxMeta
		want ipoib.Drop
	}{
		{"foreign source QP", ipoib.TxMeta{Dst: dst, SrcQPN: qpn ^ 0x5a5a, PKey: ipoib.DefaultPKey}, ipoib.DropBadMeta},
		{"another P_Key than the QP's", ipoib.TxMeta{Dst: dst, SrcQPN: qpn, PKey: 0x8001}, ipoib.DropBadMeta},
		{"multicast QPN to a unicast GID", ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, ipoib.MulticastQPN, dst.GID()), SrcQPN: qpn, PKey: ipoib.DefaultPKey}, ipoib.DropBadMeta},
		{"unicast QPN to an MGID", ipoib.TxMeta{Dst: ipoib.MakeHwAddr(0, 0x77, mc.GID()), SrcQPN: qpn, PKey: ipoib.DefaultPKey}, ipoib.DropBadMeta},
		{"super-packet with its TCP header inside the IPoIB header", ipoib.TxMeta{Dst: dst, SrcQPN: qpn, PKey: ipoib.DefaultPKey, GSO: ipoib.GSO{Type: ipoib.GSOTCPv4, L4: 2, Size: 100}}, ipoib.DropBadGSO},
	} {
		before := p.Counters()
		n, after := write(t, p, packet(100, [4]byte{10, 0, 0, 2}), c.m)
		name := c.want.String()
		if n != 0 || after.Drops[name] != before.Drops[name]+1 || after.TxPackets != before.TxPackets {
			t.Errorf("%s: took %d, %s %d → %d, tx packets %d → %d", c.name, n, name, before.Drops[name], after.Drops[name], before.TxPackets, after.TxPackets)
		}
	}
	if n, c := write(t, p, packet(100, [4]byte{10, 0, 0, 2}), good); n != 1 {
		t.Errorf("a good packet was not taken: drops %v", c.Drops)
	}
}

// readOne reads one packet, failing after a while: a packet the suite
// expects never came.
func readOne(t *testing.T, p ipoib.Port) ipoib.RxMeta {
	t.Helper()
	type result struct {
		n    int
		err  error
		meta ipoib.RxMeta
	}
	got := make(chan result, 1)
	go func() {
		bufs, sizes, meta := [][]byte{make([]byte, 4096)}, []int{0}, []ipoib.RxMeta{{}}
		n, err := p.Read(bufs, sizes, meta, 0)
		got <- result{n, err, meta[0]}
	}()
	select {
	case r := <-got:
		if r.n != 1 || r.err != nil {
			t.Fatalf("Read: %d, %v", r.n, r.err)
		}
		return r.meta
	case <-time.After(10 * time.Second):
		t.Fatalf("no packet delivered; drops %v", p.Counters().Drops)
	}
	return ipoib.RxMeta{}
}

// runRx: each packet the receive rules refuse is counted once under its
// reason and not delivered: the good packet injected after it is the one
// Read returns (a backend may apply its checks in Read). The good packets
// to the joined group and to the QP are delivered, so the injection
// works.
func runRx(t *testing.T, p ipoib.Port, qpn uint32, joined ipoib.GID, inject func([]byte, ipoib.RxMeta) bool) {
	src := ipoib.MakeHwAddr(0, 0x99, ipoib.GID{0xfe, 0x80, 15: 0x99})
	other := ipoib.IPv4MGID(netip.AddrFrom4([4]byte{239, 2, 2, 2}), ipoib.DefaultPKey, ipoib.ScopeLinkLocal)
	good := ipoib.RxMeta{Src: src, DstQPN: qpn, PKey: ipoib.DefaultPKey}
	goodMC := ipoib.RxMeta{Src: src, DstQPN: ipoib.MulticastQPN, MGID: joined, PKey: ipoib.DefaultPKey}
	unicast := [4]byte{10, 0, 0, 1}
	for _, m := range []ipoib.RxMeta{goodMC, good} {
		dst := unicast
		if m.MGID == joined {
			dst = [4]byte{239, 1, 1, 1}
		}
		if !inject(packet(100, dst), m) {
			t.Fatalf("the backend cannot be handed a good packet %+v", m)
		}
		if r := readOne(t, p); r.DstQPN != m.DstQPN || r.MGID != m.MGID {
			t.Fatalf("good packet %+v read as %+v", m, r)
		}
	}
	for _, c := range []struct {
		name string
		m    ipoib.RxMeta
		dst  [4]byte
		want ipoib.Drop
	}{
		{"unknown QPN", ipoib.RxMeta{Src: src, DstQPN: qpn ^ 0x5a5a, PKey: ipoib.DefaultPKey}, unicast, ipoib.DropUnknownQPN},
		{"another partition", ipoib.RxMeta{Src: src, DstQPN: qpn, PKey: 0x8002}, unicast, ipoib.DropPKey},
		{"group not joined", ipoib.RxMeta{Src: src, DstQPN: ipoib.MulticastQPN, MGID: other, PKey: ipoib.DefaultPKey}, [4]byte{239, 2, 2, 2}, ipoib.DropNotJoined},
	} {
		before := p.Counters()
		if !inject(packet(100, c.dst), c.m) {
			continue // the backend's fabric cannot carry it here
		}
		inject(packet(100, unicast), good)
		if r := readOne(t, p); r.DstQPN != qpn || r.MGID != (ipoib.GID{}) {
			t.Errorf("%s: delivered as %+v", c.name, r)
			continue
		}
		after := p.Counters()
		name := c.want.String()
		if after.Drops[name] != before.Drops[name]+1 || after.RxPackets != before.RxPackets+1 {
			t.Errorf("%s: %s %d → %d, rx packets %d → %d (the good one only)", c.name, name, before.Drops[name], after.Drops[name], before.RxPackets, after.RxPackets)
		}
	}
}
