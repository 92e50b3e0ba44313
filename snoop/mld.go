// Package snoop watches what guests send to learn what the fabric side
// must do for them: which IPv6 multicast groups they listen to (MLD
// reports), so that the port joins the matching MGIDs. Reports are parsed
// with gopacket's layers rather than by hand; they are rare, so the
// allocation this costs stays off the per-frame path.
package snoop

import (
	"errors"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Errors of MLDJoins.
var (
	ErrNotMLDReport = errors.New("snoop: not an MLD report")
	ErrMalformed    = errors.New("snoop: malformed MLD report")
)

// IsMLDReport is a cheap pre-check on an IPv6 packet: ICMPv6 type 131
// (MLDv1 report) or 143 (MLDv2 report), directly or after a hop-by-hop
// options header (where MLD's router alert lives).
func IsMLDReport(pkt []byte) bool {
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
	return nh == 58 && len(pkt) > off && (pkt[off] == 131 || pkt[off] == 143)
}

// MLDJoins returns the groups an MLD report (an IPv6 packet) says the
// sender listens to: the address of an MLDv1 report, and each MLDv2
// record that is not a leave (CHANGE_TO_INCLUDE or IS_INCLUDE with no
// sources, or BLOCK_OLD_SOURCES).
func MLDJoins(pkt []byte) ([]netip.Addr, error) {
	if !IsMLDReport(pkt) {
		return nil, ErrNotMLDReport
	}
	p := gopacket.NewPacket(pkt, layers.LayerTypeIPv6, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	if el := p.ErrorLayer(); el != nil {
		return nil, ErrMalformed
	}
	if l, ok := p.Layer(layers.LayerTypeMLDv1MulticastListenerReport).(*layers.MLDv1MulticastListenerReportMessage); ok {
		a, ok := netip.AddrFromSlice(l.MulticastAddress)
		if !ok || !a.Is6() || !a.IsMulticast() {
			return nil, ErrMalformed
		}
		return []netip.Addr{a}, nil
	}
	l, ok := p.Layer(layers.LayerTypeMLDv2MulticastListenerReport).(*layers.MLDv2MulticastListenerReportMessage)
	if !ok {
		return nil, ErrMalformed
	}
	var out []netip.Addr
	for _, r := range l.MulticastAddressRecords {
		a, ok := netip.AddrFromSlice(r.MulticastAddress)
		if !ok || !a.Is6() || !a.IsMulticast() {
			return nil, ErrMalformed
		}
		switch r.RecordType {
		case layers.MLDv2MulticastAddressRecordTypeModeIsIncluded, layers.MLDv2MulticastAddressRecordTypeChangeToIncludeMode:
			if r.N == 0 {
				continue // include nothing: a leave
			}
		case layers.MLDv2MulticastAddressRecordTypeBlockOldSources:
			continue
		}
		out = append(out, a)
	}
	return out, nil
}
