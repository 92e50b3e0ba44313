package snoop

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/internal/csum"
)

// AllNodes is ff02::1, where general queries go.
var AllNodes = netip.MustParseAddr("ff02::1")

// MLDv2QueryLen is the length of the IPv6 packet AppendMLDv2Query builds.
const MLDv2QueryLen = 40 + 8 + 28

// AppendMLDv2Query appends an MLDv2 general query (RFC 3810 §5.1) from
// the link-local address src to ff02::1, with a router alert hop-by-hop
// header and hop limit 1, asking listeners to report within maxResp
// (up to 32 s, the range of the linear code). Guests answer with reports
// of every group they listen to, which is how the shim learns them after
// it starts.
func AppendMLDv2Query(b []byte, src netip.Addr, maxResp time.Duration) []byte {
	s, d := src.As16(), AllNodes.As16()
	b = append(b, 0x60, 0, 0, 0, 0, 8+28, 0, 1) // version, payload length, hop-by-hop, hop limit 1
	b = append(b, s[:]...)
	b = append(b, d[:]...)
	b = append(b, 58, 0, 5, 2, 0, 0, 1, 0) // next ICMPv6; router alert (MLD); PadN
	icmp := len(b)
	b = append(b, 130, 0, 0, 0) // multicast listener query
	b = binary.BigEndian.AppendUint16(b, uint16(min(maxResp.Milliseconds(), 32767)))
	b = append(b, 0, 0)
	b = append(b, make([]byte, 16)...) // general query: address ::
	b = append(b, 2, 125, 0, 0)        // QRV 2, QQIC 125 s, no sources
	sum := csum.Fold(csum.Sum(csum.Pseudo(s[:], d[:], 58, len(b)-icmp), b[icmp:]))
	binary.BigEndian.PutUint16(b[icmp+2:], sum)
	return b
}
