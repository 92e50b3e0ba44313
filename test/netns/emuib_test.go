package netns

// eipoibd's kernel backend (--fabric kernel) end to end, over the
// emulated IPoIB wire of package emuib: this machine has no IPoIB, so
// the daemon is built with the emuib tag, which runs the backend on
// emuib's emulated kernel (IPoIB children as veths whose other ends are
// in a fabric namespace, where the wire's programs carry frames by
// their IPoIB link header). Everything else is eipoibd as it runs: the
// shim, ARP/NDP translation, multicast, the fast path's programs and
// control plane, the bridge, the TAP.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib/emukernel"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/ipoib"
)

var emuibBin struct {
	once sync.Once
	path string
	err  error
}

// emuibDaemon builds eipoibd with the emuib tag, once, beside daemonBin.
func emuibDaemon(t *testing.T) string {
	t.Helper()
	emuibBin.once.Do(func() {
		emuibBin.path = filepath.Join(filepath.Dir(daemonBin), "eipoibd-emuib")
		out, err := exec.Command("go", "build", "-tags", "emuib", "-o", emuibBin.path, "github.com/eipoib/eipoibd/cmd/eipoibd").CombinedOutput()
		if err != nil {
			emuibBin.err = fmt.Errorf("build eipoibd -tags emuib: %v\n%s", err, out)
		}
	})
	if emuibBin.err != nil {
		t.Fatal(emuibBin.err)
	}
	return emuibBin.path
}

// emuTopo is two hypervisors, each an eipoibd with --fabric kernel on
// its emulated parent ib0, a bridge br0 with the TAP and one guest; the
// fabric namespace with the wire, pinned in a bpffs mount.
type emuTopo struct {
	*topo
	fabric   *emuib.Fabric
	fabricNS string
	guests   [2]*guest
}

// emuWire pins emuib's wire (emuib.NewFabric) in a bpffs mounted on a
// temporary directory, and returns it and the directory (an
// emukernel.Config's Pins). At cleanup, after what was registered later
// (the daemons that use it), it closes the fabric and unmounts the bpffs.
func emuWire(t *testing.T) (*emuib.Fabric, string) {
	t.Helper()
	require(t, "mount", "umount")
	pins := t.TempDir()
	sh(t, "mount", "-t", "bpf", "bpf", pins)
	t.Cleanup(func() { shErr("umount", pins) })
	fab, err := emuib.NewFabric(pins)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fab.Close() })
	return fab, pins
}

// emuParent makes the emulated IPoIB parent ib0 of hypervisor namespace
// ns (emukernel.Config's Parent): a veth whose peer, named peer, is in
// the fabric namespace, for its carrier; both up.
func emuParent(t *testing.T, ns, fabric, peer string) {
	t.Helper()
	sh(t, "ip", "link", "add", "ib0", "netns", ns, "mtu", "4092", "type", "veth", "peer", "name", peer, "netns", fabric)
	sh(t, in(fabric, "ip", "link", "set", peer, "up")...)
	sh(t, in(ns, "ip", "link", "set", "ib0", "up")...)
}

