package daemon

// The registry of fabric backends: each is a name (--fabric), a check of
// the settings it takes and the opening of its port. Validate, Run,
// RunHost and "eipoibd version" all go through it. A new backend is its
// package under ipoib/ and an entry here.

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/fabric/verbsfabric"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/ipoib"
)

// The fabric backends' names, as Config.Fabric takes them.
const (
	FabricSim    = "sim"    // the simulated UD fabric over Config.Underlay
	FabricKernel = "kernel" // the kernel's IPoIB driver under Config.IBDev
	FabricVerbs  = "verbs"  // UD QPs through libibverbs on Config.IBDev
)

// Backend is a fabric backend of the registry.
type Backend struct {
	Name string // Config.Fabric
	// Tag is the build tag without which the backend cannot open its
	// port (it still checks its settings); empty for none.
	Tag string
	// takes are the flags of backendSettings the backend uses; the
	// others, given to it, are refused (checkFabric).
	takes []string
	// check refuses settings the backend cannot run with, with a
	// ConfigError naming the flag.
	check func(c *Config) error
	// open opens the port c asks for.
	open func(c *Config, log *slog.Logger) (fabric, error)
}

// fabric is an opened backend.
type fabric struct {
	port   ipoib.Port
	device string // the interface or device it runs on, as logs and show port name it
	// toggle flips the port down or up and says whether it is down now
	// (SIGUSR1); nil for a port that follows a real link.
	toggle func() (down bool)
	// fastPath: the kernel backend runs the BPF fast path (--fast-path,
	// useFastPath); startFastPath attaches it once the TAP exists.
	fastPath bool
}

// backends is the registry, in the order "eipoibd version" lists it.
var backends = []Backend{
	{Name: FabricSim, takes: []string{"underlay", "fault", "ib-mtu", "rx-workers"}, check: checkSim, open: openSim},
	{Name: FabricKernel, takes: []string{"ib-dev", "fast-path", "bpf-dir"}, check: checkKernel, open: openKernel},
	{Name: FabricVerbs, Tag: "verbs", takes: []string{"ib-dev", "verbs-recv-depth"}, check: checkVerbs, open: openVerbs},
}

// backendSetting is a setting that only some backends use (Backend.takes).
type backendSetting struct {
	flag string
	// given reports whether c gives the setting a value other than its
	// default, and that value as the flag shows it ("" for one c holds
	// parsed, not as text).
	given func(c *Config) (value string, ok bool)
}

// backendSettings are the settings only some backends use. Each is
// refused with another backend when it is away from its default, rather
// than silently ignored: a default written out (the reference config
// file, docs/eipoibd.toml, writes every key) changes nothing and passes.
var backendSettings = []backendSetting{
	{"underlay", func(c *Config) (string, bool) { return strconv.Quote(c.Underlay), c.Underlay != "" }},
	{"fault", func(c *Config) (string, bool) { return "", c.Faults != (faultport.Faults{}) }},
	{"ib-mtu", func(c *Config) (string, bool) { return strconv.Itoa(c.IBMTU), c.IBMTU != DefaultIBMTU }},
	// 0 (one per TAP queue) and 1 change nothing for a backend that
	// receives on one queue.
	{"rx-workers", func(c *Config) (string, bool) { return strconv.Itoa(c.RxWorkers), c.RxWorkers > 1 }},
	{"ib-dev", func(c *Config) (string, bool) { return strconv.Quote(c.IBDev), c.IBDev != "" }},
	{"fast-path", func(c *Config) (string, bool) { return c.FastPath.String(), c.FastPath != fastpath.Off }},
	{"bpf-dir", func(c *Config) (string, bool) {
		return strconv.Quote(c.BPFDir), c.BPFDir != "" && c.BPFDir != fastpath.PinBase
	}},
	{"verbs-recv-depth", func(c *Config) (string, bool) {
		return strconv.Itoa(c.VerbsRecvDepth), c.VerbsRecvDepth != 0 && c.VerbsRecvDepth != DefaultVerbsRecvDepth
	}},
}

