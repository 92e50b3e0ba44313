package emuib

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestMulticastProgram runs the multicast program (BPF_PROG_TEST_RUN,
// on lo, ifindex 1): unicast goes on to the wire; a frame to the
// multicast QPN gets the broadcast or a group's Ethernet destination,
// no copy to the fabric end it came from, and is dropped, counted.
func TestMulticastProgram(t *testing.T) {
	nstest.RequireRoot(t)
	mc, err := LoadMulticast()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	bcast := ipoib.BroadcastMGID(ipoib.DefaultPKey, ipoib.ScopeLinkLocal)
	group := testutil.GID("ff12:601b:ffff::1:ff00:21")
	for _, g := range []ipoib.GID{bcast, group} {
		if err := mc.PutMembers(g, 0, []int{1}); err != nil { // the sender's own end only
			t.Fatal(err)
		}
	}
	run := func(dst ipoib.HwAddr) (uint32, []byte) {
		t.Helper()
		frame := append(append(dst[:], 0x86, 0xdd, 0, 0), make([]byte, 40)...)
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}
		ret, err := mc.Prog.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		return ret, opts.DataOut
	}
	peer := ipoib.MakeHwAddr(0, 0x100007, testutil.GID("fe80::ee:2"))
	if ret, _ := run(peer); int32(ret) != tcxNext {
		t.Errorf("unicast: verdict %d, want TCX_NEXT", int32(ret))
	}
	for _, c := range []struct {
		mgid ipoib.GID
		dst  []byte
	}{{bcast, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}, {group, []byte{0x33, 0x33, 0xff, 0, 0, 0x21}}} {
		ret, out := run(ipoib.MakeHwAddr(0, ipoib.MulticastQPN, c.mgid))
		want := append(append(c.dst, make([]byte, 6)...), 0x86, 0xdd)
		if ret != tcActShot || !bytes.Equal(out[:ethLen], want) {
			t.Errorf("to %s: verdict %d, Ethernet header %x; want TC_ACT_SHOT, %x", c.mgid, ret, out[:ethLen], want)
		}
	}
	if got, err := mc.Counts(); err != nil || got != [NumMcastReasons]uint64{McastFrames: 2} {
		t.Errorf("counters %v (%v), want 2 frames, no copy", got, err)
	}
}
