package simfabric

// The wire format (docs/architecture.md, "The simulated UD fabric's wire format"): one UDP datagram
// to port 4791 per IB packet, its payload a RoCEv2-style UD SEND-only:
//
//	BTH  12  opcode 0x64 | SE M Pad(2) TVer(4) | P_Key | rsvd | DestQP(24) | A rsvd | PSN(24)
//	DETH  8  Q_Key(32) | rsvd | SrcQP(24)
//	payload  IPoIB header + packet, padded to 4 bytes (pad count in the BTH)
//	ICRC  4  CRC-32 over the masked pseudo-packet, least significant byte first

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/eipoib/eipoibd/ipoib"
)

// Wire constants.
const (
	UDPPort        = 4791 // RoCEv2's UDP port
	OpUDSendOnly   = 0x64
	BTHLen         = 12
	DETHLen        = 8
	ICRCLen        = 4
	HeaderLen      = BTHLen + DETHLen
	ipv6HeaderLen  = 40
	udpHeaderLen   = 8
	UnderlayExtra  = ipv6HeaderLen + udpHeaderLen + HeaderLen + ICRCLen // 72
	minPacketLen   = HeaderLen + ICRCLen
	udpNextHeader  = 17
	icrcMaskedLRH  = 8
	icrcPrefixSize = icrcMaskedLRH + ipv6HeaderLen + udpHeaderLen
)

// Packet is the decoded form of one fabric packet.
type Packet struct {
	PKey    uint16
	DestQPN uint32
	PSN     uint32
	QKey    uint32
	SrcQPN  uint32
	Payload []byte // IPoIB header and packet, pad removed; a view into the datagram
}

// Codec encodes and decodes fabric packets. Its scratch space keeps the
// ICRC computation off the heap, so one Codec serves one goroutine; the
// zero value is ready.
type Codec struct {
	// pre is the CRC input that comes before BTH byte 5: the masked
	// pseudo-header, BTH bytes 0-3 and the masked reserved byte; preCRC
	// its CRC once preSet. A one-entry cache: ICRC computes it again
	// only when the destination, the source port, the length or the
	// P_Key differ from the last packet's (a train's packets share it
	// but for the last's length). hash/crc32 takes a slice under 64
	// bytes 8 bytes a step (slicing-by-8), without the carry-less
	// multiply it uses from 64 on: computed each time, the 61 bytes
	// cost as much as the CRC of a 4 KB payload.
	pre    [icrcPrefixSize + 5]byte
	preCRC uint32
	preSet bool
}

// Encode writes BTH and DETH into the HeaderLen bytes before payload
// (buf[off-HeaderLen:off]), pads the payload and appends the ICRC, and
// returns the UDP payload as a view of buf. buf[off:] is the payload;
// buf needs 3+ICRCLen bytes of spare capacity after it. src, dst and
// srcPort/dstPort describe the IPv6/UDP headers the kernel will write,
// which the ICRC covers.
func (c *Codec) Encode(buf []byte, off int, p *Packet, src, dst *[16]byte, srcPort, dstPort uint16) []byte {
	n := len(buf) - off
	pad := (4 - n%4) % 4
	end := len(buf) + pad
	out := buf[off-HeaderLen : end+ICRCLen]
	for i := len(buf); i < end; i++ {
		buf[:end][i] = 0
	}
	b := out
	b[0] = OpUDSendOnly
	b[1] = byte(pad) << 4 // SE 0, M 0, TVer 0
	binary.BigEndian.PutUint16(b[2:4], p.PKey)
	b[4] = 0
	putU24(b[5:8], p.DestQPN)
	b[8] = 0 // A 0
	putU24(b[9:12], p.PSN)
	binary.BigEndian.PutUint32(b[12:16], p.QKey)
	b[16] = 0
	putU24(b[17:20], p.SrcQPN)
	udpLen := udpHeaderLen + len(out)
	crc := c.ICRC(out[:len(out)-ICRCLen], src, dst, srcPort, dstPort, udpLen)
	binary.LittleEndian.PutUint32(out[len(out)-ICRCLen:], crc)
	return out
}