// DefaultIBMTU is the IB MTU of the simulated fabric when --ib-mtu is
// not given; the other backends take their device's.
const DefaultIBMTU = 4096

// checkBackendSettings refuses a setting of backendSettings that b does
// not use, naming it, its value, the backends that use it and b.
func (c *Config) checkBackendSettings(b Backend) error {
	for _, s := range backendSettings {
		v, ok := s.given(c)
		if !ok || slices.Contains(b.takes, s.flag) {
			continue
		}
		var users []string
		for _, o := range backends {
			if slices.Contains(o.takes, s.flag) {
				users = append(users, o.Name)
			}
		}
		given := "--" + s.flag
		if v != "" {
			given += " " + v
		}
		return ConfigError{Msg: fmt.Sprintf("%s is for --fabric %s, not --fabric %s", given, cli.OrList(users), b.Name)}
	}
	return nil
}

// Backends are the registry's backends.
func Backends() []Backend { return slices.Clone(backends) }

// backend is the backend c names.
func (c *Config) backend() (Backend, error) {
	i := slices.IndexFunc(backends, func(b Backend) bool { return b.Name == c.Fabric })
	if i < 0 {
		names := make([]string, len(backends))
		for i, b := range backends {
			names[i] = b.Name
		}
		return Backend{}, ConfigError{Msg: fmt.Sprintf("--fabric %q: want %s", c.Fabric, cli.OrList(names))}
	}
	return backends[i], nil
}

// checkFabric checks the backend's settings: none that only other
// backends use, and its own.
func (c *Config) checkFabric() error {
	b, err := c.backend()
	if err != nil {
		return err
	}
	if err := c.checkBackendSettings(b); err != nil {
		return err
	}
	return b.check(c)
}

// openFabric opens the port of the backend c names, its settings
// checked.
func openFabric(c *Config, log *slog.Logger) (fabric, error) {
	b, err := c.backend()
	if err != nil {
		return fabric{}, err
	}
	return b.open(c, log)
}

// The bounds of Config.VerbsRecvDepth, and its default.
const (
	DefaultVerbsRecvDepth = verbsfabric.DefaultRecvDepth
	MinVerbsRecvDepth     = verbsfabric.MinRecvDepth
	MaxVerbsRecvDepth     = verbsfabric.MaxRecvDepth
)

// checkSim: the simulated fabric runs over --underlay.
func checkSim(c *Config) error {
	if c.Underlay == "" {
		return ConfigError{Msg: "--underlay is required (the interface the simulated fabric runs over)"}
	}
	return nil
}

// openSim opens the simulated fabric's port, behind a faultport with
// --fault. SIGUSR1 toggles it down and up.
func openSim(c *Config, _ *slog.Logger) (fabric, error) {
	p, err := simfabric.Open(simfabric.Config{Underlay: c.Underlay, IBMTU: c.IBMTU, BusyPoll: c.BusyPoll, Sockets: rxWorkers(c)})
	if err != nil {
		return fabric{}, err
	}
	f := fabric{port: p, device: c.Underlay, toggle: func() bool {
		p.SetDown(!p.IsDown())
		return p.IsDown()
	}}
	if c.Faults == (faultport.Faults{}) {
		return f, nil
	}
	if f.port, err = faultport.New(p, c.Faults); err != nil {
		p.Close()
		return fabric{}, err
	}
	return f, nil
}

// checkKernel: the kernel backend runs under the IPoIB parent --ib-dev.
func checkKernel(c *Config) error {
	return checkIBDev(c, "the IPoIB parent interface, e.g. ib0", nil)
}

