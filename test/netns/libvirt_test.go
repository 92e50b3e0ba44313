package netns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestLibvirt follows docs/libvirt.md with the real libvirtd and virsh
// (Debian's libvirt 9.0). It takes the commands and the XML from the doc
// itself, so that the doc cannot drift.
//
//   - The Linux-bridge network (macTableManager='libvirt'): on a kernel
//     without bridge VLAN filtering, as here, `virsh net-start` fails
//     with exactly the error the doc quotes. On one with it, it starts
//     with vlan_filtering on, as the doc says.
//   - Open vSwitch (userspace datapath): the doc's commands create
//     ovsbr0 and define and start its network, and eipoibd runs with the
//     doc's configuration. A guest with the doc's <interface> in VLAN 20
//     is booted by libvirt under TCG (test/vm's kernel and initramfs,
//     direct kernel boot). It is declared with origin ovs on VLAN 20
//     before it sends anything: none of its frames is ever dropped as
//     undeclared. It pings a native IPoIB host in partition 0x8014 on
//     another hypervisor (IPv4 and IPv6), and reaches it over TCP with
//     its checksum offload off, as the doc says. It receives 8 MiB of
//     TCP from it to the byte with the default offloads: no super-frame
//     and no frame over the TAP's MTU is written into eib0, and
//     ovs-vswitchd refuses nothing. Its frames from a forged MAC are
//     dropped as drop_undeclared (exactly its 3, no VIF for it). The
//     hypervisor's own frames (ovsbr0's and eib0's, 2 each) count as
//     drop_undeclared_local. `virsh destroy` frees its VIF. eipoibd
//     warns of nothing all along.
//
// Slow (libvirtd's first QEMU probe, then a TCG boot): in ONCE_TESTS.
func TestLibvirt(t *testing.T) {
	require(t, append(append([]string{"ping", "arping", "iperf3", "iperf"}, ovsTools...), "libvirtd", "virtlogd", "virsh", "qemu-system-x86_64", "rdma", "ibv_devinfo")...)
	doc := docBlocks(t, "../../docs/libvirt.md")
	pfx := fmt.Sprintf("e%d%d", os.Getpid()%1000, nsSeq.Add(1))
	hv, nat := pfx+"lv", pfx+"nat"
	nstest.Add(t, hv)
	nstest.Add(t, nat)
	logDir := t.TempDir()
	sh(t, "ip", "link", "add", "ul1", "netns", hv, "type", "veth", "peer", "name", "ul2", "netns", nat)
	sh(t, in(hv, "ip", "link", "set", "ul1", "mtu", "9000", "up")...)
	sh(t, in(nat, "ip", "link", "set", "ul2", "mtu", "9000", "up")...)
	// Devices made from now on in the hypervisor have no IPv6 (the
	// underlay has it: it carries the fabric), so that the host's own
	// frames are the ones the test sends.
	sh(t, in(hv, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")...)

	// The native IPoIB host, in VLAN 20's partition.
	host := &hypervisor{name: "nat", ns: nat, underlay: "ul2", host: true, logDir: logDir, extra: []string{"--pkey", "0x8014"}}
	host.start(t)
	t.Cleanup(func() { host.stop(t, false) })
	sh(t, in(nat, "ip", "addr", "add", "10.77.0.200/24", "dev", "ib0")...)
	sh(t, in(nat, "ip", "addr", "add", "fd77::200/64", "dev", "ib0", "nodad")...)

	ovsDir := startOVS(t, hv)
	t.Cleanup(func() { stopOVS(ovsDir) })
	ovsEnv := "OVS_RUNDIR=" + ovsDir // ovs-vsctl's default database is $OVS_RUNDIR/db.sock
	runDoc(t, hv, doc.one(t, "sh", "ovs-vsctl add-br ovsbr0"), []string{ovsEnv}, "")

	// eipoibd with the doc's configuration for the simulated fabric
	// (the --underlay the harness gives wins over the file's).
	cfg := filepath.Join(logDir, "eib0.toml")
	if err := os.WriteFile(cfg, []byte(doc.one(t, "toml", `fabric     = "sim"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	h1 := &hypervisor{name: "h1", ns: hv, underlay: "ul1", logDir: logDir, env: []string{ovsEnv}, extra: []string{"--config", cfg}}
	h1.start(t)
	t.Cleanup(func() { h1.stop(t, false) })

	lv := startLibvirt(t, hv, ovsDir)
	work := t.TempDir()

	t.Run("Linux bridge network", func(t *testing.T) {
		runDoc(t, hv, doc.one(t, "sh", "type bridge"), nil, "")
		xml := doc.one(t, "xml", "macTableManager='libvirt'")
		writeNetwork(t, work, xml)
		out, err := lv.runDoc(t, hv, doc.one(t, "sh", "virsh net-start "+networkName(t, xml)+"\n"), work)
		if _, serr := shErr(in(hv, "test", "-e", "/sys/class/net/br0/bridge/vlan_filtering")...); serr == nil {
			// This kernel has VLAN filtering: the network starts, with it on.
			if err != nil {
				t.Fatalf("the doc's Linux-bridge network on a kernel with VLAN filtering: %v\n%s", err, out)
			}
			if f := sh(t, in(hv, "cat", "/sys/class/net/br0/bridge/vlan_filtering")...); strings.TrimSpace(f) != "1" {
				t.Errorf("libvirt started the network and left vlan_filtering %s on br0, want 1", f)
			}
			return
		}
		want := doc.one(t, "text", "vlan_filtering via ioctl")
		if err == nil || errorLines(out) != strings.TrimSpace(want) {
			t.Errorf("virsh net-start of the doc's Linux-bridge network on a kernel without VLAN filtering: %v\n%s\nwant it to fail as the doc says:\n%s", err, out, want)
		}
	})

	const guestMAC, forgedMAC = "52:54:00:00:02:01", "52:54:00:00:02:99"
	iface := doc.one(t, "xml", "portgroup='vlan20'")
	if !strings.Contains(iface, guestMAC) {
		t.Fatalf("the doc's VLAN-20 guest is not %s:\n%s", guestMAC, iface)
	}
	xml := doc.one(t, "xml", "<virtualport type='openvswitch'/>")
	writeNetwork(t, work, xml)
	if out, err := lv.runDoc(t, hv, doc.one(t, "sh", "virsh net-start "+networkName(t, xml)+"\n"), work); err != nil {
		t.Fatalf("the doc's Open vSwitch network: %v\n%s", err, out)
	}

	vm := lv.boot(t, "g1", iface)
	// libvirt added the port with its attached-mac: eipoibd declared the
	// guest on VLAN 20 before it sent anything.
	v := waitVIF(t, h1, guestMAC, true)
	if v.VLAN != 20 || v.PKey != "0x8014" || v.Origin != "ovs" || v.TxPackets != 0 {
		t.Errorf("the guest's VIF at first sight: %+v, want VLAN 20, P_Key 0x8014, origin ovs, nothing sent yet", v)
	}
	vsctl := []string{"ovs-vsctl", "--timeout=10", "--db=unix:" + filepath.Join(ovsDir, "db.sock")}
	port := strings.TrimSpace(sh(t, append(vsctl, "--bare", "--columns=name", "find", "Interface", `external_ids:attached-mac="`+guestMAC+`"`)...))
	if tag := strings.TrimSpace(sh(t, append(vsctl, "get", "Port", port, "tag")...)); tag != "20" {
		t.Errorf("libvirt's port %q for the guest has tag %s, want 20", port, tag)
	}
	if !strings.Contains(h1.log(), `msg="guest declared" origin=ovs mac=`+guestMAC+" vlan=20") {
		t.Errorf("no log of the guest declared with origin ovs on VLAN 20:\n%s", h1.log())
	}
	vm.waitReady(t)

	// The userspace datapath fills in no checksum left to offload.
	vm.must(t, "ethtool -K eth0 tx off && ip addr add 10.77.0.11/24 dev eth0 && ip addr add fd77::11/64 dev eth0 nodad")
	for _, dst := range []string{"10.77.0.200", "fd77::200"} {
		out, err := vm.run(t, "ping -c 3 -i 0.2 -w 15 "+dst, 20*time.Second)
		if err != nil || !strings.Contains(out, "3 packets transmitted, 3 received") {
			t.Errorf("the libvirt guest pinging the native host %s: want 3 of 3 answered (%v):\n%s", dst, err, out)
		}
	}

	// TCP too, with the guest's checksum offload off as the doc says.
	srv := exec.Command("ip", "netns", "exec", nat, "iperf3", "-s", "-1")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	var out string
	var err error
	for range 20 { // until the server listens
		if out, err = vm.run(t, "iperf3 -c 10.77.0.200 -n 200K", 20*time.Second); err == nil || !strings.Contains(out, "Connection refused") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || !strings.Contains(out, "iperf Done.") {
		t.Errorf("TCP (iperf3) from the libvirt guest to the native host: %v\n%s", err, out)
	}

	// And to the guest, through the userspace datapath without its TSO
	// (the doc's bridge), with the default offloads. Exactly the bytes
	// sent arrive (iperf 2). eipoibd wrote no super-frame and no frame
	// over the TAP's MTU into eib0, and ovs-vswitchd refused nothing.
	gsrv := vm.start(t, "iperf -s -y C -P 1")
	sent, err := retryConnect(&guest{ns: nat}, []string{"iperf", "-y", "C", "-c", "10.77.0.11", "-n", strconv.Itoa(libvirtTCPBytes)}, "connect failed")
	rcvd, werr := gsrv.wait(30 * time.Second)
	if s, r := csvBytes(sent), csvBytes(rcvd); err != nil || werr != nil || s != libvirtTCPBytes || r != libvirtTCPBytes {
		t.Errorf("TCP from the native host to the libvirt guest: %d bytes sent, %d received, want %d both (%v, %v)\nclient: %s\nserver: %s",
			s, r, libvirtTCPBytes, err, werr, sent, rcvd)
	}
	if m := h1.metrics(t); m["tap_gro_frames_written"] != 0 || m["tap_frames_over_mtu_written"] != 0 {
		t.Errorf("%v super-frames and %v frames over the TAP's MTU written to eib0 on the userspace datapath", m["tap_gro_frames_written"], m["tap_frames_over_mtu_written"])
	}
	if b, err := os.ReadFile(filepath.Join(ovsDir, "ovs-vswitchd.log")); err != nil || strings.Contains(string(b), "Message too long") || strings.Contains(string(b), "Too big") {
		t.Errorf("ovs-vswitchd's log (%v):\n%s", err, abridge(string(b), 0, 20))
	}

	// Nothing of the guest's was ever dropped as undeclared (its IPv6
	// stack speaks as soon as eth0 is up): its VIF came first.
	if m := h1.metrics(t); m["drop_undeclared"] != 0 {
		t.Errorf("drop_undeclared %v before the forged MAC: the guest spoke before it was declared", m["drop_undeclared"])
	}

	// Only the declared MAC is served: 3 ARP requests from a forged MAC
	// in the guest are dropped as undeclared and get no VIF; the
	// hypervisor's own 2 from ovsbr0 and 2 from eib0 count apart.
	drops := watchDrops(t, h1)
	vm.must(t, "modprobe -d /run/kernel macvlan && ip link add link eth0 name fk address "+forgedMAC+" type macvlan && sysctl -qw net.ipv6.conf.fk.disable_ipv6=1 && ip link set fk up")
	if out, err := vm.run(t, "arping -c 3 -w 5 -S 10.77.0.99 -I fk 10.77.0.200", 20*time.Second); err == nil || !strings.Contains(out, "3 packets transmitted, 0 packets received") {
		t.Errorf("arping from the forged MAC: want 3 sent and none answered (%v):\n%s", err, out)
	}
	for _, dev := range []string{"ovsbr0", "eib0"} {
		if out, err := shErr(in(hv, "arping", "-c", "2", "-w", "4", "-S", "10.77.0.98", "-I", dev, "10.77.0.200")...); err == nil || !strings.Contains(out, "2 packets transmitted, 0 packets received") {
			t.Errorf("arping from the hypervisor's %s: want 2 sent and none answered (%v):\n%s", dev, err, out)
		}
	}
	drops.expect(t, rises{"h1": {"drop_undeclared": 3, "drop_undeclared_local": 4}}, 5*time.Second)
	if _, ok := findVIF(t, h1, forgedMAC); ok {
		t.Errorf("the forged MAC %s got a VIF", forgedMAC)
	}

	// virsh destroy: libvirt deletes the port, eipoibd frees the VIF.
	if out, err := lv.virsh("destroy", "g1"); err != nil {
		t.Fatalf("virsh destroy g1: %v\n%s", err, out)
	}
	waitVIF(t, h1, guestMAC, false)
	if !strings.Contains(h1.log(), `msg="guest gone" origin=ovs mac=`+guestMAC+" vlan=20") {
		t.Errorf("no log of the guest gone:\n%s", h1.log())
	}
	// The forged MAC's frames are the one warning: dropped frames from an
	// undeclared MAC are logged (rate-limited), naming it.
	forged := `msg="frames from a MAC no one declared dropped (--learn declared; one line a minute at most)" mac=` + forgedMAC + " vlan=20"
	var warned []string
	for _, line := range strings.Split(h1.log(), "\n") {
		if (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) && !strings.Contains(line, forged) {
			warned = append(warned, line)
		}
	}
	if !strings.Contains(h1.log(), forged) {
		t.Errorf("no warning naming the forged MAC %s:\n%s", forgedMAC, h1.log())
	}
	if len(warned) > 0 {
		t.Errorf("eipoibd warned with libvirt's guest on the doc's network:\n%s", strings.Join(warned, "\n"))
	}
}

// libvirtTCPBytes is what TestLibvirt sends its guest over TCP.
const libvirtTCPBytes = 8 << 20

// docBlock is one fenced block of a Markdown document.
type docBlock struct{ lang, body string }

// docSet is a document's fenced blocks.
type docSet []docBlock

var fence = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```$")

// docBlocks returns the fenced blocks of the Markdown file path.
func docBlocks(t *testing.T, path string) docSet {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d docSet
	for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
		d = append(d, docBlock{lang: m[1], body: m[2]})
	}
	return d
}

// one returns the body of the one block of language lang that holds
// text, and fails the test unless there is exactly one.
func (d docSet) one(t *testing.T, lang, text string) string {
	t.Helper()
	var found []string
	for _, b := range d {
		if b.lang == lang && strings.Contains(b.body, text) {
			found = append(found, b.body)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/libvirt.md: %d %s blocks hold %q, want 1", len(found), lang, text)
	}
	return found[0]
}

// runDoc runs the lines of a sh block of the doc in namespace ns, in
// directory dir (if not empty), with env added, and fails the test on
// the first that fails.
func runDoc(t *testing.T, ns, block string, env []string, dir string) {
	t.Helper()
	if out, err := runDocErr(ns, block, env, dir); err != nil {
		t.Fatalf("docs/libvirt.md's\n%s\nfailed (%v):\n%s", block, err, out)
	}
}

// runDocErr runs a sh block of the doc as a bash script that stops at the
// first failing line, and returns its output.
func runDocErr(ns, block string, env []string, dir string) (string, error) {
	cmd := exec.Command("ip", "netns", "exec", ns, "bash", "-e", "-c", block)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// networkName returns a libvirt network XML's <name>.
func networkName(t *testing.T, xml string) string {
	t.Helper()
	m := regexp.MustCompile(`<name>([^<]+)</name>`).FindStringSubmatch(xml)
	if m == nil {
		t.Fatalf("no <name> in\n%s", xml)
	}
	return m[1]
}

// writeNetwork saves a network XML as the doc says: <name>.xml in dir.
func writeNetwork(t *testing.T, dir, xml string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, networkName(t, xml)+".xml"), []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
}

// errorLines returns the lines of virsh's output that start with
// "error:", joined by newlines.
func errorLines(out string) string {
	var e []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "error:") {
			e = append(e, l)
		}
	}
	return strings.Join(e, "\n")
}

// findVIF returns the VIF of mac from `eipoibd show vifs`.
func findVIF(t *testing.T, h *hypervisor, mac string) (ctl.VIF, bool) {
	t.Helper()
	var vs []ctl.VIF
	ctlJSON(t, h, &vs, "show", "vifs")
	return vifOf(vs, mac)
}

// waitVIF waits up to 10 s until mac has a VIF (present) or none, and
// returns it.
func waitVIF(t *testing.T, h *hypervisor, mac string, present bool) ctl.VIF {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, ok := findVIF(t, h, mac)
		if ok == present {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: VIF of %s present %v after 10 s, want %v\n%s", h.name, mac, ok, present, h.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// libvirt is a libvirtd (and its virtlogd) of the test's own. It runs in
// a network namespace, in a mount namespace of its own. There its
// configuration, state and sockets (/etc/libvirt, /run/libvirt,
// /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt) are
// directories of the test's. /run/openvswitch is the test's Open
// vSwitch, as libvirt runs ovs-vsctl with its default database.
type libvirt struct {
	dir string   // its root: etc, run, lib, cache, log
	env []string // LIBVIRT_DEFAULT_URI: its socket, for virsh
}

// libvirtDirs are the directories libvirtd's mount namespace gets from
// the test, by the name of the test's directory.
var libvirtDirs = [][2]string{{"etc", "/etc/libvirt"}, {"run", "/run/libvirt"}, {"lib", "/var/lib/libvirt"},
	{"cache", "/var/cache/libvirt"}, {"log", "/var/log/libvirt"}, {"ovs", "/run/openvswitch"}}

// killPidFile sends SIGKILL to the process pid file f names, if it is
// still the one libvirt started (its command line names QEMU or
// virtlogd: a pid left in a stale file may have been reused).
func killPidFile(f string) {
	b, err := os.ReadFile(f)
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil || pid <= 1 {
		return
	}
	if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil &&
		(strings.Contains(string(c), "qemu") || strings.Contains(string(c), "virtlogd")) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// startLibvirt starts virtlogd and libvirtd in namespace ns with
// Open vSwitch ovsDir and waits until virsh gets an answer. QEMU runs as
// root with no security driver, cgroups or namespaces of libvirt's (the
// guest's 9p shares are the test's directories). Everything stops at
// cleanup: the domains destroyed, then libvirtd and virtlogd.
func startLibvirt(t *testing.T, ns, ovsDir string) *libvirt {
	t.Helper()
	dir, err := os.MkdirTemp("", "eipoib-lv") // short: the sockets' paths are limited
	if err != nil {
		t.Fatal(err)
	}
	lv := &libvirt{dir: dir, env: []string{"LIBVIRT_DEFAULT_URI=qemu:///system?socket=" + filepath.Join(dir, "run", "libvirt-sock")}}
	script := "set -e\n"
	for _, d := range libvirtDirs {
		src := filepath.Join(dir, d[0])
		if d[0] == "ovs" {
			src = ovsDir
		} else if err := os.Mkdir(src, 0o755); err != nil {
			t.Fatal(err)
		}
		// The mount point, made on the host if it lacks one, removed
		// at cleanup.
		if _, err := os.Stat(d[1]); os.IsNotExist(err) {
			if err := os.Mkdir(d[1], 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(d[1]) })
		}
		script += fmt.Sprintf("mount --bind %s %s\n", src, d[1])
	}
	conf := map[string]string{
		"qemu.conf":     "user = \"root\"\ngroup = \"root\"\ndynamic_ownership = 0\nsecurity_driver = \"none\"\ncgroup_controllers = [ ]\nnamespaces = [ ]\n",
		"libvirtd.conf": "", "virtlogd.conf": "",
	}
	for name, text := range conf {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Their pid files would be /run/virtlogd.pid and /run/libvirtd.pid,
	// the system's.
	script += fmt.Sprintf("virtlogd -d -p %s\nexec libvirtd -p %s\n", filepath.Join(dir, "virtlogd.pid"), filepath.Join(dir, "libvirtd.pid"))
	logPath := filepath.Join(dir, "libvirtd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// ip netns exec gives the script a mount namespace of its own, whose
	// mounts the host does not see.
	cmd := exec.Command("ip", "netns", "exec", ns, "sh", "-c", script)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited closes once libvirtd has exited, with its error in waitErr.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("libvirtd's log:\n%s", abridge(string(b), 10, 30))
		}
		names, _ := lv.virsh("list", "--name")
		for _, n := range strings.Fields(names) {
			lv.virsh("destroy", n)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		// virtlogd -d forked away from the script (no Pdeathsig), and
		// a QEMU libvirtd failed to destroy outlives it: kill what
		// their pid files name before they go with dir.
		qemus, _ := filepath.Glob(filepath.Join(dir, "run", "qemu", "*.pid"))
		for _, f := range append(qemus, filepath.Join(dir, "virtlogd.pid")) {
			killPidFile(f)
		}
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := lv.virsh("version")
		if err == nil {
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("libvirtd exited: %v\n%s", waitErr, b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("virsh version: no answer from libvirtd within 30 s: %v\n%s\nlibvirtd's log:\n%s", err, out, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return lv
}

// virsh runs virsh against the test's libvirtd.
func (lv *libvirt) virsh(args ...string) (string, error) {
	cmd := exec.Command("virsh", args...)
	cmd.Env = append(os.Environ(), lv.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// runDoc runs a sh block of the doc (its virsh commands against the
// test's libvirtd) in namespace ns and directory dir.
func (lv *libvirt) runDoc(t *testing.T, ns, block, dir string) (string, error) {
	t.Helper()
	return runDocErr(ns, block, lv.env, dir)
}

// libvirtVM is a guest libvirt runs: test/vm's kernel and initramfs and
// its agent, as startVM's VM, so that vmHost's methods run scripts in it.
type libvirtVM struct {
	*vmHost
}

// boot starts a transient domain named name under TCG with test/vm's
// kernel and initramfs (direct kernel boot). It has the host's root and
// a work directory over virtio-9p, as startVM gives them. Its network
// interface is iface, libvirt <interface> XML given as the doc has it;
// the test turns its option ROM off, which a kernel boot does not need.
// The agent's eth0 takes the interface's MTU.
func (lv *libvirt) boot(t *testing.T, name, iface string) *libvirtVM {
	t.Helper()
	kernel, initrd, pkgRoot := vmBuild(t)
	v := &vmHost{work: t.TempDir(), done: make(chan struct{})}
	v.console = filepath.Join(t.TempDir(), "console.log")
	agent, err := os.ReadFile("../vm/agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	// The agent sets eth0's MTU to 9000, more than the virtio-net device
	// takes when libvirt gives it the interface's <mtu>.
	mtu := regexp.MustCompile(`<mtu size='(\d+)'/>`).FindStringSubmatch(iface)
	if mtu != nil {
		const set = "ip link set eth0 mtu 9000 up"
		if strings.Count(string(agent), set) != 1 {
			t.Fatalf("test/vm/agent.sh no longer runs %q once", set)
		}
		agent = []byte(strings.Replace(string(agent), set, "ip link set eth0 mtu "+mtu[1]+" up", 1))
	}
	if err := os.WriteFile(v.file("agent.sh"), agent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(v.file("cmd"), 0o755); err != nil {
		t.Fatal(err)
	}
	share := func(src, tag string, ro bool) string {
		r := ""
		if ro {
			r = "<readonly/>"
		}
		return fmt.Sprintf("<filesystem type='mount' accessmode='passthrough' multidevs='remap'><source dir='%s'/><target dir='%s'/>%s</filesystem>\n", src, tag, r)
	}
	dom := fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>1024</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>console=ttyS0 quiet panic=-1</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    %s%s%s%s
    <serial type='file'><source path='%s'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>
`, name, kernel, initrd, share("/", "hostroot", true), share(v.work, "work", false), share(pkgRoot, "kernel", true),
		strings.Replace(iface, "</interface>", "  <rom enabled='no'/>\n</interface>", 1), v.console)
	domFile := filepath.Join(t.TempDir(), name+".xml")
	if err := os.WriteFile(domFile, []byte(dom), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if out, err := lv.virsh("create", domFile); err != nil {
		t.Fatalf("virsh create: %v\n%s\n%s", err, out, dom)
	}
	t.Logf("virsh create: %.1f s", time.Since(t0).Seconds())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's console (tail):\n%s", name, v.consoleTail(40))
		}
		lv.virsh("destroy", name)
		close(v.done)
	})
	return &libvirtVM{v}
}

// waitReady waits until the guest's agent is ready (vmBootTimeout,
// doubled: libvirt's guest boots as startVM's does, on a host busier
// with libvirtd and Open vSwitch).
func (vm *libvirtVM) waitReady(t *testing.T) {
	t.Helper()
	t0 := time.Now()
	deadline := t0.Add(2 * vmBootTimeout)
	for {
		if b, err := os.ReadFile(vm.file("ready")); err == nil {
			t.Logf("libvirt guest ready at guest uptime %s s", strings.TrimSpace(string(b)))
			return
		}
		if b, err := os.ReadFile(vm.file("failed")); err == nil {
			t.Fatalf("libvirt guest: agent failed: %s\nconsole (tail):\n%s", strings.TrimSpace(string(b)), vm.consoleTail(40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirt guest: agent not ready after %v\nconsole (tail):\n%s", 2*vmBootTimeout, vm.consoleTail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
