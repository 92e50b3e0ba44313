package main

// The control socket's two ends: the daemon's handler over the shim, and
// the client commands (show, vif, neigh, capture) that print what it
// answers, in columns like ip and bridge do, or as JSON.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/internal/metrics"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/shim"
)

// stdout is where the client commands print (a variable for the tests).
var stdout io.Writer = os.Stdout

// ctlHandler answers the control socket from the shim.
type ctlHandler struct {
	sh             *shim.Shim
	name, fab, dev string
}

var _ ctl.Handler = (*ctlHandler)(nil)

// vif parses a vif-add or vif-del request's MAC.
func (h *ctlHandler) vif(v ctl.VIFRequest) (ether.MAC, uint16, error) {
	mac, err := ether.ParseMAC(v.MAC)
	if err != nil {
		return mac, 0, fmt.Errorf("MAC %q: %v", v.MAC, err)
	}
	return mac, uint16(v.VLAN), nil
}

// AddVIF declares a guest (vif-add).
func (h *ctlHandler) AddVIF(v ctl.VIFRequest) error {
	mac, vlan, err := h.vif(v)
	if err != nil {
		return err
	}
	return h.sh.DeclareVIF(mac, vlan, mactrans.OriginDeclared)
}

// DelVIF removes a guest's VIF (vif-del).
func (h *ctlHandler) DelVIF(v ctl.VIFRequest) error {
	mac, vlan, err := h.vif(v)
	if err != nil {
		return err
	}
	return h.sh.RemoveVIF(mac, vlan)
}

// FlushNeighbours forgets the remote endpoints (neigh-flush).
func (h *ctlHandler) FlushNeighbours() ctl.Flushed {
	return ctl.Flushed{Flushed: h.sh.FlushNeighbours()}
}

