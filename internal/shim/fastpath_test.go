package shim

import (
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// fastView is what a FastPath was told to carry in one round.
type fastView struct {
	guests  map[ether.MAC]uint32
	neigh   map[ether.MAC]ipoib.HwAddr
	senders map[netip.Addr]ether.MAC
}

func (v fastView) String() string {
	return fmt.Sprintf("guests %v neighbours %v senders %v", v.guests, v.neigh, v.senders)
}

func (v fastView) equal(w fastView) bool {
	return maps.Equal(v.guests, w.guests) && maps.Equal(v.neigh, w.neigh) && maps.Equal(v.senders, w.senders)
}

// fakeFastPath records the last committed round and counts rounds.
type fakeFastPath struct {
	mu       sync.Mutex
	building fastView
	state    fastView
	commits  int
}

func (f *fakeFastPath) Begin() {
	f.building = fastView{map[ether.MAC]uint32{}, map[ether.MAC]ipoib.HwAddr{}, map[netip.Addr]ether.MAC{}}
}
func (f *fakeFastPath) Guest(mac ether.MAC, qpn uint32) { f.building.guests[mac] = qpn }
func (f *fakeFastPath) Neighbour(remac ether.MAC, rimac ipoib.HwAddr) {
	f.building.neigh[remac] = rimac
}
func (f *fakeFastPath) Sender(ip netip.Addr, remac ether.MAC) { f.building.senders[ip] = remac }
func (f *fakeFastPath) Commit() error {
	f.mu.Lock()
	f.state, f.commits = f.building, f.commits+1
	f.mu.Unlock()
	return nil
}

// waitState waits until a round after the commits already counted
// stated want.
func (f *fakeFastPath) waitState(t *testing.T, what string, want fastView) {
	t.Helper()
	f.mu.Lock()
	after := f.commits
	f.mu.Unlock()
	var got fastView
	testutil.WaitFor(t, what, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		got = f.state
		return f.commits > after && got.equal(want)
	})
}

func (f *fakeFastPath) view() fastView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

// TestFastPathSync: on the kernel backend (which names no senders, so
// the shim learns them from ARP), the fast path is told of the guest's
// VIF, the neighbour and its source IP once they are learned; of no
// neighbour nor source after a flush; of no guest once its VIF aged;
// of nothing during a capture; and of nothing after shutdown.
func TestFastPathSync(t *testing.T) {
	fp := &fakeFastPath{}
	f := kernelFabric{fakekernel.NewFabric()}
	a := newHV(t, f, "fe80::a", func(c *Config) { c.FastPath, c.VIFIdle = fp, time.Minute })
	b := newHV(t, f, "fe80::b", nil)
	_, remacB1 := arpExchange(t, a, b)
	va, _ := a.s.vifs.Lookup(mactrans.VIFKey{MAC: macA1})
	vb, _ := b.s.vifs.Lookup(mactrans.VIFKey{MAC: macB1})
	rimacB1 := ipoib.MakeHwAddr(0, vb.QPN, b.port.LocalGID())
	guest := map[ether.MAC]uint32{macA1: va.QPN}
	fp.waitState(t, "the guest, its neighbour and the neighbour's source", fastView{
		guests:  guest,
		neigh:   map[ether.MAC]ipoib.HwAddr{remacB1: rimacB1},
		senders: map[netip.Addr]ether.MAC{ipB1: remacB1},
	})

	c, err := a.s.StartCapture(CaptureTAP, 16)
	if err != nil {
		t.Fatal(err)
	}
	fp.waitState(t, "nothing during a capture", fastView{guests: map[ether.MAC]uint32{}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}})
	c.Stop()

	if n := a.s.FlushNeighbours(); n != 1 {
		t.Fatalf("flushed %d neighbours, want 1", n)
	}
	fp.waitState(t, "the guest alone after a flush", fastView{guests: guest, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}})

	a.clk.Advance(2 * time.Minute)
	a.waitCounter(t, VIFsAged, 1)
	if got := fp.view(); len(got.guests) != 0 {
		t.Fatalf("the aged VIF is still carried: %v", got)
	}

	a.dev.Inject(arpFrame(t, layers.ARPRequest, macA1, ipA1, ether.Broadcast, ether.MAC{}, ipB1))
	testutil.WaitFor(t, "the guest back", func() bool { return len(fp.view().guests) == 1 })
	a.shutdown(t)
	if got := fp.view(); !got.equal(fastView{guests: map[ether.MAC]uint32{}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}}) {
		t.Fatalf("after shutdown the fast path still carries %v", got)
	}
}

// TestFastPathOffForClampMSS: with --clamp-mss every SYN must cross user
// space, so the fast path is told of nothing, round after round.
func TestFastPathOffForClampMSS(t *testing.T) {
	fp := &fakeFastPath{}
	f := kernelFabric{fakekernel.NewFabric()}
	a := newHV(t, f, "fe80::a", func(c *Config) { c.FastPath, c.ClampMSS = fp, true })
	b := newHV(t, f, "fe80::b", nil)
	arpExchange(t, a, b)
	empty := fastView{guests: map[ether.MAC]uint32{}, neigh: map[ether.MAC]ipoib.HwAddr{}, senders: map[netip.Addr]ether.MAC{}}
	fp.waitState(t, "nothing with --clamp-mss", empty)
	if a.s.neigh.Len() != 1 || a.s.vifs.Len() != 1 {
		t.Fatalf("the tables hold %d neighbours and %d VIFs, want 1 and 1", a.s.neigh.Len(), a.s.vifs.Len())
	}
	fp.waitState(t, "still nothing a round later", empty)
}
