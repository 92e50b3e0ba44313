package netns

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// ctlJSON runs a client command with --json and decodes its output
// strictly into v, one of the control protocol's reply types (package
// ctl): a field the daemon answers with that the type lacks fails the
// decoding.
func ctlJSON(t *testing.T, h *hypervisor, v any, args ...string) {
	t.Helper()
	out := h.ctl(t, append(args, "--json")...)
	d := json.NewDecoder(strings.NewReader(out))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("eipoibd %v --json: %v\n%s", args, err, out)
	}
}

func vifOf(vs []ctl.VIF, mac string) (ctl.VIF, bool) {
	for _, v := range vs {
		if v.MAC == mac {
			return v, true
		}
	}
	return ctl.VIF{}, false
}

// TestCtl: every command of the control socket, against a running
// daemon, and every JSON field it answers with.
func TestCtl(t *testing.T) {
	tp := newTopo(t, 2, false, "--vlan-pkey", "10=0x800a")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	ping(t, g11, g21.ip4)

	var port ctl.Port
	ctlJSON(t, h1, &port, "show", "port")
	if port.Name != "eib0" || port.Backend != "sim" || port.Device != "ul1" || port.GID != h1.gid(t).String() ||
		port.IBMTU != 4096 || port.IPoIBMTU != 4092 || port.Link != "up" || len(port.Partitions) != 2 ||
		port.Partitions[0].VLAN != 0 || port.Partitions[0].PKey != "0xffff" || port.Partitions[1].VLAN != 10 || port.Partitions[1].PKey != "0x800a" {
		t.Errorf("show port: %+v", port)
	}
	// The typed client, as the CLI uses it, decodes the same answer.
	if p, err := (ctl.Client{Path: ctl.Path(h1.ctlDir(), "eib0")}).ShowPort(); err != nil || !reflect.DeepEqual(p, port) {
		t.Errorf("ctl.Client.ShowPort: %+v, %v; the CLI's --json said %+v", p, err, port)
	}
	if out := h1.ctl(t, "show", "port"); !strings.Contains(out, "gid        "+h1.gid(t).String()) || !strings.Contains(out, "partition  vlan 10 pkey 0x800a") {
		t.Errorf("show port (text):\n%s", out)
	}

	// Per-VIF counters: five pings of 100 bytes add five frames each
	// way, and at most one stray frame, an ND or MLD message, in that
	// time. The two guests' ARP entries for each other are pinned first;
	// otherwise a stale one's unicast probe and its answer would add one
	// more each way. The guest's start-up chatter is over first (quiet
	// for 1 s): its MLD reports, sent twice with the second within 1 s,
	// and its router solicitation once its link-local address is usable.
	pinNeighbour(t, g11, g21.ip4)
	pinNeighbour(t, g21, g11.ip4)
	mac := g11.mac(t).String()
	var before, after []ctl.VIF
	start := time.Now()
	quiet := start
	for last := uint64(0); ; time.Sleep(100 * time.Millisecond) {
		ctlJSON(t, h1, &before, "show", "vifs")
		b, _ := vifOf(before, mac)
		if b.TxPackets != last {
			last, quiet = b.TxPackets, time.Now()
		}
		if time.Since(quiet) >= time.Second {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("guest %s sent frames for 10 s without a pause", g11.ns)
		}
	}
	pingN(t, g11, g21.ip4, 5, "-s", "100")
	ctlJSON(t, h1, &after, "show", "vifs")
	b, ok1 := vifOf(before, mac)
	a, ok2 := vifOf(after, mac)
	if !ok1 || !ok2 {
		t.Fatalf("no VIF of %s in show vifs: %+v", mac, after)
	}
	const txFrame, rxPacket = 14 + 20 + 8 + 100, 4 + 20 + 8 + 100
	if d := a.TxPackets - b.TxPackets; d < 5 || d > 6 {
		t.Errorf("tx_packets rose by %d over 5 pings", d)
	}
	if d := a.TxBytes - b.TxBytes; d < 5*txFrame || d > 5*txFrame+1500 {
		t.Errorf("tx_bytes rose by %d over 5 pings of %d-byte frames", d, txFrame)
	}
	if d := a.RxPackets - b.RxPackets; d < 5 || d > 6 {
		t.Errorf("rx_packets rose by %d over 5 replies", d)
	}
	if d := a.RxBytes - b.RxBytes; d < 5*rxPacket || d > 5*rxPacket+1500 {
		t.Errorf("rx_bytes rose by %d over 5 replies of %d-byte packets", d, rxPacket)
	}
	qpn := h1.vifQPN(mac, 0)
	if a.VLAN != 0 || a.PKey != "0xffff" || a.QPN != fmt.Sprintf("%#06x", qpn) || !strings.HasPrefix(a.Address, fmt.Sprintf("00:%02x:%02x:%02x:fe:80:", qpn>>16, qpn>>8&0xff, qpn&0xff)) ||
		(a.Origin != "learned" && a.Origin != "bridge") || a.IdleS > 5 {
		t.Errorf("show vifs: %+v (QPN in the log %#x)", a, qpn)
	}
	// The same counters as labeled metrics, and the shim's byte totals
	// cover every VIF's.
	m := h1.metrics(t)
	key := fmt.Sprintf(`vif_tx_packets_total{mac="%s",origin="%s",vlan="0"}`, mac, a.Origin)
	if m[key] < float64(a.TxPackets) || m[fmt.Sprintf(`vif_rx_bytes_total{mac="%s",origin="%s",vlan="0"}`, mac, a.Origin)] < float64(a.RxBytes) {
		t.Errorf("metrics %s = %v, show vifs said %d", key, m[key], a.TxPackets)
	}
	var txb uint64
	for _, v := range after {
		txb += v.TxBytes
	}
	for _, n := range []string{"tx_bytes", "rx_bytes"} {
		if m[n] == 0 {
			t.Errorf("metric %s missing", n)
		}
	}
	if m["tx_bytes"] < float64(txb) {
		t.Errorf("tx_bytes %v below the VIFs' sum %d", m["tx_bytes"], txb)
	}
	if out := h1.ctl(t, "show", "vifs"); !strings.HasPrefix(out, "MAC ") || !strings.Contains(out, mac) {
		t.Errorf("show vifs (text):\n%s", out)
	}

	// A declared VIF, then deleted.
	const declared = "02:00:00:00:cc:01"
	h1.ctl(t, "vif", "add", declared, "--vlan", "10")
	ctlJSON(t, h1, &after, "show", "vifs")
	if v, ok := vifOf(after, declared); !ok || v.Origin != "declared" || v.VLAN != 10 || v.PKey != "0x800a" || v.TxPackets != 0 || v.RxPackets != 0 {
		t.Errorf("declared VIF: %+v %v", v, ok)
	}
	h1.ctl(t, "vif", "del", declared, "--vlan", "10")
	ctlJSON(t, h1, &after, "show", "vifs")
	if _, ok := vifOf(after, declared); ok {
		t.Errorf("VIF %s still there after vif del", declared)
	}
	if out, err := exec.Command(daemonBin, "vif", "add", "zz", "--ctl-dir", h1.ctlDir()).CombinedOutput(); err == nil || !strings.Contains(string(out), `MAC "zz"`) {
		t.Errorf("vif add zz: %v\n%s", err, out)
	}

	// Neighbours: g21's endpoint, with the IP its ARP spoke for.
	var ns []ctl.Neigh
	ctlJSON(t, h1, &ns, "show", "neigh")
	want := fmt.Sprintf("%06x", h2.vifQPN(g21.mac(t).String(), 0))
	found := false
	for _, n := range ns {
		if strings.Contains(strings.ReplaceAll(n.RIMAC, ":", ""), want) && slices.Contains(n.IPs, g21.ip4) {
			found = n.PKey == "0xffff" && n.AgeS < 10 && len(n.REMAC) == 17
		}
	}
	if !found {
		t.Errorf("show neigh: no entry for %s (QPN %s): %+v", g21.ip4, want, ns)
	}
	if out := h1.ctl(t, "show", "neigh"); !strings.HasPrefix(out, "REMAC ") || !strings.Contains(out, g21.ip4) {
		t.Errorf("show neigh (text):\n%s", out)
	}
	var flushed ctl.Flushed
	ctlJSON(t, h1, &flushed, "neigh", "flush")
	if flushed.Flushed != len(ns) {
		t.Errorf("neigh flush: %v, want %d", flushed, len(ns))
	}
	ctlJSON(t, h1, &ns, "show", "neigh")
	if len(ns) != 0 {
		t.Errorf("after neigh flush: %+v", ns)
	}
	ping(t, g11, g21.ip4) // learned again

	// Groups: the broadcast group, and a guest's group with its state and
	// the guest that reported it.
	r := startReceiver(t, g11, "239.1.1.9")
	waitJoinedAny(t, h1, "239.1.1.9")
	var gs []ctl.Group
	ctlJSON(t, h1, &gs, "show", "groups")
	var bcast, joined bool
	for _, g := range gs {
		bcast = bcast || g.MGID == bcastGroup && !g.SendOnly
		for _, m := range g.Members {
			joined = joined || m.Group == "239.1.1.9" && m.VLAN == 0 && m.ExpiresS > 200 && m.QueriesLeft == 0 && m.LastReporter == g11.ip4 && !g.SendOnly
		}
	}
	if !bcast || !joined {
		t.Errorf("show groups: broadcast %v, 239.1.1.9 %v: %+v", bcast, joined, gs)
	}
	if out := h1.ctl(t, "show", "groups"); !strings.Contains(out, "239.1.1.9 vlan 0 (expires") || !strings.Contains(out, "last reporter "+g11.ip4+")") {
		t.Errorf("show groups (text):\n%s", out)
	}
	r.stop()
	// The leave's group-specific queries end with the group gone; the
	// captures below then see no multicast of it.
	waitJoined(t, h1, groupMGID("239.1.1.9"), false, 20*time.Second)

	// Stats: the counters as the metrics have them, and deltas.
	var st ctl.Stats
	ctlJSON(t, h1, &st, "show", "stats")
	if m := h1.metrics(t); float64(st["vifs_created"]) != m["vifs_created"] || st["vifs_removed"] != 1 || st["tx_frames"] == 0 {
		t.Errorf("show stats: vifs_created %d (metrics %v), vifs_removed %d", st["vifs_created"], m["vifs_created"], st["vifs_removed"])
	}
	if out := h1.ctl(t, "show", "stats", "--interval", "300ms", "--count", "2"); strings.Count(out, "changes over 300ms") != 2 {
		t.Errorf("show stats --interval:\n%s", out)
	}

	// Capture: exactly the packets asked for, each decoded by tshark as
	// IPoIB (fabric side) or Ethernet (TAP side) carrying IPv4, IPv6 or ARP. A ping every 10 ms fills
	// the 10 packets in about 50 ms, so at most 2 of them may be other
	// traffic of the moment (an MLD report, a query).
	for _, c := range []struct{ side, link, proto string }{{"fabric", "ipoib:", "ipoib:ip:icmp"}, {"tap", "eth:ethertype:", "eth:ethertype:ip:icmp"}} {
		pcap := filepath.Join(t.TempDir(), c.side+".pcap")
		done := make(chan error, 1)
		go func() {
			_, err := exec.Command(daemonBin, "capture", "-w", pcap, "-c", "10", "--side", c.side, "--ctl-dir", h1.ctlDir()).CombinedOutput()
			done <- err
		}()
		// The capture is on once the pcap's file header (24 bytes),
		// which the daemon sends just after it started the capture, is
		// in the file.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if fi, err := os.Stat(pcap); err == nil && fi.Size() >= 24 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("capture %s: no pcap header in %s after 20 s", c.side, pcap)
			}
		}
		pingN(t, g11, g21.ip4, 20, "-i", "0.01")
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("capture %s: %v", c.side, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("capture %s -c 10 did not end", c.side)
		}
		lines := strings.Split(strings.TrimSpace(tshark(t, "-r", pcap, "-T", "fields", "-e", "frame.protocols")), "\n")
		icmp, link := 0, 0
		for _, l := range lines {
			if strings.HasPrefix(l, c.proto) {
				icmp++
			}
			if net, _, _ := strings.Cut(strings.TrimPrefix(l, c.link), ":"); strings.HasPrefix(l, c.link) && (net == "ip" || net == "ipv6" || net == "arp") {
				link++
			}
		}
		if len(lines) != 10 || link != 10 || icmp < 8 {
			t.Errorf("capture %s: %d packets, %d decoded as %s:\n%s", c.side, len(lines), icmp, c.proto, strings.Join(lines, "\n"))
		}
	}
	ping(t, g11, g21.ip4) // the data path never noticed

	// A peer that is not root is refused: by the socket's mode 0600, and,
	// with the mode opened up, by the SO_PEERCRED check. The client runs
	// as nobody from a copy it can execute, through directories it may
	// traverse.
	bin := filepath.Join(t.TempDir(), "eipoibd")
	if b, err := os.ReadFile(daemonBin); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy of %s: %v", daemonBin, err)
	}
	for _, d := range []string{filepath.Dir(bin), filepath.Dir(filepath.Dir(bin)), h1.logDir, filepath.Dir(h1.logDir), h1.ctlDir()} {
		os.Chmod(d, 0o755)
	}
	asNobody := func() string {
		cmd := exec.Command(bin, "show", "port", "--ctl-dir", h1.ctlDir())
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("eipoibd show port as nobody succeeded:\n%s", out)
		}
		return string(out)
	}
	if out := asNobody(); !strings.Contains(out, "permission denied") {
		t.Errorf("as nobody through the 0600 socket: %s", out)
	}
	sock := filepath.Join(h1.ctlDir(), "eib0.sock")
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if out := asNobody(); !strings.Contains(out, "permission denied: uid 65534 is not root") {
		t.Errorf("as nobody through a 0666 socket: %s", out)
	}
	ping(t, g11, g21.ip4)
}

// pinNeighbour makes g's neighbour entry for ip, which a ping has made,
// permanent with the address it holds: the kernel no longer probes it
// (neigh_timer_handler acts only on NUD_IN_TIMER states).
func pinNeighbour(t *testing.T, g *guest, ip string) {
	t.Helper()
	f := strings.Fields(sh(t, in(g.ns, "ip", "neigh", "show", ip, "dev", "eth0")...))
	i := slices.Index(f, "lladdr")
	if i < 0 || i+1 >= len(f) {
		t.Fatalf("%s: no neighbour entry for %s: %q", g.ns, ip, f)
	}
	sh(t, in(g.ns, "ip", "neigh", "replace", ip, "dev", "eth0", "lladdr", f[i+1], "nud", "permanent")...)
}