func secs(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

// Port answers show port.
func (h *ctlHandler) Port() ctl.Port {
	pi := h.sh.Port()
	p := ctl.Port{Name: h.name, Backend: h.fab, Device: h.dev, GID: pi.GID.String(), IBMTU: pi.IBMTU, IPoIBMTU: pi.IPoIBMTU, Link: "down"}
	if pi.Up {
		p.Link = "up"
	}
	for vlan, pk := range pi.Partitions {
		p.Partitions = append(p.Partitions, ctl.Partition{VLAN: vlan, PKey: pk.String()})
	}
	sort.Slice(p.Partitions, func(i, j int) bool { return p.Partitions[i].VLAN < p.Partitions[j].VLAN })
	return p
}

// VIFs answers show vifs.
func (h *ctlHandler) VIFs() []ctl.VIF {
	out := []ctl.VIF{}
	for _, v := range h.sh.VIFs() {
		out = append(out, ctl.VIF{MAC: v.MAC.String(), VLAN: v.VLAN, PKey: v.PKey.String(), QPN: fmt.Sprintf("%#06x", v.QPN),
			Address: v.Addr.String(), Origin: v.Origin.String(), IdleS: secs(v.Idle),
			TxPackets: v.TxPackets, TxBytes: v.TxBytes, RxPackets: v.RxPackets, RxBytes: v.RxBytes})
	}
	return out
}

// Neighbours answers show neigh.
func (h *ctlHandler) Neighbours() []ctl.Neigh {
	out := []ctl.Neigh{}
	for _, n := range h.sh.Neighbours() {
		j := ctl.Neigh{REMAC: n.REMAC.String(), RIMAC: n.RIMAC.String(), PKey: n.PKey.String(), IPs: []string{}, AgeS: secs(n.Age)}
		for _, ip := range n.IPs {
			j.IPs = append(j.IPs, ip.String())
		}
		out = append(out, j)
	}
	return out
}

// Groups answers show groups.
func (h *ctlHandler) Groups() []ctl.Group {
	out := []ctl.Group{}
	for _, g := range h.sh.Groups() {
		j := ctl.Group{MGID: g.MGID.String(), SendOnly: g.SendOnly, Members: []ctl.Member{}}
		for _, m := range g.Groups {
			j.Members = append(j.Members, ctl.Member{VLAN: m.VLAN, Group: m.Group.String(), ExpiresS: secs(m.Expires), QueriesLeft: m.QueriesLeft, LastReporter: m.LastReporter.String()})
		}
		out = append(out, j)
	}
	return out
}

// Stats answers show stats.
func (h *ctlHandler) Stats() ctl.Stats { return h.sh.Counters() }

// Capture streams a pcap of the capture's side until count packets, the
// client's hang-up or the server's close.
func (h *ctlHandler) Capture(r ctl.CaptureRequest, w io.Writer, gone <-chan struct{}) error {
	c, err := h.sh.StartCapture(r.Side, 1024)
	if err != nil {
		return err
	}
	defer c.Stop()
	pw := pcapgo.NewWriter(w)
	lt, snap := layers.LinkTypeEthernet, uint32(16384)
	if r.Side == shim.CaptureFabric {
		lt, snap = layers.LinkType(242), 16384+shim.CaptureHeader // LINKTYPE_IPOIB
	}
	if err := pw.WriteFileHeader(snap, lt); err != nil {
		return err
	}
	for n := 0; r.Count == 0 || n < r.Count; n++ {
		select {
		case <-gone:
			return nil
		case p := <-c.Packets():
			err := pw.WritePacket(gopacket.CaptureInfo{Timestamp: p.At, CaptureLength: len(p.Data), Length: p.Len}, p.Data)
			c.Release(p)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// runCtl runs a client command: show, vif, neigh or capture.
func runCtl(cmd string, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("eipoibd "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", "eib0", "the daemon's TAP name")
	dir := fs.String("ctl-dir", ctl.DefaultDir, "directory of the control sockets")
	asJSON := fs.Bool("json", false, "print JSON (stable field names, see the README)")
	interval := fs.Duration("interval", 0, "stats: print the changes every interval (like ip -s), --count times")
	count := fs.Int("count", 0, "stats --interval: rounds (0: until interrupted); capture: packets (-c)")
	fs.IntVar(count, "c", 0, "capture: stop after this many packets")
	vlan := fs.Int("vlan", 0, "vif add/del: the guest's VLAN")
	out := fs.String("w", "", "capture: the pcap file to write")
	side := fs.String("side", ctl.SideFabric, "capture: fabric (IPoIB, pcap link type 242) or tap (Ethernet)")
	usage := fmt.Sprintf(`usage: eipoibd show port|vifs|neigh|groups|stats [--name eib0] [--json] [--interval 1s]
       eipoibd vif add|del MAC [--vlan N] [--name eib0]
       eipoibd neigh flush [--name eib0]
       eipoibd capture [--name eib0] -w FILE [-c N] [--side fabric|tap]
Flags of eipoibd %s:
`, cmd)
	// Positional words first (show vifs, vif add MAC), flags after them.
	var words []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		words, args = append(words, args[0]), args[1:]
	}
	if err := cli.Parse(fs, args, usage, stderr, "eipoibd "+cmd+" -h lists the flags"); err != nil {
		return err
	}
	c := ctl.Client{Path: ctl.Path(*dir, *name)}
	switch cmd {
	case "show":
		if len(words) != 1 {
			return cli.UsageError{Msg: "show what? port, vifs, neigh, groups or stats"}
		}
		if *interval > 0 {
			if words[0] != ctl.ShowStats {
				return cli.UsageError{Msg: "--interval is for show stats"}
			}
			return statsEvery(c, *interval, *count, *asJSON)
		}
		data, err := c.Show(words[0])
		if err != nil {
			return err
		}
		return printShow(words[0], data, *asJSON)
	case "vif":
		if len(words) != 2 || (words[0] != "add" && words[0] != "del") {
			return cli.UsageError{Msg: "usage: eipoibd vif add|del MAC [--vlan N]"}
		}
		v := ctl.VIFRequest{MAC: words[1], VLAN: *vlan}
		if words[0] == "add" {
			return c.AddVIF(v)
		}
		return c.DelVIF(v)
	case "neigh":
		if len(words) != 1 || words[0] != "flush" {
			return cli.UsageError{Msg: "usage: eipoibd neigh flush"}
		}
		data, err := c.Do(ctl.Request{Cmd: ctl.CmdNeighFlush})
		if err == nil && *asJSON {
			fmt.Fprintln(stdout, string(data))
		}
		return err
	}
	// capture
	if *out == "" {
		return cli.UsageError{Msg: "capture needs -w FILE"}
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	err = c.Capture(ctl.CaptureRequest{Side: *side, Count: *count}, f)
	return errors.Join(err, f.Close())
}

// statsEvery prints the counters' changes every interval, count times
// (0: forever): non-zero deltas only, as "name delta (total)".
func statsEvery(c ctl.Client, every time.Duration, count int, asJSON bool) error {
	prev, err := c.ShowStats()
	if err != nil {
		return err
	}
	for i := 0; count == 0 || i < count; i++ {
		time.Sleep(every)
		cur, err := c.ShowStats()
		if err != nil {
			return err
		}
		delta := map[string]uint64{}
		for k, v := range cur {
			if v != prev[k] {
				delta[k] = v - prev[k]
			}
		}
		if asJSON {
			b, _ := json.Marshal(delta)
			fmt.Fprintln(stdout, string(b))
		} else {
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "# %s, changes over %s\n", time.Now().Format(time.TimeOnly), every)
			for _, k := range sortedNames(delta) {
				fmt.Fprintf(tw, "%s\t%d\t(%d)\n", k, delta[k], cur[k])
			}
			tw.Flush()
		}
		prev = cur
	}
	return nil
}

func sortedNames[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// printShow prints a show reply as JSON or in columns.
func printShow(what string, data json.RawMessage, asJSON bool) error {
	if asJSON {
		_, err := fmt.Fprintln(stdout, string(data))
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	switch what {
	case ctl.ShowPort:
		var p ctl.Port
		if err := json.Unmarshal(data, &p); err != nil {
			return err
		}
		fmt.Fprintf(tw, "name\t%s\nbackend\t%s %s\ngid\t%s\nib mtu\t%d\nipoib mtu\t%d\nlink\t%s\n", p.Name, p.Backend, p.Device, p.GID, p.IBMTU, p.IPoIBMTU, p.Link)
		for _, pt := range p.Partitions {
			fmt.Fprintf(tw, "partition\tvlan %d pkey %s\n", pt.VLAN, pt.PKey)
		}
	case ctl.ShowVIFs:
		var vs []ctl.VIF
		if err := json.Unmarshal(data, &vs); err != nil {
			return err
		}
		fmt.Fprintln(tw, "MAC\tVLAN\tPKEY\tQPN\tADDRESS\tORIGIN\tIDLE\tTX PKTS\tTX BYTES\tRX PKTS\tRX BYTES")
		for _, v := range vs {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%.0fs\t%d\t%d\t%d\t%d\n", v.MAC, v.VLAN, v.PKey, v.QPN, v.Address, v.Origin, v.IdleS, v.TxPackets, v.TxBytes, v.RxPackets, v.RxBytes)
		}
	case ctl.ShowNeigh:
		var ns []ctl.Neigh
		if err := json.Unmarshal(data, &ns); err != nil {
			return err
		}
		fmt.Fprintln(tw, "REMAC\tRIMAC\tPKEY\tIPS\tAGE")
		for _, n := range ns {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0fs\n", n.REMAC, n.RIMAC, n.PKey, strings.Join(n.IPs, ","), n.AgeS)
		}
	case ctl.ShowGroups:
		var gs []ctl.Group
		if err := json.Unmarshal(data, &gs); err != nil {
			return err
		}
		fmt.Fprintln(tw, "MGID\tMEMBERSHIP\tGUEST GROUPS")
		for _, g := range gs {
			kind := "full"
			if g.SendOnly {
				kind = "send-only"
			}
			var ms []string
			for _, m := range g.Members {
				state := fmt.Sprintf("expires %.0fs", m.ExpiresS)
				if m.QueriesLeft > 0 {
					state = fmt.Sprintf("leaving, %d queries left", m.QueriesLeft)
				}
				state += ", last reporter " + m.LastReporter
				ms = append(ms, fmt.Sprintf("%s vlan %d (%s)", m.Group, m.VLAN, state))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", g.MGID, kind, strings.Join(ms, "; "))
		}
	case ctl.ShowStats:
		var m ctl.Stats
		if err := json.Unmarshal(data, &m); err != nil {
			return err
		}
		for _, k := range sortedNames(m) {
			fmt.Fprintf(tw, "%s\t%d\n", k, m[k])
		}
	}
	return nil
}

// vifMetrics are the per-VIF metric families: packets and bytes each way
// (eipoibd_vif_{tx,rx}_{packets,bytes}) and idle seconds, labeled by MAC,
// VLAN and origin, all from one listing of the VIFs a scrape.
func vifMetrics(sh *shim.Shim) []prometheus.Collector {
	cols := []metrics.Column{
		{Name: "vif_tx_packets", Help: "Frames from the guest", Type: prometheus.CounterValue},
		{Name: "vif_tx_bytes", Help: "Bytes of frames from the guest", Type: prometheus.CounterValue},
		{Name: "vif_rx_packets", Help: "IPoIB packets to the guest", Type: prometheus.CounterValue},
		{Name: "vif_rx_bytes", Help: "Bytes of IPoIB packets to the guest", Type: prometheus.CounterValue},
		{Name: "vif_idle_seconds", Help: "Time since the VIF last carried traffic", Type: prometheus.GaugeValue},
	}
	return []prometheus.Collector{metrics.NewTable([]string{"mac", "vlan", "origin"}, cols, func() []metrics.Row {
		vs := sh.VIFs()
		out := make([]metrics.Row, len(vs))
		for i, v := range vs {
			out[i] = metrics.Row{
				Labels: []string{v.MAC.String(), strconv.Itoa(int(v.VLAN)), v.Origin.String()},
				Values: []float64{float64(v.TxPackets), float64(v.TxBytes), float64(v.RxPackets), float64(v.RxBytes), v.Idle.Seconds()},
			}
		}
		return out
	})}
}
