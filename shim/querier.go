package shim

// The shim queries the guests for their IPv6 multicast groups (MLDv2
// general queries, RFC 3810) at start-up and every query interval. Their
// reports tell it which solicited-node groups to join, so NDP keeps
// working for guests that were configured before the daemon (re)started.

import (
	"net/netip"
	"time"

	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/snoop"
)

// queryMaxResp is how soon guests must answer a query.
const queryMaxResp = time.Second

// querierAddrs returns the MAC and link-local address the queries come
// from: a locally administered MAC derived from the port GID, and its
// EUI-64 link-local address.
func (s *Shim) querierAddrs() (ether.MAC, netip.Addr) {
	mac := mactrans.DeriveREMAC(s.port.LocalGID(), 0, 0)
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10], a[11], a[12] = mac[0]^0x02, mac[1], mac[2], 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return mac, netip.AddrFrom16(a)
}

// sendQueries sends an MLDv2 general query into every partition.
func (s *Shim) sendQueries() {
	mac, src := s.querierAddrs()
	frames := make([][]byte, 0, len(s.byPKey))
	for _, p := range s.byPKey {
		f := make([]byte, ether.VLANHeaderLen, ether.VLANHeaderLen+snoop.MLDv2QueryLen)
		hl := ether.PutHeader(f, ether.MAC{0x33, 0x33, 0, 0, 0, 1}, mac, p.vlan, ether.TypeIPv6)
		frames = append(frames, snoop.AppendMLDv2Query(f[:hl], src, queryMaxResp))
	}
	s.writeDev(frames)
	s.ctr.c[TxQueries].Add(uint64(len(frames)))
}
