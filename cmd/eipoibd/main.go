// Command eipoibd gives a Linux hypervisor an Ethernet NIC (a TAP device)
// whose traffic travels over an InfiniBand fabric as standard IPoIB. It
// parses the command line and the config file into a daemon.Config and
// runs internal/daemon, which does the rest. "show", "vif", "neigh" and
// "capture" are the control socket's client; "host" is a native IPoIB
// host; "keeper" holds --persist's TAP queues outside systemd. Run
// without arguments, it lists its commands (commands.go).
//
//	eipoibd run --underlay IFACE [--name eib0] [--bridge BR] [--ib-mtu 4096]
//	            [--max-vifs N] [--fabric sim] [--metrics ADDR] ...
//	eipoibd host --underlay IFACE [--name ib0] [--ib-mtu 4096] [--pkey P]
//	eipoibd keeper [--socket /run/eipoibd/keeper.sock] [--max-fds 1024]
//	eipoibd show|vif|neigh|capture ...
//	eipoibd help [COMMAND]
//	eipoibd version
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/eipoib/eipoibd/arpndp"
	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/daemon"
	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/ipoib"
)

// errHelp ends the program successfully after printing the usage.
var errHelp = cli.ErrHelp

// usageError is a bad command line: exit status 2.
type usageError = cli.UsageError

func main() {
	cli.Exit("eipoibd", run(os.Args[1:], os.Stderr))
}

// options are the parsed flags of "run": cfg, and the flags whose text
// check turns into cfg's typed values.
type options struct {
	cfg                                                      daemon.Config
	logLevel, logFormat, config, mac, vlanPKey, dhcpClientID string
	learn, dhcp, fastPath                                    string
	faults                                                   string
}

// parse parses the flags of "run" (the arguments after it).
func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := runFlags(o)
	if err := parseFlags("run", fs, args, stderr); err != nil {
		return nil, err
	}
	if err := withConfig(fs, o.config, func() error { return check(o) }); err != nil {
		return nil, err
	}
	if o.cfg.Queues == 0 {
		o.cfg.Queues = runtime.NumCPU()
	}
	o.cfg.Settings = map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { o.cfg.Settings[f.Name] = f.Value.String() })
	return o, nil
}

