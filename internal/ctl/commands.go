package ctl

// The table of commands. Each entry names a command on the wire, says
// what its request carries, how the server checks it and which Handler
// method answers it; the server's checks and dispatch and the Client's
// typed calls derive from it (table.go). A new command is a wire name
// here, an entry in table, its Handler method (with UnimplementedHandler's),
// its Client method and, if it answers a new type, that reply type.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The commands, as the wire names them.
const (
	CmdShow       = "show"        // a listing: Request.What
	CmdVIFAdd     = "vif-add"     // declare a guest: Request.MAC, Request.VLAN
	CmdVIFDel     = "vif-del"     // remove a guest's VIF: Request.MAC, Request.VLAN
	CmdNeighFlush = "neigh-flush" // forget every remote endpoint
	CmdCapture    = "capture"     // a pcap stream: Request.Side, Request.Count
)

// What a show request lists.
const (
	ShowPort   = "port"   // a Port
	ShowVIFs   = "vifs"   // []VIF
	ShowNeigh  = "neigh"  // []Neigh
	ShowGroups = "groups" // []Group
	ShowStats  = "stats"  // Stats
)

// The sides a capture request takes.
const (
	SideFabric = "fabric" // IPoIB, pcap link type 242
	SideTAP    = "tap"    // Ethernet
)

// Request is one command as it goes on the wire; the typed requests
// (VIFRequest, CaptureRequest) and the Client's methods make it.
type Request struct {
	V   int    `json:"v"`
	Cmd string `json:"cmd"` // one of the Cmd constants
	// What to show: one of the Show constants.
	What string `json:"what,omitempty"`
	// MAC and VLAN of vif-add and vif-del.
	MAC  string `json:"mac,omitempty"`
	VLAN int    `json:"vlan,omitempty"`
	// Side (fabric or tap) and Count (0: until the client hangs up) of
	// a capture.
	Side  string `json:"side,omitempty"`
	Count int    `json:"count,omitempty"`
}

// VIFRequest is the guest of vif-add and vif-del.
type VIFRequest struct {
	MAC  string // as the operator wrote it; the daemon parses it
	VLAN int    // 0 (untagged) to 4094
}

// CaptureRequest is what a capture records.
type CaptureRequest struct {
	Side  string // SideFabric or SideTAP
	Count int    // packets; 0: until the client hangs up
}

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

// vif is r's guest.
func (r Request) vif() VIFRequest { return VIFRequest{MAC: r.MAC, VLAN: r.VLAN} }

// put writes v into r.
func (v VIFRequest) put(r *Request) { r.MAC, r.VLAN = v.MAC, v.VLAN }

// checkVIF refuses a vif-add or vif-del without a MAC or a valid VLAN.
func checkVIF(r Request) error {
	if r.MAC == "" || r.VLAN < 0 || r.VLAN > 4094 {
		return fmt.Errorf("%s needs a MAC and a VLAN from 0 to 4094", r.Cmd)
	}
	return nil
}

// capture is r's capture.
func (r Request) capture() CaptureRequest { return CaptureRequest{Side: r.Side, Count: r.Count} }

// put writes c into r.
func (c CaptureRequest) put(r *Request) { r.Side, r.Count = c.Side, c.Count }

// checkCapture refuses a capture of an unknown side or a negative count.
func checkCapture(r Request) error {
	if r.Side != SideFabric && r.Side != SideTAP {
		return fmt.Errorf("capture side %q: want fabric or tap", r.Side)
	}
	if r.Count < 0 {
		return fmt.Errorf("capture count %d: want 0 (no limit) or more", r.Count)
	}
	return nil
}

// table is every command, in the order a refusal lists them.
var table = []entry{showPort, showVIFs, showNeigh, showGroups, showStats, vifAdd, vifDel, neighFlush, capture}

var (
	showPort   = listing(ShowPort, Handler.Port)
	showVIFs   = listing(ShowVIFs, Handler.VIFs)
	showNeigh  = listing(ShowNeigh, Handler.Neighbours)
	showGroups = listing(ShowGroups, Handler.Groups)
	showStats  = listing(ShowStats, Handler.Stats)
	vifAdd     = command[VIFRequest, none]{cmd: CmdVIFAdd, put: VIFRequest.put, get: Request.vif, check: checkVIF, answer: noData(Handler.AddVIF)}
	vifDel     = command[VIFRequest, none]{cmd: CmdVIFDel, put: VIFRequest.put, get: Request.vif, check: checkVIF, answer: noData(Handler.DelVIF)}
	neighFlush = command[none, Flushed]{cmd: CmdNeighFlush, answer: func(h Handler, _ none) (Flushed, error) { return h.FlushNeighbours(), nil }}
	capture    = command[CaptureRequest, none]{cmd: CmdCapture, put: CaptureRequest.put, get: Request.capture, check: checkCapture, stream: Handler.Capture}
)