// openKernel opens the kernel backend's port, whose MTU is the
// device's, not --ib-mtu. Under --persist it adopts the IPoIB children
// an earlier run left (kernelfabric.Config.Persist; endAdoption ends
// that) and keeps its own when it stops (keepChildren).
func openKernel(c *Config, log *slog.Logger) (fabric, error) {
	use, err := useFastPath(c.FastPath, fastpath.Probe, log)
	if err != nil {
		return fabric{}, err
	}
	k, err := newKernel(log)
	if err != nil {
		return fabric{}, err
	}
	p, err := kernelfabric.New(kernelfabric.Config{Kernel: k, Parent: c.IBDev, Logger: log, FastPath: use, Persist: c.Persist})
	if err != nil {
		return fabric{}, err
	}
	return fabric{port: p, device: c.IBDev, fastPath: use}, nil
}

// newKernel is the kernel the kernel backend runs on: the real one. It
// is the emulation's seam: eipoibd built with the emuib tag (emuib.go,
// for the tests only) runs the backend on an emulated IPoIB kernel
// instead (package emuib/emukernel).
var newKernel = func(*slog.Logger) (kernelfabric.Kernel, error) { return kernelfabric.System{}, nil }

// useFastPath decides whether the kernel backend runs the BPF fast path:
// never with --fast-path off (probe is not called); with auto when probe
// passes, else it logs why not, once, and the user-space path runs; with
// on when probe passes, else it refuses to start, saying what is missing.
func useFastPath(m fastpath.Mode, probe func() error, log *slog.Logger) (bool, error) {
	if m == fastpath.Off {
		return false, nil
	}
	err := probe()
	switch {
	case err == nil:
		return true, nil
	case m == fastpath.On:
		return false, fmt.Errorf("--fast-path on: this kernel cannot run it: %w", err)
	}
	log.Warn("fast path off: this kernel cannot run it; frames cross user space", "fast_path", m, "reason", err)
	return false, nil
}

// startFastPath attaches the fast path's programs (TX at the egress of
// the TAP) and returns what the shim keeps in step with its tables
// (shim.Config.FastPath) and the closing of the programs, to run once
// the shim has stopped; nil and a no-op when f runs none. An attach that
// fails refuses the start under --fast-path on, and is logged, the
// user-space path running alone, under auto.
//
// Under --persist the fast path is pinned in --bpf-dir/NAME (a bpffs is
// mounted if there is none) and the closing leaves it attached and
// pinned, for the next start to take over (fastpath.AttachWith). A start
// that does not pin it removes what an earlier --persist run pinned
// there.
func startFastPath(f fabric, c *Config, log *slog.Logger) (shim.FastPath, func(), error) {
	base := c.BPFDir
	if base == "" {
		base = fastpath.PinBase
	}
	dir := filepath.Join(base, c.Name)
	kp, ok := f.port.(*kernelfabric.Port)
	use := f.fastPath && ok
	if !use || !c.Persist {
		unpinFastPath(dir, base, c.Name, log)
	}
	if !use {
		return nil, func() {}, nil
	}
	ifi, err := net.InterfaceByName(c.Name)
	if err != nil {
		err = fmt.Errorf("TAP %s: %w", c.Name, err)
	}
	pin := ""
	if c.Persist {
		pin = dir
		if err == nil {
			err = fastpath.MountBPFFS(base)
		}
	}
	var att *fastpath.Attached
	if err == nil {
		att, err = fastpath.AttachWith(ifi.Index, fastpath.Options{Pin: pin, Log: log})
	}
	if err != nil {
		if c.FastPath == fastpath.On {
			return nil, nil, fmt.Errorf("--fast-path on: %w", err)
		}
		log.Warn("fast path off: its programs did not attach; frames cross user space", "fast_path", c.FastPath, "reason", err)
		return nil, func() {}, nil
	}
	log.Info("fast path attached", "tap", c.Name, "tap_ifindex", ifi.Index, "hook", att.Hook(), "pinned", pin)
	fp := kp.NewFastPath(att, ifi.Index, ifi.MTU)
	return fp, func() {
		fp.Stop()
		if pin != "" {
			if err := att.Release(); err != nil {
				log.Warn("fast path: release for the next start", "err", err)
			}
			return
		}
		if err := att.Close(); err != nil {
			log.Warn("fast path: detach", "err", err)
		}
		os.Remove(base) // when no other TAP pins there
	}, nil
}

