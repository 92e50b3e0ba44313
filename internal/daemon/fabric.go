package daemon

import (
	"fmt"
	"log/slog"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/faultport"
	"github.com/eipoib/eipoibd/ipoib/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib/simfabric"
	"github.com/eipoib/eipoibd/ipoib/verbsfabric"
)

// The fabric backends of Config.Fabric.
const (
	FabricSim    = "sim"    // the simulated UD fabric over Config.Underlay
	FabricKernel = "kernel" // the kernel's IPoIB driver under Config.IBDev
	FabricVerbs  = "verbs"  // UD QPs through libibverbs on Config.IBDev
)

// The bounds of Config.VerbsRecvDepth, and its default.
const (
	DefaultVerbsRecvDepth = verbsfabric.DefaultRecvDepth
	MinVerbsRecvDepth     = verbsfabric.MinRecvDepth
	MaxVerbsRecvDepth     = verbsfabric.MaxRecvDepth
)

// checkFabric validates the backend settings: --underlay for sim,
// --ib-dev for kernel and verbs (NAME or NAME:PORT for verbs).
func (c *Config) checkFabric() error {
	switch c.Fabric {
	case FabricSim:
		if c.Underlay == "" {
			return ConfigError{Msg: "--underlay is required (the interface the simulated fabric runs over)"}
		}
	case FabricKernel, FabricVerbs:
		if c.IBDev == "" {
			what := "the IPoIB parent interface, e.g. ib0"
			if c.Fabric == FabricVerbs {
				what = "the verbs device, e.g. mlx5_0 or rxe0"
			}
			return ConfigError{Msg: fmt.Sprintf("--fabric %s needs --ib-dev (%s)", c.Fabric, what)}
		}
		if c.Fabric == FabricVerbs {
			if _, _, err := verbsfabric.ParseDevice(c.IBDev); err != nil {
				return ConfigError{Msg: fmt.Sprintf("--ib-dev %q: %v", c.IBDev, err)}
			}
		}
		if c.Faults != (faultport.Faults{}) || c.Underlay != "" {
			return ConfigError{Msg: "--fault and --underlay are for --fabric sim"}
		}
		if c.RxWorkers > 1 {
			return ConfigError{Msg: fmt.Sprintf("--rx-workers %d: the %s backend receives on one queue; --rx-workers is for --fabric sim (leave it at 1)", c.RxWorkers, c.Fabric)}
		}
	default:
		return ConfigError{Msg: fmt.Sprintf("--fabric %q: want sim, kernel or verbs", c.Fabric)}
	}
	return nil
}

// openFabric opens the port of the chosen backend. The kernel and verbs
// backends take their MTU from the device, not --ib-mtu.
func openFabric(c *Config, log *slog.Logger) (ipoib.Port, error) {
	switch c.Fabric {
	case FabricKernel:
		return kernelfabric.New(kernelfabric.Config{Kernel: kernelfabric.System{}, Parent: c.IBDev, Logger: log})
	case FabricVerbs:
		return verbsfabric.New(verbsfabric.Config{Device: c.IBDev, RecvDepth: c.VerbsRecvDepth, Logger: log})
	}
	p, err := simfabric.Open(simfabric.Config{Underlay: c.Underlay, IBMTU: c.IBMTU, BusyPoll: c.BusyPoll, Sockets: rxWorkers(c)})
	if err != nil {
		return nil, err
	}
	if c.Faults == (faultport.Faults{}) {
		return p, nil
	}
	fp, err := faultport.New(p, c.Faults)
	if err != nil {
		p.Close()
		return nil, err
	}
	return fp, nil
}

// MaxRxWorkers bounds Config.RxWorkers: the simulated fabric's most
// sockets.
const MaxRxWorkers = simfabric.MaxSockets

// rxWorkers is the number of receive sockets (and RX workers) of the
// simulated fabric: --rx-workers, or for 0 one per TAP queue (at most
// simfabric.MaxSockets).
func rxWorkers(c *Config) int {
	if c.RxWorkers == 0 {
		return min(max(c.Queues, 1), MaxRxWorkers)
	}
	return c.RxWorkers
}

// toggleDown flips the simulated port down or up (SIGUSR1); other backends
// follow their real link state and ignore it.
func toggleDown(port ipoib.Port, log *slog.Logger) {
	if fp, ok := port.(*faultport.Port); ok {
		port = fp.Unwrap()
	}
	sp, ok := port.(*simfabric.Port)
	if !ok {
		log.Info("SIGUSR1 ignored: only the simulated port can be toggled")
		return
	}
	sp.SetDown(!sp.IsDown())
	log.Info("simulated port state toggled", "down", sp.IsDown())
}