// newEmuTopo builds it with --fast-path fastPath.
func newEmuTopo(t *testing.T, fastPath string) *emuTopo {
	t.Helper()
	require(t, "ping")
	bin := emuibDaemon(t)
	tp := &emuTopo{topo: &topo{t: t, pfx: fmt.Sprintf("fe%d%d", os.Getpid()%1000, nsSeq.Add(1))}}
	var all []string
	logDir := t.TempDir()
	var pins string
	tp.fabric, pins = emuWire(t)
	addNS := func(name string) string {
		ns := tp.pfx + name
		sh(t, "ip", "netns", "add", ns)
		all = append(all, ns)
		sh(t, in(ns, "ip", "link", "set", "lo", "up")...)
		// Only the guests' traffic: no IPv6 of the hypervisors' own
		// devices (the guests' eth0 get theirs explicitly).
		sh(t, in(ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")...)
		return ns
	}
	t.Cleanup(func() {
		if t.Failed() {
			tp.dump()
			w, werr := tp.fabric.Programs.Counts()
			m, merr := tp.fabric.Multicast.Counts()
			t.Logf("wire counters %v (%v), multicast %v (%v)", w, werr, m, merr)
		}
		for _, h := range tp.hvs {
			h.stop(t, !t.Failed())
		}
		for _, ns := range all {
			shErr("ip", "netns", "delete", ns)
		}
	})
	fabric := addNS("f")
	tp.fabricNS = fabric
	for i := range 2 {
		h := &hypervisor{name: fmt.Sprintf("h%d", i+1), logDir: logDir, bin: bin,
			fabricArgs: []string{"--fabric", "kernel", "--ib-dev", "ib0", "--fast-path", fastPath},
			switchArgs: []string{"--bridge", "br0"}}
		h.ns = addNS(h.name)
		cfg, err := json.Marshal(emukernel.Config{Fabric: fabric, Pins: pins, Host: i, GID: netip.MustParseAddr(fmt.Sprintf("fe80::ee:%d", i+1)), Parent: "ib0"})
		if err != nil {
			t.Fatal(err)
		}
		h.env = []string{"EIPOIB_EMUIB=" + string(cfg)}
		emuParent(t, h.ns, fabric, fmt.Sprintf("p%d", i+1))
		sh(t, in(h.ns, "ip", "link", "add", "br0", "type", "bridge")...)
		sh(t, in(h.ns, "ip", "link", "set", "br0", "up")...)
		g := &guest{ns: addNS(h.name + "g1"), ip4: fmt.Sprintf("10.77.0.%d1", i+1), ip6: fmt.Sprintf("fd77::%d1", i+1)}
		sh(t, in(g.ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=0")...)
		sh(t, "ip", "link", "add", "eth0", "netns", g.ns, "type", "veth", "peer", "name", "vg1", "netns", h.ns)
		sh(t, in(h.ns, "ip", "link", "set", "vg1", "master", "br0", "up")...)
		sh(t, in(g.ns, "ip", "link", "set", "eth0", "up")...)
		h.guests = []*guest{g}
		tp.guests[i] = g
		tp.hvs = append(tp.hvs, h)
	}
	for _, h := range tp.hvs {
		h.start(t)
	}
	// The guests' addresses once the daemons run, as when guests boot on
	// a running hypervisor: their MLD reports reach the shim.
	for _, g := range tp.guests {
		sh(t, in(g.ns, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0")...)
		sh(t, in(g.ns, "ip", "addr", "add", g.ip4+"/24", "dev", "eth0")...)
		sh(t, in(g.ns, "ip", "addr", "add", g.ip6+"/64", "dev", "eth0", "nodad")...)
		// No default route: IPv4 multicast needs one of its own.
		sh(t, in(g.ns, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")...)
	}
	return tp
}

// member reports whether hypervisor host (0 or 1) has a child that is a
// member of mgid on the wire.
func (tp *emuTopo) member(t *testing.T, host int, mgid ipoib.GID) bool {
	t.Helper()
	var v emuib.Members
	err := tp.fabric.Groups.Lookup(emuib.GroupKey{MGID: mgid, Host: uint32(host)}, &v)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	return v != emuib.Members{}
}

// waitMember waits up to 20 s for hypervisor host's membership of mgid
// on the wire to be want.
func (tp *emuTopo) waitMember(t *testing.T, host int, mgid ipoib.GID, want bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); tp.member(t, host, mgid) != want; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("h%d: member of %s on the wire = %v after 20 s, want %v", host+1, mgid, !want, want)
		}
	}
}

// guestOffloads turns the guests' offloads (checksum, segmentation,
// scatter-gather) on or off.
func (tp *emuTopo) guestOffloads(t *testing.T, on bool) {
	t.Helper()
	nstestRequire(t, "ethtool")
	v := map[bool]string{true: "on", false: "off"}[on]
	for _, g := range tp.guests {
		sh(t, in(g.ns, "ethtool", "-K", "eth0", "tx", v, "sg", v, "tso", v, "gso", v)...)
	}
}

// tcpDigest sends n pseudo-random bytes over one TCP connection, over
// IPv6 if v6, from client to server (nstest.TCPDigest).
func tcpDigest(t *testing.T, server, client *guest, n int64, v6 bool) {
	t.Helper()
	network, ip := "tcp4", server.ip4
	if v6 {
		network, ip = "tcp6", server.ip6
	}
	nstest.TCPDigest(t, client.ns, server.ns, network, ip, n, 0)
}

// waitFastPath pings from guest 1 to guest 2 until the request and the
// reply each crossed both hypervisors' fast path: the shim leaves a new
// guest to user space during its announcement window (30 s), in which it
// learns the addresses the guest shows.
func (tp *emuTopo) waitFastPath(t *testing.T) {
	t.Helper()
	nstestRequire(t, "ping")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	const within = 90 * time.Second
	for deadline := time.Now().Add(within); ; time.Sleep(500 * time.Millisecond) {
		b1, b2 := h1.metrics(t), h2.metrics(t)
		runPing(tp.guests[0], tp.guests[1].ip4, 1, 2*time.Second)
		a1, a2 := h1.metrics(t), h2.metrics(t)
		rose := func(b, a map[string]float64, k string) bool { return a[k] > b[k] }
		if rose(b1, a1, "port_fast_path_tx_redirected") && rose(b2, a2, "port_fast_path_rx_redirected") &&
			rose(b2, a2, "port_fast_path_tx_redirected") && rose(b1, a1, "port_fast_path_rx_redirected") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a ping's request and reply did not both cross the fast path within %v", within)
		}
	}
}

// fabricEnd matches the name of a child's fabric end (emukernel's
// AddChild names them hHqN).
var fabricEnd = regexp.MustCompile(`: h[0-9]q[0-9]+@`)

// maxFrameData bounds the TCP payload of one frame the fast path's
// programs redirect: a GSO super-frame holds at most 64 KiB (GSO_MAX_SIZE
// on a TAP and a veth, no BIG TCP here), a frame without offloads the
// guest's MTU.
func maxFrameData(offloads bool) int64 {
	if offloads {
		return 65536
	}
	return 1500
}

// TestKernelBackendEmulated runs eipoibd's kernel backend end to end
// over the emulated IPoIB wire, with the fast path off and on: the
// guests resolve each other through eipoibd's own ARP/NDP translation
// (no static neighbour), every ping is answered, TCP crosses both ways
// byte-exact, with the guests' offloads on and off.
func TestKernelBackendEmulated(t *testing.T) {
	const n = 8 << 20
	for _, fastPath := range []string{"off", "on"} {
		t.Run("fast-path-"+fastPath, func(t *testing.T) {
			tp := newEmuTopo(t, fastPath)
			g1, g2 := tp.guests[0], tp.guests[1]
			h1, h2 := tp.hvs[0], tp.hvs[1]
			drops := watchDrops(t, h1, h2)
			t.Run("ping", func(t *testing.T) {
				pingN(t, g1, g2.ip4, 5)
				pingN(t, g2, g1.ip4, 5)
			})
			t.Run("ping6", func(t *testing.T) {
				pingN(t, g1, g2.ip6, 5)
				pingN(t, g2, g1.ip6, 5)
			})
			// Each request crosses as a broadcast, each answer as a
			// unicast ARP to the asking guest's VIF child, which a socket
			// bound to ETH_P_ARP reads under the fast path.
			t.Run("arping", func(t *testing.T) {
				arping(t, g1, g2.ip4, 3)
				arping(t, g2, g1.ip4, 3)
			})
			// eipoibd resolved each guest's one peer itself (the fast
			// path takes no ARP or NDP).
			t.Run("resolved", func(t *testing.T) {
				for _, h := range tp.hvs {
					if m := h.metrics(t); m["neighbours"] != 1 || m["neighbours_learned"] != 1 {
						t.Errorf("%s: %v neighbours, %v learned, want 1 and 1", h.name, m["neighbours"], m["neighbours_learned"])
					}
				}
			})
			if fastPath == "on" {
				t.Run("carried", func(t *testing.T) { tp.waitFastPath(t) })
			}
			// A guest's IGMP join makes its hypervisor's group child a
			// member on the wire, which carries the other guest's stream
			// to it whole; its leave ends the membership.
			t.Run("multicast", func(t *testing.T) {
				const group = "239.1.1.1"
				mgid := groupMGID(group)
				r := startReceiver(t, g2, group)
				tp.waitMember(t, 1, mgid, true)
				r.expectStream(t, g2, 0, send(t, g1, group))
				r.stop()
				tp.waitMember(t, 1, mgid, false)
			})
			for _, offloads := range []bool{true, false} {
				t.Run(fmt.Sprintf("tcp-offloads-%v", offloads), func(t *testing.T) {
					tp.guestOffloads(t, offloads)
					// h1 to h2 over IPv4, back over IPv6.
					for _, dir := range [][2]*hypervisor{{h1, h2}, {h2, h1}} {
						from, to := dir[0], dir[1]
						before := [2]map[string]float64{from.metrics(t), to.metrics(t)}
						tcpDigest(t, to.guests[0], from.guests[0], n, from == h2)
						after := [2]map[string]float64{from.metrics(t), to.metrics(t)}
						userTx := after[0]["port_tx_bytes"] - before[0]["port_tx_bytes"]
						userRx := after[1]["port_rx_bytes"] - before[1]["port_rx_bytes"]
						fastTx := after[0]["port_fast_path_tx_redirected"] - before[0]["port_fast_path_tx_redirected"]
						fastRx := after[1]["port_fast_path_rx_redirected"] - before[1]["port_fast_path_rx_redirected"]
						t.Logf("%s → %s: user space sent %v bytes and received %v; the fast path redirected %v frames out, %v in",
							from.name, to.name, userTx, userRx, fastTx, fastRx)
						if fastPath == "off" {
							// Every byte crossed user space both ends: the
							// payload and its headers.
							if userTx < n || userRx < n || fastTx != 0 || fastRx != 0 {
								t.Errorf("fast path off: user space sent %v and received %v bytes, want at least %d each; fast path %v/%v frames, want 0", userTx, userRx, n, fastTx, fastRx)
							}
							continue
						}
						// The bytes user space did not carry crossed the
						// fast path, at most maxFrameData of them a frame.
						per := maxFrameData(offloads)
						if userTx > n/8 || userRx > n/8 {
							t.Errorf("fast path on: user space sent %v and received %v bytes of a %d-byte transfer, want at most %d: the fast path must carry the bulk", userTx, userRx, n, n/8)
						}
						if wantTx := (n - int64(userTx) + per - 1) / per; int64(fastTx) < wantTx {
							t.Errorf("fast path on: %s's TX program redirected %v frames, want at least %d for the %d bytes user space did not send", from.name, fastTx, wantTx, n-int64(userTx))
						}
						if wantRx := (n - int64(userRx) + per - 1) / per; int64(fastRx) < wantRx {
							t.Errorf("fast path on: %s's RX program redirected %v frames, want at least %d for the %d bytes user space did not receive", to.name, fastRx, wantRx, n-int64(userRx))
						}
					}
				})
			}
			drops.check(t)
			// The emulation dropped nothing: every unicast found its
			// child, every frame its layout, every multicast its header.
			w, err := tp.fabric.Programs.Counts()
			mc, merr := tp.fabric.Multicast.Counts()
			if err != nil || merr != nil || w[emuib.Short] != 0 || w[emuib.Unknown] != 0 || w[emuib.HarnessRefused] != 0 || mc[emuib.McastShort] != 0 {
				t.Errorf("the wire dropped frames: %v %v, multicast %v %v", w, err, mc, merr)
			}
			// A clean stop takes the TAP and every child away (their
			// fabric ends with them).
			t.Run("shutdown", func(t *testing.T) {
				for _, h := range tp.hvs {
					h.stop(t, true)
					if out := sh(t, in(h.ns, "ip", "-o", "link", "show")...); strings.Contains(out, "ib0.") {
						t.Errorf("%s: children left after the daemon stopped:\n%s", h.name, out)
					}
				}
				if out := sh(t, in(tp.fabricNS, "ip", "-o", "link", "show")...); fabricEnd.MatchString(out) {
					t.Errorf("fabric ends left after the daemons stopped:\n%s", out)
				}
			})
		})
	}
}
