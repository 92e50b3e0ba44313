package udprate

import (
	"bytes"
	"testing"
)

// datagram builds a size-byte datagram with header h.
func datagram(size int, h Header) []byte {
	b := make([]byte, size)
	Put(b, h)
	return b
}

func TestPutParseRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Kind: Data, Flow: 0, Flows: 1, Seq: 0},
		{Kind: Data, Flow: 255, Flows: MaxFlows, Seq: MaxSeq},
		{Kind: End, Flow: 3, Flows: 4, Seq: 123456789},
	} {
		got, err := Parse(datagram(HeaderLen, h))
		if err != nil || got != h {
			t.Errorf("Parse(Put(%+v)) = %+v, %v", h, got, err)
		}
	}
}

func TestParseRejects(t *testing.T) {
	good := datagram(64, Header{Kind: Data, Flow: 1, Flows: 2, Seq: 7})
	mod := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"15 bytes", good[:HeaderLen-1]},
		{"other magic", mod(func(b []byte) { b[0] ^= 1 })},
		{"unknown kind", mod(func(b []byte) { b[2] = 2 })},
		{"other version", mod(func(b []byte) { b[3] = 2 })},
		{"no flows", mod(func(b []byte) { b[6], b[7] = 0, 0 })},
		{"too many flows", mod(func(b []byte) { b[6], b[7] = 1, 1 })},
		{"flow id not below flows", mod(func(b []byte) { b[5] = 2 })},
		{"sequence number above MaxSeq", mod(func(b []byte) { b[8] = 0x80 })},
	} {
		if h, err := Parse(tc.b); err != ErrNotOurs {
			t.Errorf("%s: Parse = %+v, %v; want ErrNotOurs", tc.name, h, err)
		}
	}
}

// FuzzParse parses arbitrary datagrams: one Parse accepts is exactly
// what Put writes for its header, and the Tracker counts each datagram
// in exactly one bucket, a data datagram seen twice as a duplicate the
// second time.
func FuzzParse(f *testing.F) {
	f.Add(datagram(64, Header{Kind: Data, Flow: 0, Flows: 2, Seq: 0}))
	f.Add(datagram(HeaderLen, Header{Kind: Data, Flow: 1, Flows: 2, Seq: window + 3}))
	f.Add(datagram(64, Header{Kind: End, Flow: 0, Flows: 1, Seq: 100000}))
	f.Add(datagram(64, Header{Kind: Data, Flow: MaxFlows - 1, Flows: MaxFlows, Seq: MaxSeq}))
	f.Add([]byte("UR\x00\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var tr Tracker
		tr.Add(b)
		tr.Add(b)
		s := tr.Stats()
		h, err := Parse(b)
		if err != nil {
			if s != (Stats{Invalid: 2}) {
				t.Fatalf("rejected datagram counted as %+v", s)
			}
			return
		}
		if want := datagram(HeaderLen, h); !bytes.Equal(b[:HeaderLen], want) {
			t.Fatalf("Parse(%x) = %+v, which Put writes as %x", b, h, want)
		}
		switch h.Kind {
		case End:
			if s.Received != 0 || tr.Done() != (h.Flows == 1) || s.Sent != h.Seq {
				t.Fatalf("end datagram %+v: Stats %+v, Done %v", h, s, tr.Done())
			}
		case Data:
			if s.Received != 1 || s.Duplicates != 1 || s.Bytes != uint64(len(b)) || s.Sent != h.Seq+1 || s.Lost != h.Seq {
				t.Fatalf("data datagram %+v twice: Stats %+v", h, s)
			}
		}
	})
}
