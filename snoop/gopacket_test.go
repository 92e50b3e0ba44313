package snoop

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// The reference decoders: gopacket's layers, as the parsers used them
// before they read reports in place. gopacket checks no IGMP or ICMPv6
// checksum and decodes a first fragment as a whole message; everything
// else the parsers accept, it must decode to the same records.

// gopacketIGMP decodes an IGMP report or leave with gopacket.
func gopacketIGMP(pkt []byte) ([]Record, bool) {
	if !IsIGMP(pkt) {
		return nil, false
	}
	tl := int(binary.BigEndian.Uint16(pkt[2:4]))
	if tl > len(pkt) || tl < int(pkt[0]&0x0f)*4+8 {
		return nil, false
	}
	p := gopacket.NewPacket(pkt[:tl], layers.LayerTypeIPv4, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	if p.ErrorLayer() != nil {
		return nil, false
	}
	if l, ok := p.Layer(layers.LayerTypeIGMP).(*layers.IGMPv1or2); ok {
		switch l.Type {
		case igmpV1Report, igmpV2Report, igmpV2Leave:
			return gopacketOne(l.GroupAddress, l.Type == igmpV2Leave, true)
		}
		return nil, false
	}
	l, ok := p.Layer(layers.LayerTypeIGMP).(*layers.IGMP)
	if !ok || l.Type != igmpV3Report || len(l.GroupRecords) != int(l.NumberOfGroupRecords) {
		return nil, false
	}
	return gopacketRecords(l.GroupRecords, func(r layers.IGMPv3GroupRecord) ([]byte, uint8, int) {
		return r.MulticastAddress, uint8(r.Type), int(r.NumberOfSources)
	}, true)
}

// gopacketMLD decodes an MLD report or done with gopacket.
func gopacketMLD(pkt []byte) ([]Record, bool) {
	if !IsMLD(pkt) {
		return nil, false
	}
	tl := 40 + int(binary.BigEndian.Uint16(pkt[4:6]))
	if tl > len(pkt) {
		return nil, false
	}
	p := gopacket.NewPacket(pkt[:tl], layers.LayerTypeIPv6, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	if p.ErrorLayer() != nil {
		return nil, false
	}
	if l, ok := p.Layer(layers.LayerTypeMLDv1MulticastListenerReport).(*layers.MLDv1MulticastListenerReportMessage); ok {
		return gopacketOne(l.MulticastAddress, false, false)
	}
	if l, ok := p.Layer(layers.LayerTypeMLDv1MulticastListenerDone).(*layers.MLDv1MulticastListenerDoneMessage); ok {
		return gopacketOne(l.MulticastAddress, true, false)
	}
	l, ok := p.Layer(layers.LayerTypeMLDv2MulticastListenerReport).(*layers.MLDv2MulticastListenerReportMessage)
	if !ok || len(l.MulticastAddressRecords) != int(l.NumberOfMulticastAddressRecords) {
		return nil, false
	}
	return gopacketRecords(l.MulticastAddressRecords, func(r layers.MLDv2MulticastAddressRecord) ([]byte, uint8, int) {
		return r.MulticastAddress, uint8(r.RecordType), int(r.N)
	}, false)
}

// gopacketRecords interprets gopacket's IGMPv3 or MLDv2 records, whose
// types differ only in field names.
func gopacketRecords[R any](recs []R, fields func(R) (group []byte, typ uint8, sources int), v4 bool) ([]Record, bool) {
	var out []Record
	for _, r := range recs {
		group, typ, sources := fields(r)
		rec, keep, ok := gopacketRecord(group, typ, sources, v4)
		if !ok {
			return nil, false
		}
		if keep {
			out = append(out, rec)
		}
	}
	return out, true
}

func gopacketOne(ip []byte, leave, v4 bool) ([]Record, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || a.Unmap().Is4() != v4 || !a.IsMulticast() {
		return nil, false
	}
	return []Record{{Group: a.Unmap(), Leave: leave}}, true
}

func gopacketRecord(ip []byte, typ uint8, sources int, v4 bool) (r Record, keep, ok bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || a.Unmap().Is4() != v4 || !a.IsMulticast() {
		return r, false, false
	}
	r.Group = a.Unmap()
	switch typ {
	case 1, 3:
		r.Leave = sources == 0
	case 2, 4, 5:
	case 6:
		return r, false, true
	default:
		return r, false, false
	}
	return r, true, true
}

// differ checks that parse and the gopacket decoder ref agree on b.
// Where both accept it, they agree on its records. Where ref accepts it
// and parse does not, parse's reason is one gopacket does not check: the
// checksum, or, for IGMP, a fragment.
func differ(t *testing.T, b []byte, parse func([]byte) (Records, error), ref func([]byte) ([]Record, bool)) {
	recs, err := parse(b)
	got := records(recs)
	want, ok := ref(b)
	switch {
	case err == nil && ok:
		if !slices.Equal(got, want) {
			t.Fatalf("records %v, gopacket %v", got, want)
		}
	case ok && !errors.Is(err, ErrChecksum) && !fragment(b):
		t.Fatalf("gopacket decodes %v, parser says %v", want, err)
	}
}

// fragment reports whether b is an IPv4 fragment.
func fragment(b []byte) bool {
	ip, ok := header.ParseIPv4(b)
	return ok && (ip.MoreFragments() || ip.FragmentOffset() != 0)
}

// TestGopacketAgrees runs the differential check on the known reports, so
// that a change in either decoder shows without fuzzing.
func TestGopacketAgrees(t *testing.T) {
	for _, h := range []string{igmpv3Report, igmpv2Report, igmpv2Leave, igmpv1Report} {
		b := testutil.Unhex(t, h)
		if _, ok := gopacketIGMP(b); !ok {
			t.Fatalf("gopacket rejects %s", h)
		}
		differ(t, b, ParseIGMP, gopacketIGMP)
	}
	for _, h := range []string{mldv2Report, mldv1Report} {
		b := testutil.Unhex(t, h)
		if _, ok := gopacketMLD(b); !ok {
			t.Fatalf("gopacket rejects %s", h)
		}
		differ(t, b, ParseMLD, gopacketMLD)
	}
}

func FuzzIGMPGopacket(f *testing.F) {
	for _, h := range []string{igmpv3Report, igmpv2Report, igmpv2Leave, igmpv1Report} {
		f.Add(testutil.Unhex(f, h))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		differ(t, b, ParseIGMP, gopacketIGMP)
		// The same with the checksum made right, so that the records of
		// mutated reports are compared, not only their rejection.
		if ip, ok := header.ParseIPv4(slices.Clone(b)); ok && len(ip.Payload()) >= 4 {
			differ(t, igmpSum(ip), ParseIGMP, gopacketIGMP)
		}
	})
}

func FuzzMLDGopacket(f *testing.F) {
	f.Add(testutil.Unhex(f, mldv2Report))
	f.Add(testutil.Unhex(f, mldv1Report))
	f.Fuzz(func(t *testing.T, b []byte) {
		differ(t, b, ParseMLD, gopacketMLD)
		// The same with the checksum made right, so that the records of
		// mutated reports are compared, not only their rejection.
		if ip, ok := header.ParseIPv6(slices.Clone(b)); ok && len(ip) > header.IPv6Len+1 {
			off := header.IPv6Len
			if ip.NextHeader() == 0 {
				off += 8 * (int(ip[off+1]) + 1)
			}
			if len(ip) >= off+4 {
				differ(t, mldSum(ip, off), ParseMLD, gopacketMLD)
			}
		}
	})
}
