package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// The VM tests boot Debian's kernel under QEMU (TCG: no KVM needed) with
// the host's root read-only over virtio-9p, so that the guest runs the
// host's own binaries. Soft-RoCE (rxe0) runs on its virtio-net eth0,
// whose TAP is in a bridge of the test's. See test/vm/ and
// docs/architecture.md, "Testing against a real RDMA stack".

// vmTools are what a VM needs on the host beyond ip (the guest runs
// them from the host's root); the helpers that run more in the VM
// require their own tools.
var vmTools = []string{"qemu-system-x86_64", "rdma", "ibv_devinfo"}

const (
	vmMAC  = "52:54:00:12:34:56" // the VM's eth0
	vmTap  = "vmtap"             // its TAP, in the namespace startVM is given
	vmWork = "/tmp/work"         // the work directory, as the guest sees it
	// vmBootTimeout bounds the wait for the VM's agent. TCG boots in
	// 15-30 s on a quiet machine, but while both cores are busy (make
	// test-load, with other work beside it) the firmware alone took
	// over a minute: the wait is for the state, the bound only catches
	// a VM that never comes up.
	vmBootTimeout = 4 * time.Minute
	// vmStartTimeout bounds the wait for the agent to start a script
	// it was handed (it polls for new ones), apart from the script's
	// own run time, which run's timeout bounds.
	vmStartTimeout = time.Minute
)

// vmHost is a running VM (startVM). Its agent (test/vm/agent.sh) runs
// the scripts it is given as root in the guest's initial network
// namespace, where rxe0 lives. The guest runs the host's binaries: its
// root is the host's, read-only, with tmpfs on /tmp, /run and /dev/shm.
// The work directory is on vmWork and the unpacked kernel package on
// /run/kernel. modprobe -d /run/kernel MODULE loads more modules; a
// plain modprobe does too where the host has a /lib/modules to mount
// them on.
type vmHost struct {
	ns      string // where its TAP and QEMU are
	work    string // the work directory on the host (vmWork in the guest)
	console string // the console log
	done    chan struct{}
	err     error // QEMU's exit, once done is closed
	seq     atomic.Int32
}

// vmProc is a script running in the VM (vmHost.start).
type vmProc struct {
	v *vmHost
	n string // its files in the work directory, without extension
}

// startVM boots a VM whose eth0 (MTU 9000, MAC vmMAC) is TAP vmTap in
// namespace ns, enslaved to bridge there, and waits until its agent is
// ready: rxe0 active on eth0. The VM stops at cleanup. It fails the test
// if anything needed is missing, under EIPOIB_REQUIRE_NETNS=1; it skips
// otherwise, as require does. It gives test/vm/build.sh's reason if that
// fails (no kernel package reachable, say). It gives the console log's
// tail if the VM does not come up within vmBootTimeout.
func startVM(t *testing.T, ns, bridge string) *vmHost {
	t.Helper()
	return startVMWith(t, ns, bridge, "")
}

