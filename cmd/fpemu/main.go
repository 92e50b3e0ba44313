// Command fpemu sets up the fast path end to end over the EMULATED IPoIB
// wire (package kernelfabric/emuib/testbed) between two existing
// hypervisor namespaces, for the network benchmark (scripts/bench.sh,
// row (f)). It is no part of eipoibd: no daemon runs, the guests' ARP
// and NDP are not answered (fpemu gives each guest a permanent
// neighbour entry for the other's addresses, with the REMAC eipoibd
// would show it), and what the fast path leaves to user space is read
// from the TAPs and dropped.
//
//	fpemu --fabric NS --hosts H1,H2 --guests G1:DEV,G2:DEV [--bridge br0] [--prefix fp] [--offload=true] [--mtu 4092] [--plain]
//
// In each hypervisor it makes a TAP <prefix>t in the bridge, with the TX
// program at its egress, and a veth child <prefix>c, with the harness
// and the RX program at its ingress, whose peer is a fabric end
// <prefix>f1 or <prefix>f2 in the fabric namespace, where the wire runs;
// the maps are filled through kernelfabric.FastPath. With --plain
// (row (g)) it builds the emulation alone instead: the same veths with
// the children in the bridges and a plain redirect at the fabric ends
// (testbed.StartPlain), no TAP and no fast path program, so that the
// emulation's own cost is measured apart. It logs "fpemu running" once
// the maps hold both guests (at once with --plain). It stops on SIGINT or
// SIGTERM, logs the programs' counters and removes what it made. A bad
// command line exits with status 2, a failure with status 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib/testbed"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
)

const usage = `usage: fpemu --fabric NS --hosts H1,H2 --guests G1:DEV,G2:DEV [flags]

The fast path between two hypervisor namespaces over an emulated IPoIB
wire, until SIGINT or SIGTERM. Flags:
`

func main() {
	cli.Exit("fpemu", run(os.Args[1:], os.Stderr))
}

// options are a parsed command line.
type options struct {
	cfg   testbed.Config
	plain bool
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	cfg := &o.cfg
	var hosts, guests, bridge string
	fs := flag.NewFlagSet("fpemu", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Fabric, "fabric", "", "namespace of the fabric ends (required; it must exist)")
	fs.StringVar(&hosts, "hosts", "", "the two hypervisor namespaces, comma-separated (required)")
	fs.StringVar(&guests, "guests", "", "each hypervisor's guest, NS:DEV, comma-separated (required)")
	fs.StringVar(&bridge, "bridge", "br0", "the bridge, in each hypervisor, of the guest's port")
	fs.StringVar(&cfg.Prefix, "prefix", "fp", "prefix of the devices fpemu makes")
	fs.BoolVar(&cfg.Offload, "offload", true, "TAP offloads, as eipoibd run --offload")
	fs.IntVar(&cfg.MTU, "mtu", 4092, "IPoIB MTU of the emulated ports")
	fs.BoolVar(&o.plain, "plain", false, "the emulation alone: the children in the bridges, no TAP, no fast path")
	if err := cli.Parse(fs, args, usage, stderr, "fpemu -h lists the flags"); err != nil {
		return o, err
	}
	bad := func(format string, a ...any) error { return cli.UsageError{Msg: fmt.Sprintf(format, a...)} }
	h, g := strings.Split(hosts, ","), strings.Split(guests, ",")
	switch {
	case cfg.Fabric == "":
		return o, bad("--fabric is required: the namespace of the fabric ends")
	case len(h) != 2 || h[0] == "" || h[1] == "" || h[0] == h[1]:
		return o, bad("--hosts %q: want two hypervisor namespaces, H1,H2", hosts)
	case len(g) != 2:
		return o, bad("--guests %q: want two guests, NS:DEV,NS:DEV", guests)
	case cfg.MTU < 1280 || cfg.MTU > 4092:
		return o, bad("--mtu %d: want 1280 to 4092", cfg.MTU)
	case cfg.Prefix == "" || len(cfg.Prefix) > 10:
		return o, bad("--prefix %q: want 1 to 10 characters", cfg.Prefix)
	}
	for i := range cfg.Hosts {
		ns, dev, ok := strings.Cut(g[i], ":")
		if !ok || ns == "" || dev == "" {
			return o, bad("--guests: %q is not NS:DEV", g[i])
		}
		cfg.Hosts[i] = testbed.Host{NS: h[i], Bridge: bridge, GuestNS: ns, GuestDev: dev}
	}
	return o, nil
}

func run(args []string, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	cfg := o.cfg
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.plain {
		bed, err := testbed.StartPlain(cfg)
		if err != nil {
			return err
		}
		log.Info("fpemu running", "plain", true)
		<-ctx.Done()
		return bed.Close()
	}
	bed, err := testbed.Start(cfg)
	if err != nil {
		return err
	}
	for i := range cfg.Hosts {
		log.Info("guest", "host", cfg.Hosts[i].NS, "addrs", bed.GuestIPs(i), "seen as", bed.REMAC(i).String())
	}
	log.Info("fpemu running", "offload", cfg.Offload, "mtu", cfg.MTU)
	<-ctx.Done()
	for i := range cfg.Hosts {
		tx, rx, err := bed.Counts(i)
		if err != nil {
			log.Error("counters", "host", cfg.Hosts[i].NS, "err", err)
			continue
		}
		attrs := []any{"host", cfg.Hosts[i].NS, "to user space", bed.Fallbacks(i)}
		for r, n := range tx {
			if n > 0 {
				attrs = append(attrs, "tx_"+fastpath.Reason(r).String(), n)
			}
		}
		for r, n := range rx {
			if n > 0 {
				attrs = append(attrs, "rx_"+fastpath.RXReason(r).String(), n)
			}
		}
		log.Info("fast path counters", attrs...)
	}
	if w, err := bed.WireCounts(); err == nil {
		attrs := []any{}
		for r, n := range w {
			attrs = append(attrs, emuib.Reason(r).String(), n)
		}
		log.Info("wire counters", attrs...)
	}
	return bed.Close()
}
