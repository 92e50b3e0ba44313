// Package udprate is a UDP packet generator and counter for the network
// benchmark. Its paced sender moves fixed-size datagrams in sendmmsg
// batches over one socket per flow. Its receiver takes them in recvmmsg
// batches and accounts for every sequence number: received, lost,
// duplicated, reordered. Neither allocates per datagram.
//
// Every datagram starts with a 16-byte header (big-endian):
//
//	0  magic 0x5552 ("UR")
//	2  kind: 0 data, 1 end
//	3  version 1
//	4  flow id, 0 to flows-1
//	6  flows: how many flows the sender runs
//	8  data: the datagram's sequence number in its flow, from 0;
//	   end: how many data datagrams the flow sent (both up to MaxSeq)
//
// The rest of the datagram is zeros. A sender closes each flow with a few
// end datagrams, so that a receiver knows exactly what was sent even when
// the last data datagrams were lost, and can stop without waiting.
package udprate

import (
	"encoding/binary"
	"errors"
)

// HeaderLen is the size of the header, the smallest datagram.
const HeaderLen = 16

// MaxSize is the largest datagram: the most a UDP/IPv4 datagram carries.
const MaxSize = 65507

// MaxSeq is the largest sequence number (and end count) Parse accepts,
// far beyond what a sender reaches, so that counts never wrap.
const MaxSeq = 1<<63 - 1

// MaxFlows is the most flows a sender runs and a receiver tells apart.
const MaxFlows = 256

const (
	magic   = 0x5552
	version = 1
)

// Kind is what a datagram is.
type Kind uint8

const (
	// Data is a datagram of the measured stream.
	Data Kind = 0
	// End closes a flow; its Seq is how many data datagrams it sent.
	End Kind = 1
)

// Header is the parsed start of a datagram.
type Header struct {
	Kind  Kind
	Flow  uint16
	Flows uint16
	Seq   uint64
}

// ErrNotOurs is the error of Parse for a datagram this package did not
// build: too short, another magic or version, an unknown kind, a flow id
// out of range, or a sequence number above MaxSeq.
var ErrNotOurs = errors.New("udprate: not a udprate datagram")

// Put writes h into the first HeaderLen bytes of b.
func Put(b []byte, h Header) {
	_ = b[HeaderLen-1]
	binary.BigEndian.PutUint16(b[0:], magic)
	b[2], b[3] = byte(h.Kind), version
	binary.BigEndian.PutUint16(b[4:], h.Flow)
	binary.BigEndian.PutUint16(b[6:], h.Flows)
	binary.BigEndian.PutUint64(b[8:], h.Seq)
}

// putSeq rewrites the sequence number of a header Put wrote into b.
func putSeq(b []byte, seq uint64) { binary.BigEndian.PutUint64(b[8:], seq) }

// Parse reads the header of datagram b.
func Parse(b []byte) (Header, error) {
	if len(b) < HeaderLen || binary.BigEndian.Uint16(b) != magic || b[3] != version || Kind(b[2]) > End {
		return Header{}, ErrNotOurs
	}
	h := Header{Kind: Kind(b[2]), Flow: binary.BigEndian.Uint16(b[4:]), Flows: binary.BigEndian.Uint16(b[6:]), Seq: binary.BigEndian.Uint64(b[8:])}
	if h.Flows == 0 || h.Flows > MaxFlows || h.Flow >= h.Flows || h.Seq > MaxSeq {
		return Header{}, ErrNotOurs
	}
	return h, nil
}