// runFlags is the flag set of "eipoibd run", bound to o; the config
// file's keys are its flag names.
func runFlags(o *options) *flag.FlagSet {
	fs := newFlags("run")
	fs.StringVar(&o.config, "config", "", "TOML file of flag values (keys are the flag names); flags on the command line win")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.cfg.Underlay, "underlay", "", "underlay interface of the simulated fabric (required)")
	fs.StringVar(&o.cfg.Name, "name", "eib0", "name of the TAP interface to create")
	fs.StringVar(&o.mac, "mac", "", "MAC of the TAP (default: a random one from the kernel)")
	fs.StringVar(&o.cfg.Bridge, "bridge", "", "existing Linux bridge to enslave the TAP to")
	fs.IntVar(&o.cfg.IBMTU, "ib-mtu", daemon.DefaultIBMTU, "the simulated fabric's IB MTU, 2048 or 4096 (the IPoIB MTU is 4 less; kernel and verbs take the device's)")
	fs.IntVar(&o.cfg.MaxVIFs, "max-vifs", 1024, "most guest MACs (one UD QP each) per port")
	fs.IntVar(&o.cfg.MaxNeighbours, "max-neighbours", 65536, "most remote IPoIB endpoints remembered")
	fs.IntVar(&o.cfg.MemoryLimit, "memory-limit", 0, "soft limit in MiB of the memory the Go runtime holds (debug.SetMemoryLimit): past it the garbage collector runs more often, at a CPU cost; 0: none (or $GOMEMLIMIT)")
	fs.DurationVar(&o.cfg.VIFIdle, "vif-idle", 300*time.Second, "idle time after which a learned guest's VIF is removed (a declared one stays until undeclared)")
	fs.StringVar(&o.cfg.Fabric, "fabric", daemon.FabricSim, "fabric backend: sim (the simulated UD fabric), kernel (the kernel's IPoIB driver, with --ib-dev) or verbs (UD QPs through libibverbs, with --ib-dev; needs a build with -tags verbs)")
	fs.IntVar(&o.cfg.VerbsRecvDepth, "verbs-recv-depth", daemon.DefaultVerbsRecvDepth, fmt.Sprintf("receive buffers --fabric verbs keeps posted on its shared receive queue (%d to %d), reposted as packets arrive whatever the reader does; as many again hold packets for the reader, beyond which new ones are dropped and counted (rx_queue_full). Memory: (2 x depth + 64) x 4160 bytes", daemon.MinVerbsRecvDepth, daemon.MaxVerbsRecvDepth))
	fs.StringVar(&o.fastPath, "fast-path", fastpath.Off.String(), "--fabric kernel: carry guests' ordinary unicast IP between the TAP and the IPoIB children with in-kernel BPF programs (Linux 5.8 or later; tcx from 6.6, clsact before): off; auto (when the kernel passes a probe, else logged and off); on (refuse to start when it fails). auto and on are experimental")
	fs.StringVar(&o.cfg.IBDev, "ib-dev", "", "IPoIB parent interface of --fabric kernel (e.g. ib0), or verbs device of --fabric verbs, NAME or NAME:PORT (e.g. mlx5_0, mlx5_0:2, rxe0; port 1 when none is given)")
	fs.StringVar(&o.cfg.Metrics, "metrics", "", "listen address for Prometheus metrics, e.g. 127.0.0.1:9474 (off when empty)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.dhcp, "dhcp", shim.DHCPBroadcast.String(), "DHCP handling: broadcast or rfc4390")
	fs.StringVar(&o.dhcpClientID, "dhcp-client-id", "mac", "client-identifier --dhcp rfc4390 gives guests' requests: mac (type 1 + the guest MAC, only where the guest sent none) or mlnx (the Mellanox form OpenStack's networking-mlnx keys DHCP hosts by, always)")
	fs.StringVar(&o.cfg.OVSBridge, "ovs-bridge", "", "Open vSwitch bridge to attach the TAP to as a trunk port (detached on shutdown)")
	fs.StringVar(&o.cfg.OVSDB, "ovs-db", "", "OVSDB remote for --ovs-bridge (default: ovs-vsctl's, $OVS_RUNDIR/db.sock)")
	fs.StringVar(&o.vlanPKey, "vlan-pkey", "", "VLAN to P_Key map, e.g. 10=0x800a,20=0x8014 (untagged is always 0xffff)")
	fs.DurationVar(&o.cfg.Multicast.QueryInterval, "mcast-query-interval", 125*time.Second, "IGMP/MLD general query interval towards guests")
	fs.DurationVar(&o.cfg.Multicast.QueryResponseInterval, "mcast-response-interval", 10*time.Second, "maximum response time of general queries")
	fs.DurationVar(&o.cfg.Multicast.LastMemberQueryInterval, "mcast-last-member-interval", time.Second, "interval of group-specific queries after a leave")
	fs.IntVar(&o.cfg.Multicast.Robustness, "mcast-robustness", 2, "robustness variable: queries after a leave, and the membership interval factor")
	fs.BoolVar(&o.cfg.Offload, "offload", true, "TAP offloads: read guests' TCP super-frames whole and cut them here, write received segment runs as super-frames (where the switch takes them: on an Open vSwitch userspace datapath only when ovs-vswitchd runs every port of the bridge with userspace TSO)")
	fs.IntVar(&o.cfg.TAPMTU, "tap-mtu", 9000, fmt.Sprintf("MTU of the TAP itself, up to %d: guests' frames up to it reach eipoibd, which fragments them or answers ICMP too-big with the IPoIB MTU (a bridge would drop them silently)", daemon.MaxTAPMTU))
	fs.IntVar(&o.cfg.TAPQueueLen, "tap-queue-len", daemon.DefaultTAPQueueLen, "frames each TAP queue holds for its reader (the TAP's txqueuelen): guests' frames beyond it are dropped by the kernel (the TAP's TX dropped) while the reader is not running; 0: the TAP's own (1000)")
	fs.StringVar(&o.learn, "learn", shim.LearnAuto.String(), "auto: a VIF for any guest MAC (promiscuous emulation); declared: only MACs with a static entry in the --bridge FDB (as libvirt adds) or on an --ovs-bridge port's external_ids:attached-mac, others dropped and counted")
	fs.BoolVar(&o.cfg.ClampMSS, "clamp-mss", false, "lower the MSS of guests' TCP SYNs to fit the IPoIB MTU, for guests that ignore path MTU discovery")
	fs.DurationVar(&o.cfg.BusyPoll, "busy-poll", 0, fmt.Sprintf("spin on the TAP queues and (simulated fabric) the fabric socket for up to this long (e.g. 50us, at most %s) after finding them empty, before sleeping: lower latency for CPU time; 0: off", daemon.MaxBusyPoll))
	fs.IntVar(&o.cfg.Queues, "queues", 0, "TAP queues, each read by its own TX worker (the kernel spreads guests' flows over them); 0: one per CPU")
	fs.IntVar(&o.cfg.RxWorkers, "rx-workers", 1, fmt.Sprintf("simulated fabric: receive sockets on UDP 4791 (SO_REUSEPORT), each read by its own RX worker, and twice as many source ports, one per flow, for the peers' sockets to spread flows by (set it alike on every hypervisor); 0: one per TAP queue; at most %d", daemon.MaxRxWorkers))
	fs.StringVar(&o.cfg.CtlDir, "ctl-dir", ctl.DefaultDir, "directory of the control socket NAME.sock (eipoibd show, vif, neigh, capture); empty: none")
	fs.BoolVar(&o.cfg.Persist, "persist", false, "keep the TAP (and its bridge or OVS port) across restarts and crashes, its queues in systemd's file descriptor store so the link never drops, and the guests in --state-dir; a stop leaves the TAP (ip link del removes it)")
	fs.StringVar(&o.cfg.StateDir, "state-dir", ctl.DefaultDir, "directory of the --persist state file NAME.state")
	fs.StringVar(&o.cfg.BPFDir, "bpf-dir", fastpath.PinBase, "--fabric kernel --fast-path with --persist: the bpffs directory where the fast path's maps and links are pinned, in NAME/, so that they outlive a restart (a bpffs is mounted if there is none)")
	fs.StringVar(&o.cfg.FDStore, "fd-store", "", "socket of an \"eipoibd keeper\" (e.g. /run/eipoibd/keeper.sock) that keeps --persist's TAP queues instead of systemd's file descriptor store, and hands them back at the next start; empty: systemd's")
	fs.BoolVar(&o.cfg.PProf, "pprof", false, "also serve Go's profiles at /debug/pprof/ on the --metrics address")
	fs.StringVar(&o.faults, "fault", "", "simulated fabric faults, e.g. loss=0.01,dup=0.01,reorder=0.01,corrupt=0.01")
	return fs
}

