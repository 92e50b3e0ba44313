package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/keeper"
)

// keeperOptions are the parsed flags of "keeper".
type keeperOptions struct {
	cfg                 keeper.Config
	logLevel, logFormat string
	level               slog.Level
}

func parseKeeper(args []string, stderr io.Writer) (*keeperOptions, error) {
	o := &keeperOptions{}
	fs := newFlags("keeper")
	fs.StringVar(&o.cfg.Socket, "socket", filepath.Join(ctl.DefaultDir, "keeper.sock"), "path of the keeper's socket (eipoibd run --fd-store)")
	fs.IntVar(&o.cfg.MaxFDs, "max-fds", keeper.DefaultMaxFDs, "most file descriptors held, all names together (a TAP has one per queue)")
	fs.IntVar(&o.cfg.MaxNames, "max-names", keeper.DefaultMaxNames, "most names held (one per TAP)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	if err := parseFlags("keeper", fs, args, stderr); err != nil {
		return nil, err
	}
	if err := checkLog(o.logLevel, o.logFormat, &o.level); err != nil {
		return nil, err
	}
	switch {
	case o.cfg.Socket == "":
		return nil, usageError{Msg: "--socket: give the path of the keeper's socket"}
	case o.cfg.MaxFDs < 1:
		return nil, usageError{Msg: fmt.Sprintf("--max-fds %d: want at least 1", o.cfg.MaxFDs)}
	case o.cfg.MaxNames < 1:
		return nil, usageError{Msg: fmt.Sprintf("--max-names %d: want at least 1", o.cfg.MaxNames)}
	}
	return o, nil
}

// runKeeper is "eipoibd keeper": it holds descriptors until SIGINT or
// SIGTERM.
func runKeeper(args []string, stderr io.Writer) error {
	o, err := parseKeeper(args, stderr)
	if err != nil {
		return err
	}
	log := newLogger(o.logFormat, stderr, o.level)
	o.cfg.Logger = log
	k, err := keeper.Listen(o.cfg)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR2)
	defer signal.Stop(sig)
	served := make(chan error, 1)
	go func() { served <- k.Serve() }()
	for {
		select {
		case err := <-served:
			k.Close()
			return err
		case s := <-sig:
			if s == syscall.SIGUSR2 {
				log.Info("keeper holds", "fds_by_name", fmt.Sprint(k.Held()), "counters", fmt.Sprint(k.Counters()))
				continue
			}
			err := k.Close()
			<-served
			return err
		}
	}
}
