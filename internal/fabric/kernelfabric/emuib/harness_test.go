package emuib

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestHarnessARP runs the harness (BPF_PROG_TEST_RUN) on an ARP frame
// as the wire hands it to a child: it goes on (TCX_NEXT) with ipoib's
// 24 bytes (20 zero bytes, the EtherType, 2 zero bytes) in front of
// the ARP packet, which is unchanged; bpf_skb_adjust_room would refuse
// it, and a refused frame is dropped.
func TestHarnessARP(t *testing.T) {
	nstest.RequireRoot(t)
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	arp := bytes.Repeat([]byte{0x5a}, 28)
	frame := append([]byte{2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x08, 0x06}, bytes.Repeat([]byte{0xee}, strip)...)
	frame = append(frame, arp...)
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}
	ret, err := p.Harness.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append(make([]byte, 20), 0x08, 0x06, 0, 0), arp...)
	if int32(ret) != tcxNext || !bytes.Equal(opts.DataOut, want) {
		t.Fatalf("verdict %d, out %x; want TCX_NEXT, %x", int32(ret), opts.DataOut, want)
	}
	if c, err := p.Counts(); err != nil || c[HarnessRefused] != 0 {
		t.Fatalf("counters %v (%v), want none refused", c, err)
	}
}
