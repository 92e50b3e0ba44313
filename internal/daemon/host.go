package daemon

// "eipoibd host": a native IPoIB host on the simulated fabric (package
// ipoibhost), with its TUN device. It opens its port through the
// backends' registry, as Run does.

import (
	"context"
	"log/slog"
	"os"
	"syscall"

	"github.com/eipoib/eipoibd/internal/ipoibhost"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
)

// HostConfig is what RunHost runs with; each field is the setting of the
// "eipoibd host" flag named beside it.
type HostConfig struct {
	Name          string     // --name: the TUN device
	Underlay      string     // --underlay
	IBMTU         int        // --ib-mtu: 2048 or 4096
	PKey          ipoib.PKey // --pkey
	MaxNeighbours int        // --max-neighbours
	NeighFile     string     // --neigh-file: empty for none
	Logger        *slog.Logger
	// Signals delivers SIGUSR1 (log the neighbour table) and SIGUSR2
	// (log the counters); nil for none.
	Signals <-chan os.Signal
}

// RunHost runs a native IPoIB host until ctx ends, then logs its
// counters and removes its TUN device.
func RunHost(ctx context.Context, cfg HostConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fc := Config{Fabric: FabricSim, Underlay: cfg.Underlay, IBMTU: cfg.IBMTU}
	if err := fc.checkFabric(); err != nil {
		return err
	}
	fab, err := openFabric(&fc, log)
	if err != nil {
		return err
	}
	port := fab.port
	defer port.Close()
	ipMTU, _ := ipoib.IPMTU(cfg.IBMTU)
	dev, err := tap.Create(tap.Config{Name: cfg.Name, MTU: ipMTU, TUN: true})
	if err != nil {
		return err
	}
	defer dev.Close()
	h, err := ipoibhost.New(ipoibhost.Config{
		Device: dev, Port: port, Link: ipoibhost.OSLink(cfg.Name), Name: cfg.Name,
		PKey: cfg.PKey, Logger: log, MaxNeighbours: cfg.MaxNeighbours, NeighFile: cfg.NeighFile,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	sigDone := make(chan struct{})
	defer func() { cancel(); <-sigDone }()
	go func() {
		defer close(sigDone)
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-cfg.Signals:
				if s == syscall.SIGUSR1 {
					log.Info("neighbours\n" + h.Neighbours())
				} else if s == syscall.SIGUSR2 {
					LogCounters(log, h.Counters())
				}
			}
		}
	}()
	log.Info("started", "tun", cfg.Name, "underlay", cfg.Underlay, "gid", port.LocalGID(), "ib_mtu", cfg.IBMTU, "ipoib_mtu", ipMTU)
	err = h.Run(ctx)
	LogCounters(log, h.Counters())
	log.Info("stopped", "tun_removed", cfg.Name)
	return err
}
