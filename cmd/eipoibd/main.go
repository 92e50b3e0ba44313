// Command eipoibd gives a Linux hypervisor an Ethernet NIC (a TAP device)
// whose traffic travels over an InfiniBand fabric as standard IPoIB. It
// parses flags, wires the fabric port, the TAP, the bridge and the shim
// together, serves metrics and handles signals; the logic lives in the
// packages.
//
//	eipoibd run --underlay IFACE [--name eib0] [--bridge BR] [--ib-mtu 4096]
//	            [--max-vifs N] [--fabric sim] [--metrics ADDR] ...
//	eipoibd host --underlay IFACE [--name ib0] [--ib-mtu 4096] [--pkey P]
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/internal/cli"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/ether"
	"github.com/eipoib/eipoibd/internal/metrics"
	"github.com/eipoib/eipoibd/internal/sdnotify"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/faultport"
	"github.com/eipoib/eipoibd/mactrans"
	"github.com/eipoib/eipoibd/shim"
	"github.com/eipoib/eipoibd/snoop"
	"github.com/eipoib/eipoibd/tap"
	"github.com/eipoib/eipoibd/vswitch"
)

const usage = `usage: eipoibd run --underlay IFACE [flags]

Runs in the foreground: creates the TAP, binds the IB port and moves
traffic until SIGINT or SIGTERM. Flags:
`

// maxQueues bounds --queues: the kernel's limit on TUN queues
// (MAX_TAP_QUEUES, drivers/net/tun.c).
const maxQueues = 256

// minTAPMTU and maxTAPMTU bound --tap-mtu: IPv6's minimum link MTU
// (RFC 8200 §5), and the largest MTU a TAP takes, 65535 less its
// Ethernet header (tun_net_init's max_mtu, drivers/net/tun.c).
const (
	minTAPMTU = 1280
	maxTAPMTU = 65535 - 14
)

// announceWindow is how long after a guest's MAC appears (its VIF made,
// or its RARP after a live migration) the addresses it shows are
// announced on the fabric.
const announceWindow = 30 * time.Second

// errHelp ends the program successfully after printing the usage.
var errHelp = cli.ErrHelp

// usageError is a bad command line: exit status 2.
type usageError = cli.UsageError

func main() {
	cli.Exit("eipoibd", run(os.Args[1:], os.Stderr))
}

// options are the parsed flags of "run".
type options struct {
	underlay, name, bridge, fabric, metrics, logLevel, dhcp, faults, mac string
	learn, ctlDir, config, logFormat, dhcpClientID                       string
	ovsBridge, ovsDB, vlanPKey, ibDev                                    string
	mcast                                                                snoop.Timers
	ibMTU, maxVIFs, maxNeigh, queues, tapMTU                             int
	vifIdle                                                              time.Duration
	offload, pprof, clampMSS, persist                                    bool
	stateDir                                                             string
	level                                                                slog.Level
	clientID                                                             arpndp.ClientIDForm
	// values are every flag's value as text, by name, for reloads.
	values map[string]string
}

func parse(args []string, stderr io.Writer) (*options, error) {
	if len(args) == 0 || args[0] != "run" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			args = []string{"run", "-h"}
		} else {
			return nil, usageError{Msg: `missing command: use "eipoibd run --underlay IFACE" (eipoibd run -h lists the flags)`}
		}
	}
	o := &options{}
	fs := runFlags(o)
	if err := cli.Parse(fs, args[1:], usage, stderr, "eipoibd run -h lists the flags"); err != nil {
		return nil, err
	}
	if err := withConfig(fs, o.config, func() error { return check(o) }); err != nil {
		return nil, err
	}
	if o.queues == 0 {
		o.queues = runtime.NumCPU()
	}
	o.values = map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { o.values[f.Name] = f.Value.String() })
	return o, nil
}

