// Command taplink is the network benchmark's ceiling (scripts/bench.sh,
// row (e)): two TAPs, each with eipoibd's shim in front of it, joined by
// an in-memory fabric (internal/fabric/memfabric) in one process. A frame a guest
// sends into one TAP crosses the shim, the in-memory port and the other
// shim to the other TAP, so the TAP + shim cost is measured apart from
// the simulated fabric's (its UDP sockets, encoding and ICRC).
//
//	taplink --tap1 NAME --tap2 NAME [--offload=true] [--queues N] [--ib-mtu 4096] [--tap-mtu 9000] [--tap-queue-len 8192]
//
// Both TAPs are made in taplink's network namespace, up and unattached.
// The caller moves them where it wants (a TAP's queues stay open across
// "ip link set NAME netns NS") and enslaves them to its bridges. Each TAP
// and shim is set up exactly as "eipoibd run" sets up its own
// (daemon.TAPConfig, daemon.ShimConfig), with eipoibd run's defaults.
// taplink logs "taplink running" once both shims run. It stops on SIGINT
// or SIGTERM, logs each shim's non-zero counters (drops included) and
// removes both TAPs. A bad command line exits with status 2, a failure
// with status 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/daemon"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
)

const usage = `usage: taplink --tap1 NAME --tap2 NAME [flags]

Two TAPs joined by eipoibd's shim over an in-memory fabric, until SIGINT
or SIGTERM. Flags:
`

func main() {
	cli.Exit("taplink", run(os.Args[1:], os.Stderr))
}

// options are a parsed command line: the two TAPs' names and the
// settings both share, with eipoibd run's defaults.
type options struct {
	names [2]string
	cfg   daemon.Config
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{cfg: daemon.Config{
		// eipoibd run's defaults (cmd/eipoibd runFlags).
		MaxVIFs: 1024, MaxNeighbours: 65536, VIFIdle: 300 * time.Second,
		Learn: shim.LearnAuto, DHCP: shim.DHCPBroadcast,
	}}
	fs := flag.NewFlagSet("taplink", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.names[0], "tap1", "", "name of the first TAP (required)")
	fs.StringVar(&o.names[1], "tap2", "", "name of the second TAP (required)")
	fs.BoolVar(&o.cfg.Offload, "offload", true, "TAP offloads, as eipoibd run --offload")
	fs.IntVar(&o.cfg.Queues, "queues", 0, "queues of each TAP; 0: one per CPU")
	fs.IntVar(&o.cfg.IBMTU, "ib-mtu", 4096, "IB MTU of the in-memory fabric, 2048 or 4096")
	fs.IntVar(&o.cfg.TAPMTU, "tap-mtu", 9000, "MTU of each TAP itself, as eipoibd run --tap-mtu")
	fs.IntVar(&o.cfg.TAPQueueLen, "tap-queue-len", daemon.DefaultTAPQueueLen, "txqueuelen of each TAP, as eipoibd run --tap-queue-len")
	if err := cli.Parse(fs, args, usage, stderr, "taplink -h lists the flags"); err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error { return cli.UsageError{Msg: fmt.Sprintf(format, a...)} }
	switch {
	case o.names[0] == "" || o.names[1] == "":
		return nil, bad("--tap1 and --tap2 are required: the names of the two TAPs to create")
	case o.names[0] == o.names[1]:
		return nil, bad("--tap1 and --tap2 are both %q: give the TAPs two names", o.names[0])
	case o.cfg.IBMTU != 2048 && o.cfg.IBMTU != 4096:
		return nil, bad("--ib-mtu %d: want 2048 or 4096", o.cfg.IBMTU)
	case o.cfg.Queues < 0 || o.cfg.Queues > daemon.MaxQueues:
		return nil, bad("--queues %d: want 0 (one per CPU) to %d", o.cfg.Queues, daemon.MaxQueues)
	case o.cfg.TAPMTU < daemon.MinTAPMTU || o.cfg.TAPMTU > daemon.MaxTAPMTU:
		return nil, bad("--tap-mtu %d: want %d to %d", o.cfg.TAPMTU, daemon.MinTAPMTU, daemon.MaxTAPMTU)
	case o.cfg.TAPQueueLen < 0 || o.cfg.TAPQueueLen > daemon.MaxTAPQueueLen:
		return nil, bad("--tap-queue-len %d: want 0 (the TAP's own, 1000) to %d", o.cfg.TAPQueueLen, daemon.MaxTAPQueueLen)
	}
	if o.cfg.Queues == 0 {
		o.cfg.Queues = runtime.NumCPU()
	}
	return o, nil
}

func run(args []string, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return link(ctx, o, log, nil)
}

// link runs the two TAPs and their shims over one in-memory fabric until
// ctx ends or a shim stops on its own. Unless ready is nil, link closes
// it once both TAPs are made and set up and both shims started, just
// before it logs "taplink running". From then on the caller may move the
// TAPs to other namespaces; before, tap.Create may still be finding a
// TAP by name in this one.
func link(ctx context.Context, o *options, log *slog.Logger, ready chan<- struct{}) error {
	fab, err := memfabric.New(o.cfg.IBMTU)
	if err != nil {
		return fmt.Errorf("taplink: %w", err)
	}
	// The simulated fabric's ports take TCP and UDP super-packets and cut
	// them; so do these, so that the shim does the same work in front of
	// both.
	fab.SetTSO(true)
	fab.SetUSO(true)
	var shims [2]*shim.Shim
	for i, name := range o.names {
		cfg := o.cfg
		cfg.Name = name
		cfg.Logger = log.With("tap", name)
		// Link-local GIDs fe80::1 and fe80::2, as the simulated
		// fabric's come from the underlay's link-local addresses.
		port, err := fab.NewPort(ipoib.GID{0: 0xfe, 1: 0x80, 15: byte(i + 1)})
		if err != nil {
			return fmt.Errorf("taplink: %w", err)
		}
		defer port.Close()
		dev, err := tap.Create(daemon.TAPConfig(&cfg, port, nil))
		if err != nil {
			return fmt.Errorf("taplink: %w (run as root; the name must be free)", err)
		}
		defer dev.Close()
		if shims[i], err = shim.New(daemon.ShimConfig(&cfg, dev, port)); err != nil {
			return fmt.Errorf("taplink: %s: %w", name, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(shims))
	for i, sh := range shims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel() // one shim stopping stops the link
			errs[i] = sh.Run(ctx)
		}()
	}
	if ready != nil {
		close(ready)
	}
	log.Info("taplink running", "tap1", o.names[0], "tap2", o.names[1], "ib_mtu", o.cfg.IBMTU, "offload", o.cfg.Offload, "queues", o.cfg.Queues)
	wg.Wait()
	for i, sh := range shims {
		daemon.LogCounters(log.With("tap", o.names[i]), sh.Counters())
	}
	log.Info("taplink stopped")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("taplink: %w", err)
	}
	return nil
}
