// Package snoop watches the IGMP and MLD messages guests send, to learn
// which multicast groups they listen to, and builds the queries the shim
// sends them as querier. Reports are read in place through
// internal/header's views (checksum checked, group records walked with
// Records.Next), so snooping allocates nothing on the TX path. Table is
// the membership state machine (RFC 3376 §6 and RFC 3810 §7 as a
// snooping switch applies them): one for both protocols, driven by an
// injected clock.
package snoop

import (
	"errors"
	"net/netip"

	"github.com/eipoib/eipoibd/internal/header"
)

// Errors of the parsers.
var (
	ErrNotReport = errors.New("snoop: not a membership report or leave")
	ErrMalformed = errors.New("snoop: malformed membership message")
	ErrChecksum  = errors.New("snoop: membership message with a wrong checksum")
)

// Record is one group a report speaks of: joined (or still joined), or
// left.
type Record struct {
	Group netip.Addr
	Leave bool
}

// Records are the group records of a membership message that ParseIGMP
// or ParseMLD checked whole, read in place from the packet (which must
// not change while they are walked): Next returns them in order,
// BLOCK_OLD_SOURCES records left out. The zero value has none.
type Records struct {
	one     Record // a v1/v2 message's record, if hasOne
	hasOne  bool
	rest    []byte // v3 records not walked yet
	n       int    // how many
	addrLen int    // 4 (IGMPv3) or 16 (MLDv2)
}

// Next returns the next record; ok is false when there are no more.
func (r *Records) Next() (rec Record, ok bool) {
	if r.hasOne {
		r.hasOne = false
		return r.one, true
	}
	for r.n > 0 {
		g, rest, _ := header.ParseGroupRecord(r.rest, r.addrLen) // checked by v3Records
		r.rest, r.n = rest, r.n-1
		if rec, keep := v3Record(g); keep {
			return rec, true
		}
	}
	return Record{}, false
}

// IsMLD is a cheap pre-check on an IPv6 packet: an MLD report (131, 143)
// or done (132), directly or after a hop-by-hop options header (where
// MLD's router alert lives).
func IsMLD(pkt []byte) bool {
	if len(pkt) < 41 || pkt[0]>>4 != 6 {
		return false
	}
	off, nh := 40, pkt[6]
	if nh == 0 { // hop-by-hop options
		if len(pkt) < 42 {
			return false
		}
		nh = pkt[40]
		off += 8 * (int(pkt[41]) + 1)
	}
	return nh == header.ProtoICMPv6 && len(pkt) > off && (pkt[off] == header.MLDv1Report || pkt[off] == header.MLDv1Done || pkt[off] == header.MLDv2Report)
}

// ParseMLD checks an MLDv1 report or done, or an MLDv2 report (an IPv6
// packet, the message directly after the fixed header or after a
// hop-by-hop options header) whole and returns its records, read in
// place. A message whose ICMPv6 checksum is wrong is ErrChecksum.
func ParseMLD(pkt []byte) (Records, error) {
	if !IsMLD(pkt) {
		return Records{}, ErrNotReport
	}
	ip, ok := header.ParseIPv6(pkt)
	if !ok {
		return Records{}, ErrMalformed
	}
	off := header.IPv6Len
	if ip.NextHeader() == 0 {
		if len(ip) < header.IPv6Len+2 { // IsMLD saw it in the padding
			return Records{}, ErrMalformed
		}
		off += 8 * (int(ip[header.IPv6Len+1]) + 1)
	}
	if off > len(ip) {
		return Records{}, ErrMalformed
	}
	m, ok := header.ParseMLD(ip[off:])
	if !ok {
		return Records{}, ErrMalformed
	}
	if !m.ChecksumValid(ip.SrcBytes(), ip.DstBytes()) {
		return Records{}, ErrChecksum
	}
	switch m.Type() {
	case header.MLDv1Report:
		return oneRecord(m.Group(), false, false)
	case header.MLDv1Done:
		return oneRecord(m.Group(), true, false)
	}
	return v3Records(m.Records(), m.NumRecords(), 16)
}

// oneRecord is the record of a v1/v2 message about one group, which must
// be a multicast address of the message's family.
func oneRecord(a netip.Addr, leave, v4 bool) (Records, error) {
	if !isGroup(a, v4) {
		return Records{}, ErrMalformed
	}
	return Records{one: Record{Group: a, Leave: leave}, hasOne: true}, nil
}

// isGroup reports whether a is a multicast address of the family a
// message of IGMP (v4) or MLD speaks of: an IPv4-mapped address in MLD is
// none.
func isGroup(a netip.Addr, v4 bool) bool {
	return a.Is4() == v4 && !a.Is4In6() && a.IsMulticast()
}

// v3Records checks the n group records of an IGMPv3 or MLDv2 report in
// b, whose addresses are addrLen bytes long, and returns them to walk:
// each must fit, be of a known type and name a multicast group.
func v3Records(b []byte, n, addrLen int) (Records, error) {
	rest := b
	for range n {
		g, r, ok := header.ParseGroupRecord(rest, addrLen)
		if !ok || g.Type() < 1 || g.Type() > 6 || !isGroup(g.Group(), addrLen == 4) {
			return Records{}, ErrMalformed
		}
		rest = r
	}
	return Records{rest: b, n: n, addrLen: addrLen}, nil
}

// v3Record interprets an IGMPv3/MLDv2 group record (of a known type, as
// v3Records checked) at group granularity (a snooping switch forwards
// whole groups): CHANGE_TO_INCLUDE or IS_INCLUDE with no sources is a
// leave, BLOCK_OLD_SOURCES changes nothing, everything else is a join.
func v3Record(g header.GroupRecord) (Record, bool) {
	r := Record{Group: g.Group()}
	switch g.Type() {
	case 1, 3: // MODE_IS_INCLUDE, CHANGE_TO_INCLUDE_MODE
		r.Leave = g.NumSources() == 0
	case 6: // BLOCK_OLD_SOURCES
		return r, false
	} // 2, 4, 5: MODE_IS_EXCLUDE, CHANGE_TO_EXCLUDE_MODE, ALLOW_NEW_SOURCES
	return r, true
}
