package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite docs/flags.md and docs/eipoibd.toml from runFlags")

// flagDoc is what docs/flags.md says of a flag beyond runFlags' name,
// default and usage: the detail an operator needs ("" for none).
type flagDoc struct{ name, more string }

// flagSections lay out docs/flags.md and docs/eipoibd.toml: every flag
// of runFlags in one section (TestFlagDocs fails on one in none).
var flagSections = []struct {
	title string
	flags []flagDoc
}{
	{"The TAP and the guests' switch", []flagDoc{
		{"name", "TAP to create (it must not exist, unless `--persist` left it; without `--persist` it disappears with the process)"},
		{"mac", ""},
		{"tap-mtu", "the TAP's own MTU (1280 to 65521; never below the IPoIB MTU): a bridge drops frames longer than a port's MTU silently, so the TAP takes guests' jumbo frames and eipoibd answers them with ICMP or fragments them instead of a black hole"},
		{"tap-queue-len", "frames each TAP queue holds for eipoibd's reader (the TAP's `txqueuelen`, up to 524288, the kernel's largest ring; 0 keeps the TAP's own, 1000); a frame a guest sends into a full queue is dropped by the kernel and counted in the TAP's TX `dropped` (`ip -s link show eib0`), so it must cover what guests send while the reader waits for a core: on the bench's 2 cores, 64-byte datagrams one a call at 220,000 a second lost 3.7 % at the 1000 a TAP is created with, none at 8192 up to the sender's most (264,000 a second). A queued frame is not charged to the guest's socket (`tun_net_xmit` orphans it): a full queue holds about 1 KB of kernel memory a small frame, and at worst, full of 64 KB super-frames that a guest sends faster than eipoibd reads them, 512 MB per TAP queue (64 MB at 1000); lower it where that matters more than bursts of small packets"},
		{"queues", "TAP queues (`IFF_MULTI_QUEUE`, at most 256): the kernel spreads guests' flows over them by hash and each has its own TX worker, so flows are read, translated and cut in parallel; writes to the port are serialised, and each received frame goes out through the queue its flow hashes to"},
		{"rx-workers", "simulated fabric: N sockets bound to UDP 4791 together (`SO_REUSEPORT`), each read by its own RX worker, for hosts with cores to spare (on the 2-core test machine it did not raise TCP throughput); the port sends each flow from one of 2N source ports, for the peer's kernel to put each flow on one of its sockets (in order) and spread flows: set it alike on every hypervisor (a peer with one source port reaches one socket); `0`: one per TAP queue; at most 32; the kernel and verbs backends receive on one queue. Measured in [scale.md](scale.md#parallel-receive)"},
		{"offload", "TAP offloads: checksum offload and TSO towards eipoibd (guests' 64 KB TCP super-frames are read whole and cut to the IPoIB MTU here), and runs of received TCP segments of one flow written back as one super-frame; `false` gives one frame per system call each way"},
		{"busy-poll", "after finding a TAP queue or (on the simulated fabric; the kernel and verbs backends' receive is not changed by it) the fabric socket empty, its reader retries the non-blocking read on its thread for up to this long (e.g. `50us`, at most `10ms`) before it waits for the next packet: a packet arriving meanwhile skips the sleep and wake-up, at the cost of a core spinning between packets (on a machine without spare cores it costs latency instead); on the simulated fabric it also sets `SO_BUSY_POLL` and `SO_PREFER_BUSY_POLL` (root), which act only on an underlay whose driver receives through NAPI (not a veth without XDP or GRO); with `--rx-workers N`, each of the N receive sockets' readers spins on its own thread, so up to N cores spin besides the TAP queues' readers"},
		{"bridge", "existing Linux bridge to enslave the TAP to; eipoibd follows its FDB (netlink): guests in it get their VIFs before they speak (at start-up, or when libvirt adds a static entry), and a guest whose entry goes (its port left the bridge) loses its VIF and QP at once (`vifs_removed`)"},
		{"ovs-bridge", "Open vSwitch bridge to attach the TAP to as a trunk port (all VLANs), detached on shutdown (kept with `--persist`); excludes `--bridge`. eipoibd follows OVSDB (`ovsdb-client monitor` of the Interface and Port tables): a port whose interface has `external_ids:attached-mac` (as libvirt and os-vif set it) declares that guest on the port's access VLAN (its `tag`; 0 for a trunk port) before it speaks, and deleting the port frees its VIF (`vifs_removed`); the log says `guest declared`/`guest gone` with `origin=ovs` (`origin=bridge` for the Linux bridge's static FDB entries)"},
		{"ovs-db", "OVSDB remote for `--ovs-bridge`, e.g. `unix:/run/openvswitch/db.sock`"},
		{"learn", "`auto`: a VIF for any guest source MAC (promiscuous emulation); `declared`: only MACs with a static entry in the `--bridge` FDB (libvirt's `macTableManager='libvirt'` adds them) or an `external_ids:attached-mac` on an `--ovs-bridge` port, frames from any other MAC dropped as `drop_undeclared` (and logged, at most once a minute, with the last such MAC), so a guest forging or flooding MACs cannot take QPs; the hypervisor's own frames (the bridge's or the TAP's MAC: the host's IPv6 router solicitations, MLD, ND) are dropped as `drop_undeclared_local`"},
		{"clamp-mss", "lower the MSS option of guests' TCP SYNs to what the IPoIB MTU carries (4052 for IPv4, 4032 for IPv6 at IB MTU 4096), checksum fixed incrementally, for guests that ignore path MTU discovery (`tx_mss_clamped`)"},
		{"dhcp", "`broadcast` sets the BROADCAST flag on guests' DHCP requests; `rfc4390` also rewrites them to the IPoIB form (htype 32, hlen 0, client-identifier) and restores the replies for the guest that asked (by transaction ID)"},
		{"dhcp-client-id", "the client-identifier `--dhcp rfc4390` gives requests: `mac` adds type 1 + the guest's MAC where the guest sent none (a server keyed by MAC, or one that leases to whatever asks); `mlnx` always writes the form OpenStack's Mellanox driver (networking-mlnx) and Mellanox boot firmware use, `ff:00:00:00:00:00:02:00:00:02:c9:00` + MAC[0:3] + `00:00` + MAC[3:6], for a DHCP server whose host entries are keyed by it (an OpenStack network on IPoIB, or a dnsmasq/ISC host file written the same way)"},
	}},
	{"The fabric", []flagDoc{
		{"fabric", "`sim`: the simulated UD fabric; `kernel`: the kernel's IPoIB driver (`--ib-dev ib0`); `verbs`: UD QPs through libibverbs (`--ib-dev mlx5_0`, `rxe0`; a binary built with `-tags verbs`, `bin/eipoibd-verbs`)"},
		{"underlay", "interface the simulated fabric runs over; its IPv6 link-local address is the port GID; its MTU must be at least the IB MTU + 72"},
		{"ib-dev", "the IPoIB parent interface (`--fabric kernel`) or the verbs device and its port (`--fabric verbs`): `NAME` or `NAME:PORT`, e.g. `mlx5_0:2` for a dual-port HCA's second port; port 1 when none is given. The verbs backend acts only on its port's async events (another port's are counted in `async_events_other_port`)"},
		{"fast-path", "`--fabric kernel` only, experimental: `off` (the default) runs every frame through eipoibd; `auto` loads two tc BPF programs (Linux 5.8 or later; tcx links from 6.6, clsact filters before) that carry guests' ordinary unicast IPv4/IPv6 between the TAP and the IPoIB children in the kernel when the kernel passes a probe (both programs load), and otherwise logs why not, once, and runs without them; `on` refuses to start when the probe fails, naming what is missing. See [kernel-backend.md](kernel-backend.md#fast-path)"},
		{"verbs-recv-depth", "`--fabric verbs`: receive buffers kept posted on the shared receive queue (64 to 16384). They are reposted as packets arrive, whatever the reader does (UD has no RNR: a packet that finds no buffer is lost in the HCA, uncounted); as many again hold packets for a reader that falls behind, beyond which new packets are dropped and counted (`rx_queue_full`). Registered memory: (2 × N + 64) × 4160 bytes, 8.8 MB at 1024"},
		{"ib-mtu", "2048 or 4096; the IPoIB MTU is 4 less (2044/4092): segments are cut to it, larger packets fragmented or answered \"too big\""},
		{"vlan-pkey", "VLAN → P_Key partitions, e.g. `10=0x800a,20=0x8014`; untagged is always 0xffff; frames on other VLANs are dropped and counted"},
		{"fault", ""},
	}},
	{"Tables and timers", []flagDoc{
		{"max-vifs", "most guest MACs (one UD QP each); more are refused and counted, live guests are never evicted"},
		{"max-neighbours", "most remote endpoints remembered (LRU-evicted beyond)"},
		{"memory-limit", "soft limit in MiB of the memory the Go runtime holds (`debug.SetMemoryLimit`; with 0, `$GOMEMLIMIT` applies if set): past it the garbage collector runs more often instead of letting the heap grow by half the live heap (eipoibd sets the collector's `GOGC` to 50 unless `$GOGC` is set: the data path allocates nothing per frame, so only control-plane churn such as floods and scrapes makes garbage, and a flood then costs a third less RSS: `TestMemoryFlood` 45–47 MB against 54–57 MB at Go's default of 100). Set it well above the live heap, which at the default bounds after floods of 20,000 guest MACs and 100,000 fabric endpoints is what `go_memstats_heap_alloc_bytes` shows after a forced collection (the tables, and the buffers of the port and the RX loop; the TX workers' 64 KB read buffers are mapped outside the Go heap, `internal/iobuf`, so the collector neither counts nor scans them): a limit under the live heap keeps the collector running (measured with 48 when the QP table's leaves alone took 36 MB: 12–14% CPU, and the daemon fell behind a flood of 40,000 packets a second, dropping 20,148)"},
		{"vif-idle", "a learned guest MAC silent this long loses its VIF (and QP); a declared one (control socket, CNI plugin, static bridge entry, OVS port) keeps it until undeclared"},
		{"mcast-query-interval", ""},
		{"mcast-response-interval", ""},
		{"mcast-last-member-interval", ""},
		{"mcast-robustness", "robustness variable: membership interval = robustness × query interval + response interval (260 s); leave time = robustness × last-member interval (2 s)"},
	}},
	{"Operations", []flagDoc{
		{"ctl-dir", ""},
		{"persist", "keep the TAP and its switch port across restarts and crashes, its queues in systemd's file descriptor store (or `--fd-store`'s keeper) so its carrier never changes, and the guests in a state file (see [persist.md](persist.md))"},
		{"state-dir", ""},
		{"bpf-dir", "with `--fabric kernel`, `--fast-path` and `--persist`: the bpffs directory under which the fast path's maps and tcx links are pinned (`DIR/NAME/`), so that the next start takes them over and the programs stay attached meanwhile; a bpffs is mounted at `/sys/fs/bpf` (or at DIR elsewhere) if there is none. Without `--persist` what an earlier run pinned there is removed. See [kernel-backend.md](kernel-backend.md#fast-path)"},
		{"fd-store", "socket of an `eipoibd keeper` (e.g. `/run/eipoibd/keeper.sock`) that keeps the `--persist` TAP queues instead of systemd's file descriptor store, where no systemd runs eipoibd (a container); without `--persist`, queues it still holds for this TAP are released (see [persist.md](persist.md))"},
		{"metrics", ""},
		{"pprof", "also serve Go's profiles at `http://ADDR/debug/pprof/` on the `--metrics` address (`go tool pprof http://ADDR/debug/pprof/profile?seconds=10`)"},
		{"log-level", ""},
		{"log-format", "`text` (logfmt) or `json` (one JSON object a line, for journald/Loki/Elasticsearch pipelines); a value reads the same in both: MACs and LIMACs in colon-hex, GIDs as `fe80::…`, P_Keys and QPNs in hex (`0xffff`), names such as `tap_start=created` as words"},
		{"config", ""},
	}},
}

