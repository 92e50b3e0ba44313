package ctl

// The replies' data, as the daemon answers them and `eipoibd ... --json`
// prints them; the JSON field names are stable (docs/operations.md,
// "Control socket and CLI"), operators' scripts read them.

// Port answers show port.
type Port struct {
	Name       string      `json:"name"`
	Backend    string      `json:"backend"`
	Device     string      `json:"device"`
	GID        string      `json:"gid"`
	IBMTU      int         `json:"ib_mtu"`
	IPoIBMTU   int         `json:"ipoib_mtu"`
	Link       string      `json:"link"` // "up" or "down"
	Partitions []Partition `json:"partitions"`
}

// Partition is one VLAN and its P_Key, sorted by VLAN in a Port.
type Partition struct {
	VLAN uint16 `json:"vlan"`
	PKey string `json:"pkey"`
}

// VIF is one guest of show vifs.
type VIF struct {
	MAC       string  `json:"mac"`
	VLAN      uint16  `json:"vlan"`
	PKey      string  `json:"pkey"`
	QPN       string  `json:"qpn"`
	Address   string  `json:"address"` // the 20-byte LIMAC
	Origin    string  `json:"origin"`  // learned, declared, bridge or ovs
	IdleS     float64 `json:"idle_s"`
	TxPackets uint64  `json:"tx_packets"` // Ethernet frames from the guest
	TxBytes   uint64  `json:"tx_bytes"`
	RxPackets uint64  `json:"rx_packets"` // IPoIB packets to the guest
	RxBytes   uint64  `json:"rx_bytes"`
}

// Neigh is one remote endpoint of show neigh.
type Neigh struct {
	REMAC string   `json:"remac"`
	RIMAC string   `json:"rimac"`
	PKey  string   `json:"pkey"`
	IPs   []string `json:"ips"`   // the addresses its ARP/NDP spoke for
	AgeS  float64  `json:"age_s"` // since last seen
}

// Group is one multicast group of the port, of show groups.
type Group struct {
	MGID     string   `json:"mgid"`
	SendOnly bool     `json:"send_only"`
	Members  []Member `json:"members"`
}

// Member is a guest group behind a Group.
type Member struct {
	VLAN         uint16  `json:"vlan"`
	Group        string  `json:"group"`
	ExpiresS     float64 `json:"expires_s"`
	QueriesLeft  int     `json:"queries_left"` // > 0: a guest left, the shim is querying
	LastReporter string  `json:"last_reporter"`
}

// Stats answers show stats: every counter of the metrics, by name.
type Stats map[string]uint64

// Flushed answers neigh-flush.
type Flushed struct {
	Flushed int `json:"flushed"`
}
