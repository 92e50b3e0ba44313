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

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/ctl"
)

// clientCommands are the control socket's client commands, in the
// order the command list gives them (after run, host and keeper). Each
// names the control commands (package ctl's table) it sends; its run
// function follows below.
var clientCommands = []command{
	{name: "show", synopsis: "show " + strings.Join(ctl.Listings(), "|") + " [--name eib0] [--json] [--interval 1s [--count N]]", run: runShow, ctl: []string{ctl.CmdShow},
		summary: "print a running daemon's port, VIFs, neighbours, groups or counters",
		about: `Asks the daemon of TAP --name on its control socket: port (GID, MTUs,
link, partitions), vifs (the guests' VIFs), neigh (the remote
endpoints), groups (multicast) or stats (every counter; with
--interval, their changes every interval, like ip -s).`},
	{name: "vif", synopsis: "vif add|del MAC [--vlan N] [--name eib0]", run: runVIF, ctl: []string{ctl.CmdVIFAdd, ctl.CmdVIFDel},
		summary: "declare a guest's VIF ahead of its traffic, or remove one",
		about: `Declares the guest MAC on --vlan (its VIF stays until removed, however
idle), or removes its VIF.`},
	{name: "neigh", synopsis: "neigh flush [--name eib0] [--json]", run: runNeigh, ctl: []string{ctl.CmdNeighFlush},
		summary: "forget every remote endpoint (traffic learns them again)",
		about:   `Forgets every remote IPoIB endpoint the daemon knows.`},
	{name: "capture", synopsis: "capture -w FILE|- [-c N] [--side fabric|tap] [--name eib0]", run: runCapture, ctl: []string{ctl.CmdCapture},
		summary: "write a running daemon's packets as pcap (-w - to standard output)",
		about: `Writes what the daemon sends and receives as pcap to FILE, or to
standard output with -w - (eipoibd capture -w - | tcpdump -r -): the
fabric side (IPoIB, pcap link type 242) or the TAP side (Ethernet),
until -c packets or an interrupt.`},
}

// stdout is where the client commands print (a variable for the tests).
var stdout io.Writer = os.Stdout

// ctlFlags are the flags every client command takes: the daemon's TAP
// name and the directory of its control socket.
type ctlFlags struct {
	fs        *flag.FlagSet
	name, dir *string
}

// newCtlFlags is the flag set of client command cmd.
func newCtlFlags(cmd string) ctlFlags {
	fs := newFlags(cmd)
	return ctlFlags{
		fs:   fs,
		name: fs.String("name", "eib0", "the daemon's TAP name"),
		dir:  fs.String("ctl-dir", ctl.DefaultDir, "directory of the control sockets"),
	}
}

// parse takes the positional words first (show vifs, vif add MAC), then
// the flags after them, and returns the words.
func (f ctlFlags) parse(cmd string, args []string, stderr io.Writer) ([]string, error) {
	var words []string
	for len(args) > 0 && (args[0] == "-" || !strings.HasPrefix(args[0], "-")) {
		words, args = append(words, args[0]), args[1:]
	}
	return words, parseFlags(cmd, f.fs, args, stderr)
}

// client is the control socket's client of the daemon the flags name.
func (f ctlFlags) client() ctl.Client { return ctl.Client{Path: ctl.Path(*f.dir, *f.name)} }