// startVMWith is startVM with more kernel command-line arguments, cmdline
// ("ipv6.disable=1", say: the agent then sets up no rxe0, which needs
// eth0's IPv6 link-local address for its GID, and is ready with eth0 up).
func startVMWith(t *testing.T, ns, bridge, cmdline string) *vmHost {
	t.Helper()
	nstestRequire(t, vmTools...)
	t0 := time.Now()
	kernel, initrd, pkgRoot := vmBuild(t)
	tBuild := time.Since(t0)

	v := &vmHost{ns: ns, work: t.TempDir(), done: make(chan struct{})}
	v.console = filepath.Join(t.TempDir(), "console.log")
	agent, err := os.ReadFile("../vm/agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v.file("agent.sh"), agent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(v.file("cmd"), 0o755); err != nil {
		t.Fatal(err)
	}

	sh(t, in(ns, "ip", "tuntap", "add", vmTap, "mode", "tap")...)
	sh(t, in(ns, "ip", "link", "set", vmTap, "mtu", "9000", "master", bridge, "up")...)

	logf, err := os.Create(v.console)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"qemu-system-x86_64", "-machine", "pc,accel=tcg", "-smp", "1", "-m", "1024",
		"-nographic", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", strings.TrimSpace("console=ttyS0 quiet panic=-1 " + cmdline),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + v.work + ",mount_tag=work,security_model=none,multidevs=remap",
		"-virtfs", "local,path=" + pkgRoot + ",mount_tag=kernel,security_model=none,readonly=on,multidevs=remap",
		"-netdev", "tap,id=n0,ifname=" + vmTap + ",script=no,downscript=no",
		// No option ROM: booting a kernel needs no iPXE, whose banner
		// alone waits 2 s.
		"-device", "virtio-net-pci,netdev=n0,mac=" + vmMAC + ",romfile=",
	}
	cmd := exec.Command("ip", in(ns, args...)[1:]...) // ip netns exec execs QEMU: one process
	cmd.Stdout, cmd.Stderr = logf, logf
	// QEMU dies with the test binary (a timeout's panic, say).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t1 := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	go func() {
		v.err = cmd.Wait()
		logf.Close()
		close(v.done)
	}()
	booted := false
	t.Cleanup(func() {
		if t.Failed() && booted { // a failed boot says so itself
			t.Logf("VM console (tail):\n%s", v.consoleTail(40))
		}
		os.WriteFile(v.file("stop"), nil, 0o644)
		select {
		case <-v.done:
		case <-time.After(10 * time.Second):
			t.Logf("VM did not power off within 10 s of stop: killing QEMU")
			cmd.Process.Kill()
			<-v.done
		}
		shErr(in(ns, "ip", "link", "delete", vmTap)...)
	})

	deadline := time.Now().Add(vmBootTimeout)
	for {
		if b, err := os.ReadFile(v.file("ready")); err == nil {
			t.Logf("VM: booted in %.1f s (agent ready at guest uptime %s s; build.sh %.1f s)",
				time.Since(t1).Seconds(), strings.TrimSpace(string(b)), tBuild.Seconds())
			booted = true
			return v
		}
		if b, err := os.ReadFile(v.file("failed")); err == nil {
			t.Fatalf("VM: agent failed: %s\nconsole (tail):\n%s", strings.TrimSpace(string(b)), v.consoleTail(40))
		}
		select {
		case <-v.done:
			t.Fatalf("VM: QEMU exited (%v) before the agent was ready\nconsole (tail):\n%s", v.err, v.consoleTail(40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("VM: agent not ready after %v\nconsole (tail):\n%s", vmBootTimeout, v.consoleTail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// vmBuild runs test/vm/build.sh and returns the kernel and the
// initramfs to boot, and the unpacked kernel package (the guest's
// /run/kernel: modules in lib/modules/RELEASE).
func vmBuild(t *testing.T) (kernel, initrd, pkgRoot string) {
	t.Helper()
	cmd := exec.Command("../vm/build.sh")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	// The first run downloads the kernel package.
	timer := time.AfterFunc(10*time.Minute, func() { cmd.Process.Kill() })
	out, err := cmd.Output()
	timer.Stop()
	if err != nil {
		reason := strings.TrimSpace(stderr.String())
		if reason == "" {
			reason = err.Error()
		}
		t.Fatalf("VM: test/vm/build.sh failed: %s", reason)
	}
	f := strings.Fields(string(out))
	if len(f) != 4 {
		t.Fatalf("VM: test/vm/build.sh printed %q, want KERNEL INITRD MODULES_DIR RELEASE", out)
	}
	root, ok := strings.CutSuffix(f[2], "/lib/modules/"+f[3])
	if !ok {
		t.Fatalf("VM: test/vm/build.sh printed modules directory %s, want one ending in /lib/modules/%s", f[2], f[3])
	}
	return f[0], f[1], root
}

// file returns the host path of name in the VM's work directory, which
// the guest sees as vmWork/name (a binary put there runs in the VM). The
// guest sees the rest of the host's root read-only and as it was at boot,
// except /tmp, /run and /dev/shm: tmpfs of its own.
func (v *vmHost) file(name string) string { return filepath.Join(v.work, name) }

// vmNamespace makes the namespace pfx+"vm" (removed at cleanup) with
// bridge ubr (MTU 9000) up in it, for startVM's TAP, and returns pfx,
// a prefix unique to the test, and the namespace.
func vmNamespace(t *testing.T) (pfx, ns string) {
	t.Helper()
	pfx = fmt.Sprintf("e%d%d", os.Getpid()%1000, nsSeq.Add(1))
	ns = pfx + "vm"
	nstest.Add(t, ns)
	sh(t, in(ns, "ip", "link", "add", "ubr", "mtu", "9000", "type", "bridge")...)
	sh(t, in(ns, "ip", "link", "set", "ubr", "up")...)
	return pfx, ns
}

// copyDaemon puts the eipoibd binary the tests built into the VM's work
// directory, as ./eipoibd.
func (v *vmHost) copyDaemon(t *testing.T) {
	t.Helper()
	bin, err := os.ReadFile(daemonBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v.file("eipoibd"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
}

// buildTest builds package pkg's test binary into the VM's work
// directory, as ./name.
func (v *vmHost) buildTest(t *testing.T, name, pkg string) {
	t.Helper()
	if out, err := exec.Command("go", "test", "-c", "-o", v.file(name), pkg).CombinedOutput(); err != nil {
		t.Fatalf("build %s's test binary: %v\n%s", pkg, err, out)
	}
}

// consoleTail returns the last n lines of the VM's console log, without
// the terminal control sequences the firmware prints.
func (v *vmHost) consoleTail(n int) string {
	b, _ := os.ReadFile(v.console)
	s := regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]|\x1bc`).ReplaceAllString(string(b), "")
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run runs a bash script as root in the VM (working directory vmWork)
// and returns its output (stdout and stderr) once it ends. err is
// non-nil if it exits non-zero, if the VM stops, if the agent does not
// start it within vmStartTimeout, or if it runs longer than timeout
// from its start (it is then killed).
func (v *vmHost) run(t *testing.T, script string, timeout time.Duration) (out string, err error) {
	t.Helper()
	p, err := v.submit(script, vmStartTimeout)
	if err != nil {
		return "", err
	}
	return p.wait(timeout)
}

// vmMustTimeout bounds a command must runs. It bounds no speed: the
// guest is emulated (TCG), and on a machine whose cores are busy (make
// test-load, with other work beside it) its commands run several times
// slower; starting a libvirt domain in the VLAN test took more than 30 s
// there, and then more than 2 minutes (the old bounds). It only ends a
// hung command before go test's own -timeout ends the suite.
const vmMustTimeout = 10 * time.Minute

// must is run with vmMustTimeout that fails the test on any error.
func (v *vmHost) must(t *testing.T, script string) string {
	t.Helper()
	out, err := v.run(t, script, vmMustTimeout)
	if err != nil {
		t.Fatalf("in the VM: %s: %v\n%s", script, err, out)
	}
	return out
}

// start starts a long-running bash script in the VM in the background
// and returns once it runs; vmProc's stop and wait end it. A script still
// running at cleanup dies with the VM.
func (v *vmHost) start(t *testing.T, script string) *vmProc {
	t.Helper()
	p, err := v.submit(script, vmStartTimeout)
	if err != nil {
		t.Fatalf("in the VM: %s: %v", script, err)
	}
	return p
}

// submit hands a script to the agent and waits until it has started it.
func (v *vmHost) submit(script string, timeout time.Duration) (*vmProc, error) {
	p := &vmProc{v: v, n: v.file(fmt.Sprintf("cmd/%d", v.seq.Add(1)))}
	// Written under another name, then renamed: the agent only takes
	// whole scripts.
	if err := os.WriteFile(p.n+".tmp", []byte(script+"\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(p.n+".tmp", p.n+".sh"); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(p.n + ".pid"); err == nil {
			return p, nil
		}
		if err := v.gone(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the VM's agent did not start the script within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gone returns an error once the VM has stopped.
func (v *vmHost) gone() error {
	select {
	case <-v.done:
		return fmt.Errorf("the VM stopped (QEMU: %v)", v.err)
	default:
		return nil
	}
}

// output returns what the script has written so far.
func (p *vmProc) output() string {
	b, _ := os.ReadFile(p.n + ".out")
	return string(b)
}

// exited reports whether the script has ended, and its exit status.
func (p *vmProc) exited() (bool, int) {
	b, err := os.ReadFile(p.n + ".rc")
	if err != nil {
		return false, 0
	}
	rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return true, -1
	}
	return true, rc
}

var errVMTimeout = errors.New("timed out")

// wait waits up to timeout for the script to end and returns its output;
// err is non-nil if it exits non-zero or the VM stops, or if it is still
// running after timeout (it is then killed).
func (p *vmProc) wait(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if ok, rc := p.exited(); ok {
			if rc != 0 {
				return p.output(), fmt.Errorf("exit status %d", rc)
			}
			return p.output(), nil
		}
		if err := p.v.gone(); err != nil {
			return p.output(), err
		}
		if time.Now().After(deadline) {
			p.signal("KILL")
			return p.output(), fmt.Errorf("%w after %v", errVMTimeout, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM to the script and everything it started (its
// session), SIGKILL after 5 s if it still runs, and returns its output
// and the error wait would.
func (p *vmProc) stop() (string, error) {
	if ok, _ := p.exited(); !ok {
		p.signal("TERM")
	}
	out, err := p.wait(5 * time.Second)
	if errors.Is(err, errVMTimeout) {
		out, err = p.wait(5 * time.Second)
	}
	return out, err
}

// signal sends a signal to the script's session.
func (p *vmProc) signal(sig string) {
	b, err := os.ReadFile(p.n + ".pid")
	if err != nil {
		return
	}
	pid := strings.TrimSpace(string(b))
	if k, err := p.v.submit(fmt.Sprintf("kill -%s -- -%s", sig, pid), vmStartTimeout); err == nil {
		k.wait(10 * time.Second)
	}
}

// eui64LinkLocal returns the link-local address IPv6 derives from mac.
func eui64LinkLocal(mac net.HardwareAddr) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	copy(a[8:11], mac[:3])
	a[8] ^= 0x02
	a[11], a[12] = 0xff, 0xfe
	copy(a[13:], mac[3:])
	return netip.AddrFrom16(a)
}

// linkLocal returns the link-local address of dev in the VM.
func (v *vmHost) linkLocal(t *testing.T, dev string) netip.Addr {
	t.Helper()
	out := v.must(t, "ip -6 -o addr show dev "+dev+" scope link")
	f := strings.Fields(out)
	if len(f) < 4 {
		t.Fatalf("no link-local address on %s in the VM: %s", dev, out)
	}
	return netip.MustParsePrefix(f[3]).Addr()
}

var (
	rdmaLinkActive = regexp.MustCompile(`(?m)^link rxe0/1 state ACTIVE .*netdev eth0\b`)
	ibvPortActive  = regexp.MustCompile(`(?m)^\s+state:\s+PORT_ACTIVE\b`)
	ibvActiveMTU   = regexp.MustCompile(`(?m)^\s+active_mtu:\s+4096\b`)
)

// TestVMRxe boots the VM on a bridge with one peer namespace and checks
// what the verbs tests build on. rxe0 is active on eth0 with MTU 4096
// and eth0's link-local address as its RoCE v2 GID 0. IPv6 works both
// ways over the bridge. Network namespaces and the kernel's modules work
// inside the VM, and host binaries run there.
func TestVMRxe(t *testing.T) {
	require(t)
	t0 := time.Now()
	pfx, ns := vmNamespace(t)
	peer := pfx + "peer"
	nstest.Add(t, peer)
	sh(t, in(peer, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")...)
	sh(t, "ip", "link", "add", "eth0", "netns", peer, "type", "veth", "peer", "name", "vpeer", "netns", ns)
	sh(t, in(ns, "ip", "link", "set", "vpeer", "mtu", "9000", "master", "ubr", "up")...)
	sh(t, in(peer, "ip", "link", "set", "eth0", "mtu", "9000", "up")...)

	v := startVM(t, ns, "ubr")

	if out := v.must(t, "rdma link show"); !rdmaLinkActive.MatchString(out) {
		t.Errorf("rdma link show: want rxe0/1 state ACTIVE on netdev eth0:\n%s", out)
	}
	out := v.must(t, "ibv_devinfo -d rxe0 -v")
	if !ibvPortActive.MatchString(out) || !ibvActiveMTU.MatchString(out) {
		t.Errorf("ibv_devinfo -d rxe0 -v: want state PORT_ACTIVE, active_mtu 4096:\n%s", out)
	}
	ll := v.linkLocal(t, "eth0")
	mac, _ := net.ParseMAC(vmMAC)
	if want := eui64LinkLocal(mac); ll != want {
		t.Errorf("the VM's eth0 has link-local address %v, want %v (from %s)", ll, want, vmMAC)
	}
	port := "/sys/class/infiniband/rxe0/ports/1/gid_attrs/"
	if typ := strings.TrimSpace(v.must(t, "cat "+port+"types/0")); typ != "RoCE v2" {
		t.Errorf("rxe0 GID 0 type %q, want RoCE v2", typ)
	}
	gidText := strings.TrimSpace(v.must(t, "cat /sys/class/infiniband/rxe0/ports/1/gids/0"))
	if gid, err := netip.ParseAddr(gidText); err != nil || gid != ll {
		t.Errorf("rxe0 GID 0 is %q, want eth0's link-local address %v", gidText, ll)
	}

	// IPv6 over the bridge, both ways.
	pingN(t, &guest{ns: peer}, ll.String()+"%eth0", 3)
	f := strings.Fields(sh(t, in(peer, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")...))
	if len(f) < 4 {
		t.Fatalf("no link-local address on %s's eth0: %v", peer, f)
	}
	peerLL := netip.MustParsePrefix(f[3]).Addr()
	out, err := v.run(t, fmt.Sprintf("ping -c 3 -i 0.2 -w 10 %s%%eth0", peerLL), 20*time.Second)
	if err != nil || !strings.Contains(out, "3 packets transmitted, 3 received") {
		t.Errorf("ping from the VM to %s: want 3 of 3 answered (%v):\n%s", peerLL, err, out)
	}

	// Guests in the VM are network namespaces.
	out, err = v.run(t, "ip netns add x && ip netns exec x ip -o link; rc=$?; ip netns delete x; exit $rc", 20*time.Second)
	if err != nil || !strings.Contains(out, "1: lo:") {
		t.Errorf("a network namespace in the VM (%v):\n%s", err, out)
	}

	// More modules, for the tests that need them.
	if out, err := v.run(t, "modprobe -d /run/kernel -n -v 8021q", 20*time.Second); err != nil || !strings.Contains(out, "8021q.ko") {
		t.Errorf("modprobe -d /run/kernel -n -v 8021q in the VM (%v):\n%s", err, out)
	}

	// Host binaries run in the VM.
	v.copyDaemon(t)
	if out, err := v.run(t, vmWork+"/eipoibd run -h", 20*time.Second); err != nil {
		t.Errorf("eipoibd run -h in the VM: %v\n%s", err, out)
	}

	// A background script runs until stopped, with what it started.
	p := v.start(t, "echo started; sleep 300 & wait")
	if out, err := p.stop(); err == nil || !strings.Contains(out, "started") {
		t.Errorf("a stopped background script: got %v, want it killed by SIGTERM, with its output:\n%s", err, out)
	}
	// One that outlives its timeout is killed, with what it started.
	// 10 s: long enough for the echo on a busy machine, far short of
	// the sleep.
	if out, err := v.run(t, "echo started; sleep 301 & wait", 10*time.Second); !errors.Is(err, errVMTimeout) || !strings.Contains(out, "started") {
		t.Errorf("a script past its timeout: got %v, want a time-out, with its output:\n%s", err, out)
	}
	if out := v.must(t, "pgrep -x sleep || true"); strings.TrimSpace(out) != "" {
		t.Errorf("the background scripts' sleeps survived their stop: pid %s", out)
	}
	t.Logf("VM test: %.1f s to here", time.Since(t0).Seconds())
}