// Handler does the commands, one method each, with requests ParseRequest
// checked; the server sends what they return as the reply's data.
// Capture writes a pcap stream to w until the count is reached, w fails
// or gone is closed (the client hung up, or the server is closing).
// An implementation that embeds UnimplementedHandler keeps compiling
// when a command is added.
type Handler interface {
	Port() Port
	VIFs() []VIF
	Neighbours() []Neigh
	Groups() []Group
	Stats() Stats
	AddVIF(r VIFRequest) error
	DelVIF(r VIFRequest) error
	FlushNeighbours() Flushed
	Capture(r CaptureRequest, w io.Writer, gone <-chan struct{}) error
}

// ErrUnimplemented is UnimplementedHandler's refusal.
var ErrUnimplemented = errors.New("not implemented by this daemon")

// UnimplementedHandler answers every command as one its daemon lacks: a
// listing is empty, the others fail with ErrUnimplemented. A Handler
// embeds it and overrides the commands it does, so that one added to
// the table later does not break it (test fakes, typically).
type UnimplementedHandler struct{}

var _ Handler = UnimplementedHandler{}

func unimplemented(cmd string) error { return fmt.Errorf("%s: %w", cmd, ErrUnimplemented) }

// Port answers show port with a zero Port.
func (UnimplementedHandler) Port() Port { return Port{} }

// VIFs answers show vifs with none.
func (UnimplementedHandler) VIFs() []VIF { return nil }

// Neighbours answers show neigh with none.
func (UnimplementedHandler) Neighbours() []Neigh { return nil }

// Groups answers show groups with none.
func (UnimplementedHandler) Groups() []Group { return nil }

// Stats answers show stats with none.
func (UnimplementedHandler) Stats() Stats { return nil }

// AddVIF refuses vif-add.
func (UnimplementedHandler) AddVIF(VIFRequest) error { return unimplemented(CmdVIFAdd) }

// DelVIF refuses vif-del.
func (UnimplementedHandler) DelVIF(VIFRequest) error { return unimplemented(CmdVIFDel) }

// FlushNeighbours answers neigh-flush with nothing flushed.
func (UnimplementedHandler) FlushNeighbours() Flushed { return Flushed{} }

// Capture refuses capture: the stream after the reply is empty.
func (UnimplementedHandler) Capture(CaptureRequest, io.Writer, <-chan struct{}) error {
	return unimplemented(CmdCapture)
}

// Show returns the listing what (a Show constant) as the daemon wrote it.
func (c Client) Show(what string) (json.RawMessage, error) {
	return c.Do(Request{Cmd: CmdShow, What: what})
}

// ShowPort returns the port, its link and partitions.
func (c Client) ShowPort() (Port, error) { return showPort.call(c, none{}) }

// ShowVIFs returns the guests' VIFs.
func (c Client) ShowVIFs() ([]VIF, error) { return showVIFs.call(c, none{}) }

// ShowNeighbours returns the remote endpoints.
func (c Client) ShowNeighbours() ([]Neigh, error) { return showNeigh.call(c, none{}) }

// ShowGroups returns the port's multicast groups and the guest groups
// behind them.
func (c Client) ShowGroups() ([]Group, error) { return showGroups.call(c, none{}) }

// ShowStats returns every counter.
func (c Client) ShowStats() (Stats, error) { return showStats.call(c, none{}) }

// AddVIF declares a guest ahead of its traffic.
func (c Client) AddVIF(r VIFRequest) error {
	_, err := vifAdd.call(c, r)
	return err
}

// DelVIF removes a guest's VIF.
func (c Client) DelVIF(r VIFRequest) error {
	_, err := vifDel.call(c, r)
	return err
}

// FlushNeighbours forgets every remote endpoint and says how many went.
func (c Client) FlushNeighbours() (Flushed, error) { return neighFlush.call(c, none{}) }

// Capture sends a capture request and copies the pcap stream that
// follows the reply to w until the daemon ends it.
func (c Client) Capture(r CaptureRequest, w io.Writer) error { return capture.streamTo(c, r, w) }
