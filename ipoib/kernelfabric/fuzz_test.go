package kernelfabric

import "testing"

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
