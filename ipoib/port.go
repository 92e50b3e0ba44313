package ipoib

// RxMeta describes one received UD packet.
type RxMeta struct {
	// Src is the sender: its source QPN and source GID (flags zero).
	// It is zero when SrcUnknown is set.
	Src HwAddr
	// SrcUnknown says the port cannot tell the sender. The kernel's
	// IPoIB driver hands packet sockets no source address, and a verbs
	// packet without a GRH names only the sender's LID, which the port
	// may never have seen. The shim then finds the sender from the
	// packet's source IP and the ARP/NDP payloads it has seen (the
	// sender's address is in every ARP packet and most NDP ones). It
	// delivers a packet from a source it has not seen (routed from
	// another subnet) under a stand-in source MAC, and never drops it.
	SrcUnknown bool
	// DstQPN is the receiving QP, or MulticastQPN for a multicast packet.
	DstQPN uint32
	// MGID is the destination group of a multicast packet.
	MGID GID
	// PKey is the P_Key the packet carried.
	PKey PKey
}

// TxMeta describes one UD packet to send.
type TxMeta struct {
	// Dst is the destination QPN + GID. For multicast the QPN is
	// MulticastQPN and the GID is the MGID.
	Dst HwAddr
	// SrcQPN is the sending VIF's QP, allocated with AllocQP.
	SrcQPN uint32
	// PKey is the partition the packet is sent in.
	PKey PKey
	// GSO marks a TCP or UDP super-packet; zero for an ordinary packet.
	// Only a port whose Offloads report TSO is given TCP super-packets,
	// and only one that reports USO UDP ones.
	GSO GSO
}

// GSOType is the kind of super-packet in TxMeta.GSO.
type GSOType uint8

// The super-packet kinds.
const (
	GSONone  GSOType = iota // an ordinary packet, at most the IB MTU
	GSOTCPv4                // IPv4 TCP super-packet
	GSOTCPv6                // IPv6 TCP super-packet
	GSOUDPv4                // IPv4 UDP super-packet (Linux's SKB_GSO_UDP_L4)
	GSOUDPv6                // IPv6 UDP super-packet
)

// UDP reports whether t is a UDP super-packet kind.
func (t GSOType) UDP() bool { return t == GSOUDPv4 || t == GSOUDPv6 }

// V6 reports whether t is an IPv6 super-packet kind.
func (t GSOType) V6() bool { return t == GSOTCPv6 || t == GSOUDPv6 }

// GSO describes a TCP super-packet handed to a port whole: the 4-byte
// IPoIB header, the IP header (IPv6 extension headers included), the TCP
// header and a payload. The port cuts the payload into Size-byte
// segments, as a Linux GSO skb or an HCA's LSO work request is cut. Each
// segment carries copies of the headers with the IP length, the IPv4 ID
// (one more per segment), the TCP sequence number and the flags fixed up
// (FIN and PSH on the last segment only, CWR on the first only). The TCP
// checksum field holds the pseudo-header sum over the super-packet's
// whole TCP length, as Linux leaves it in a CHECKSUM_PARTIAL GSO skb
// (virtio_net_hdr NEEDS_CSUM). Each segment's checksum is computed from
// it with the segment's length, and each IPv4 header checksum from
// scratch.
//
// A UDP super-packet (GSOUDPv4, GSOUDPv6) is cut as Linux's
// __udp_gso_segment cuts an SKB_GSO_UDP_L4 skb: into datagrams of Size
// bytes of UDP payload (the last may be shorter). Each has the headers,
// its own IP and UDP lengths, IPv4 ID (one more per datagram) and
// checksums. The UDP checksum is computed from the pseudo-header sum the
// checksum field holds (0 sent as 0xFFFF). Every datagram fits the IPoIB
// MTU: the caller checks, as a datagram cannot be cut smaller.
type GSO struct {
	Type GSOType
	// L4 is the offset of the TCP (UDP) header from the start of the
	// IPoIB header.
	L4 uint16
	// Size is the TCP (UDP) payload of each segment (datagram) but the
	// last: the MSS, or gso_size; the caller keeps a segment within the
	// IPoIB MTU.
	Size uint16
}

// Offloads says what a port takes beyond ordinary packets.
type Offloads struct {
	// TSO: the port takes TCP super-packets (TxMeta.GSO) of up to
	// MaxSuper bytes from offset and cuts them itself; Headroom still
	// applies in front of offset.
	TSO bool
	// USO: the port takes UDP super-packets as well (with TSO's
	// MaxSuper); the shim cuts them into datagrams for a port without.
	USO      bool
	MaxSuper int
}

// Headroom is the space a Port may use in front of offset in Write buffers
// for its transport headers (BTH 12 + DETH 8, rounded up).
const Headroom = 32

