package netns

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// vlanFilterTopo is TestVLANFilterVM's topology, built in the QEMU
// guest, whose Debian kernel has CONFIG_BRIDGE_VLAN_FILTERING (this
// machine's has not). A simulated fabric on bridge fab joins namespace
// hv and two native IPoIB hosts, n0 on the default partition and n10 on
// 0x800a. hv is the hypervisor, with bridge br0, whose vlan_filtering
// libvirt turns on. Guests g1 and g3 are on br0's default PVID 1. g2 is
// on a port whose only VLAN is 10 (PVID untagged: its untagged frames
// are VLAN 10's).
//
// libvirtd runs in hv, as the guest's own namespace has rxe0's UDP port
// 4791, which the simulated fabric needs. Its state is on tmpfs, as the
// guest's root is the host's, read-only. It runs as root without a
// security driver, with QEMU's output to a file (no virtlogd) and
// cgroup2 mounted.
const vlanFilterTopo = `set -e
for d in /etc/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt; do
  mkdir -p /tmp/libvirt$d
  cp -a $d/. /tmp/libvirt$d/
  mount --bind /tmp/libvirt$d $d
done
printf 'user = "root"\ngroup = "root"\nsecurity_driver = "none"\nstdio_handler = "file"\n' >/etc/libvirt/qemu.conf
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup
for n in hv n0 n10 g1 g2 g3; do
  ip netns add $n
  ip -n $n link set lo up
  ip netns exec $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
ip link add fab mtu 9000 type bridge
ip link set fab up
for n in hv n0 n10; do
  ip link add u$n mtu 9000 type veth peer name ul mtu 9000 netns $n
  ip link set u$n master fab up
  ip -n $n link set ul up
done
ip -n hv link add br0 type bridge
ip -n hv link set br0 up
for g in g1 g2 g3; do
  ip -n $g link add eth0 type veth peer name v$g netns hv
  ip -n hv link set v$g master br0 up
  ip -n $g link set eth0 up
done
bridge -n hv vlan add vid 10 dev vg2 pvid untagged
bridge -n hv vlan del vid 1 dev vg2
ip -n g1 addr add 10.78.0.1/24 dev eth0
ip -n g3 addr add 10.78.0.3/24 dev eth0
ip -n g2 addr add 10.78.10.2/24 dev eth0
ip netns exec hv libvirtd --daemon --pid-file /run/libvirtd.pid
`

// libvirtDomain is the libvirt domain TestVLANFilterVM starts: no disk,
// nothing to boot, with docs/libvirt.md's guest interface (%s).
const libvirtDomain = `<domain type='qemu'>
  <name>lv1</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    %s
  </devices>
</domain>
`

var (
	docsNetwork   = regexp.MustCompile(`(?s)<network>.*?macTableManager='libvirt'.*?</network>`)
	docsNetName   = regexp.MustCompile(`<name>([^<]+)</name>`)
	docsInterface = regexp.MustCompile(`(?s)<interface type='network'>.*?</interface>`)
	docsIfMAC     = regexp.MustCompile(`<mac address='([0-9a-f:]+)'/>`)
)

// libvirtDocs returns docs/libvirt.md's Linux-bridge network (the one
// with macTableManager='libvirt'), its name, the guest interface and
// its MAC.
func libvirtDocs(t *testing.T) (network, name, iface, mac string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/libvirt.md")
	if err != nil {
		t.Fatal(err)
	}
	network, iface = docsNetwork.FindString(string(b)), docsInterface.FindString(string(b))
	n, m := docsNetName.FindStringSubmatch(network), docsIfMAC.FindStringSubmatch(iface)
	if n == nil || m == nil {
		t.Fatalf("docs/libvirt.md: no <network> with macTableManager='libvirt' and a <name> (%q), or no <interface type='network'> with a <mac> (%q)", network, iface)
	}
	return network, n[1], iface, m[1]
}

// vifCreatedVM and vifRemovedVM are the shim's log lines of a VIF made
// and freed.
var (
	vifCreatedVM = regexp.MustCompile(`msg="VIF created" mac=(\S+) vlan=(\d+)`)
	vifRemovedVM = regexp.MustCompile(`msg="VIF removed" mac=(\S+) vlan=(\d+)`)
)