// check reads the flags whose text has a type into o.cfg, then validates
// it: every problem is a usage error naming the flag.
func check(o *options) error {
	var level slog.Level
	if err := checkLog(o.logLevel, o.logFormat, &level); err != nil {
		return err
	}
	o.cfg.Level = new(slog.LevelVar)
	o.cfg.Level.Set(level)
	var ok bool
	if o.cfg.Learn, ok = shim.ParseLearnMode(o.learn); !ok {
		return usageError{Msg: fmt.Sprintf("--learn %q: want auto or declared", o.learn)}
	}
	if o.cfg.DHCP, ok = shim.ParseDHCPMode(o.dhcp); !ok {
		return usageError{Msg: fmt.Sprintf("--dhcp %q: want broadcast or rfc4390", o.dhcp)}
	}
	if o.cfg.DHCPClientID, ok = arpndp.ParseClientIDForm(o.dhcpClientID); !ok {
		return usageError{Msg: fmt.Sprintf("--dhcp-client-id %q: want mac or mlnx", o.dhcpClientID)}
	}
	if o.cfg.FastPath, ok = fastpath.ParseMode(o.fastPath); !ok {
		return usageError{Msg: fmt.Sprintf("--fast-path %q: want off, auto or on", o.fastPath)}
	}
	var err error
	if o.cfg.Faults, err = parseFaults(o.faults); err != nil {
		return err
	}
	if o.cfg.Partitions, err = parseVLANPKeys(o.vlanPKey); err != nil {
		return err
	}
	if o.mac != "" {
		if o.cfg.MAC, err = ether.ParseMAC(o.mac); err != nil || o.cfg.MAC.IsMulticast() || o.cfg.MAC.IsZero() {
			return usageError{Msg: fmt.Sprintf("--mac %q: want a unicast MAC like 02:00:00:00:00:01", o.mac)}
		}
	}
	if err := o.cfg.Validate(); err != nil {
		return usageError{Msg: err.Error()}
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

// runDaemon is "eipoibd run": the daemon, until SIGINT or SIGTERM.
func runDaemon(args []string, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	cfg := o.cfg
	cfg.Logger = newLogger(o.logFormat, stderr, cfg.Level)
	// SIGHUP reads the command line and its config file afresh.
	cfg.Reload = func() (daemon.Config, error) {
		o, err := parse(args, io.Discard)
		if err != nil {
			return daemon.Config{}, err
		}
		return o.cfg, nil
	}
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	defer signal.Stop(sig)
	cfg.Signals = sig
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return daemon.Run(ctx, cfg)
}