// unpinFastPath removes the fast path an earlier --persist run pinned
// in dir (under base) for the TAP tap, if there is one, and our clsact
// filter on the TAP even when dir is gone (removed by hand).
func unpinFastPath(dir, base, tap string, log *slog.Logger) {
	_, err := os.Stat(dir)
	pinned := err == nil
	index := 0 // no TAP: no filter of ours on it either
	if ifi, err := net.InterfaceByName(tap); err == nil {
		index = ifi.Index
	}
	if !pinned && index == 0 {
		return
	}
	if err := fastpath.RemovePins(dir, index); err != nil {
		log.Warn("fast path: removing what a --persist run pinned", "dir", dir, "err", err)
		return
	}
	if pinned {
		os.Remove(base) // when no other TAP pins there
		log.Info("fast path: removed what a --persist run pinned", "dir", dir)
	}
}

// checkVerbs: the verbs backend runs on the device --ib-dev, NAME or
// NAME:PORT.
func checkVerbs(c *Config) error {
	return checkIBDev(c, "the verbs device, e.g. mlx5_0 or rxe0", func(dev string) error {
		_, _, err := verbsfabric.ParseDevice(dev)
		return err
	})
}

// openVerbs opens the verbs backend's port, whose MTU is the device's,
// not --ib-mtu. Without the verbs build tag it fails, saying so.
func openVerbs(c *Config, log *slog.Logger) (fabric, error) {
	p, err := verbsfabric.New(verbsfabric.Config{Device: c.IBDev, RecvDepth: c.VerbsRecvDepth, Logger: log})
	if err != nil {
		return fabric{}, err
	}
	return fabric{port: p, device: c.IBDev}, nil
}

// checkIBDev checks the settings of a backend on a real IB device: it
// needs --ib-dev (what: what the device is; parse, if not nil, checks
// its form).
func checkIBDev(c *Config, what string, parse func(dev string) error) error {
	if c.IBDev == "" {
		return ConfigError{Msg: fmt.Sprintf("--fabric %s needs --ib-dev (%s)", c.Fabric, what)}
	}
	if parse != nil {
		if err := parse(c.IBDev); err != nil {
			return ConfigError{Msg: fmt.Sprintf("--ib-dev %q: %v", c.IBDev, err)}
		}
	}
	return nil
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

// endAdoption deletes the IPoIB children an earlier --persist run left
// that no restored guest claimed (kernelfabric.Port.EndAdoption): Run
// calls it once the saved state is restored, before the shim runs.
func endAdoption(f fabric, log *slog.Logger) {
	if kp, ok := f.port.(*kernelfabric.Port); ok {
		if err := kp.EndAdoption(); err != nil {
			log.Warn("kernel: children left by an earlier run not all deleted", "err", err)
		}
	}
}

// keepChildren has the kernel backend leave its IPoIB children, and the
// fast path's maps, in place as the daemon stops under --persist
// (kernelfabric.Port.Keep), for the next start to adopt: the fast path
// carries the guests' unicast meanwhile.
func keepChildren(f fabric) {
	if kp, ok := f.port.(*kernelfabric.Port); ok {
		kp.Keep()
	}
}

// toggleDown flips a simulated port down or up (SIGUSR1); the other
// backends follow their real link state and ignore it.
func toggleDown(f fabric, log *slog.Logger) {
	if f.toggle == nil {
		log.Info("SIGUSR1 ignored: only the simulated port can be toggled")
		return
	}
	log.Info("simulated port state toggled", "down", f.toggle())
}
