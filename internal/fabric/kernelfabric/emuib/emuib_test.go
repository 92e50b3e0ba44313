package emuib

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/bpfasm"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/ipoib"
)

// tcActRedirect is TC_ACT_REDIRECT, what bpf_redirect returns.
const tcActRedirect = 7

var (
	// dest is the one address the wire knows in these tests, with the
	// connected-mode flag, which the wire ignores.
	dest     = ipoib.MakeHwAddr(0x80, 0x12345, ipoib.GID{0xfe, 0x80, 15: 2})
	childMAC = net.HardwareAddr{0x02, 0xc0, 0, 0, 0, 2}
)

const fabricEnd = 42

// loadWithEnd loads the programs (root) with dest's end.
func loadWithEnd(t testing.TB) *Programs {
	t.Helper()
	nstest.RequireRoot(t)
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.PutEnd(dest.WithoutFlags(), fabricEnd, childMAC); err != nil {
		t.Fatal(err)
	}
	return p
}

// linkFrame is the TX program's output: [address][EtherType][0 0][l3].
func linkFrame(addr ipoib.HwAddr, typ uint16, l3 []byte) []byte {
	f := append(addr[:], byte(typ>>8), byte(typ), 0, 0)
	return append(f, l3...)
}

// ipv4 is an IPv4 header of a packet of n bytes, then n-20 bytes.
func ipv4(n int) []byte {
	p := make([]byte, n)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	p[9] = 6
	for i := 20; i < n; i++ {
		p[i] = byte(i)
	}
	return p
}

// run runs prog on frame with BPF_PROG_TEST_RUN and returns its verdict,
// its output and which counter moved (NumReasons if none); it fails the
// test if another counter moved or one moved by more than one.
func run(t *testing.T, p *Programs, prog *ebpf.Program, frame []byte) (uint32, []byte, Reason) {
	t.Helper()
	before, err := p.Counts()
	if err != nil {
		t.Fatal(err)
	}
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	after, err := p.Counts()
	if err != nil {
		t.Fatal(err)
	}
	moved := NumReasons
	for r := range NumReasons {
		switch d := after[r] - before[r]; {
		case d == 1 && moved == NumReasons:
			moved = r
		case d != 0:
			t.Fatalf("counter %s moved by %d (after %s)", r, d, moved)
		}
	}
	return ret, opts.DataOut, moved
}

// TestWire: a frame to the known address (whatever its flags byte) is
// redirected to its child's fabric end with the child's MAC, a zero
// source and the EtherType over the first 14 bytes, the rest as it was;
// a frame to another address, or shorter than the link header, is
// dropped; each verdict counted once.
func TestWire(t *testing.T) {
	p := loadWithEnd(t)
	frame := linkFrame(dest, 0x0800, ipv4(60))
	ret, out, moved := run(t, p, p.Wire, frame)
	want := append(append(append([]byte{}, childMAC...), 0, 0, 0, 0, 0, 0, 0x08, 0x00), frame[ethLen:]...)
	if ret != tcActRedirect || moved != Redirected || !bytes.Equal(out, want) {
		t.Errorf("known address: verdict %d, counter %s, output\n%x\nwant %d, redirected,\n%x", ret, moved, out, tcActRedirect, want)
	}

	other := ipoib.MakeHwAddr(0, 0x12346, dest.GID())
	if ret, out, moved := run(t, p, p.Wire, linkFrame(other, 0x0800, ipv4(60))); ret != tcActShot || moved != Unknown {
		t.Errorf("unknown address: verdict %d, counter %s (%x), want %d, unknown", ret, moved, out[:24], tcActShot)
	}
	if ret, _, moved := run(t, p, p.Wire, frame[:20]); ret != tcActShot || moved != Short {
		t.Errorf("20-byte frame: verdict %d, counter %s, want %d, short", ret, moved, tcActShot)
	}
}

// TestHarness: from what the wire delivers, the harness makes ipoib's
// receive layout (20 zero bytes, the EtherType, 2 zero bytes, L3) and
// hands it on (TCX_NEXT), counting nothing; a packet whose L3 would be
// shorter than its IP header once the 10 bytes are gone is dropped and
// counted.
func TestHarness(t *testing.T) {
	p := loadWithEnd(t)
	l3 := ipv4(60)
	wired := append(append(append([]byte{}, childMAC...), 0, 0, 0, 0, 0, 0, 0x08, 0x00), 1, 2, 3, 4, 5, 6, 0x08, 0x00, 0, 0)
	ret, out, moved := run(t, p, p.Harness, append(wired, l3...))
	want := append(make([]byte, 20), 0x08, 0x00, 0, 0)
	want = append(want, l3...)
	if int32(ret) != tcxNext || moved != NumReasons || !bytes.Equal(out, want) {
		t.Errorf("verdict %d, counter %s, output\n%x\nwant %d, none,\n%x", int32(ret), moved, out, tcxNext, want)
	}
	// 20 bytes after the Ethernet header pass BPF_PROG_TEST_RUN's own
	// IPv4 check, but only 10 would be left for the IP header.
	if ret, _, moved := run(t, p, p.Harness, append(wired, l3[:10]...)); ret != tcActShot || moved != HarnessRefused {
		t.Errorf("short packet: verdict %d, counter %s, want %d, harness_refused", ret, moved, tcActShot)
	}
}

// FuzzWire runs arbitrary frames through the wire: exactly one counter
// moves by one; a frame is redirected, rewritten exactly as TestWire
// says, only when it holds a link header to the known address;
// otherwise it is dropped as short or unknown.
func FuzzWire(f *testing.F) {
	for _, seed := range [][]byte{
		linkFrame(dest, 0x0800, ipv4(60)),
		linkFrame(dest.WithoutFlags(), 0x86dd, make([]byte, 40)),
		linkFrame(ipoib.MakeHwAddr(0, 1, dest.GID()), 0x0800, ipv4(20)),
		linkFrame(dest, 0x0806, make([]byte, 28))[:23],
		make([]byte, 14),
	} {
		f.Add(seed)
	}
	p := loadWithEnd(f)
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !bpfasm.TestRunTakes(frame) {
			return
		}
		ret, out, moved := run(t, p, p.Wire, frame)
		switch {
		case len(frame) < linkLen:
			if ret != tcActShot || moved != Short {
				t.Fatalf("%d-byte frame: verdict %d, counter %s, want short", len(frame), ret, moved)
			}
		case !bytes.Equal(frame[1:ipoib.HwAddrLen], dest[1:]):
			if ret != tcActShot || moved != Unknown {
				t.Fatalf("frame to %x: verdict %d, counter %s, want unknown", frame[:ipoib.HwAddrLen], ret, moved)
			}
		default:
			want := append(append(append([]byte{}, childMAC...), 0, 0, 0, 0, 0, 0, frame[20], frame[21]), frame[ethLen:]...)
			if ret != tcActRedirect || moved != Redirected || !bytes.Equal(out, want) {
				t.Fatalf("verdict %d, counter %s, output\n%x\nwant redirected\n%x", ret, moved, out, want)
			}
		}
	})
}
