package ipoibhost

// Counter indexes the host's counters.
type Counter int

// The host's counters. Every IP packet read from the device is sent,
// dropped (drop_*), or first waits for a resolution (tx_queued); tx_sent
// also counts the host's own ARP and NDP. Every packet read from the
// port is delivered, handled (ARP, NDP) or dropped.
const (
	TxPackets       Counter = iota // IP packets read from the device
	TxSent                         // packets the port accepted (control packets included)
	TxPortRefused                  // packets the port refused (see its drop counters)
	TxQueued                       // packets that waited for a resolution
	TxBroadcast                    // packets to the broadcast group
	TxMulticast                    // packets to another MGID
	DropNotIP                      // read from the device but neither IPv4 nor IPv6
	DropTooBig                     // larger than the IPoIB MTU
	DropUnresolved                 // destination not resolved in time, or its queue full
	RxPackets                      // packets read from the port
	RxDelivered                    // IP packets written to the device
	RxARP                          // ARP packets handled
	RxNDP                          // neighbour solicitations and advertisements handled
	RxNDPIgnored                   // router solicitations/advertisements and redirects
	DropRxBadHeader                // IPoIB header missing or reserved bits set
	DropRxEtherType                // ethertype other than IPv4, IPv6, ARP
	DropRxBadARP                   // ARP that is not IPoIB ARP for IPv4
	DropRxBadNDP                   // malformed NS/NA, or an NS with no way back
	DropDevWrite                   // received packets the device refused
	ARPRequests                    // ARP requests sent to resolve a neighbour
	ARPReplies                     // ARP replies sent for the host's addresses
	NSSent                         // neighbour solicitations sent
	NASent                         // neighbour advertisements sent in answer
	Gratuitous                     // gratuitous ARPs and unsolicited NAs for new addresses
	NeighEvicted                   // neighbours evicted from a full table
	NeighAged                      // neighbours forgotten after NeighTTL
	numCounters
)

var counterNames = [numCounters]string{
	"tx_packets", "tx_sent", "tx_port_refused", "tx_queued", "tx_broadcast", "tx_multicast",
	"drop_not_ip", "drop_too_big", "drop_unresolved",
	"rx_packets", "rx_delivered", "rx_arp", "rx_ndp", "rx_ndp_ignored",
	"drop_rx_bad_header", "drop_rx_ethertype", "drop_rx_bad_arp", "drop_rx_bad_ndp", "drop_dev_write",
	"arp_requests", "arp_replies", "ns_sent", "na_sent", "gratuitous", "neigh_evicted", "neigh_aged",
}

// String returns the counter's name.
func (c Counter) String() string { return counterNames[c] }

// Get returns one counter.
func (h *Host) Get(c Counter) uint64 { return h.ctr[c].Load() }

// Counters returns every counter by name, the table sizes (neighbours,
// resolving: gauges) and the port's counters as port_*.
func (h *Host) Counters() map[string]uint64 {
	m := make(map[string]uint64, int(numCounters)+16)
	for i := range h.ctr {
		m[counterNames[i]] = h.ctr[i].Load()
	}
	n, r := h.neigh.size()
	m["neighbours"], m["resolving"] = uint64(n), uint64(r)
	pc := h.port.Counters()
	m["port_tx_packets"], m["port_rx_packets"] = pc.TxPackets, pc.RxPackets
	for k, v := range pc.Drops {
		m["port_drop_"+k] = v
	}
	return m
}

// IsGauge reports whether a Counters name is a level, not a total.
func IsGauge(name string) bool { return name == "neighbours" || name == "resolving" }
