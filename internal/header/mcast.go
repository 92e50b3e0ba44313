package header

import (
	"encoding/binary"
	"net/netip"

	"github.com/eipoib/eipoibd/internal/csum"
)

// IGMP offsets and sizes (RFC 3376 §4, RFC 2236 §2, RFC 1112 App. I).
const (
	IGMPMinLen     = 8
	igmpType       = 0
	igmpGroup      = 4
	igmpNumRecords = 6
)

// IGMP is a view of an IGMP message: the payload of its IPv4 packet.
type IGMP []byte

// ParseIGMP checks that b, the whole payload of an IPv4 packet of
// protocol 2, is long enough for an IGMP message (8 bytes).
func ParseIGMP(b []byte) (IGMP, bool) {
	if len(b) < IGMPMinLen {
		return nil, false
	}
	return IGMP(b), true
}

// ChecksumValid reports whether the checksum over the whole message is
// right. RFC 3376 §4.1.2 and §9 say "an IGMP message with an incorrect
// checksum MUST be ignored". The kernel's snooping bridge checks it so:
// net/ipv4/igmp.c ip_mc_check_igmp → ip_mc_check_igmp_csum →
// skb_checksum_trimmed(…, ip_mc_validate_checksum) over
// ip_transport_len.
func (h IGMP) ChecksumValid() bool { return csum.Fold(csum.Sum(0, h)) == 0 }

// Type is the message type.
func (h IGMP) Type() uint8 { return h[igmpType] }

// Group is the group address of an IGMPv1/v2 report or leave, or of a
// query (bytes 4 to 8).
func (h IGMP) Group() netip.Addr { return netip.AddrFrom4([4]byte(h[igmpGroup : igmpGroup+4])) }

// NumRecords is the number of group records an IGMPv3 report states.
func (h IGMP) NumRecords() int { return int(binary.BigEndian.Uint16(h[igmpNumRecords:])) }

// Records are the bytes that follow an IGMPv3 report's header: its group
// records (RFC 3376 §4.2), to walk with ParseGroupRecord.
func (h IGMP) Records() []byte { return h[IGMPMinLen:] }

// MLD offsets and sizes (RFC 2710 §3, RFC 3810 §5.2).
const (
	MLDMinLen      = 8  // an MLDv2 report's header
	MLDv1Len       = 24 // an MLDv1 message: header and address
	mldType        = 0
	mldGroup       = 8
	mldNumRecords  = 6
	MLDQuery       = 130 // multicast listener query, v1 or v2
	MLDv1Report    = 131 // multicast listener report (v1)
	MLDv1Done      = 132 // multicast listener done
	MLDv2Report    = 143 // version 2 multicast listener report
	ipv6AddrLength = 16
)

// MLD is a view of an MLD message: an ICMPv6 message, type first.
type MLD []byte

// ParseMLD checks that b, an ICMPv6 message, is long enough for its type
// as MLD: 24 bytes for MLDv1 (and the query), 8 for the MLDv2 report's
// header.
func ParseMLD(b []byte) (MLD, bool) {
	if len(b) < MLDMinLen {
		return nil, false
	}
	switch b[mldType] {
	case MLDQuery, MLDv1Report, MLDv1Done:
		if len(b) < MLDv1Len {
			return nil, false
		}
	}
	return MLD(b), true
}

// ChecksumValid reports whether the ICMPv6 checksum over the
// pseudo-header of src and dst (16 bytes each) and the whole message is
// right (RFC 4443 §2.3; RFC 3810 §5.2). The kernel's snooping bridge
// checks it so: net/ipv6/mcast_snoop.c ipv6_mc_check_mld →
// ipv6_mc_check_icmpv6 → skb_checksum_trimmed(…,
// ipv6_mc_validate_checksum). That is ip6_compute_pseudo over
// ipv6_transport_len, what follows the extension headers.
func (h MLD) ChecksumValid(src, dst []byte) bool {
	return csum.Fold(csum.Sum(csum.Pseudo(src, dst, ProtoICMPv6, len(h)), h)) == 0
}

// Type is the ICMPv6 type.
func (h MLD) Type() uint8 { return h[mldType] }

// Group is the multicast address of an MLDv1 query, report or done.
func (h MLD) Group() netip.Addr { return netip.AddrFrom16([16]byte(h[mldGroup : mldGroup+16])) }

// NumRecords is the number of multicast address records an MLDv2 report
// states.
func (h MLD) NumRecords() int { return int(binary.BigEndian.Uint16(h[mldNumRecords:])) }

// Records are the bytes that follow an MLDv2 report's header: its
// multicast address records (RFC 3810 §5.2), to walk with
// ParseGroupRecord.
func (h MLD) Records() []byte { return h[MLDMinLen:] }

// Group record offsets (RFC 3376 §4.2.4, RFC 3810 §5.2.4).
const (
	groupRecordHeaderLen = 4
	grecType             = 0
	grecAuxLen           = 1
	grecNumSources       = 2
)

// GroupRecord is a view of an IGMPv3 group record (RFC 3376 §4.2.4) or
// an MLDv2 multicast address record (RFC 3810 §5.2.4). They differ only
// in the length of their addresses. A record holds the type, auxiliary
// data length, number of sources, the group, the sources and the
// auxiliary data.
type GroupRecord []byte

// ParseGroupRecord checks that b starts with a group record whose
// addresses are addrLen bytes long (4 for IGMPv3, 16 for MLDv2) and whose
// sources and auxiliary data fit b, and returns the record and the bytes
// after it. The auxiliary data is stepped over (RFC 3376 §4.2.10, RFC
// 3810 §5.2.10: receivers ignore it).
func ParseGroupRecord(b []byte, addrLen int) (rec GroupRecord, rest []byte, ok bool) {
	if len(b) < groupRecordHeaderLen+addrLen {
		return nil, nil, false
	}
	n := groupRecordHeaderLen + addrLen*(1+int(binary.BigEndian.Uint16(b[grecNumSources:]))) + 4*int(b[grecAuxLen])
	if n > len(b) {
		return nil, nil, false
	}
	return GroupRecord(b[:n]), b[n:], true
}

// Type is the record type (1 MODE_IS_INCLUDE … 6 BLOCK_OLD_SOURCES).
func (r GroupRecord) Type() uint8 { return r[grecType] }

// NumSources is the number of source addresses.
func (r GroupRecord) NumSources() int { return int(binary.BigEndian.Uint16(r[grecNumSources:])) }

// Group is the group address: IPv4 or IPv6, as the record's length
// shows.
func (r GroupRecord) Group() netip.Addr {
	g := r[groupRecordHeaderLen:]
	addrLen := (len(r) - groupRecordHeaderLen - 4*int(r[grecAuxLen])) / (1 + r.NumSources())
	if addrLen == ipv6AddrLength {
		return netip.AddrFrom16([16]byte(g[:16]))
	}
	return netip.AddrFrom4([4]byte(g[:4]))
}
