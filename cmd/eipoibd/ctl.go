package main

// The control socket's client commands (show, vif, neigh, capture): they
// print what the daemon (internal/daemon) answers, in columns like ip and
// bridge do, or as JSON.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/ctl"
)

// stdout is where the client commands print (a variable for the tests).
var stdout io.Writer = os.Stdout

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
			for _, k := range slices.Sorted(maps.Keys(delta)) {
				fmt.Fprintf(tw, "%s\t%d\t(%d)\n", k, delta[k], cur[k])
			}
			tw.Flush()
		}
		prev = cur
	}
	return nil
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
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(tw, "%s\t%d\n", k, m[k])
		}
	}
	return nil
}