// runFlags is the flag set of "eipoibd run", bound to o; the config
// file's keys are its flag names.
func runFlags(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("eipoibd run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.config, "config", "", "TOML file of flag values (keys are the flag names); flags on the command line win")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.underlay, "underlay", "", "underlay interface of the simulated fabric (required)")
	fs.StringVar(&o.name, "name", "eib0", "name of the TAP interface to create")
	fs.StringVar(&o.mac, "mac", "", "MAC of the TAP (default: a random one from the kernel)")
	fs.StringVar(&o.bridge, "bridge", "", "existing Linux bridge to enslave the TAP to")
	fs.IntVar(&o.ibMTU, "ib-mtu", 4096, "IB MTU, 2048 or 4096 (the IPoIB MTU is 4 less)")
	fs.IntVar(&o.maxVIFs, "max-vifs", 1024, "most guest MACs (one UD QP each) per port")
	fs.IntVar(&o.maxNeigh, "max-neighbours", 65536, "most remote IPoIB endpoints remembered")
	fs.DurationVar(&o.vifIdle, "vif-idle", 300*time.Second, "idle time after which a guest's VIF is removed")
	fs.StringVar(&o.fabric, "fabric", "sim", "fabric backend: sim (the simulated UD fabric), kernel (the kernel's IPoIB driver, with --ib-dev) or verbs (UD QPs through libibverbs, with --ib-dev; needs a build with -tags verbs)")
	fs.StringVar(&o.ibDev, "ib-dev", "", "IPoIB parent interface of --fabric kernel (e.g. ib0), or verbs device of --fabric verbs (e.g. mlx5_0, rxe0)")
	fs.StringVar(&o.metrics, "metrics", "", "listen address for Prometheus metrics, e.g. 127.0.0.1:9474 (off when empty)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.dhcp, "dhcp", shim.DHCPBroadcast, "DHCP handling: broadcast or rfc4390")
	fs.StringVar(&o.dhcpClientID, "dhcp-client-id", "mac", "client-identifier --dhcp rfc4390 gives guests' requests: mac (type 1 + the guest MAC, only where the guest sent none) or mlnx (the Mellanox form OpenStack's networking-mlnx keys DHCP hosts by, always)")
	fs.StringVar(&o.ovsBridge, "ovs-bridge", "", "Open vSwitch bridge to attach the TAP to as a trunk port (detached on shutdown)")
	fs.StringVar(&o.ovsDB, "ovs-db", "", "OVSDB remote for --ovs-bridge (default: ovs-vsctl's, $OVS_RUNDIR/db.sock)")
	fs.StringVar(&o.vlanPKey, "vlan-pkey", "", "VLAN to P_Key map, e.g. 10=0x800a,20=0x8014 (untagged is always 0xffff)")
	fs.DurationVar(&o.mcast.QueryInterval, "mcast-query-interval", 125*time.Second, "IGMP/MLD general query interval towards guests")
	fs.DurationVar(&o.mcast.QueryResponseInterval, "mcast-response-interval", 10*time.Second, "maximum response time of general queries")
	fs.DurationVar(&o.mcast.LastMemberQueryInterval, "mcast-last-member-interval", time.Second, "interval of group-specific queries after a leave")
	fs.IntVar(&o.mcast.Robustness, "mcast-robustness", 2, "robustness variable: queries after a leave, and the membership interval factor")
	fs.BoolVar(&o.offload, "offload", true, "TAP offloads: read guests' TCP super-frames whole and cut them here, write received segment runs as super-frames")
	fs.IntVar(&o.tapMTU, "tap-mtu", 9000, fmt.Sprintf("MTU of the TAP itself, up to %d: guests' frames up to it reach eipoibd, which fragments them or answers ICMP too-big with the IPoIB MTU (a bridge would drop them silently)", maxTAPMTU))
	fs.StringVar(&o.learn, "learn", shim.LearnAuto, "auto: a VIF for any guest MAC (promiscuous emulation); declared: only MACs with a static entry in the --bridge FDB (as libvirt adds) or on an --ovs-bridge port's external_ids:attached-mac, others dropped and counted")
	fs.BoolVar(&o.clampMSS, "clamp-mss", false, "lower the MSS of guests' TCP SYNs to fit the IPoIB MTU, for guests that ignore path MTU discovery")
	fs.IntVar(&o.queues, "queues", 0, "TAP queues, each read by its own TX worker (the kernel spreads guests' flows over them); 0: one per CPU")
	fs.StringVar(&o.ctlDir, "ctl-dir", ctl.DefaultDir, "directory of the control socket NAME.sock (eipoibd show, vif, neigh, capture); empty: none")
	fs.BoolVar(&o.persist, "persist", false, "keep the TAP (and its bridge or OVS port) across restarts and crashes, its queues in systemd's file descriptor store so the link never drops, and the guests in --state-dir; a stop leaves the TAP (ip link del removes it)")
	fs.StringVar(&o.stateDir, "state-dir", ctl.DefaultDir, "directory of the --persist state file NAME.state")
	fs.BoolVar(&o.pprof, "pprof", false, "also serve Go's profiles at /debug/pprof/ on the --metrics address")
	fs.StringVar(&o.faults, "fault", "", "simulated fabric faults, e.g. loss=0.01,dup=0.01,reorder=0.01,corrupt=0.01")
	return fs
}

// check validates the options of "run".
func check(o *options) error {
	if err := checkLog(o.logLevel, o.logFormat, &o.level); err != nil {
		return err
	}
	if err := checkFabric(o); err != nil {
		return err
	}
	switch {
	case o.ibMTU != 2048 && o.ibMTU != 4096:
		return usageError{Msg: fmt.Sprintf("--ib-mtu %d: want 2048 or 4096", o.ibMTU)}
	case o.maxVIFs < 1 || o.maxVIFs > 1<<20:
		return usageError{Msg: fmt.Sprintf("--max-vifs %d: want 1 to %d", o.maxVIFs, 1<<20)}
	case o.tapMTU < minTAPMTU || o.tapMTU > maxTAPMTU:
		return usageError{Msg: fmt.Sprintf("--tap-mtu %d: want %d to %d (below the IPoIB MTU it is raised to it)", o.tapMTU, minTAPMTU, maxTAPMTU)}
	case o.queues < 0 || o.queues > maxQueues:
		return usageError{Msg: fmt.Sprintf("--queues %d: want 0 (one per CPU) to %d", o.queues, maxQueues)}
	case o.maxNeigh < 1:
		return usageError{Msg: fmt.Sprintf("--max-neighbours %d: want at least 1", o.maxNeigh)}
	case o.vifIdle < time.Second:
		return usageError{Msg: fmt.Sprintf("--vif-idle %s: want at least 1s", o.vifIdle)}
	case o.learn != shim.LearnAuto && o.learn != shim.LearnDeclared:
		return usageError{Msg: fmt.Sprintf("--learn %q: want auto or declared", o.learn)}
	case o.learn == shim.LearnDeclared && o.bridge == "" && o.ovsBridge == "":
		return usageError{Msg: "--learn declared takes its guests from the --bridge FDB or the --ovs-bridge ports: give one"}
	case o.dhcp != shim.DHCPBroadcast && o.dhcp != shim.DHCPRFC4390:
		return usageError{Msg: fmt.Sprintf("--dhcp %q: want broadcast or rfc4390", o.dhcp)}
	case !o.parseClientID():
		return usageError{Msg: fmt.Sprintf("--dhcp-client-id %q: want mac or mlnx", o.dhcpClientID)}
	case o.dhcpClientID != "mac" && o.dhcp != shim.DHCPRFC4390:
		return usageError{Msg: fmt.Sprintf("--dhcp-client-id %s goes with --dhcp rfc4390 (with --dhcp %s guests' requests keep their own client-identifier)", o.dhcpClientID, o.dhcp)}
	case o.pprof && o.metrics == "":
		return usageError{Msg: "--pprof serves on the --metrics address: give --metrics too"}
	case o.bridge != "" && o.ovsBridge != "":
		return usageError{Msg: "--bridge and --ovs-bridge exclude each other: the TAP has one switch"}
	case o.persist && o.stateDir == "":
		return usageError{Msg: "--persist keeps its state in --state-dir: give one"}
	}
	if err := o.mcast.WithDefaults().Validate(); err != nil {
		return usageError{Msg: "--mcast-*: " + strings.TrimPrefix(err.Error(), "snoop: ")}
	}
	return nil
}

// parseVLANPKeys parses "10=0x800a,20=0x8014".
func parseVLANPKeys(s string) (map[uint16]ipoib.PKey, error) {
	m := make(map[uint16]ipoib.PKey)
	if s == "" {
		return m, nil
	}
	for _, kv := range strings.Split(s, ",") {
		v, p, ok := strings.Cut(kv, "=")
		vlan, err := strconv.ParseUint(v, 10, 16)
		if !ok || err != nil || vlan < 1 || vlan > 4094 {
			return nil, usageError{Msg: fmt.Sprintf("--vlan-pkey %q: want VLAN=P_Key with VLAN 1..4094, e.g. 10=0x800a", kv)}
		}
		pkey, err := ipoib.ParsePKey(p)
		if err != nil {
			return nil, usageError{Msg: fmt.Sprintf("--vlan-pkey %q: %s", kv, strings.TrimPrefix(err.Error(), "ipoib: "))}
		}
		if _, dup := m[uint16(vlan)]; dup {
			return nil, usageError{Msg: fmt.Sprintf("--vlan-pkey: VLAN %d given twice", vlan)}
		}
		m[uint16(vlan)] = pkey
	}
	return m, nil
}

// parseFaults parses "loss=0.01,dup=0.02".
func parseFaults(s string) (faultport.Faults, error) {
	var f faultport.Faults
	if s == "" {
		return f, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		p, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return f, usageError{Msg: fmt.Sprintf("--fault %q: want name=probability", kv)}
		}
		switch k {
		case "loss":
			f.Loss = p
		case "dup":
			f.Dup = p
		case "reorder":
			f.Reorder = p
		case "corrupt":
			f.Corrupt = p
		default:
			return f, usageError{Msg: fmt.Sprintf("--fault %q: unknown fault (loss, dup, reorder, corrupt)", k)}
		}
	}
	if err := f.Validate(); err != nil {
		return f, usageError{Msg: err.Error()}
	}
	return f, nil
}

func run(args []string, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "host":
			return runHost(args[1:], stderr)
		case "show", "vif", "neigh", "capture":
			return runCtl(args[0], args[1:], stderr)
		}
	}
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	level := new(slog.LevelVar)
	level.Set(o.level)
	faults, err := parseFaults(o.faults)
	if err != nil {
		return err
	}
	partitions, err := parseVLANPKeys(o.vlanPKey)
	if err != nil {
		return err
	}
	log := newLogger(o.logFormat, stderr, level)
	var mac ether.MAC
	if o.mac != "" {
		if mac, err = ether.ParseMAC(o.mac); err != nil || mac.IsMulticast() || mac.IsZero() {
			return usageError{Msg: fmt.Sprintf("--mac %q: want a unicast MAC like 02:00:00:00:00:01", o.mac)}
		}
	}
	if o.persist {
		if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
			return fmt.Errorf("--state-dir: %w", err)
		}
	}
	port, err := openFabric(o, faults, log)
	if err != nil {
		return err
	}
	defer port.Close()
	ipMTU, _ := ipoib.IPMTU(port.MTU())
	kept := keptQueues(o, log)
	dev, err := tap.Create(tap.Config{Name: o.name, MTU: ipMTU, LinkMTU: o.tapMTU, MAC: mac, Offload: o.offload, Queues: o.queues,
		Persist: o.persist, FDs: kept})
	if err != nil {
		return err
	}
	defer dev.Close()
	fabDev := o.underlay
	if o.fabric != "sim" {
		fabDev = o.ibDev
	}
	log.Info("started", "tap", o.name, "tap_start", dev.Start(), "fabric", o.fabric, "device", fabDev, "gid", port.LocalGID(), "ib_mtu", port.MTU(), "ipoib_mtu", ipMTU)
	if dev.Offload() != o.offload {
		log.Warn("the kept TAP keeps its offload setting while its queues are open: stop eipoibd (not restart) to change it", "offload", dev.Offload(), "wanted", o.offload)
	}
	storeQueues(o, dev, log)

	sh, err := shim.New(shim.Config{
		Device: dev, Port: port, Logger: log,
		MaxVIFs: o.maxVIFs, MaxNeighbours: o.maxNeigh, VIFIdle: o.vifIdle, DHCP: o.dhcp, DHCPClientID: o.clientID, ClampMSS: o.clampMSS, Learn: o.learn,
		Partitions: partitions, Multicast: o.mcast, AnnounceWindow: announceWindow,
	})
	if err != nil {
		return err
	}
	if o.persist {
		restoreState(o, sh, log)
	}
	ovs := vswitch.OVS{DB: o.ovsDB}
	if o.ovsBridge != "" {
		// A kept TAP keeps its port: removing it first would flap it.
		if err := ovs.Attach(o.name, o.ovsBridge, dev.Start() != tap.Created); err != nil {
			return err
		}
		log.Info("attached to Open vSwitch bridge", "tap", o.name, "bridge", o.ovsBridge)
		defer func() {
			if o.persist {
				return // the TAP stays, and its port with it
			}
			if err := ovs.Detach(o.name, o.ovsBridge); err != nil {
				log.Warn("detach from Open vSwitch", "err", err)
			} else {
				log.Info("detached from Open vSwitch bridge", "bridge", o.ovsBridge)
			}
		}()
	}
	if o.bridge != "" {
		if err := vswitch.AttachBridge(o.name, o.bridge); err != nil {
			return err
		}
		log.Info("attached to bridge", "tap", o.name, "bridge", o.bridge)
		if o.learn == shim.LearnAuto {
			// Guests the bridge already learned get their VIFs now, so
			// traffic to them flows before they speak (after a restart,
			// for one); static entries come through the watch below.
			guests, err := vswitch.BridgeGuests(o.bridge, o.name)
			if err != nil {
				log.Warn("read bridge FDB", "err", err)
			}
			for _, g := range guests {
				if err := sh.DeclareVIF(g.MAC, g.VLAN, mactrans.OriginBridge); err != nil {
					log.Warn("declare VIF from bridge FDB", "mac", g.MAC, "vlan", g.VLAN, "err", err)
				}
			}
		}
	}
	if o.ctlDir != "" {
		srv, err := ctl.Listen(ctl.Path(o.ctlDir, o.name), &ctlHandler{sh: sh, name: o.name, fab: o.fabric, dev: fabDev})
		if err != nil {
			return err
		}
		go srv.Serve()
		defer srv.Close()
		log.Info("control socket", "path", ctl.Path(o.ctlDir, o.name))
	}
	if o.metrics != "" {
		ln, err := net.Listen("tcp", o.metrics)
		if err != nil {
			return fmt.Errorf("--metrics %s: %w", o.metrics, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler(sh.Counters, sh.IsGauge, vifMetrics(sh)...))
		if o.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("serving metrics", "addr", ln.Addr().String())
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.bridge != "" {
		// Guests the bridge knows, now and from now on, get their VIFs
		// before they speak (after a restart, or when libvirt adds a
		// static entry), and lose them as soon as the bridge forgets
		// them (their port went).
		go func() {
			if err := vswitch.WatchBridge(ctx, o.bridge, o.name, func(g vswitch.Guest, added bool) { bridgeGuest(sh, log, mactrans.OriginBridge, g, added) },
				func(err error) { log.Debug("bridge FDB events dropped by the kernel; listed afresh", "err", err) }); err != nil {
				log.Warn("bridge guests are learned from their traffic only", "err", err)
			}
		}()
	}
	if o.ovsBridge != "" {
		// The same for Open vSwitch: a port whose interface carries
		// external_ids:attached-mac (as libvirt and os-vif set it) is a
		// declared guest, on the port's access VLAN.
		go func() {
			if err := ovs.Watch(ctx, o.ovsBridge, o.name, func(g vswitch.Guest, added bool) { bridgeGuest(sh, log, mactrans.OriginOVS, g, added) },
				func(err error) { log.Warn("watching Open vSwitch guests", "err", err) }); err != nil {
				log.Warn("Open vSwitch guests are learned from their traffic only", "err", err)
			}
		}()
	}
	// SIGUSR1 toggles the simulated port down and up (a test hook: the
	// TAP's carrier follows); SIGUSR2 logs the counters.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	go func() {
		cur := o
		for s := range sig {
			switch s {
			case syscall.SIGUSR1:
				toggleDown(port, log)
				continue
			case syscall.SIGHUP:
				reload(args, cur, level, sh, log)
				continue
			}
			args := []any{}
			for k, v := range sh.Counters() {
				if v != 0 {
					args = append(args, k, v)
				}
			}
			log.Info("counters", args...)
		}
	}()
	notifySystemd(ctx, sh, log, fmt.Sprintf("%s on %s %s, GID %s", o.name, o.fabric, fabDev, port.LocalGID()))
	// On a signal the shim stops after the state's last save, while it
	// still has its VIFs; if the shim stops on its own, the saver is
	// stopped after it and saves nothing more.
	shimCtx, stopShim := context.WithCancel(context.Background())
	defer stopShim()
	saveCtx, stopSaving := context.WithCancel(ctx)
	saverDone := make(chan struct{})
	go func() {
		defer close(saverDone)
		if o.persist {
			(&stateSaver{path: statePath(o), tap: o.name, sh: sh, log: log}).run(saveCtx)
		} else {
			<-saveCtx.Done()
		}
		stopShim()
	}()
	err = sh.Run(shimCtx)
	stopSaving()
	<-saverDone
	port.Close()
	if o.persist {
		log.Info("stopped", "tap_kept", o.name)
	} else {
		log.Info("stopped", "tap_removed", o.name)
	}
	return err
}