// runShow is "eipoibd show WHAT".
func runShow(args []string, stderr io.Writer) error {
	f := newCtlFlags("show")
	asJSON := f.fs.Bool("json", false, "print JSON (stable field names, see the README)")
	interval := f.fs.Duration("interval", 0, "stats: print the changes every interval (like ip -s), --count times")
	count := f.fs.Int("count", 0, "stats --interval: rounds (0: until interrupted)")
	words, err := f.parse("show", args, stderr)
	if err != nil {
		return err
	}
	showWhat := ctl.Listings()
	want := "want " + strings.Join(showWhat, ", ")
	switch {
	case len(words) == 0:
		return usageError{Msg: "show what? " + want}
	case !slices.Contains(showWhat, words[0]):
		return usageError{Msg: fmt.Sprintf("show %q: %s", words[0], want)}
	case len(words) > 1:
		return usageError{Msg: fmt.Sprintf("unexpected argument %q", words[1])}
	case *interval > 0 && words[0] != ctl.ShowStats:
		return usageError{Msg: "--interval is for show stats"}
	case *interval > 0:
		return statsEvery(f.client(), *interval, *count, *asJSON)
	}
	data, err := f.client().Show(words[0])
	if err != nil {
		return err
	}
	return printShow(words[0], data, *asJSON)
}

// runVIF is "eipoibd vif add|del MAC": the MAC is checked here, before
// any daemon is asked.
func runVIF(args []string, stderr io.Writer) error {
	f := newCtlFlags("vif")
	vlan := f.fs.Int("vlan", 0, "the guest's VLAN (0: untagged)")
	words, err := f.parse("vif", args, stderr)
	if err != nil {
		return err
	}
	if len(words) != 2 || (words[0] != "add" && words[0] != "del") {
		return usageError{Msg: "want vif add|del MAC [--vlan N]"}
	}
	if _, err := ether.ParseMAC(words[1]); err != nil {
		return usageError{Msg: fmt.Sprintf("MAC %q: want six colon-separated hex bytes, e.g. 02:00:00:00:00:01", words[1])}
	}
	if *vlan < 0 || *vlan > 4094 {
		return usageError{Msg: fmt.Sprintf("--vlan %d: want 0 (untagged) to 4094", *vlan)}
	}
	v := ctl.VIFRequest{MAC: words[1], VLAN: *vlan}
	if words[0] == "add" {
		return f.client().AddVIF(v)
	}
	return f.client().DelVIF(v)
}

// runNeigh is "eipoibd neigh flush".
func runNeigh(args []string, stderr io.Writer) error {
	f := newCtlFlags("neigh")
	asJSON := f.fs.Bool("json", false, "print the daemon's answer as JSON")
	words, err := f.parse("neigh", args, stderr)
	if err != nil {
		return err
	}
	if len(words) != 1 || words[0] != "flush" {
		return usageError{Msg: "want neigh flush"}
	}
	fl, err := f.client().FlushNeighbours()
	if err == nil && *asJSON {
		b, _ := json.Marshal(fl)
		fmt.Fprintln(stdout, string(b))
	}
	return err
}

// runCapture is "eipoibd capture -w FILE": -w - writes to standard
// output.
func runCapture(args []string, stderr io.Writer) error {
	f := newCtlFlags("capture")
	var count int
	f.fs.IntVar(&count, "count", 0, "stop after this many packets (0: at an interrupt)")
	f.fs.IntVar(&count, "c", 0, "the same as --count")
	out := f.fs.String("w", "", "the pcap file to write; - for standard output")
	side := f.fs.String("side", ctl.SideFabric, "fabric (IPoIB, pcap link type 242) or tap (Ethernet)")
	words, err := f.parse("capture", args, stderr)
	switch {
	case err != nil:
		return err
	case len(words) > 0:
		return usageError{Msg: fmt.Sprintf("unexpected argument %q", words[0])}
	case *out == "":
		return usageError{Msg: "capture needs -w FILE (- for standard output)"}
	case *side != ctl.SideFabric && *side != ctl.SideTAP:
		return usageError{Msg: fmt.Sprintf("--side %q: want fabric or tap", *side)}
	}
	req := ctl.CaptureRequest{Side: *side, Count: count}
	if *out == "-" {
		return f.client().Capture(req, stdout)
	}
	w, err := os.Create(*out)
	if err != nil {
		return err
	}
	err = f.client().Capture(req, w)
	return errors.Join(err, w.Close())
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
