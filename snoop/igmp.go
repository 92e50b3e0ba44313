package snoop

import (
	"encoding/binary"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// IGMP message types (RFC 3376 §4, RFC 2236 §2.1, RFC 1112 App. I).
const (
	igmpQuery    = 0x11
	igmpV1Report = 0x12
	igmpV2Report = 0x16
	igmpV2Leave  = 0x17
	igmpV3Report = 0x22
)

// IsIGMP is a cheap pre-check on an IPv4 packet: protocol 2, an IGMP
// report or leave.
func IsIGMP(pkt []byte) bool {
	if len(pkt) < 20 || pkt[0]>>4 != 4 || pkt[9] != 2 {
		return false
	}
	off := int(pkt[0]&0x0f) * 4
	if off < 20 || len(pkt) <= off {
		return false
	}
	switch pkt[off] {
	case igmpV1Report, igmpV2Report, igmpV2Leave, igmpV3Report:
		return true
	}
	return false
}

// ParseIGMP returns the records of an IGMPv1/v2 report, an IGMPv2 leave
// or an IGMPv3 report (an IPv4 packet).
func ParseIGMP(pkt []byte) ([]Record, error) {
	if !IsIGMP(pkt) {
		return nil, ErrNotReport
	}
	tl := int(binary.BigEndian.Uint16(pkt[2:4]))
	if tl > len(pkt) || tl < int(pkt[0]&0x0f)*4+8 {
		return nil, ErrMalformed
	}
	p := gopacket.NewPacket(pkt[:tl], layers.LayerTypeIPv4, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	if p.ErrorLayer() != nil {
		return nil, ErrMalformed
	}
	if l, ok := p.Layer(layers.LayerTypeIGMP).(*layers.IGMPv1or2); ok {
		switch l.Type {
		case igmpV1Report, igmpV2Report:
			return oneRecord(l.GroupAddress, false, true)
		case igmpV2Leave:
			return oneRecord(l.GroupAddress, true, true)
		}
		return nil, ErrMalformed
	}
	l, ok := p.Layer(layers.LayerTypeIGMP).(*layers.IGMP)
	if !ok || l.Type != igmpV3Report || len(l.GroupRecords) != int(l.NumberOfGroupRecords) {
		return nil, ErrMalformed
	}
	return v3Records(l.GroupRecords, func(r layers.IGMPv3GroupRecord) ([]byte, uint8, int) {
		return r.MulticastAddress, uint8(r.Type), int(r.NumberOfSources)
	}, true)
}
