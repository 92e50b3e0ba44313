// Package daemon is eipoibd's "run". It opens the TAP and the fabric
// port, builds and runs the shim, and attaches the TAP to its switch and
// follows the switch's guests. It serves the control socket and the
// metrics, reloads its settings on SIGHUP, keeps its state across
// restarts (--persist) and talks to systemd. cmd/eipoibd parses the
// command line and the config file into a Config and calls Run; tests
// call Run in-process.
//
// It lives under internal/ because nothing outside this module embeds
// eipoibd: its Config follows the flags, and may change with them.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/snoop"
)

// MaxQueues bounds Config.Queues: the kernel's limit on TUN queues
// (MAX_TAP_QUEUES, drivers/net/tun.c).
const MaxQueues = 256

// MaxBusyPoll bounds Config.BusyPoll: a reader spins at most this long
// before it sleeps (a longer spin only burns a core between packets).
const MaxBusyPoll = 10 * time.Millisecond

// MinTAPMTU and MaxTAPMTU bound Config.TAPMTU: IPv6's minimum link MTU
// (RFC 8200 §5), and the largest MTU a TAP takes, 65535 less its
// Ethernet header (tun_net_init's max_mtu, drivers/net/tun.c).
const (
	MinTAPMTU = 1280
	MaxTAPMTU = 65535 - 14
)

// DefaultTAPQueueLen is --tap-queue-len's default. A TAP queue must hold
// what guests send while its reader is off the CPU. On the bench's two
// cores, a guest sent 64-byte datagrams one a call at 220,000 a second
// while the reader waited a few ms for a core. The TAP's queue lost
// 3.7 % of them at the 1000 a TAP is created with, 0.07 % at 4096, and none
// at 8192 up to the sender's most (264,000 a second).
//
// A queued frame is orphaned (tun_net_xmit's skb_orphan), not charged to
// the guest's socket. A full queue of 64-byte frames holds about 8 MB of
// kernel memory. At worst, full of 64 KB super-frames that a guest sends
// faster than eipoibd reads them, it holds 512 MB (64 MB at 1000). TCP's
// super-frames are bounded by the guests' windows before that.
const DefaultTAPQueueLen = 8192

// MaxTAPQueueLen bounds Config.TAPQueueLen. Each queue's ring is an
// array of a pointer per frame, and __ptr_ring_init_queue_alloc
// (include/linux/ptr_ring.h) refuses one above KMALLOC_MAX_SIZE (4 MB on
// x86-64) / 8. On this kernel a TAP with a queue open takes 524,288 and
// refuses 524,289 (EPERM, tun_device_event's NOTIFY_BAD).
const MaxTAPQueueLen = 1 << 19

// gcPercent is the collector's GOGC unless $GOGC sets one: the heap may
// grow by half the live heap between collections, not by all of it.
const gcPercent = 50

// MaxMemoryLimit bounds Config.MemoryLimit (MiB): 1 TiB, far past any
// daemon's needs, so that a unit slip (bytes for MiB) is refused.
const MaxMemoryLimit = 1 << 20

// announceWindow is how long after a guest's MAC appears (its VIF made,
// or its RARP after a live migration) the addresses it shows are
// announced on the fabric.
const announceWindow = 30 * time.Second

// Config is what the daemon runs with. Each field is the setting of the
// flag (and config file key) named beside it; docs/flags.md, generated
// from the flags, says what it means.
type Config struct {
	Name           string        // --name: the TAP
	MAC            ether.MAC     // --mac: the TAP's MAC; zero for the kernel's random one
	Fabric         string        // --fabric: FabricSim, FabricKernel or FabricVerbs
	Underlay       string        // --underlay: the simulated fabric's interface
	IBDev          string        // --ib-dev: IPoIB parent or verbs device
	IBMTU          int           // --ib-mtu: 2048 or 4096 (sim; the others ask the device)
	VerbsRecvDepth int           // --verbs-recv-depth: 0 for the default
	FastPath       fastpath.Mode // --fast-path: the kernel backend's BPF fast path
	BPFDir         string        // --bpf-dir: where --persist pins the fast path; "" for fastpath.PinBase
	TAPMTU         int           // --tap-mtu
	TAPQueueLen    int           // --tap-queue-len: 0 leaves the TAP's own
	Queues         int           // --queues: 0 for one per CPU
	RxWorkers      int           // --rx-workers: 0 for one per TAP queue
	Offload        bool          // --offload

	BusyPoll time.Duration // --busy-poll: 0 for off

	Bridge    string // --bridge
	OVSBridge string // --ovs-bridge
	OVSDB     string // --ovs-db

	Learn         shim.LearnMode        // --learn
	MaxVIFs       int                   // --max-vifs
	MaxNeighbours int                   // --max-neighbours
	MemoryLimit   int                   // --memory-limit: MiB; 0 leaves the runtime's ($GOMEMLIMIT or none)
	VIFIdle       time.Duration         // --vif-idle
	Partitions    map[uint16]ipoib.PKey // --vlan-pkey: untagged (0xffff) left out
	Multicast     snoop.Timers          // --mcast-*
	DHCP          shim.DHCPMode         // --dhcp
	DHCPClientID  arpndp.ClientIDForm   // --dhcp-client-id
	ClampMSS      bool                  // --clamp-mss
	Faults        faultport.Faults      // --fault

	Metrics  string // --metrics: listen address; empty for none
	PProf    bool   // --pprof
	CtlDir   string // --ctl-dir: empty for no control socket
	Persist  bool   // --persist
	StateDir string // --state-dir
	FDStore  string // --fd-store: the keeper's socket; empty for systemd's store

	// Logger logs lifecycle events; Level is its level, which a reload
	// sets (nil: the level cannot change).
	Logger *slog.Logger
	Level  *slog.LevelVar
	// Settings are every setting's value as text, by config key (the
	// flag's name), as a reload compares and logs them: a reload applies
	// the settings whose text here changed, and only those.
	Settings map[string]string
	// Reload reads the settings afresh on SIGHUP (nil: a reload changes
	// nothing).
	Reload func() (Config, error)
	// Signals delivers SIGHUP (reload), SIGUSR1 (toggle the simulated
	// port) and SIGUSR2 (log the counters); nil for none.
	Signals <-chan os.Signal
}