// wrap writes text as lines of at most 72 columns, each begun by prefix.
func wrap(b *strings.Builder, prefix, text string) {
	line := prefix
	for _, w := range strings.Fields(text) {
		if len(line) > len(prefix) && len(line)+1+len(w) > 72 {
			b.WriteString(line + "\n")
			line = prefix
		}
		if len(line) > len(prefix) {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
}

// tomlValue is f's default as a TOML value of its type.
func tomlValue(f *flag.Flag) string {
	switch v := f.Value.(flag.Getter).Get().(type) {
	case int, bool:
		return fmt.Sprint(v)
	case time.Duration:
		return strconv.Quote(v.String())
	}
	return strconv.Quote(f.DefValue)
}

// flagDocs returns docs/flags.md and docs/eipoibd.toml, made from
// runFlags and flagSections.
func flagDocs(t *testing.T) (md, toml string) {
	fs := runFlags(&options{})
	seen := map[string]bool{}
	var m, c strings.Builder
	m.WriteString("# Flags of eipoibd run\n\n")
	m.WriteString("<!-- Generated by `go test ./cmd/eipoibd -run TestFlagDocs -update` from\n")
	m.WriteString("runFlags (cmd/eipoibd/main.go). Do not edit. -->\n\n")
	m.WriteString("Each flag is also a key of the `--config` file, without its dashes:\n")
	m.WriteString("[eipoibd.toml](eipoibd.toml) is the reference, every key with its\n")
	m.WriteString("default. Flags given on the command line override the file.\n")
	c.WriteString(`# eipoibd run --config FILE: the reference. Every key is a flag of
# "eipoibd run" without its dashes; each value below is the default.
# Flags given on the command line override the file. SIGHUP re-reads the
# file (see the README, "Reloading"); docs/flags.md says more of each
# key. Generated by go test ./cmd/eipoibd -run TestFlagDocs -update from
# the flags; do not edit.
`)
	for _, s := range flagSections {
		fmt.Fprintf(&m, "\n## %s\n\n| Flag | Default | Usage |\n|---|---|---|\n", s.title)
		fmt.Fprintf(&c, "\n# --- %s ---\n", strings.ToLower(s.title[:1])+s.title[1:])
		var more strings.Builder
		for _, d := range s.flags {
			f := fs.Lookup(d.name)
			if f == nil || seen[d.name] {
				t.Fatalf("flagSections: %q is no flag of eipoibd run, or is listed twice", d.name)
			}
			seen[d.name] = true
			def := "`" + f.DefValue + "`"
			if f.DefValue == "" {
				def = "none"
			}
			fmt.Fprintf(&m, "| `--%s` | %s | %s |\n", f.Name, def, f.Usage)
			if d.more != "" {
				fmt.Fprintf(&more, "- `--%s`: %s\n", f.Name, d.more)
			}
			if f.Name == "config" {
				continue // not a key of the file itself
			}
			c.WriteString("\n")
			wrap(&c, "# ", strings.ToUpper(f.Usage[:1])+f.Usage[1:]+".")
			fmt.Fprintf(&c, "%s = %s\n", f.Name, tomlValue(f))
		}
		if more.Len() > 0 {
			m.WriteString("\n" + more.String())
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !seen[f.Name] {
			t.Errorf("flag --%s is in no section of flagSections", f.Name)
		}
	})
	return m.String(), c.String()
}

// TestFlagDocs: docs/flags.md and docs/eipoibd.toml are the ones
// runFlags makes (-update rewrites them), so neither drifts from the flag
// set.
func TestFlagDocs(t *testing.T) {
	md, toml := flagDocs(t)
	for _, f := range []struct{ path, want string }{{"../../docs/flags.md", md}, {"../../docs/eipoibd.toml", toml}} {
		if *update {
			if err := os.WriteFile(f.path, []byte(f.want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != f.want {
			t.Errorf("%s is not the one runFlags makes; run go test ./cmd/eipoibd -run TestFlagDocs -update", f.path)
		}
	}
}
