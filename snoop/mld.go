// Package snoop watches the IGMP and MLD messages guests send, to learn
// which multicast groups they listen to, and builds the queries the shim
// sends them as querier. Reports are parsed with gopacket's layers (group
// records included) rather than by hand; they are rare, so the allocation
// this costs stays off the per-frame path. Table is the membership state
// machine (RFC 3376 §6 and RFC 3810 §7 as a snooping switch applies
// them): one for both protocols, driven by an injected clock.
package snoop

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Errors of the parsers.
var (
	ErrNotReport = errors.New("snoop: not a membership report or leave")
	ErrMalformed = errors.New("snoop: malformed membership message")
)

// Record is one group a report speaks of: joined (or still joined), or
// left.
type Record struct {
	Group netip.Addr
	Leave bool
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
	return nh == 58 && len(pkt) > off && (pkt[off] == 131 || pkt[off] == 132 || pkt[off] == 143)
}

// ParseMLD returns the records of an MLDv1 report or done, or an MLDv2
// report (an IPv6 packet).
func ParseMLD(pkt []byte) ([]Record, error) {
	if !IsMLD(pkt) {
		return nil, ErrNotReport
	}
	tl := 40 + int(binary.BigEndian.Uint16(pkt[4:6]))
	if tl > len(pkt) {
		return nil, ErrMalformed
	}
	p := gopacket.NewPacket(pkt[:tl], layers.LayerTypeIPv6, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	if p.ErrorLayer() != nil {
		return nil, ErrMalformed
	}
	if l, ok := p.Layer(layers.LayerTypeMLDv1MulticastListenerReport).(*layers.MLDv1MulticastListenerReportMessage); ok {
		return oneRecord(l.MulticastAddress, false, false)
	}
	if l, ok := p.Layer(layers.LayerTypeMLDv1MulticastListenerDone).(*layers.MLDv1MulticastListenerDoneMessage); ok {
		return oneRecord(l.MulticastAddress, true, false)
	}
	l, ok := p.Layer(layers.LayerTypeMLDv2MulticastListenerReport).(*layers.MLDv2MulticastListenerReportMessage)
	if !ok || len(l.MulticastAddressRecords) != int(l.NumberOfMulticastAddressRecords) {
		return nil, ErrMalformed
	}
	return v3Records(l.MulticastAddressRecords, func(r layers.MLDv2MulticastAddressRecord) ([]byte, uint8, int) {
		return r.MulticastAddress, uint8(r.RecordType), int(r.N)
	}, false)
}

// v3Records interprets the group records of an IGMPv3 or MLDv2 report,
// whose gopacket types differ only in field names.
func v3Records[R any](recs []R, fields func(R) (group []byte, typ uint8, sources int), v4 bool) ([]Record, error) {
	out := make([]Record, 0, len(recs))
	for _, r := range recs {
		group, typ, sources := fields(r)
		rec, keep, err := v3Record(group, typ, sources, v4)
		if err != nil {
			return nil, err
		}
		if keep {
			out = append(out, rec)
		}
	}
	return out, nil
}

// oneRecord is the record of a v1/v2 message about one group.
func oneRecord(ip []byte, leave, v4 bool) ([]Record, error) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || a.Unmap().Is4() != v4 || !a.IsMulticast() {
		return nil, ErrMalformed
	}
	return []Record{{Group: a.Unmap(), Leave: leave}}, nil
}

// v3Record interprets an IGMPv3/MLDv2 group record at group granularity
// (a snooping switch forwards whole groups): CHANGE_TO_INCLUDE or
// IS_INCLUDE with no sources is a leave, BLOCK_OLD_SOURCES changes
// nothing, everything else is a join.
func v3Record(ip []byte, typ uint8, sources int, v4 bool) (Record, bool, error) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || a.Unmap().Is4() != v4 || !a.IsMulticast() {
		return Record{}, false, ErrMalformed
	}
	r := Record{Group: a.Unmap()}
	switch typ {
	case 1, 3: // MODE_IS_INCLUDE, CHANGE_TO_INCLUDE_MODE
		r.Leave = sources == 0
	case 2, 4, 5: // MODE_IS_EXCLUDE, CHANGE_TO_EXCLUDE_MODE, ALLOW_NEW_SOURCES
	case 6: // BLOCK_OLD_SOURCES
		return r, false, nil
	default:
		return r, false, ErrMalformed
	}
	return r, true, nil
}
