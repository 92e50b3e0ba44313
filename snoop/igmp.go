package snoop

import "github.com/eipoib/eipoibd/internal/header"

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

// ParseIGMP checks an IGMPv1/v2 report, an IGMPv2 leave or an IGMPv3
// report (an IPv4 packet) whole and returns its records, read in place.
// A fragment (a report never is one) is malformed; a message whose IGMP
// checksum is wrong is ErrChecksum (RFC 3376 §9: ignored).
func ParseIGMP(pkt []byte) (Records, error) {
	if !IsIGMP(pkt) {
		return Records{}, ErrNotReport
	}
	// igmp.c ip_mc_check_iphdr: version, header length, total length.
	// Unlike it, the IPv4 header checksum (ip_fast_csum) is not checked:
	// the IGMP checksum below guards what snooping reads, and the packet
	// is forwarded as the guest sent it either way.
	ip, ok := header.ParseIPv4(pkt)
	if !ok || ip.MoreFragments() || ip.FragmentOffset() != 0 {
		return Records{}, ErrMalformed
	}
	msg, ok := header.ParseIGMP(ip.Payload())
	if !ok {
		return Records{}, ErrMalformed
	}
	if !msg.ChecksumValid() {
		return Records{}, ErrChecksum
	}
	switch msg.Type() {
	case igmpV1Report, igmpV2Report:
		return oneRecord(msg.Group(), false, true)
	case igmpV2Leave:
		return oneRecord(msg.Group(), true, true)
	}
	return v3Records(msg.Records(), msg.NumRecords(), 4)
}
