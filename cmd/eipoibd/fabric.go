package main

import (
	"fmt"
	"log/slog"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/faultport"
	"github.com/eipoib/eipoibd/ipoib/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib/simfabric"
	"github.com/eipoib/eipoibd/ipoib/verbsfabric"
)

// checkFabric validates the backend flags: --underlay for sim, --ib-dev
// for kernel and verbs.
func checkFabric(o *options) error {
	switch o.fabric {
	case "sim":
		if o.underlay == "" {
			return usageError{Msg: "--underlay is required (the interface the simulated fabric runs over)"}
		}
	case "kernel", "verbs":
		if o.ibDev == "" {
			what := "the IPoIB parent interface, e.g. ib0"
			if o.fabric == "verbs" {
				what = "the verbs device, e.g. mlx5_0 or rxe0"
			}
			return usageError{Msg: fmt.Sprintf("--fabric %s needs --ib-dev (%s)", o.fabric, what)}
		}
		if o.faults != "" || o.underlay != "" {
			return usageError{Msg: "--fault and --underlay are for --fabric sim"}
		}
	default:
		return usageError{Msg: fmt.Sprintf("--fabric %q: want sim, kernel or verbs", o.fabric)}
	}
	return nil
}

// openFabric opens the port of the chosen backend. The kernel and verbs
// backends take their MTU from the device, not --ib-mtu.
func openFabric(o *options, faults faultport.Faults, log *slog.Logger) (ipoib.Port, error) {
	switch o.fabric {
	case "kernel":
		return kernelfabric.New(kernelfabric.Config{Kernel: kernelfabric.System{}, Parent: o.ibDev, Logger: log})
	case "verbs":
		return verbsfabric.New(verbsfabric.Config{Device: o.ibDev, Logger: log})
	}
	p, err := simfabric.Open(simfabric.Config{Underlay: o.underlay, IBMTU: o.ibMTU})
	if err != nil || faults == (faultport.Faults{}) {
		return p, err
	}
	fp, err := faultport.New(p, faults)
	if err != nil {
		p.Close()
		return nil, err
	}
	return fp, nil
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
