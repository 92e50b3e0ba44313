package ctl

// The commands: their names on the wire, their requests, how the server
// checks and dispatches them to a Handler, and the Client's typed calls.

import (
	"bytes"
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

// vif is r's guest.
func (r Request) vif() VIFRequest { return VIFRequest{MAC: r.MAC, VLAN: r.VLAN} }

// capture is r's capture.
func (r Request) capture() CaptureRequest { return CaptureRequest{Side: r.Side, Count: r.Count} }

// ParseRequest parses and checks one request line.
func ParseRequest(line []byte) (Request, error) {
	var r Request
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		return r, fmt.Errorf("malformed request: %v", err)
	}
	if d.More() {
		return r, errors.New("malformed request: more than one JSON value")
	}
	if r.V != Version {
		return r, fmt.Errorf("protocol version %d, this daemon speaks %d", r.V, Version)
	}
	switch r.Cmd {
	case CmdShow:
		switch r.What {
		case ShowPort, ShowVIFs, ShowNeigh, ShowGroups, ShowStats:
		default:
			return r, fmt.Errorf("show %q: want port, vifs, neigh, groups or stats", r.What)
		}
	case CmdVIFAdd, CmdVIFDel:
		if r.MAC == "" || r.VLAN < 0 || r.VLAN > 4094 {
			return r, fmt.Errorf("%s needs a MAC and a VLAN from 0 to 4094", r.Cmd)
		}
	case CmdNeighFlush:
	case CmdCapture:
		if r.Side != SideFabric && r.Side != SideTAP {
			return r, fmt.Errorf("capture side %q: want fabric or tap", r.Side)
		}
		if r.Count < 0 {
			return r, fmt.Errorf("capture count %d: want 0 (no limit) or more", r.Count)
		}
	default:
		return r, fmt.Errorf("unknown command %q", r.Cmd)
	}
	return r, nil
}

// Handler does the commands, one method each, with requests ParseRequest
// checked; the server sends what they return as the reply's data.
// Capture writes a pcap stream to w until the count is reached, w fails
// or gone is closed (the client hung up, or the server is closing).
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

// dispatch answers a checked request other than a capture with h.
func dispatch(h Handler, r Request) (any, error) {
	switch r.Cmd {
	case CmdVIFAdd:
		return nil, h.AddVIF(r.vif())
	case CmdVIFDel:
		return nil, h.DelVIF(r.vif())
	case CmdNeighFlush:
		return h.FlushNeighbours(), nil
	}
	switch r.What {
	case ShowPort:
		return h.Port(), nil
	case ShowVIFs:
		return h.VIFs(), nil
	case ShowNeigh:
		return h.Neighbours(), nil
	case ShowGroups:
		return h.Groups(), nil
	}
	return h.Stats(), nil
}

// Show returns the listing what (a Show constant) as the daemon wrote it.
func (c Client) Show(what string) (json.RawMessage, error) {
	return c.Do(Request{Cmd: CmdShow, What: what})
}

// show decodes the listing what into v.
func (c Client) show(what string, v any) error {
	data, err := c.Show(what)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("ctl: bad %s reply from eipoibd: %w", what, err)
	}
	return nil
}

// ShowPort returns the port, its link and partitions.
func (c Client) ShowPort() (Port, error) {
	var p Port
	return p, c.show(ShowPort, &p)
}

// ShowVIFs returns the guests' VIFs.
func (c Client) ShowVIFs() ([]VIF, error) {
	var v []VIF
	return v, c.show(ShowVIFs, &v)
}

// ShowNeighbours returns the remote endpoints.
func (c Client) ShowNeighbours() ([]Neigh, error) {
	var n []Neigh
	return n, c.show(ShowNeigh, &n)
}

// ShowGroups returns the port's multicast groups and the guest groups
// behind them.
func (c Client) ShowGroups() ([]Group, error) {
	var g []Group
	return g, c.show(ShowGroups, &g)
}

// ShowStats returns every counter.
func (c Client) ShowStats() (Stats, error) {
	var s Stats
	return s, c.show(ShowStats, &s)
}

// AddVIF declares a guest ahead of its traffic.
func (c Client) AddVIF(r VIFRequest) error {
	_, err := c.Do(Request{Cmd: CmdVIFAdd, MAC: r.MAC, VLAN: r.VLAN})
	return err
}

// DelVIF removes a guest's VIF.
func (c Client) DelVIF(r VIFRequest) error {
	_, err := c.Do(Request{Cmd: CmdVIFDel, MAC: r.MAC, VLAN: r.VLAN})
	return err
}

// FlushNeighbours forgets every remote endpoint and says how many went.
func (c Client) FlushNeighbours() (Flushed, error) {
	data, err := c.Do(Request{Cmd: CmdNeighFlush})
	var f Flushed
	if err == nil {
		err = json.Unmarshal(data, &f)
	}
	return f, err
}

// Capture sends a capture request and copies the pcap stream that
// follows the reply to w until the daemon ends it.
func (c Client) Capture(r CaptureRequest, w io.Writer) error {
	conn, err := dial(c.Path, Request{Cmd: CmdCapture, Side: r.Side, Count: r.Count})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, rest, err := readReply(c.Path, conn)
	if err != nil {
		return err
	}
	_, err = io.Copy(w, io.MultiReader(rest, conn))
	return err
}
