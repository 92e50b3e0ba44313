package netns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// cniDir is where Debian's containernetworking-plugins installs the
// reference plugins.
const cniDir = "/usr/lib/cni"

// cniRuntime runs CNI network lists as a container runtime does
// (containerd and CRI-O call libcni the same way), on one hypervisor:
// the plugins run in its namespace, the eipoib plugin built from this
// tree found before the reference ones.
type cniRuntime struct {
	h      *hypervisor
	bridge string // where the bridge plugin attaches pods (br0)
	cni    *libcni.CNIConfig
	cache  string // libcni's cache of results
	ipam   string // host-local's data directory
	data   string // the eipoib plugin's records (dataDir)
}

// newCNIRuntime makes a runtime for hypervisor h with the plugin
// directory pluginDir.
func newCNIRuntime(t *testing.T, h *hypervisor, pluginDir string) *cniRuntime {
	t.Helper()
	cache := t.TempDir()
	return &cniRuntime{h: h, bridge: "br0", cni: libcni.NewCNIConfigWithCacheDir([]string{pluginDir, cniDir}, cache, nil), cache: cache, ipam: t.TempDir(), data: t.TempDir()}
}

// list is the network list of docs/kubernetes.md, as a Multus
// NetworkAttachmentDefinition carries it. It runs bridge (on the
// hypervisor's r.bridge) with IPAM bridgeIPAM, then eipoib chained, on
// the hypervisor's eipoibd. eipoib declares the MAC, frees the VIF at
// DEL and checks it at CHECK.
func (r *cniRuntime) list(t *testing.T, name, bridgeIPAM string) *libcni.NetworkConfigList {
	t.Helper()
	return r.listVersion(t, "1.0.0", name, bridgeIPAM)
}