// ConfigError is a setting Validate refuses: one line naming the
// setting as its flag, its value and what is allowed.
type ConfigError struct{ Msg string }

// Error is the message.
func (e ConfigError) Error() string { return e.Msg }

// Validate checks the settings together.
func (c *Config) Validate() error {
	if err := c.checkFabric(); err != nil {
		return err
	}
	bad := func(format string, a ...any) error { return ConfigError{Msg: fmt.Sprintf(format, a...)} }
	switch {
	case c.IBMTU != 2048 && c.IBMTU != 4096:
		return bad("--ib-mtu %d: want 2048 or 4096", c.IBMTU)
	case c.VerbsRecvDepth != 0 && (c.VerbsRecvDepth < MinVerbsRecvDepth || c.VerbsRecvDepth > MaxVerbsRecvDepth):
		return bad("--verbs-recv-depth %d: want %d to %d (0: %d)", c.VerbsRecvDepth, MinVerbsRecvDepth, MaxVerbsRecvDepth, DefaultVerbsRecvDepth)
	case !c.FastPath.Valid():
		return bad("--fast-path %s: want off, auto or on", c.FastPath)
	case c.BPFDir != "" && !filepath.IsAbs(c.BPFDir):
		return bad("--bpf-dir %q: want an absolute directory such as %s", c.BPFDir, fastpath.PinBase)
	case c.MaxVIFs < 1 || c.MaxVIFs > 1<<20:
		return bad("--max-vifs %d: want 1 to %d", c.MaxVIFs, 1<<20)
	case c.TAPMTU < MinTAPMTU || c.TAPMTU > MaxTAPMTU:
		return bad("--tap-mtu %d: want %d to %d (below the IPoIB MTU it is raised to it)", c.TAPMTU, MinTAPMTU, MaxTAPMTU)
	case c.TAPQueueLen < 0 || c.TAPQueueLen > MaxTAPQueueLen:
		return bad("--tap-queue-len %d: want 0 (the TAP's own, 1000) to %d", c.TAPQueueLen, MaxTAPQueueLen)
	case c.BusyPoll < 0 || c.BusyPoll > MaxBusyPoll:
		return bad("--busy-poll %s: want 0 (off) to %s, e.g. 50us", c.BusyPoll, MaxBusyPoll)
	case c.Queues < 0 || c.Queues > MaxQueues:
		return bad("--queues %d: want 0 (one per CPU) to %d", c.Queues, MaxQueues)
	case c.RxWorkers < 0 || c.RxWorkers > MaxRxWorkers:
		return bad("--rx-workers %d: want 0 (one per TAP queue) to %d", c.RxWorkers, MaxRxWorkers)
	case c.MaxNeighbours < 1:
		return bad("--max-neighbours %d: want at least 1", c.MaxNeighbours)
	case c.MemoryLimit < 0 || c.MemoryLimit > MaxMemoryLimit:
		return bad("--memory-limit %d: want 0 (none) to %d MiB", c.MemoryLimit, MaxMemoryLimit)
	case c.VIFIdle < time.Second:
		return bad("--vif-idle %s: want at least 1s", c.VIFIdle)
	case !c.Learn.Valid():
		return bad("--learn %s: want auto or declared", c.Learn)
	case c.Learn == shim.LearnDeclared && c.Bridge == "" && c.OVSBridge == "":
		return bad("--learn declared takes its guests from the --bridge FDB or the --ovs-bridge ports: give one")
	case !c.DHCP.Valid():
		return bad("--dhcp %s: want broadcast or rfc4390", c.DHCP)
	case c.DHCPClientID > arpndp.ClientIDMlnx:
		return bad("--dhcp-client-id %d: want mac or mlnx", c.DHCPClientID)
	case c.DHCPClientID != arpndp.ClientIDMAC && c.DHCP != shim.DHCPRFC4390:
		return bad("--dhcp-client-id %s goes with --dhcp rfc4390 (with --dhcp %s guests' requests keep their own client-identifier)", c.DHCPClientID, c.DHCP)
	case c.PProf && c.Metrics == "":
		return bad("--pprof serves on the --metrics address: give --metrics too")
	case c.Bridge != "" && c.OVSBridge != "":
		return bad("--bridge and --ovs-bridge exclude each other: the TAP has one switch")
	case c.Persist && c.StateDir == "":
		return bad("--persist keeps its state in --state-dir: give one")
	case c.MAC != (ether.MAC{}) && c.MAC.IsMulticast():
		return bad("--mac %s: want a unicast MAC like 02:00:00:00:00:01", c.MAC)
	}
	for vlan, pk := range c.Partitions {
		if vlan < 1 || vlan > 4094 || !pk.IsValid() {
			return bad("--vlan-pkey %d=%s: want VLAN=P_Key with VLAN 1..4094, e.g. 10=0x800a", vlan, pk)
		}
	}
	if err := c.Faults.Validate(); err != nil {
		return ConfigError{Msg: err.Error()}
	}
	if err := c.Multicast.WithDefaults().Validate(); err != nil {
		return bad("--mcast-*: %s", strings.TrimPrefix(err.Error(), "snoop: "))
	}
	return nil
}

