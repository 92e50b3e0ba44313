package simfabric

// Lanes: with several sockets (Config.Sockets), each unicast packet
// leaves from the sending socket its inner flow hashes to, so that it
// carries that socket's UDP source port. docs/architecture.md lets the
// sender choose the source port and forbids the receiver to depend on
// it.
//
// A receiver with several sockets bound to port 4791 (SO_REUSEPORT) is
// given each datagram on the socket that the kernel's hash of the source
// address and port picks (udp6_lib_lookup2 → reuseport_select_sock,
// net/core/sock_reuseport.c). So each flow gets one socket, and so one
// receive worker, which keeps the flow in order, while different flows
// spread. One source port for every flow would put them all on one
// socket.
//
// Multicast leaves from lane 0 (the group member's socket, port 4791).

import (
	"golang.org/x/net/ipv6"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/header"
	"github.com/eipoib/eipoibd/ipoib"
)

// laneOf is the lane of packet pkt (IPoIB header first) sent as m. A
// group's packet takes lane 0, the member socket's. A unicast one takes
// the lane its inner flow hashes to (IPs, and ports for TCP and UDP:
// header.FlowHash), else the hash of the QPs it goes between.
func (p *Port) laneOf(pkt []byte, m *ipoib.TxMeta) int {
	n := uint64(len(p.snds))
	if n == 1 || m.Dst.GID().IsMulticast() {
		return 0
	}
	h := ipoib.Header(pkt)
	if h.IsValid() {
		if et := h.EtherType(); et == ether.TypeIPv4 || et == ether.TypeIPv6 {
			if f, ok := header.FlowHash(pkt[ipoib.HeaderLen:], et == ether.TypeIPv6); ok {
				return int(f % n)
			}
		}
	}
	q := uint64(m.SrcQPN)<<24 | uint64(m.Dst.QPN())
	q *= 0x9e3779b97f4a7c15
	return int((q >> 32) % n)
}

// maxLanes is the most lanes a port has.
const maxLanes = lanesPerSocket * MaxSockets

// laneSort orders a chunk's messages by lane, each lane's in the order
// they came (a counting sort into storage made once).
type laneSort struct {
	msgs  []ipv6.Message
	orig  []int
	start [maxLanes + 1]int // lane l's messages are [start[l], start[l+1])
}

func (s *laneSort) init() {
	s.msgs, s.orig = make([]ipv6.Message, batch), make([]int, batch)
}

// sort places msgs (with their indices in the batch, orig, and lanes)
// by lane, for n lanes.
func (s *laneSort) sort(msgs []ipv6.Message, orig []int, lanes []uint8, n int) {
	clear(s.start[:n+1])
	for _, l := range lanes {
		s.start[l+1]++
	}
	for l := 1; l <= n; l++ {
		s.start[l] += s.start[l-1]
	}
	var next [maxLanes]int
	copy(next[:n], s.start[:n])
	for i, l := range lanes {
		k := next[l]
		next[l]++
		s.msgs[k], s.orig[k] = msgs[i], orig[i]
	}
}

// sendLanes sends the chunk's messages (p.worig their indices in the
// batch, p.wlane their lanes), each lane's from its own socket, and
// clears size for the packets lost. The lanes' refusals that may pass
// share one patience: sendPatience for the chunk, whatever the number
// of lanes it takes.
func (p *Port) sendLanes(msgs []ipv6.Message, size *[batch]int) error {
	p.budget.allow(sendPatience)
	if len(p.snds) == 1 {
		return p.sendOn(p.snds[0], msgs, p.worig, size)
	}
	s := &p.sorted
	s.sort(msgs, p.worig, p.wlane, len(p.snds))
	for l, snd := range p.snds {
		a, b := s.start[l], s.start[l+1]
		if a == b {
			continue
		}
		if err := p.sendOn(snd, s.msgs[a:b], s.orig[a:b], size); err != nil {
			return err
		}
	}
	return nil
}

// sendOn sends msgs from snd's socket: in UDP GSO trains while the
// port makes them and no encode hook is set, else one by one.
func (p *Port) sendOn(snd *sender, msgs []ipv6.Message, orig []int, size *[batch]int) error {
	var out []ipv6.Message
	var spans []span
	if p.gso && p.hook == nil {
		out, spans = p.trains(msgs)
	} else {
		out, spans = msgs, p.singles(len(msgs))
	}
	return p.send(snd, out, spans, msgs, orig, size)
}