// listVersion is list in spec version v.
func (r *cniRuntime) listVersion(t *testing.T, v, name, bridgeIPAM string) *libcni.NetworkConfigList {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[
  {"type":"bridge","bridge":%q,"ipam":%s},
  {"type":"eipoib","tap":"eib0","socketDir":%q,"dataDir":%q}]}`, v, name, r.bridge, bridgeIPAM, r.h.ctlDir(), r.data)
	l, err := libcni.NetworkConfFromBytes([]byte(conf))
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, conf)
	}
	return l
}

// wrap is bridge's IPAM eipoib wrapping ipam: the pod's MAC is declared
// before its addresses are asked for and configured, so that its DHCP
// and its announcements (MLD reports for its solicited-node groups)
// pass under --learn declared.
func (r *cniRuntime) wrap(ipam string) string {
	return fmt.Sprintf(`{"type":"eipoib","tap":"eib0","socketDir":%q,"dataDir":%q,"ipam":%s}`, r.h.ctlDir(), r.data, ipam)
}

// hostLocal is host-local IPAM handing out 10.77.0.lo–hi and
// fd77::lo–hi, its leases in the runtime's directory.
func (r *cniRuntime) hostLocal(lo, hi int) string {
	return fmt.Sprintf(`{"type":"host-local","dataDir":%q,"ranges":[
  [{"subnet":"10.77.0.0/24","rangeStart":"10.77.0.%d","rangeEnd":"10.77.0.%d"}],
  [{"subnet":"fd77::/64","rangeStart":"fd77::%d","rangeEnd":"fd77::%d"}]]}`, r.ipam, lo, hi, lo, hi)
}

// pod is a pod sandbox: a network namespace and what ADD answered.
type pod struct {
	g   *guest
	id  string
	res *current.Result
	mac string
}

// rt is the runtime configuration of p's interface eth0.
func (p *pod) rt() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.id, NetNS: "/var/run/netns/" + p.g.ns, IfName: "eth0"}
}

// in runs fn with the calling thread in the hypervisor's namespace, so
// that the plugins libcni executes start there, as they would in a
// node's host namespace.
func (r *cniRuntime) in(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var err error
	if derr := nstest.DoErr(r.h.ns, func() error { err = fn(ctx); return nil }); derr != nil {
		return derr
	}
	return err
}

// add creates a pod namespace named name and runs ADD of list for it;
// the pod's address (the first of each family) is taken from the result.
func (r *cniRuntime) add(t *testing.T, list *libcni.NetworkConfigList, name string) *pod {
	t.Helper()
	p := &pod{g: &guest{ns: name}, id: "ctr-" + name}
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { shErr("ip", "netns", "delete", name) }) // after a failure; del deletes it
	var res types.Result
	if err := r.in(func(ctx context.Context) (err error) { res, err = r.cni.AddNetworkList(ctx, list, p.rt()); return err }); err != nil {
		t.Fatalf("ADD %s for %s on %s: %v", list.Name, name, r.h.name, err)
	}
	var err error
	if p.res, err = current.NewResultFromResult(res); err != nil {
		t.Fatal(err)
	}
	for _, i := range p.res.Interfaces {
		if i.Name == "eth0" && i.Sandbox != "" {
			p.mac = i.Mac
		}
	}
	for _, ip := range p.res.IPs {
		if a := ip.Address.IP; a.To4() != nil && p.g.ip4 == "" {
			p.g.ip4 = a.String()
		} else if a.To4() == nil && p.g.ip6 == "" {
			p.g.ip6 = a.String()
		}
	}
	if p.mac == "" {
		t.Fatalf("ADD %s for %s: no eth0 in the pod in the result %+v", list.Name, name, p.res)
	}
	return p
}

// del runs DEL of list for p and deletes its namespace.
func (r *cniRuntime) del(t *testing.T, list *libcni.NetworkConfigList, p *pod) {
	t.Helper()
	if err := r.in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, list, p.rt()) }); err != nil {
		t.Fatalf("DEL %s for %s on %s: %v", list.Name, p.g.ns, r.h.name, err)
	}
	sh(t, "ip", "netns", "delete", p.g.ns)
}

// check runs CHECK of list for p.
func (r *cniRuntime) check(list *libcni.NetworkConfigList, p *pod) error {
	return r.in(func(ctx context.Context) error { return r.cni.CheckNetworkList(ctx, list, p.rt()) })
}

// vifs returns the daemon's VIFs by MAC (eipoibd show vifs --json).
func (h *hypervisor) vifs(t *testing.T) map[string]ctl.VIF {
	t.Helper()
	var vs []ctl.VIF
	if err := json.Unmarshal([]byte(h.ctl(t, "show", "vifs", "--json")), &vs); err != nil {
		t.Fatal(err)
	}
	m := map[string]ctl.VIF{}
	for _, v := range vs {
		m[v.MAC] = v
	}
	return m
}

// buildCNIPlugin builds cmd/eipoib-cni as "eipoib" in a directory of
// its own and returns the directory.
func buildCNIPlugin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "eipoib"), "github.com/eipoib/eipoibd/cmd/eipoib-cni").CombinedOutput(); err != nil {
		t.Fatalf("build the CNI plugin: %v\n%s", err, out)
	}
	return dir
}

// TestCNI runs the CNI chain bridge (its IPAM wrapped by eipoib) +
// eipoib through libcni, as a container runtime does. It uses Debian's
// reference plugins and the plugin built from this tree. There are two
// hypervisors whose eipoibd serves declared guests only (--learn
// declared), and a native IPoIB host on the fabric.
//   - host-local: a pod on each hypervisor. Each pod's VIF exists,
//     declared, once ADD returns, before the pod's processes start. ping
//     and ping -6 work both ways, every request (the first included)
//     answered once.
//   - silent: a pod silent past --vif-idle (2 s here) and past the
//     bridge's ageing of its learned FDB entry (2 s) keeps its VIF (none
//     aged, none removed). It is answered at once: no daemon holds a
//     frame either way (for a new VIF or a resolution), and every
//     request is answered within a second.
//   - static: a pod with fixed addresses pings the other hypervisor's
//     pod and the native host.
//   - dhcp: a pod with the reference dhcp plugin (its daemon running)
//     gets a lease from dnsmasq on the native host, and pings it.
//   - spec versions 0.3.1 and 0.4.0: ADD declares, CHECK (0.4.0) passes,
//     DEL frees.
//   - layer 2 (no IPAM, eipoib chained only, as for a KubeVirt VM): the
//     pod's VIF is declared at ADD. Addresses configured afterwards ping
//     and ping -6 the other hypervisor's pod.
//   - CHECK passes on a healthy pod, and fails, naming the missing VIF,
//     after the VIF is removed behind the plugin's back.
//   - DEL frees the VIF (show vifs, vifs_removed).
//   - ADD then DEL 100 times leaves nothing behind: no VIF, veth,
//     namespace, host-local lease, cached result or FDB entry.
func TestCNI(t *testing.T) {
	require(t, "dnsmasq", cniDir+"/bridge", cniDir+"/host-local", cniDir+"/static", cniDir+"/dhcp", "bridge")
	plugins := buildCNIPlugin(t)
	tp := newTopoOpts(t, topoOpts{n: 2, viaBridge: true, extra: []string{"--learn", "declared", "--vif-idle", "2s"}})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	nh := addNative(t, tp, 1)
	r1, r2 := newCNIRuntime(t, h1, plugins), newCNIRuntime(t, h2, plugins)
	l1, l2 := r1.list(t, "ib-hl1", r1.wrap(r1.hostLocal(50, 59))), r2.list(t, "ib-hl2", r2.wrap(r2.hostLocal(60, 69)))
	ns := func(name string) string { return tp.pfx + name }

	p1 := r1.add(t, l1, ns("p1"))
	p2 := r2.add(t, l2, ns("p2"))
	for _, c := range []struct {
		h *hypervisor
		p *pod
	}{{h1, p1}, {h2, p2}} {
		v, ok := c.h.vifs(t)[c.p.mac]
		if !ok || v.Origin != "declared" || v.VLAN != 0 {
			t.Fatalf("%s: VIF of pod %s (%s) after ADD: %+v (found %v), want one declared, untagged", c.h.name, c.p.g.ns, c.p.mac, v, ok)
		}
	}
	if p1.g.ip4 != "10.77.0.50" || p1.g.ip6 != "fd77::50" || p2.g.ip4 != "10.77.0.60" || p2.g.ip6 != "fd77::60" {
		t.Fatalf("host-local gave %s %s and %s %s, want the first of each range", p1.g.ip4, p1.g.ip6, p2.g.ip4, p2.g.ip6)
	}
	t.Run("host-local", func(t *testing.T) {
		ping(t, p1.g, p2.g.ip4)
		ping(t, p1.g, p2.g.ip6)
		ping(t, p2.g, p1.g.ip4)
		ping(t, p2.g, p1.g.ip6)
	})

	t.Run("silent", func(t *testing.T) {
		before := h1.metrics(t)
		learned := func() bool {
			for _, l := range strings.Split(sh(t, in(h1.ns, "bridge", "fdb", "show", "br", "br0")...), "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == p1.mac && !strings.Contains(l, "permanent") && !strings.Contains(l, "static") {
					return true
				}
			}
			return false
		}
		if !learned() { // host-local's pings just went through it
			t.Fatalf("the bridge has no learned entry of pod %s: nothing would age", p1.mac)
		}
		sh(t, in(h1.ns, "ip", "link", "set", "br0", "type", "bridge", "ageing_time", "200")...) // 2 s
		t.Cleanup(func() { sh(t, in(h1.ns, "ip", "link", "set", "br0", "type", "bridge", "ageing_time", "30000")...) })
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			v, ok := h1.vifs(t)[p1.mac]
			if !ok || v.Origin != "declared" {
				t.Fatalf("VIF of the silent pod %s: %+v (found %v), want it kept, declared", p1.mac, v, ok)
			}
			if !learned() && v.IdleS >= 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s after 20 s: learned FDB entry still there (%v), VIF idle %.1f s", p1.mac, learned(), v.IdleS)
			}
		}
		after := h1.metrics(t)
		for _, k := range []string{"vifs_aged", "vifs_removed"} {
			if after[k] != before[k] {
				t.Errorf("%s %v → %v while the pod was silent", k, before[k], after[k])
			}
		}
		// At once: the path was ready, so no daemon held a frame for a
		// new VIF or a resolution, and no reply is late. The bound is
		// the claim, far above a busy machine's scheduling (a reply
		// takes milliseconds); pingN would log a 5 s late one only.
		held1, held2 := h1.metrics(t), h2.metrics(t)
		pingPrompt(t, p2.g, p1.g.ip4, 3, time.Second)
		pingPrompt(t, p2.g, p1.g.ip6, 3, time.Second)
		for _, c := range []struct {
			h       *hypervisor
			base, m map[string]float64
		}{{h1, held1, h1.metrics(t)}, {h2, held2, h2.metrics(t)}} {
			for _, k := range []string{"tx_queued", "tx_queued_new_vif"} {
				if _, ok := c.m[k]; !ok {
					t.Fatalf("%s: no %s in the metrics", c.h.name, k)
				}
				if c.m[k] != c.base[k] {
					t.Errorf("%s: %s %v → %v: a frame to or from the silent pod was held", c.h.name, k, c.base[k], c.m[k])
				}
			}
		}
	})

	t.Run("static", func(t *testing.T) {
		l := r1.list(t, "ib-static", r1.wrap(`{"type":"static","addresses":[{"address":"10.77.0.71/24"},{"address":"fd77::71/64"}]}`))
		p := r1.add(t, l, ns("p3"))
		if p.g.ip4 != "10.77.0.71" || p.g.ip6 != "fd77::71" {
			t.Fatalf("static gave %s %s", p.g.ip4, p.g.ip6)
		}
		ping(t, p.g, p2.g.ip4)
		ping(t, p.g, p2.g.ip6)
		ping(t, p.g, nh.ep.ip4)
		ping(t, nh.ep, p.g.ip6)
		r1.del(t, l, p)
	})

	t.Run("dhcp", func(t *testing.T) { cniDHCP(t, r2, nh, ns("p4")) })

	t.Run("layer2", func(t *testing.T) {
		// No IPAM, as for a KubeVirt VM, which configures its address
		// when it boots, after ADD.
		l := r1.list(t, "ib-l2", `{}`)
		p := r1.add(t, l, ns("p5"))
		if v, ok := h1.vifs(t)[p.mac]; !ok || v.Origin != "declared" {
			t.Fatalf("VIF of the layer-2 pod %s: %+v (found %v), want one declared", p.mac, v, ok)
		}
		p.g.ip4, p.g.ip6 = "10.77.0.81", "fd77::81"
		sh(t, in(p.g.ns, "ip", "addr", "add", p.g.ip4+"/24", "dev", "eth0")...)
		sh(t, in(p.g.ns, "ip", "addr", "add", p.g.ip6+"/64", "dev", "eth0", "nodad")...)
		ping(t, p.g, p2.g.ip4)
		ping(t, p.g, p2.g.ip6)
		ping(t, p2.g, p.g.ip6)
		// No CHECK: bridge's CHECK runs its IPAM's unconditionally and
		// fails without one ("no plugin name provided").
		r1.del(t, l, p)
	})

	t.Run("versions", func(t *testing.T) {
		// Older lists, as runtimes may still hold them: ADD declares,
		// CHECK (0.4.0 on) passes, DEL frees.
		for i, v := range []string{"0.3.1", "0.4.0"} {
			l := r1.listVersion(t, v, "ib-v"+v, r1.wrap(r1.hostLocal(90+i, 90+i)))
			p := r1.add(t, l, ns(fmt.Sprintf("v%d", i)))
			if vif, ok := h1.vifs(t)[p.mac]; !ok || vif.Origin != "declared" || p.g.ip4 != fmt.Sprintf("10.77.0.%d", 90+i) {
				t.Errorf("spec %s: VIF %+v (found %v), address %s", v, vif, ok, p.g.ip4)
			}
			if v != "0.3.1" {
				if err := r1.check(l, p); err != nil {
					t.Errorf("spec %s: CHECK: %v", v, err)
				}
			}
			r1.del(t, l, p)
			if vif, ok := h1.vifs(t)[p.mac]; ok {
				t.Errorf("spec %s: VIF left after DEL: %+v", v, vif)
			}
		}
	})

	t.Run("check", func(t *testing.T) {
		if err := r1.check(l1, p1); err != nil {
			t.Fatalf("CHECK of a healthy pod: %v", err)
		}
		h1.ctl(t, "vif", "del", p1.mac)
		err := r1.check(l1, p1)
		want := fmt.Sprintf("eipoibd eib0 has no VIF for the pod's MAC %s on VLAN 0", p1.mac)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("CHECK after the VIF was removed: %v, want an error saying %q", err, want)
		}
	})

	t.Run("del", func(t *testing.T) {
		before := h2.metrics(t)["vifs_removed"]
		r2.del(t, l2, p2)
		if v, ok := h2.vifs(t)[p2.mac]; ok {
			t.Errorf("VIF of %s still there after DEL: %+v", p2.mac, v)
		}
		if d := h2.metrics(t)["vifs_removed"] - before; d != 1 {
			t.Errorf("vifs_removed rose by %v at DEL, want 1", d)
		}
		// DEL again, as a runtime may: nothing left, no error.
		if err := r2.in(func(ctx context.Context) error { return r2.cni.DelNetworkList(ctx, l2, p2.rt()) }); err != nil {
			t.Errorf("second DEL: %v", err)
		}
	})

	t.Run("churn", func(t *testing.T) { cniChurn(t, r1, l1, ns("c")) })
}

// cniDHCP: pod name on r's hypervisor, with the reference dhcp plugin
// (wrapped by eipoib), gets its address from dnsmasq on the native host
// nh, and pings nh. Its VIF is declared before the DHCP exchange, which
// --learn declared would drop otherwise.
func cniDHCP(t *testing.T, r *cniRuntime, nh *native, name string) {
	t.Helper()
	nstestRequire(t, "dnsmasq")
	dir := t.TempDir()
	leases := filepath.Join(dir, "dnsmasq.leases")
	srv := exec.Command("ip", in(nh.ep.ns, "dnsmasq", "--no-daemon", "--port=0", "--interface=ib0", "--bind-interfaces",
		"--dhcp-range=10.77.0.100,10.77.0.150,1h", "--dhcp-leasefile="+leases)[1:]...)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	sock := filepath.Join(dir, "dhcp.sock")
	daemon := exec.Command(cniDir+"/dhcp", "daemon", "-socketpath", sock, "-timeout", "20s")
	logf, err := os.Create(filepath.Join(dir, "dhcp.log"))
	if err != nil {
		t.Fatal(err)
	}
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		daemon.Process.Kill()
		daemon.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("the dhcp plugin's daemon:\n%s", b)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dhcp plugin's daemon made no socket %s", sock)
		}
	}
	l := r.list(t, "ib-dhcp", r.wrap(fmt.Sprintf(`{"type":"dhcp","daemonSocketPath":%q}`, sock)))
	p := r.add(t, l, name)
	addr, err := netip.ParseAddr(p.g.ip4)
	if lo, hi := netip.MustParseAddr("10.77.0.100"), netip.MustParseAddr("10.77.0.150"); err != nil || addr.Less(lo) || hi.Less(addr) {
		t.Fatalf("dhcp gave %q, want an address of dnsmasq's range %s–%s", p.g.ip4, lo, hi)
	}
	b, _ := os.ReadFile(leases)
	// dnsmasq: expiry, hardware address, IP address, hostname, client-id.
	f := strings.Fields(string(b))
	if len(f) < 3 || f[1] != p.mac || f[2] != addr.String() {
		t.Fatalf("dnsmasq's leases %q, want %s leased to %s", b, addr, p.mac)
	}
	ping(t, p.g, nh.ep.ip4)
	r.del(t, l, p)
}

// cniChurn runs ADD then DEL of list for 100 pods, one after the other,
// on r's hypervisor. It checks that nothing of them is left (no VIF,
// veth, namespace, host-local lease, cached result, or FDB entry for
// their MACs) and that the daemon removed 100 VIFs. A veth there before
// the churn may go meanwhile: make test-load once saw one of an earlier
// subtest's pods (its namespace deleted) still listed when the churn
// began.
func cniChurn(t *testing.T, r *cniRuntime, list *libcni.NetworkConfigList, prefix string) {
	t.Helper()
	h := r.h
	veths := func() []string {
		var names []string
		for _, l := range strings.Split(strings.TrimSpace(sh(t, in(h.ns, "ip", "-o", "link", "show", "type", "veth")...)), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				names = append(names, strings.Split(strings.TrimSuffix(f[1], ":"), "@")[0])
			}
		}
		slices.Sort(names)
		return names
	}
	ipamFiles := func() []string {
		var names []string
		filepath.WalkDir(r.ipam, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.HasPrefix(d.Name(), "last_reserved_ip") && d.Name() != "lock" {
				names = append(names, strings.TrimPrefix(p, r.ipam))
			}
			return nil
		})
		return names
	}
	vethsBefore, ipamBefore := veths(), ipamFiles()
	cacheBefore, _ := filepath.Glob(filepath.Join(r.cache, "results", "*"))
	removedBefore := h.metrics(t)["vifs_removed"]
	vifsBefore := len(h.vifs(t))
	const n = 100
	macs := map[string]bool{}
	for i := range n {
		p := r.add(t, list, fmt.Sprintf("%s%d", prefix, i))
		macs[p.mac] = true
		r.del(t, list, p)
	}
	if len(macs) != n {
		t.Errorf("%d distinct pod MACs in %d ADDs", len(macs), n)
	}
	vifs := h.vifs(t)
	for mac := range macs {
		if v, ok := vifs[mac]; ok {
			t.Errorf("VIF of a deleted pod left: %+v", v)
		}
	}
	if len(vifs) != vifsBefore {
		t.Errorf("%d VIFs after the churn, %d before", len(vifs), vifsBefore)
	}
	if d := h.metrics(t)["vifs_removed"] - removedBefore; d != n {
		t.Errorf("vifs_removed rose by %v, want %d", d, n)
	}
	// No veth the churn made is left: the kernel destroys a deleted
	// pod's host veth with its namespace, asynchronously (cleanup_net),
	// so the check waits. A veth of before that went meanwhile (an
	// earlier subtest's, going the same way) is no leak.
	left := func() []string {
		var extra []string
		for _, v := range veths() {
			if !slices.Contains(vethsBefore, v) {
				extra = append(extra, v)
			}
		}
		return extra
	}
	for deadline := time.Now().Add(10 * time.Second); len(left()) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("veths %v left 10 s after the churn (before it: %v)", left(), vethsBefore)
			break
		}
	}
	if got := ipamFiles(); !slices.Equal(got, ipamBefore) {
		t.Errorf("host-local leases %v after the churn, %v before", got, ipamBefore)
	}
	if got, _ := filepath.Glob(filepath.Join(r.cache, "results", "*")); len(got) != len(cacheBefore) {
		t.Errorf("libcni's cached results %v after the churn, %v before", got, cacheBefore)
	}
	for _, l := range strings.Split(sh(t, "ip", "netns", "list"), "\n") {
		if strings.HasPrefix(l, prefix) {
			t.Errorf("namespace left: %s", l)
		}
	}
	for _, l := range strings.Split(sh(t, in(h.ns, "bridge", "fdb", "show", "br", "br0")...), "\n") {
		if f := strings.Fields(l); len(f) > 0 && macs[f[0]] {
			t.Errorf("FDB entry of a deleted pod left: %s", l)
		}
	}
}

// chainedOnly is a list of spec version 1.1.0 holding the chained eipoib
// alone, on r's daemon: Debian's reference plugins (1.1.1) speak up to
// 1.0.0, so GC and STATUS go to a list without them.
func (r *cniRuntime) chainedOnly(t *testing.T, name string) *libcni.NetworkConfigList {
	t.Helper()
	l, err := libcni.NetworkConfFromBytes([]byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[
  {"type":"eipoib","tap":"eib0","socketDir":%q,"dataDir":%q}]}`, name, r.h.ctlDir(), r.data)))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCNILifecycle: what the CNI plugin frees when the runtime cannot