// notifySystemd tells systemd (Type=notify) the daemon is ready — the TAP
// and the port are up and the shim is about to run — and that it is
// stopping when ctx ends; with WatchdogSec= it sends WATCHDOG=1 every half
// interval while the shim's housekeeping rounds keep coming, so a stuck
// pipeline gets the service restarted. Without systemd it does nothing.
func notifySystemd(ctx context.Context, sh *shim.Shim, log *slog.Logger, status string) {
	ok, err := sdnotify.Notify("READY=1\nSTATUS=" + status)
	if err != nil {
		log.Warn("systemd notification", "err", err)
	}
	if !ok {
		return
	}
	wd, watch := sdnotify.WatchdogInterval()
	go func() {
		var tick <-chan time.Time
		if watch {
			t := time.NewTicker(wd / 2)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-ctx.Done():
				sdnotify.Notify("STOPPING=1")
				return
			case <-tick:
				if sh.Healthy(wd / 2) {
					sdnotify.Notify("WATCHDOG=1")
				} else {
					log.Error("housekeeping stalled: withholding the systemd watchdog", "for_at_least", wd/2)
				}
			}
		}
	}()
}

// bridgeGuest declares or removes the VIF of a guest the switch (origin:
// the bridge's forwarding database, or OVSDB) gained or lost. Only static
// bridge entries and OVS attached-macs declare one: a learned entry comes
// from a frame that reaches the shim anyway (and from traffic a guest may
// forge, so a MAC flood would become a flood of declarations); the
// start-up preload takes learned entries in auto mode.
func bridgeGuest(sh *shim.Shim, log *slog.Logger, origin mactrans.Origin, g vswitch.Guest, added bool) {
	var err error
	if added && !g.Static {
		return
	}
	if added {
		err = sh.DeclareVIF(g.MAC, g.VLAN, origin)
	} else {
		err = sh.RemoveVIF(g.MAC, g.VLAN)
	}
	if err != nil {
		log.Warn("VIF of a switch guest", "origin", origin, "mac", g.MAC, "vlan", g.VLAN, "added", added, "err", err)
		return
	}
	if added {
		log.Info("guest declared", "origin", origin, "mac", g.MAC, "vlan", g.VLAN)
	} else {
		log.Info("guest gone", "origin", origin, "mac", g.MAC, "vlan", g.VLAN)
	}
}

// parseClientID reads --dhcp-client-id into o.clientID.
func (o *options) parseClientID() (ok bool) {
	o.clientID, ok = arpndp.ParseClientIDForm(o.dhcpClientID)
	return ok
}
