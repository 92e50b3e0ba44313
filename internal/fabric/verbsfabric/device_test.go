package verbsfabric

import (
	"bytes"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestPickGID: on IB the default GID (the first IB entry); on RoCE the
// RoCE v2 entry with a link-local address, not a v1 one nor a global v2
// one; none is an error naming how many entries there were.
func TestPickGID(t *testing.T) {
	ll := testutil.GID("fe80::5054:ff:fe12:3456")
	global := testutil.GID("fd77::1")
	roce := []gidEntry{
		{gid: ll, index: 0, typ: gidRoCEv1},
		{gid: global, index: 1, typ: gidRoCEv2},
		{gid: ll, index: 2, typ: gidRoCEv2, ifindex: 7},
	}
	e, err := pickGID(roce, false)
	if err != nil || e.index != 2 || e.gid != ll || e.ifindex != 7 {
		t.Fatalf("RoCE: %+v, %v; want entry 2", e, err)
	}
	if _, err := pickGID(roce[:2], false); err == nil || !strings.Contains(err.Error(), "among 2 entries") {
		t.Fatalf("RoCE without a v2 link-local: %v", err)
	}
	ib := []gidEntry{{gid: ll, index: 0, typ: gidIB}, {gid: global, index: 1, typ: gidIB}}
	if e, err := pickGID(ib, true); err != nil || e.index != 0 {
		t.Fatalf("IB: %+v, %v; want entry 0", e, err)
	}
	if _, err := pickGID(nil, true); err == nil {
		t.Fatal("IB with an empty table: no error")
	}
}

func TestMtuOf(t *testing.T) {
	for enum, want := range map[int]int{0: 0, 1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096, 6: 0} {
		if got := mtuOf(enum); got != want {
			t.Errorf("mtuOf(%d) = %d, want %d", enum, got, want)
		}
	}
}

// grh6 is a GRH as IB and RoCE v2 over IPv6 deliver it: the IPv6 header.
func grh6(src, dst ipoib.GID) []byte {
	b := make([]byte, grhLen)
	b[0] = 0x60
	b[6] = 17 // UDP
	copy(b[8:24], src[:])
	copy(b[24:40], dst[:])
	return b
}

func TestParseGRH(t *testing.T) {
	src := testutil.GID("fe80::1")
	dst := ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal)
	s, d, err := parseGRH(grh6(src, dst))
	if err != nil || s != src || d != dst {
		t.Fatalf("IPv6 GRH: %s %s %v", s, d, err)
	}
	// RoCE v2 over IPv4: 20 zero bytes, then the IPv4 header.
	v4 := make([]byte, grhLen)
	copy(v4[20:], []byte{0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2})
	s, d, err = parseGRH(v4)
	if err != nil || s.Addr().String() != "::ffff:10.0.0.1" || d.Addr().String() != "::ffff:10.0.0.2" {
		t.Fatalf("IPv4 GRH: %s %s %v", s, d, err)
	}
	bad := bytes.Clone(v4)
	bad[3] = 1 // garbage in the zero area
	for name, b := range map[string][]byte{"short": v4[:39], "junk in the pad": bad, "not IPv4": make([]byte, grhLen)} {
		if _, _, err := parseGRH(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// FuzzParseGRH: any 40 bytes parse or are refused without a panic; an
// IPv6-form GRH yields exactly its SGID and DGID.
func FuzzParseGRH(f *testing.F) {
	f.Add(grh6(testutil.GID("fe80::1"), ipoib.BroadcastMGID(0xffff, 2)))
	v4 := make([]byte, grhLen)
	copy(v4[20:], []byte{0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2})
	f.Add(v4)
	f.Add([]byte{})
	f.Add(make([]byte, grhLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, d, err := parseGRH(b)
		if err != nil || len(b) < grhLen || b[0]>>4 != 6 {
			return
		}
		if !bytes.Equal(s[:], b[8:24]) || !bytes.Equal(d[:], b[24:40]) {
			t.Fatalf("GIDs %s %s from %x", s, d, b)
		}
	})
}

// TestIfaceGroupMTU: a datagram-mode IPoIB interface's MTU is the IPoIB
// MTU of its broadcast group (or less); connected mode, or an MTU below
// 2044, tells nothing.
func TestIfaceGroupMTU(t *testing.T) {
	for _, c := range []struct {
		b    ipoibBind
		want int
	}{
		{ipoibBind{mtu: 4092}, 4096},
		{ipoibBind{mtu: 2044}, 2048},
		{ipoibBind{mtu: 4000}, 2048},
		{ipoibBind{mtu: 1500}, 0},
		{ipoibBind{mtu: 65520, connected: true}, 0},
		{ipoibBind{mtu: 2044, connected: true}, 0},
	} {
		if got := ifaceGroupMTU(c.b); got != c.want {
			t.Errorf("%+v: %d, want %d", c.b, got, c.want)
		}
	}
}