// DataPort is the data half of a Port, what a data path holds: it is
// batch-shaped. Read fills up to len(bufs) packets; Write takes a batch of
// any length and moves it BatchSize packets per system call (or work
// request batch), so a caller never has to split its batches. None of its
// calls waits on the fabric.
//
// In Write, bufs[i][offset:] holds the IPoIB header and payload; bytes
// before offset (at least Headroom) are scratch space for the port.
// meta[i].SrcQPN must be a QP allocated on this port and meta[i].PKey its
// partition: any other packet is refused and counted, never sent. Write
// returns how many packets the port accepted; the others are counted
// under the port's drop reasons.
//
// In Read, the port writes the IPoIB header and payload at
// bufs[i][offset:], sets sizes[i] and meta[i], and returns how many it
// filled; offset leaves room for the shim to push an Ethernet header in
// place.
type DataPort interface {
	Read(bufs [][]byte, sizes []int, meta []RxMeta, offset int) (n int, err error)
	Write(bufs [][]byte, meta []TxMeta, offset int) (n int, err error)
	BatchSize() int
	// LocalGID is the port GID (the GID half of every local LIMAC).
	LocalGID() GID
	// MTU is the IB MTU (2048 or 4096); the IPoIB MTU is 4 less.
	MTU() int
	// Offloads says whether the port takes super-packets; the shim cuts
	// them to the MTU itself for a port that does not.
	Offloads() Offloads
	// Counters returns a snapshot of the port's counters.
	Counters() PortCounters
	// Events reports the port's state changes (see Event), as
	// wireguard-go's tun.Device.Events reports a TUN's: the first event
	// is the link state at the time the port was made, later ones come
	// as the backend learns of changes. The channel is buffered and a
	// backend never blocks on it: events of one state (the link, one
	// partition's MTU) that the reader has not taken are coalesced to
	// the latest (see EventQueue). It is closed on Close, and every call
	// returns the same channel.
	Events() <-chan Event
}

// ControlPort is the control half of a Port: the calls that change the
// port's QPs, groups and partitions, or learn of them, and close it. On
// hardware each may wait on the fabric for milliseconds to seconds (an
// SA round trip, a netlink request), so a data path never holds one.
type ControlPort interface {
	// AllocQP creates a UD QP in partition pkey and returns its QPN. hint
	// is the QPN the caller would like (0 for none); a backend that can
	// choose QPNs uses it when free, so that a guest keeps its LIMAC across
	// daemon restarts. Hardware backends ignore it.
	AllocQP(pkey PKey, hint uint32) (qpn uint32, err error)
	// FreeQP destroys a QP created by AllocQP.
	FreeQP(qpn uint32) error

	// Join attaches the port to a multicast group as a full member (it
	// receives the group's traffic); JoinSendOnly as a send-only member
	// (IBA 10.5.2.3: allowed to send, receives nothing). Leave detaches it
	// either way. Joining twice is harmless, as is leaving a group not
	// joined; a full join upgrades a send-only one.
	Join(mgid GID) error
	JoinSendOnly(mgid GID) error
	Leave(mgid GID) error
	// PartitionMTU is the IB MTU of partition pkey: on InfiniBand, that
	// of the partition's broadcast group, which the subnet manager may
	// set below the port's (the kernel's ipoib_mcast_join_finish sets
	// each IPoIB interface's MTU from it). It is never more than MTU(),
	// and MTU() for a partition the port has not used yet.
	PartitionMTU(pkey PKey) int

	// Close ends the port: Read and Write return net.ErrClosed after it,
	// and the Events channel is closed.
	Close() error
}

// QPAdopter is a Port that can take over a QP a previous run of the
// daemon left in place rather than create one (the kernel backend's
// IPoIB children under --persist). The shim restores a saved guest with
// AdoptQP when its port has it: AdoptQP(pkey, qpn) is AllocQP, except
// that the QP with QPN qpn in partition pkey, if one was left, is taken
// over. AllocQP never takes one over, so that a new guest never gets a
// QP that a restored guest's peers know.
type QPAdopter interface {
	AdoptQP(pkey PKey, qpn uint32) (uint32, error)
}

// Port is one IB port with UD QPs, the fabric side of the shim: its data
// half and its control half in one value, as a backend makes it.
type Port interface {
	DataPort
	ControlPort
}

// RxQueue is one of a port's receive queues (DataPort.Read's signature and
// contract): each may be read by its own goroutine, in parallel with the
// others.
type RxQueue interface {
	Read(bufs [][]byte, sizes []int, meta []RxMeta, offset int) (n int, err error)
}

// RxQueues is a Port that receives on several queues, as the simulated
// fabric's port does on several sockets: every packet arrives on exactly
// one of them, and each flow's packets on one, in order. A flow's IP
// fragments, which carry no ports, may take another queue than its
// unfragmented packets (each fragmented datagram's on one, in order), so
// the order between the two kinds is not kept. The shim reads
// each with a worker of its own; a Port without it has Read alone, and
// a wrapper of a Port (faultport) passes its inner port's on.
type RxQueues interface {
	RxQueues() []RxQueue
}

// RxQueuesOf is p's receive queues: those RxQueues gives, or p (its Read)
// alone for a port without any.
func RxQueuesOf(p DataPort) []RxQueue {
	if q, ok := p.(RxQueues); ok {
		if qs := q.RxQueues(); len(qs) > 0 {
			return qs
		}
	}
	return []RxQueue{p}
}

// PortCounters is a snapshot of a port's traffic and drop counters. Drops
// is keyed by reason, e.g. "bad_icrc", "unknown_qpn".
type PortCounters struct {
	TxPackets, TxBytes uint64
	RxPackets, RxBytes uint64
	Drops              map[string]uint64
	// Stats are the backend's other counters by name, e.g. "tx_trains".
	Stats map[string]uint64
	// Levels are the backend's levels by name (table sizes, buffers in
	// use), which go up and down, e.g. "address_handles".
	Levels map[string]uint64
}

// MaxSuperPacket is the largest super-packet: an IPoIB header and the
// largest IP packet.
const MaxSuperPacket = HeaderLen + 65535