func putU24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

func u24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

// ICRC computes the invariant CRC of IBA Annex A17 for a RoCEv2 packet
// whose BTH, DETH, payload and pad are ib (everything but the ICRC). It
// is a CRC-32 over, in order:
//   - 8 bytes of 0xFF (masked LRH);
//   - the IPv6 header with traffic class, flow label and hop limit all
//     ones;
//   - the UDP header with checksum 0xFFFF;
//   - ib with the BTH reserved byte (byte 4) all ones.
func (c *Codec) ICRC(ib []byte, src, dst *[16]byte, srcPort, dstPort uint16, udpLen int) uint32 {
	var pre [icrcPrefixSize + 5]byte
	for i := 0; i < icrcMaskedLRH; i++ {
		pre[i] = 0xff
	}
	h := pre[icrcMaskedLRH:]
	h[0], h[1], h[2], h[3] = 0x6f, 0xff, 0xff, 0xff // version 6, TC and flow label masked
	binary.BigEndian.PutUint16(h[4:6], uint16(udpLen))
	h[6], h[7] = udpNextHeader, 0xff // next header UDP, hop limit masked
	copy(h[8:24], src[:])
	copy(h[24:40], dst[:])
	u := h[ipv6HeaderLen:]
	binary.BigEndian.PutUint16(u[0:2], srcPort)
	binary.BigEndian.PutUint16(u[2:4], dstPort)
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen))
	u[6], u[7] = 0xff, 0xff // checksum masked
	copy(pre[icrcPrefixSize:], ib[:4])
	pre[icrcPrefixSize+4] = 0xff // BTH reserved byte masked
	if !c.preSet || pre != c.pre {
		c.pre, c.preSet = pre, true
		c.preCRC = crc32.Update(0, crc32.IEEETable, c.pre[:]) // c.pre: pre would escape
	}
	return crc32.Update(c.preCRC, crc32.IEEETable, ib[5:])
}

// DecodeError is why Decode rejected a datagram; its String is the drop
// counter name.
type DecodeError uint8

// Decode errors.
const (
	ErrTruncated DecodeError = iota + 1
	ErrOpcode
	ErrVersion
	ErrICRC
	ErrPad
	numDecodeErrors
)

// String returns the drop counter name, that of its Drop; "unknown"
// for a value that is no decode error.
func (e DecodeError) String() string {
	if e.Drop() == ipoib.DropNone {
		return "unknown"
	}
	return e.Drop().String()
}

func (e DecodeError) Error() string { return "simfabric: " + e.String() }

// Decode parses and verifies one UDP payload received from src to dst
// (the IPv6 addresses) with the given UDP ports. On success p.Payload is
// a view of b without pad and ICRC.
func (c *Codec) Decode(b []byte, src, dst *[16]byte, srcPort, dstPort uint16, p *Packet) error {
	if len(b) < minPacketLen || len(b)%4 != 0 {
		return ErrTruncated
	}
	if b[0] != OpUDSendOnly {
		return ErrOpcode
	}
	if b[1]&0x0f != 0 {
		return ErrVersion
	}
	body := b[:len(b)-ICRCLen]
	want := binary.LittleEndian.Uint32(b[len(b)-ICRCLen:])
	if c.ICRC(body, src, dst, srcPort, dstPort, udpHeaderLen+len(b)) != want {
		return ErrICRC
	}
	pad := int(b[1]>>4) & 0x3
	if len(body)-HeaderLen < pad {
		return ErrPad
	}
	p.PKey = binary.BigEndian.Uint16(b[2:4])
	p.DestQPN = u24(b[5:8])
	p.PSN = u24(b[9:12])
	p.QKey = binary.BigEndian.Uint32(b[12:16])
	p.SrcQPN = u24(b[17:20])
	p.Payload = body[HeaderLen : len(body)-pad]
	return nil
}