// name it, and spec 1.1.0's GC and STATUS through libcni. It runs on one
// hypervisor whose eipoibd serves declared guests only.
//   - typo: in a list, bridge's IPAM, eipoib wrapping host-local,
//     declared the pod's VIF, but the chained eipoib has "vlan":"0" (a
//     string). ADD fails naming the key. DEL of the same list succeeds
//     and leaves nothing: no VIF of the pod's MAC (vifs_removed + 1), no
//     veth, no host-local lease, no record of the plugin.
//   - GC: two pods are added by a 1.0.0 list. The runtime loses the
//     second: its cached result and its namespace go, and no DEL runs.
//     GC of the network, with the first pod its only valid attachment,
//     frees the lost pod's VIF (vifs_removed + 1) and keeps the first's.
//   - STATUS succeeds while eipoibd runs, fails with code 50 naming the
//     control socket while it is stopped, and succeeds once it is back.
func TestCNILifecycle(t *testing.T) {
	require(t, cniDir+"/bridge", cniDir+"/host-local", "bridge")
	plugins := buildCNIPlugin(t)
	tp := newTopoOpts(t, topoOpts{n: 1, viaBridge: true, extra: []string{"--learn", "declared"}})
	h := tp.hvs[0]
	r := newCNIRuntime(t, h, plugins)
	veths := func() string { return sh(t, in(h.ns, "ip", "-o", "link", "show", "type", "veth")...) }
	leftIn := func(dir string) []string {
		var names []string
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.HasPrefix(d.Name(), "last_reserved_ip") && d.Name() != "lock" {
				names = append(names, strings.TrimPrefix(p, dir))
			}
			return nil
		})
		return names
	}

	t.Run("typo", func(t *testing.T) {
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ib-typo","plugins":[
  {"type":"bridge","bridge":"br0","ipam":%s},
  {"type":"eipoib","tap":"eib0","socketDir":%q,"dataDir":%q,"vlan":"0"}]}`, r.wrap(r.hostLocal(40, 40)), h.ctlDir(), r.data)
		l, err := libcni.NetworkConfFromBytes([]byte(conf))
		if err != nil {
			t.Fatal(err)
		}
		p := &pod{g: &guest{ns: tp.pfx + "typo"}, id: "ctr-typo"}
		sh(t, "ip", "netns", "add", p.g.ns)
		t.Cleanup(func() { shErr("ip", "netns", "delete", p.g.ns) })
		vethsBefore, removed := veths(), h.metrics(t)["vifs_removed"]
		err = r.in(func(ctx context.Context) error { _, err := r.cni.AddNetworkList(ctx, l, p.rt()); return err })
		if err == nil || !strings.Contains(err.Error(), `eipoib: vlan "0": want a number, 0 (untagged) to 4094`) {
			t.Fatalf("ADD with \"vlan\":\"0\": %v, want an error naming the key", err)
		}
		mac := linkMAC(t, p.g.ns, "eth0").String()
		if v, ok := h.vifs(t)[mac]; !ok || v.Origin != "declared" {
			t.Fatalf("VIF of the pod %s after the failed ADD: %+v (found %v), want the one bridge's IPAM declared", mac, v, ok)
		}
		r.del(t, l, p)
		if v, ok := h.vifs(t)[mac]; ok {
			t.Errorf("VIF of %s left after DEL: %+v", mac, v)
		}
		if d := h.metrics(t)["vifs_removed"] - removed; d != 1 {
			t.Errorf("vifs_removed rose by %v at DEL, want 1", d)
		}
		if got := veths(); got != vethsBefore {
			t.Errorf("veths after DEL:\n%s\nbefore ADD:\n%s", got, vethsBefore)
		}
		if got := leftIn(r.ipam); len(got) != 0 {
			t.Errorf("host-local leases left: %v", got)
		}
		if got := leftIn(r.data); len(got) != 0 {
			t.Errorf("records of the plugin left: %v", got)
		}
	})

	t.Run("gc", func(t *testing.T) {
		l := r.list(t, "ib-gc", r.wrap(r.hostLocal(41, 42)))
		keep, lost := r.add(t, l, tp.pfx+"g1"), r.add(t, l, tp.pfx+"g2")
		if err := os.Remove(filepath.Join(r.cache, "results", "ib-gc-"+lost.id+"-eth0")); err != nil {
			t.Fatal(err)
		}
		sh(t, "ip", "netns", "delete", lost.g.ns)
		removed := h.metrics(t)["vifs_removed"]
		valid := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: keep.id, IfName: "eth0"}}}
		if err := r.in(func(ctx context.Context) error { return r.cni.GCNetworkList(ctx, r.chainedOnly(t, "ib-gc"), valid) }); err != nil {
			t.Fatalf("GC: %v", err)
		}
		vifs := h.vifs(t)
		if v, ok := vifs[lost.mac]; ok {
			t.Errorf("VIF of the lost pod %s left after GC: %+v", lost.mac, v)
		}
		if v, ok := vifs[keep.mac]; !ok || v.Origin != "declared" {
			t.Errorf("VIF of the valid pod %s after GC: %+v (found %v), want it kept", keep.mac, v, ok)
		}
		if d := h.metrics(t)["vifs_removed"] - removed; d != 1 {
			t.Errorf("vifs_removed rose by %v at GC, want 1", d)
		}
		r.del(t, l, keep)
		if got := leftIn(filepath.Join(r.data, "ib-gc")); len(got) != 0 {
			t.Errorf("records left after GC and DEL: %v", got)
		}
	})

	t.Run("status", func(t *testing.T) {
		l := r.chainedOnly(t, "ib-status")
		status := func() error {
			return r.in(func(ctx context.Context) error { return r.cni.GetStatusNetworkList(ctx, l) })
		}
		if err := status(); err != nil {
			t.Fatalf("STATUS while eipoibd runs: %v", err)
		}
		h.stop(t, true)
		var ce *types.Error
		want := "eipoibd control socket " + filepath.Join(h.ctlDir(), "eib0.sock") + ": no such file or directory: is eipoibd running for eib0?"
		if err := status(); !errors.As(err, &ce) || ce.Code != 50 || ce.Msg != want {
			t.Errorf("STATUS while eipoibd is stopped: %v, want code 50 %q", err, want)
		}
		h.start(t)
		if err := status(); err != nil {
			t.Errorf("STATUS once eipoibd is back: %v", err)
		}
	})
}
