package kernelfabric

import (
	"strconv"
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
)

// FuzzParseSockaddrLL: any bytes and name length decode or are refused,
// never crash, and a decoded address lies within the name.
func FuzzParseSockaddrLL(f *testing.F) {
	var b [SockaddrLLIPoIBLen]byte
	n := PutSockaddrLL(&b, 7, 0x0800, McastHwAddr(testGID))
	f.Add(b[:], n)
	f.Add(b[:], SockaddrLLSize)
	f.Add([]byte{17, 0, 0x86, 0xdd, 3, 0, 0, 0, 32, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 20)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		sa, err := ParseSockaddrLL(b, n)
		if err == nil && 12+len(sa.Addr) > n {
			t.Fatalf("address of %d bytes in a %d-byte name", len(sa.Addr), n)
		}
	})
}

// FuzzParseMreq: membership options decode or are refused.
func FuzzParseMreq(f *testing.F) {
	var b [MreqMaxSize]byte
	PutMreq(&b, 9, testGID)
	f.Add(b[:])
	f.Add(b[:MreqSize])
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMreq(b)
		if err == nil && int(m.Alen) != len(m.Addr) {
			t.Fatalf("alen %d with %d bytes", m.Alen, len(m.Addr))
		}
	})
}

// FuzzParseVnetHdr: received virtio_net_hdrs decode or are refused.
func FuzzParseVnetHdr(f *testing.F) {
	f.Add(make([]byte, VnetHdrLen))
	f.Add([]byte{1, 1, 76, 0, 0x78, 0x05, 44, 0, 16, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseVnetHdr(b)
		if err == nil {
			var out [VnetHdrLen]byte
			h.Put(&out)
			if string(out[:]) != string(b[:VnetHdrLen]) {
				t.Fatal("round trip")
			}
		}
	})
}

// FuzzIsChildName: IsChildName reads link names from the kernel's dump,
// and reclaim deletes what it accepts. Any name is accepted or refused,
// never crashes. A name it accepts is exactly one ChildName or
// GroupChildName gives under the stem, so that reclaim deletes nothing
// the backend would not have made.
func FuzzIsChildName(f *testing.F) {
	f.Add("ib0", "ib0.e3")
	f.Add("ib0", "ib0.m8001")
	f.Add("ib0", "ib0.e03")
	f.Add("ib0", "ib0.mFFFF")
	f.Add(ChildStem("ibp129s0f0np0xy"), ChildStem("ibp129s0f0np0xy")+".e99999")
	f.Fuzz(func(t *testing.T, stem, name string) {
		if !IsChildName(stem, name) {
			return
		}
		rest := name[len(stem)+2:]
		var again string
		if name[len(stem)+1] == 'e' {
			n, _ := strconv.Atoi(rest)
			again, _ = ChildName(stem, n)
		} else {
			v, _ := strconv.ParseUint(rest, 16, 16)
			again = GroupChildName(stem, ipoib.PKey(v))
		}
		if again != name {
			t.Fatalf("IsChildName(%q, %q), but the backend names it %q", stem, name, again)
		}
	})
}