// Run runs the daemon until ctx ends (SIGINT, SIGTERM) or the shim stops
// on its own. Then it shuts down cleanly: the in-flight batch is
// finished, the state saved (--persist), QPs freed, groups left, and the
// TAP removed unless it is kept. cfg is validated first.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Queues == 0 {
		cfg.Queues = runtime.NumCPU()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	if cfg.MemoryLimit > 0 {
		// A soft limit: the collector runs more often as the heap nears
		// it, and gives up (at half the CPU) rather than fail when the
		// live heap exceeds it.
		debug.SetMemoryLimit(int64(cfg.MemoryLimit) << 20)
	}
	if os.Getenv("GOGC") == "" {
		// The data path allocates nothing per frame, so the collector
		// runs only for control-plane churn (floods, scrapes), whose
		// garbage would otherwise grow the heap to twice the live one.
		debug.SetGCPercent(gcPercent)
	}
	if cfg.Persist {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return fmt.Errorf("--state-dir: %w", err)
		}
	}
	fab, err := openFabric(&cfg, log)
	if err != nil {
		return err
	}
	port, fabDev := fab.port, fab.device
	// A start that fails under --persist leaves the kernel backend's
	// children (adopted or not) for the next start to adopt, as a stop
	// does: their QPNs are the restored guests' identity, and the
	// pinned fast-path maps name their ifindexes.
	running := false
	defer func() {
		if cfg.Persist && !running {
			keepChildren(fab)
		}
		port.Close()
	}()
	kept, inKeeper := keptQueues(&cfg, log)
	tc := TAPConfig(&cfg, port, kept)
	dev, err := tap.Create(tc)
	if err != nil {
		return err
	}
	defer dev.Close()
	log.Info("started", "tap", cfg.Name, "tap_start", dev.Start(), "fabric", cfg.Fabric, "device", fabDev, "gid", port.LocalGID(), "ib_mtu", port.MTU(), "ipoib_mtu", tc.MTU)
	if dev.Offload() != cfg.Offload {
		log.Warn("the kept TAP keeps its offload setting while its queues are open: stop eipoibd (not restart) to change it", "offload", dev.Offload(), "wanted", cfg.Offload)
	}
	keeper := storeQueues(&cfg, dev, kept, inKeeper, log) // nil unless --persist with --fd-store

	sc := ShimConfig(&cfg, dev, port)
	var closeFastPath func()
	if sc.FastPath, closeFastPath, err = startFastPath(fab, &cfg, log); err != nil {
		return err
	}
	defer closeFastPath() // after the shim has stopped, having emptied its maps (left full under --persist: keepChildren)
	sh, err := shim.New(sc)
	if err != nil {
		return err
	}
	if cfg.Persist {
		restoreState(&cfg, sh, log)
		endAdoption(fab, log)
	}
	sw, err := attachSwitch(&cfg, dev, sh, log)
	if err != nil {
		return err
	}
	defer sw.detach()
	var saver *stateSaver
	if cfg.Persist {
		saver = &stateSaver{path: statePath(&cfg), tap: cfg.Name, sh: sh, log: log}
	}
	if cfg.CtlDir != "" {
		path := ctl.Path(cfg.CtlDir, cfg.Name)
		srv, err := ctl.Listen(path, &ctlHandler{sh: sh, name: cfg.Name, fab: cfg.Fabric, dev: fabDev, saver: saver})
		if err != nil {
			return err
		}
		go srv.Serve()
		defer srv.Close()
		log.Info("control socket", "path", path)
	}
	if cfg.Metrics != "" {
		stop, err := serveMetrics(cfg.Metrics, cfg.PProf, sh, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	// Everything started below ends with ctx, and Run waits for it.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	sw.watch(ctx, &wg)
	if keeper != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			watchKeeper(ctx, &cfg, dev, keeper, log)
		}()
	}
	sw.watchLocal(ctx, &wg)
	wg.Add(1)
	go func() {
		defer wg.Done()
		handleSignals(ctx, &cfg, fab, sh)
	}()
	notifySystemd(ctx, &wg, sh, log, fmt.Sprintf("%s on %s %s, GID %s", cfg.Name, cfg.Fabric, fabDev, port.LocalGID()))
	// On a signal the shim stops after the state's last save, while it
	// still has its VIFs; if the shim stops on its own, the saver is
	// stopped after it and saves nothing more.
	shimCtx, stopShim := context.WithCancel(context.Background())
	defer stopShim()
	saveCtx, stopSaving := context.WithCancel(ctx)
	saverDone := make(chan struct{})
	go func() {
		defer close(saverDone)
		if saver != nil {
			saver.run(saveCtx)
			if ctx.Err() != nil { // a signal, not the shim stopping on its own
				keepChildren(fab) // before the shim frees its VIFs
			}
		} else {
			<-saveCtx.Done()
		}
		stopShim()
	}()
	running = true
	err = sh.Run(shimCtx)
	stopSaving()
	<-saverDone
	port.Close()
	if cfg.Persist {
		log.Info("stopped", "tap_kept", cfg.Name)
	} else {
		log.Info("stopped", "tap_removed", cfg.Name)
	}
	return err
}

