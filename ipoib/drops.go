package ipoib

import "sync/atomic"

// Drop is why a port dropped a packet: one enum for every backend, so a
// reason is counted under the same name (PortCounters.Drops' key, the
// metrics' reason) whichever backend drops it. DropNone is no drop.
type Drop uint8

// The drop reasons. Each backend counts the ones that can happen to it.
const (
	DropNone Drop = iota // not dropped

	// Sending (Write).
	DropBadMeta    // TxMeta refused: a source QP the port did not allocate, another P_Key than the QP's, a multicast QPN to a unicast GID or the reverse, no IPoIB header
	DropBadGSO     // a super-packet the port does not take, or one it cannot cut
	DropOversize   // larger than the IB MTU (of the port, partition or child)
	DropPortDown   // the port is down
	DropNoCarrier  // kernel: the sending child has no carrier (its broadcast join is not done)
	DropSendError  // the kernel or the device refused the send (an errno without a reason of its own below)
	DropSendAgain  // simfabric: EAGAIN, the socket's send buffer still full after the bounded wait for room
	DropSendNoBufs // simfabric: ENOBUFS, the kernel had no memory for the skb, still after the bounded wait (a full qdisc or veth backlog does not say ENOBUFS here: udp_v6_send_skb turns it into success)
	DropSendInval  // simfabric: EINVAL, on the host: the kernel could not make the underlay neighbour (its table is full, gc_thresh3)
	DropNoRoute    // memfabric: no port has the destination GID
	DropFaultLoss  // simfabric: lost by fault injection
	DropRingFull   // verbs: no free slot in the registered send ring
	DropNoAH       // verbs: the destination's address handle could not be made
	DropAHPending  // verbs: too many packets already wait for address handles
	DropBadSource  // simfabric: the kernel refused the source address
	DropNoPktinfo  // simfabric: a datagram came without its IPV6_PKTINFO
	DropRxOverflow // simfabric, kernelfabric: the kernel's receive queue overflowed (simfabric: SO_RXQ_OVFL; kernelfabric: a child's packet socket, PACKET_STATISTICS)

	// Receiving (Read): the shared checks (CheckRx).
	DropBadDestQPN  // the multicast QPN to a unicast GID, or a unicast QPN to an MGID (IBA 9.8.1)
	DropUnknownQPN  // no QP of this port has the destination QPN
	DropPKey        // the packet's P_Key cannot talk to the QP's or group's (IBA 10.9.3)
	DropNotJoined   // multicast to a group the port is no full member of
	DropQueueFull   // the port's receive queue is full
	DropBufferSmall // the packet is larger than the buffer Read was given
	DropRecvError   // the kernel or the device reported a receive error

	// Receiving: what a backend sees of the wire or of the kernel.
	DropTruncated   // shorter than its headers, or cut by the socket
	DropBadOpcode   // simfabric: not a UD SEND-only packet
	DropBadTVer     // simfabric: a BTH transport version other than 0
	DropBadICRC     // simfabric: the ICRC does not match
	DropBadPad      // simfabric: a pad count longer than the payload
	DropQKey        // simfabric: a Q_Key other than IPoIB's
	DropBadSockaddr // kernel: a sockaddr_ll that does not parse
	DropBadVnetHdr  // kernel: a virtio_net_hdr that does not parse
	DropRxSuper     // kernel: a received super-packet (GRO is off on every child)
	DropPktType     // kernel: a packet type the child cannot receive
	DropBadMcast    // kernel: multicast whose group cannot be told from its destination IP
	DropEmpty       // kernel: a datagram with no payload
	DropNoGRH       // verbs: a RoCE packet without a GRH
	DropBadGRH      // verbs: a GRH that does not parse
	DropOwn         // verbs: multicast this port sent, looped back to it

	// NumDrops is the number of drop reasons, DropNone included.
	NumDrops
)

// dropNames are the counter names, by reason: the names the backends
// counted under before they shared this enum.
var dropNames = [NumDrops]string{
	DropNone:        "none",
	DropBadMeta:     "bad_meta",
	DropBadGSO:      "bad_gso",
	DropOversize:    "oversize",
	DropPortDown:    "port_down",
	DropNoCarrier:   "child_no_carrier",
	DropSendError:   "send_error",
	DropSendAgain:   "send_eagain",
	DropSendNoBufs:  "send_enobufs",
	DropSendInval:   "send_einval",
	DropNoRoute:     "no_route",
	DropFaultLoss:   "fault_loss",
	DropRingFull:    "tx_ring_full",
	DropNoAH:        "no_address_handle",
	DropAHPending:   "ah_pending_full",
	DropBadSource:   "bad_source",
	DropNoPktinfo:   "no_pktinfo",
	DropRxOverflow:  "rx_queue_overflow",
	DropBadDestQPN:  "bad_dest_qpn",
	DropUnknownQPN:  "unknown_qpn",
	DropPKey:        "pkey_mismatch",
	DropNotJoined:   "not_joined",
	DropQueueFull:   "rx_queue_full",
	DropBufferSmall: "rx_buffer_small",
	DropRecvError:   "recv_error",
	DropTruncated:   "truncated",
	DropBadOpcode:   "bad_opcode",
	DropBadTVer:     "bad_tver",
	DropBadICRC:     "bad_icrc",
	DropBadPad:      "bad_pad",
	DropQKey:        "qkey_mismatch",
	DropBadSockaddr: "bad_sockaddr",
	DropBadVnetHdr:  "bad_vnet_hdr",
	DropRxSuper:     "rx_super_packet",
	DropPktType:     "pkttype",
	DropBadMcast:    "bad_multicast",
	DropEmpty:       "empty",
	DropNoGRH:       "no_grh",
	DropBadGRH:      "bad_grh",
	DropOwn:         "own_packet",
}

// String is the reason's counter name, e.g. "bad_meta".
func (d Drop) String() string {
	if d >= NumDrops {
		return "unknown"
	}
	return dropNames[d]
}

// DropCounters counts drops by reason without a lock: Add is one atomic
// add, safe from any goroutine on the hot path. The zero value is ready.
type DropCounters [NumDrops]atomic.Uint64

// Add counts one drop for reason d. DropNone and unknown reasons are
// not counted.
func (c *DropCounters) Add(d Drop) { c.AddN(d, 1) }

// AddN counts n drops for reason d.
func (c *DropCounters) AddN(d Drop, n uint64) {
	if d != DropNone && d < NumDrops {
		c[d].Add(n)
	}
}

// Load returns the count of reason d.
func (c *DropCounters) Load(d Drop) uint64 {
	if d >= NumDrops {
		return 0
	}
	return c[d].Load()
}

// Snapshot returns the non-zero counts keyed by reason name, as
// PortCounters.Drops holds them.
func (c *DropCounters) Snapshot() map[string]uint64 {
	m := make(map[string]uint64)
	for d := DropNone + 1; d < NumDrops; d++ {
		if v := c[d].Load(); v != 0 {
			m[dropNames[d]] = v
		}
	}
	return m
}
