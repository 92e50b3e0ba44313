package netns

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestMemoryFlood: a daemon runs at the default table bounds (--max-vifs
// 1024, --max-neighbours 65536, no memory limit). It takes a flood of
// 20,000 source MACs from a guest, then ARP requests from 100,000
// distinct (GID, QPN) endpoints on the fabric, while another guest pings
// across the fabric. Each flood comes in bursts the daemon reads before
// the next, so that the kernel drops none. Each flood frame is counted
// once: sent through the VIF made for its MAC, up to the bound, else
// drop_vif_limit, or drop_vif_pending_full when it came while the VIFs
// being made held as many frames as they may. Each flood endpoint is learned once, and as
// many evicted as the bound calls for. Every ping is answered. The
// daemon's RSS after both floods is at most 64 MiB (logged).
func TestMemoryFlood(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21 := h1.guests[0], h1.guests[1], h2.guests[0]
	ping(t, g11, g21.ip4)
	quiet(t, h1) // every new source MAC is the flood's
	before, rss := h1.metrics(t), h1.rssKB(t)
	const (
		nMAC   = 20000
		nNeigh = 100000
	)
	// A valid IPv4 UDP datagram to the subnet's broadcast from source
	// MAC 02:ee:00:00:00:00 + i: distinct MACs, nothing else wrong.
	ip := []byte{0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 12, 10, 77, 0, 255, 0, 9, 0, 9, 0, 8, 0, 0}
	csum.IPv4Header(ip[:20])
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	gid := ipoib.GID(h2.gid(t).As16())
	dst := h1.vifQPN(g11.mac(t).String(), 0)
	spa, tpa := netip.MustParseAddr("10.77.0.249"), netip.MustParseAddr("10.77.0.250")
	delta := func(after map[string]float64, k string) float64 { return after[k] - before[k] }
	// The flood's frames that went through their VIFs: each MAC sends
	// one frame, but a VIF may be made for a MAC whose frame was dropped
	// (drop_vif_pending_full: holdNew asks for the VIF, then finds the
	// held frames at their bound), so the frames the VIFs sent are
	// summed, not the VIFs counted. make test-load once counted 8,193
	// of 8,192 that way.
	floodSent := func(after map[string]float64) (n float64) {
		for k, v := range after {
			if strings.HasPrefix(k, `vif_tx_packets_total{mac="02:ee:`) {
				n += v
			}
		}
		return n
	}
	macsCounted := func(after map[string]float64) float64 {
		return floodSent(after) + delta(after, "drop_vif_limit") + delta(after, "drop_vif_pending_full")
	}
	// The MAC flood waits, every quarter of the TAP's queue, until the
	// daemon has counted every frame sent so far, and the kernel drops
	// none on the way.
	p := pacer(t, g12, h1, macsCounted)
	pingDuring(t, g11, g21.ip4, 20, func() {
		err := rawFramesPaced(t, g12.ns, "eth0", nMAC, func(i int) []byte {
			src := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(src[2:], uint32(i))
			return append(ethHeader(bcast, src, 0x0800), ip...)
		}, p.burst, p.caughtUp)
		if err != nil {
			t.Error(err)
		}
		floodFabric(t, h2, h1, nNeigh, func(i int) (simfabric.Packet, []byte) {
			qpn := 0x100000 + uint32(i)
			return simfabric.Packet{PKey: 0xffff, DestQPN: dst, QKey: ipoib.QKey, SrcQPN: qpn, PSN: uint32(i)},
				ipoibARP(ipoib.MakeHwAddr(0, qpn, gid), spa, tpa)
		})
	})
	p.checkHops(t)
	var after map[string]float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		after = h1.metrics(t)
		if macsCounted(after) >= nMAC && delta(after, "neighbours_learned") >= nNeigh || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n := macsCounted(after); n != nMAC {
		t.Errorf("%v flood frames counted (%v sent through their VIFs, %v drop_vif_limit, %v drop_vif_pending_full), want %d",
			n, floodSent(after), delta(after, "drop_vif_limit"), delta(after, "drop_vif_pending_full"), nMAC)
	}
	if after["vifs"] != 1024 {
		t.Errorf("%v VIFs after the flood, want the default --max-vifs 1024", after["vifs"])
	}
	learned, evicted, aged := delta(after, "neighbours_learned"), delta(after, "neighbours_evicted"), delta(after, "neighbours_aged")
	if learned != nNeigh {
		var rose []string
		for k, v := range after {
			if strings.Contains(k, "drop") && v != before[k] {
				rose = append(rose, fmt.Sprintf("%s +%v", k, v-before[k]))
			}
		}
		t.Errorf("%v neighbours learned during the flood, want one per flood endpoint: %d; drop counters that rose: %s",
			learned, nNeigh, strings.Join(rose, ", "))
	}
	if after["neighbours"] != 65536 || after["neighbours"] != before["neighbours"]+learned-evicted-aged {
		t.Errorf("%v neighbours after the flood (%v before, %v learned, %v evicted, %v aged), want the default --max-neighbours 65536, every endpoint accounted for",
			after["neighbours"], before["neighbours"], learned, evicted, aged)
	}
	ping(t, g11, g21.ip4)
	kb := h1.rssKB(t)
	t.Logf("floods of %d MACs and %d endpoints: RSS %d KB before, %d KB after", nMAC, nNeigh, rss, kb)
	if kb > 64<<10 {
		t.Errorf("RSS %d KB after the floods, want at most 64 MiB", kb)
	}
	h1.running(t)
}
