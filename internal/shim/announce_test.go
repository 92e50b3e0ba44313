package shim

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// announcements returns the announcements of ip delivered to h within
// wait, or as soon as want came (want 0: the whole wait). They are
// gratuitous ARPs (sender and target ip) or unsolicited NAs (target ip,
// override, no solicited flag); other frames are skipped.
func announcements(t *testing.T, h *hv, ip netip.Addr, want int, wait time.Duration) (n int, src ether.MAC) {
	t.Helper()
	deadline := time.After(wait)
	for want == 0 || n < want {
		select {
		case f := <-h.dev.Sent():
			p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
			e := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
			if a, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP); ok && a.Operation == layers.ARPRequest &&
				netip.AddrFrom4([4]byte(a.SourceProtAddress)) == ip && netip.AddrFrom4([4]byte(a.DstProtAddress)) == ip {
				n, src = n+1, ether.MAC(a.SourceHwAddress)
				if ether.MAC(e.SrcMAC) != src || !ether.MAC(e.DstMAC).IsBroadcast() {
					t.Fatalf("gratuitous ARP framed %s → %s, sender %s", e.SrcMAC, e.DstMAC, src)
				}
			}
			if na, ok := p.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement); ok &&
				netip.AddrFrom16([16]byte(na.TargetAddress)) == ip && na.Override() && !na.Solicited() && len(na.Options) == 1 {
				n, src = n+1, ether.MAC(na.Options[0].Data)
			}
		case <-deadline:
			return n, src
		}
	}
	return n, src
}

// announceSteps moves a's clock through the steps of announcements
// that began with tx_announced at from+per, per announcements sent at
// each. It takes each step once the one before was sent: two steps in
// one housekeeping round would send one announcement less. It returns
// the announcements of ip b received, one wanted per step.
func announceSteps(t *testing.T, a, b *hv, ip netip.Addr, from uint64, per int) (n int, src ether.MAC) {
	t.Helper()
	for i := 1; i <= 3; i++ {
		if i > 1 {
			a.clk.Advance(time.Second)
		}
		a.waitCounter(t, TxAnnounced, from+uint64(per*i))
		k, s := announcements(t, b, ip, 1, testutil.Settle)
		n, src = n+k, s
	}
	return n, src
}

// TestAnnounce: a guest's addresses seen within the window of its VIF's
// creation are announced to the fabric three times, a second apart, from
// its own QP (the peer sees its REMAC there). Later addresses are not.
// QEMU's RARP announcement reopens the window and announces every
// address known.
func TestAnnounce(t *testing.T) {
	a, b := pair(t, func(c *Config) { c.AnnounceWindow = 30 * time.Second })
	_, remacB1 := arpExchange(t, a, b) // A1's first frame: an ARP request from ipA1
	n, src := announceSteps(t, a, b, ipA1, 0, 1)
	a.clk.Advance(time.Second)
	a.rounds(t, 2) // one began after the advance
	if k, _ := announcements(t, b, ipA1, 0, 300*time.Millisecond); k != 0 || n != 3 || a.s.Get(TxAnnounced) != 3 {
		t.Fatalf("%d announcements of %s, then %d more (tx_announced %d); want 3", n, ipA1, k, a.s.Get(TxAnnounced))
	}
	// The REMAC B knows A1 by: the announcement came from A1's VIF.
	if nb, ok := b.s.neigh.LookupREMAC(0xffff, src); !ok || nb.RIMAC.QPN() != a.s.VIFs()[0].QPN {
		t.Fatalf("announced as %s (%v), not A1's QP", src, ok)
	}
	// IPv6, still in the window: an unsolicited NA.
	la := netip.MustParseAddr("fd00::a1")
	a.dev.Inject(ndpFrame(t, macA1, la, netip.MustParseAddr("ff02::2"), ether.MAC{0x33, 0x33, 0, 0, 0, 2},
		layers.CreateICMPv6TypeCode(layers.ICMPv6TypeRouterSolicitation, 0), &layers.ICMPv6RouterSolicitation{}))
	if k, _ := announceSteps(t, a, b, la, 3, 1); k != 3 {
		t.Fatalf("%d NAs of %s, want 3", k, la)
	}
	// A datagram's source address claims nothing.
	forged := netip.MustParseAddr("10.0.0.98")
	a.dev.Inject(udpFrame(t, macA1, remacB1, forged, ipB1, 10, true))
	if k, _ := announcements(t, b, forged, 0, 300*time.Millisecond); k != 0 {
		t.Fatalf("%d announcements of a datagram's source", k)
	}
	// After the window, a new address is not announced...
	a.clk.Advance(40 * time.Second)
	ip2 := netip.MustParseAddr("10.0.0.99")
	frames := a.s.Get(TxFrames)
	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA1, ip2, ether.Broadcast, ether.MAC{}, ipB1))
	a.waitCounter(t, TxFrames, frames+1)
	a.rounds(t, 2)
	if k, _ := announcements(t, b, ip2, 0, 300*time.Millisecond); k != 0 || a.s.Get(TxAnnounced) != 6 {
		t.Fatalf("%d announcements outside the window (tx_announced %d, want 6)", k, a.s.Get(TxAnnounced))
	}
	// ...until QEMU's RARP announcement: every address again.
	before := a.s.Get(TxAnnounced)
	a.dev.Inject(rarpFrame(macA1))
	a.waitCounter(t, RARPAnnouncements, 1)
	for i := 0; i < 3; i++ {
		a.waitCounter(t, TxAnnounced, before+uint64(3*(i+1)))
		a.clk.Advance(time.Second)
	}
	if got := a.s.Get(TxAnnounced) - before; got != 9 {
		t.Fatalf("after the RARP: %d announcements, want 3 × 3 addresses", got)
	}
}

// rarpFrame is QEMU's announcement: a RARP request from mac about mac.
func rarpFrame(mac ether.MAC) []byte {
	f := make([]byte, 60)
	copy(f, ether.Broadcast[:])
	copy(f[6:], mac[:])
	f[12], f[13] = 0x80, 0x35
	copy(f[14:], []byte{0, 1, 8, 0, 6, 4, 0, 3})
	copy(f[22:], mac[:])
	copy(f[32:], mac[:])
	return f
}