// TestVLANFilterVM: bridge VLAN filtering, in the QEMU guest with
// Debian's kernel and the host's libvirt 9.0.
//
// First vswitch's TestBridgeVLANsKernel runs there (the kernel must
// accept vlan_filtering): BridgeVLANs, the FDB's per-VLAN copies and
// WatchBridgeVLANs against the real br_netlink.c.
//
// Then eipoibd runs on bridge br0 (--learn declared, --vlan-pkey
// 10=0x800a). While it runs, virsh net-define/net-start
// docs/libvirt.md's Linux-bridge network; libvirt turns vlan_filtering
// on, and eipoibd follows. VLAN 10 is added tagged to its TAP's port.
// Guests' static entries are added as libvirt adds them: g1's without a
// VLAN (the kernel adds its VLAN 1 copy), g3's with vlan 1, g2's without
// a VLAN on its VLAN 10 port (the kernel's copy is VLAN 10). It asserts
// that:
//   - eipoibd shows g1's and g3's VIFs on VLAN 0 (the untagged
//     partition) and g2's on VLAN 10;
//   - a libvirt domain with docs/libvirt.md's interface, started, gets
//     libvirt's static entry and its VLAN 1 copy and one VIF on VLAN 0,
//     freed by virsh destroy;
//   - a port given its entry right after it joins gets its VIF;
//   - each netns guest pings the native host of its partition across the
//     fabric (declared mode: a VIF on a wrong VLAN would leave the
//     guest's frames dropped);
//   - turning vlan_filtering off leaves the VIFs of the entries without
//     a VLAN, all on VLAN 0: g2 moves there, and g3's entry with a VLAN
//     declares nothing. Turning it on again brings back the three as
//     before, g2 pinging again.
//   - removing g1's VLAN 1 entry keeps its VIF, and removing its last
//     entry frees it. Deleting g2's and g3's ports (as libvirt's TAPs
//     go) frees theirs.
//   - the log made and freed each VIF once; g3's, and g2's on VLAN 10,
//     twice, as vlan_filtering 0 freed them. It holds no "has no P_Key"
//     and no warning but the rate-limited one for frames from undeclared
//     MACs.
func TestVLANFilterVM(t *testing.T) {
	require(t, "bridge", "libvirtd", "virsh")
	_, ns := vmNamespace(t)
	v := startVM(t, ns, "ubr")
	v.buildTest(t, "vswitch.test", "github.com/eipoib/eipoibd/internal/vswitch")
	out, err := v.run(t, "EIPOIB_REQUIRE_NETNS=1 EIPOIB_REQUIRE_VLAN_FILTERING=1 ./vswitch.test -test.run '^TestBridgeVLANsKernel$' -test.count=1 -test.v", time.Minute)
	if err != nil || !strings.Contains(out, "--- PASS: TestBridgeVLANsKernel") {
		t.Fatalf("TestBridgeVLANsKernel in the VM did not pass (%v):\n%s", err, out)
	}

	v.copyDaemon(t)
	v.must(t, vlanFilterTopo)
	mac := map[string]string{}
	for _, g := range []string{"g1", "g2", "g3"} {
		mac[g] = strings.TrimSpace(v.must(t, "ip netns exec "+g+" cat /sys/class/net/eth0/address"))
	}
	const ctlDir = "/run/eipoibd-hv"
	hv := v.start(t, "exec ip netns exec hv ./eipoibd run --underlay ul --bridge br0 --learn declared --vlan-pkey 10=0x800a --ctl-dir "+ctlDir+" --state-dir "+ctlDir+" --vif-idle 10m")
	n0 := v.start(t, "exec ip netns exec n0 ./eipoibd host --underlay ul --pkey 0xffff")
	n10 := v.start(t, "exec ip netns exec n10 ./eipoibd host --underlay ul --pkey 0x800a")
	waitVM := func(p *vmProc, what string, ok func(out string) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok(p.output()) {
			if done, rc := p.exited(); done {
				t.Fatalf("%s: exited (%d):\n%s", what, rc, p.output())
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not seen in 30 s:\n%s", what, p.output())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	has := func(s string) func(string) bool { return func(out string) bool { return strings.Contains(out, s) } }
	waitVM(hv, "eipoibd run's start", has("shim running"))
	waitVM(n0, "eipoibd host (0xffff)'s start", has("host running"))
	waitVM(n10, "eipoibd host (0x800a)'s start", has("host running"))
	v.must(t, "ip -n n0 addr add 10.78.0.100/24 dev ib0 && ip -n n10 addr add 10.78.10.100/24 dev ib0")

	// While it runs: docs/libvirt.md's network started (libvirt turns on
	// vlan_filtering), VLAN 10 on the TAP's port, tagged, then the
	// guests' entries as libvirt adds them (g3's with the VLAN named).
	network, netName, iface, lvMAC := libvirtDocs(t)
	if err := os.WriteFile(v.file("net.xml"), []byte(network), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v.file("lv1.xml"), []byte(fmt.Sprintf(libvirtDomain, iface)), 0o644); err != nil {
		t.Fatal(err)
	}
	v.must(t, "virsh -q net-define net.xml && virsh -q net-start "+netName)
	waitVM(hv, "vlan_filtering turned on by libvirt followed", has(`msg="bridge VLANs" vlan_filtering=true default_pvid=1 tap_pvid=1 tap_untagged=true tap_tagged=[]`))
	v.must(t, "bridge -n hv vlan add vid 10 dev eib0")
	waitVM(hv, "the TAP's VLAN 10 followed", has(`msg="bridge VLANs" vlan_filtering=true default_pvid=1 tap_pvid=1 tap_untagged=true tap_tagged=[10]`))
	v.must(t, fmt.Sprintf("bridge -n hv fdb replace %s dev vg1 master static && bridge -n hv fdb replace %s dev vg3 master static vlan 1 && bridge -n hv fdb replace %s dev vg2 master static",
		mac["g1"], mac["g3"], mac["g2"]))
	fdb := v.must(t, "bridge -n hv fdb show br br0 | grep -v permanent")
	for _, want := range []string{mac["g1"] + " dev vg1 master br0 static", mac["g1"] + " dev vg1 vlan 1 master br0 static",
		mac["g3"] + " dev vg3 vlan 1 master br0 static", mac["g2"] + " dev vg2 master br0 static", mac["g2"] + " dev vg2 vlan 10 master br0 static"} {
		if !strings.Contains(fdb, want+"\n") {
			t.Errorf("the bridge's FDB lacks %q (the kernel's per-VLAN copies):\n%s", want, fdb)
		}
	}
	// showVIFs returns the VIFs eipoibd shows, as "MAC/VLAN origin".
	showVIFs := func() []string {
		t.Helper()
		var vifs []ctl.VIF
		if err := json.Unmarshal([]byte(v.must(t, "./eipoibd show vifs --json --ctl-dir "+ctlDir)), &vifs); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range vifs {
			out = append(out, fmt.Sprintf("%s/%d %s", f.MAC, f.VLAN, f.Origin))
		}
		slices.Sort(out)
		return out
	}
	vifSet := func(vifs ...string) []string {
		for i := range vifs {
			vifs[i] += " bridge"
		}
		slices.Sort(vifs)
		return vifs
	}
	waitVIFs := func(step string, want []string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for got := showVIFs(); !slices.Equal(got, want); got = showVIFs() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: show vifs %q, want %q\n%s", step, got, want, hv.output())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	pvidAndTagged := vifSet(mac["g1"]+"/0", mac["g3"]+"/0", mac["g2"]+"/10")
	waitVIFs("the guests' static entries", pvidAndTagged)

	// A libvirt domain on the network: libvirt adds its static entry
	// when its vCPUs start (a paused domain has none), and the kernel
	// its VLAN 1 copy: one guest on VLAN 0. It goes at once (its CPU,
	// emulated inside the emulated guest, would slow the rest).
	v.must(t, "virsh -q define lv1.xml && virsh -q start --paused lv1 && virsh -q resume lv1")
	waitVIFs("the libvirt domain's entries", vifSet(mac["g1"]+"/0", mac["g3"]+"/0", mac["g2"]+"/10", lvMAC+"/0"))
	fdb = v.must(t, "bridge -n hv fdb show br br0 | grep -v permanent")
	if !regexp.MustCompile(`(?m)^`+lvMAC+` dev vnet\d+ master br0 static$`).MatchString(fdb) ||
		!regexp.MustCompile(`(?m)^`+lvMAC+` dev vnet\d+ vlan 1 master br0 static$`).MatchString(fdb) {
		t.Errorf("libvirt's static entry and its VLAN 1 copy are not in the bridge's FDB:\n%s", fdb)
	}
	v.must(t, "virsh -q destroy lv1")
	waitVIFs("the libvirt domain destroyed", pvidAndTagged)

	// A port that joins and gets its entry at once (as a script does):
	// the entry may come before the port's VLANs, and still maps.
	const quick = "02:00:00:00:04:01"
	v.must(t, "ip -n hv link add vg4 type veth peer name vg4p && ip -n hv link set vg4 master br0 up && bridge -n hv fdb replace "+quick+" dev vg4 master static")
	waitVIFs("a port's entry right after it joined", vifSet(mac["g1"]+"/0", mac["g3"]+"/0", mac["g2"]+"/10", quick+"/0"))
	v.must(t, "ip -n hv link del vg4")
	waitVIFs("that port gone", pvidAndTagged)

	// Traffic across the fabric, each guest to its partition's native
	// host.
	ping := func(g, dst string) {
		t.Helper()
		if out, err := v.run(t, "ip netns exec "+g+" ping -c 3 -i 0.3 -w 20 "+dst, 30*time.Second); err != nil || !strings.Contains(out, "3 packets transmitted, 3 received") {
			t.Errorf("%s pings %s: want 3 of 3 answered (%v):\n%s", g, dst, err, out)
		}
	}
	ping("g1", "10.78.0.100")
	ping("g3", "10.78.0.100")
	ping("g2", "10.78.10.100")

	// VLAN filtering off: entries without a VLAN declare guests, all on
	// VLAN 0 (g2's frames now reach the TAP untagged), and g3's entry
	// with a VLAN none; on again: as before, and g2 on VLAN 10 again.
	v.must(t, "ip -n hv link set br0 type bridge vlan_filtering 0")
	waitVIFs("vlan_filtering 0", vifSet(mac["g1"]+"/0", mac["g2"]+"/0"))
	v.must(t, "ip -n hv link set br0 type bridge vlan_filtering 1")
	waitVIFs("vlan_filtering 1", pvidAndTagged)
	ping("g2", "10.78.10.100")

	// Removal: g1's VLAN 1 copy alone keeps its VIF, its last entry frees
	// it; g2's and g3's ports go (a libvirt guest's TAP deleted).
	v.must(t, fmt.Sprintf("bridge -n hv fdb del %s dev vg1 master vlan 1", mac["g1"]))
	v.must(t, "ip -n hv link del vg3")
	waitVM(hv, "g3 freed", has(`msg="VIF removed" mac=`+mac["g3"]+" vlan=0"))
	if strings.Contains(hv.output(), `msg="VIF removed" mac=`+mac["g1"]) {
		t.Errorf("g1's VIF freed while its entry without a VLAN remains:\n%s", hv.output())
	}
	v.must(t, fmt.Sprintf("bridge -n hv fdb del %s dev vg1 master", mac["g1"]))
	v.must(t, "ip -n hv link del vg2")
	waitVIFs("all guests gone", nil)

	log, _ := hv.stop()
	count := func(re *regexp.Regexp) map[string]int {
		n := map[string]int{}
		for _, m := range re.FindAllStringSubmatch(log, -1) {
			n[m[1]+"/"+m[2]]++
		}
		return n
	}
	// Once each, and once more for g3's and g2's VLAN 10 VIFs, which
	// vlan_filtering 0 freed.
	want := map[string]int{mac["g1"] + "/0": 1, mac["g3"] + "/0": 2, mac["g2"] + "/10": 2, mac["g2"] + "/0": 1, lvMAC + "/0": 1, quick + "/0": 1}
	for name, got := range map[string]map[string]int{"made": count(vifCreatedVM), "freed": count(vifRemovedVM)} {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("VIFs %s: %v, want %v", name, got, want)
		}
	}
	// A frame a guest sends before its FDB entry declares it is dropped
	// (--learn declared) and logged by design, rate-limited: that is the
	// one warning allowed.
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "has no P_Key") || strings.Contains(line, "level=WARN") && !strings.Contains(line, `msg="frames from a MAC no one declared dropped`) {
			t.Errorf("eipoibd warned: %s", line)
		}
	}
	// Every entry maps to a guest (g2's port left VLAN 1): none is said
	// to declare none, not even one seen before its port's VLANs.
	if strings.Contains(log, "declares no guest") {
		t.Errorf("eipoibd said an entry declares no guest:\n%s", log)
	}
	if t.Failed() {
		t.Logf("eipoibd run's log:\n%s", log)
	}
}
