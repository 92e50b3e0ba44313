package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/eipoib/eipoibd/internal/daemon"
	"github.com/eipoib/eipoibd/ipoib"
)

// hostOptions are the parsed flags of "host".
type hostOptions struct {
	underlay, name, pkey, neighFile, logLevel string
	config, logFormat                         string
	level                                     slog.Level
	pkeyV                                     ipoib.PKey
	ibMTU, maxNeigh                           int
}

func parseHost(args []string, stderr io.Writer) (*hostOptions, error) {
	o := &hostOptions{}
	fs := newFlags("host")
	fs.StringVar(&o.underlay, "underlay", "", "underlay interface of the simulated fabric (required)")
	fs.StringVar(&o.name, "name", "ib0", "name of the TUN device to create")
	fs.IntVar(&o.ibMTU, "ib-mtu", daemon.DefaultIBMTU, "IB MTU, 2048 or 4096 (the device's MTU is 4 less)")
	fs.StringVar(&o.pkey, "pkey", "0xffff", "partition key")
	fs.IntVar(&o.maxNeigh, "max-neighbours", 4096, "most neighbours remembered")
	fs.StringVar(&o.neighFile, "neigh-file", "", "file rewritten with the neighbour table whenever it changes")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.config, "config", "", "TOML file of flag values (keys are the flag names); flags on the command line win")
	if err := parseFlags("host", fs, args, stderr); err != nil {
		return nil, err
	}
	if err := withConfig(fs, o.config, o.check); err != nil {
		return nil, err
	}
	return o, nil
}

// check validates the options of "host".
func (o *hostOptions) check() error {
	err := checkLog(o.logLevel, o.logFormat, &o.level)
	switch {
	case err != nil:
		return err
	case o.underlay == "":
		return usageError{Msg: "--underlay is required (the interface the simulated fabric runs over)"}
	case o.ibMTU != 2048 && o.ibMTU != 4096:
		return usageError{Msg: fmt.Sprintf("--ib-mtu %d: want 2048 or 4096", o.ibMTU)}
	case o.maxNeigh < 1:
		return usageError{Msg: fmt.Sprintf("--max-neighbours %d: want at least 1", o.maxNeigh)}
	}
	if o.pkeyV, err = ipoib.ParsePKey(o.pkey); err != nil {
		return usageError{Msg: "--pkey: " + err.Error()}
	}
	return nil
}

// runHost is "eipoibd host": a native IPoIB host until SIGINT or SIGTERM.
func runHost(args []string, stderr io.Writer) error {
	o, err := parseHost(args, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sig)
	return daemon.RunHost(ctx, daemon.HostConfig{
		Name: o.name, Underlay: o.underlay, IBMTU: o.ibMTU, PKey: o.pkeyV, MaxNeighbours: o.maxNeigh, NeighFile: o.neighFile,
		Logger: newLogger(o.logFormat, stderr, o.level), Signals: sig,
	})
}