// TAPConfig is the TAP cfg asks for in front of port, whose IB MTU gives
// the IPoIB MTU, with kept the queues an earlier run left (nil for
// none). Run creates its TAP with it, and cmd/taplink (the benchmark's
// ceiling: two TAPs joined in memory) each of its two.
func TAPConfig(cfg *Config, port ipoib.Port, kept []int) tap.Config {
	ipMTU, _ := ipoib.IPMTU(port.MTU())
	return tap.Config{Name: cfg.Name, MTU: ipMTU, LinkMTU: cfg.TAPMTU, TxQueueLen: cfg.TAPQueueLen, MAC: cfg.MAC, Offload: cfg.Offload, Queues: cfg.Queues,
		Persist: cfg.Persist, FDs: kept, BusyPoll: cfg.BusyPoll}
}

// ShimConfig is the shim cfg asks for between dev and port, logging to
// cfg.Logger: Run's, and each of cmd/taplink's two.
func ShimConfig(cfg *Config, dev tap.Device, port ipoib.Port) shim.Config {
	return shim.Config{
		Device: dev, Port: port, Logger: cfg.Logger,
		MaxVIFs: cfg.MaxVIFs, MaxNeighbours: cfg.MaxNeighbours, VIFIdle: cfg.VIFIdle, DHCP: cfg.DHCP, DHCPClientID: cfg.DHCPClientID, ClampMSS: cfg.ClampMSS, Learn: cfg.Learn,
		Partitions: cfg.Partitions, Multicast: cfg.Multicast, AnnounceWindow: announceWindow,
	}
}

// handleSignals answers cfg.Signals until ctx ends: SIGUSR1 toggles the
// simulated port down and up (a test hook: the TAP's carrier follows),
// SIGHUP reloads, SIGUSR2 logs the counters.
func handleSignals(ctx context.Context, cfg *Config, fab fabric, sh *shim.Shim) {
	r := reloader{cur: *cfg, sh: sh, log: cfg.Logger}
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-cfg.Signals:
			switch s {
			case syscall.SIGUSR1:
				toggleDown(fab, cfg.Logger)
			case syscall.SIGHUP:
				r.reload()
			case syscall.SIGUSR2:
				LogCounters(cfg.Logger, sh.Counters())
			}
		}
	}
}

// LogCounters logs the non-zero counters, as eipoibd does on SIGUSR2 and
// cmd/taplink when it stops.
func LogCounters(log *slog.Logger, ctrs map[string]uint64) {
	args := []any{}
	for k, v := range ctrs {
		if v != 0 {
			args = append(args, k, v)
		}
	}
	log.Info("counters", args...)
}
