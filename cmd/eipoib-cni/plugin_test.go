package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// fakeDaemon answers vif-add and vif-del as eipoibd does, keeping the
// declared VIFs; refuse makes vif-add fail with that message; its port
// is up unless down.
type fakeDaemon struct {
	ctl.UnimplementedHandler
	mu     sync.Mutex
	vifs   map[ctl.VIFRequest]bool
	refuse string
	down   bool
}

func (d *fakeDaemon) Port() ctl.Port {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return ctl.Port{Backend: "sim", Device: "veth0", Link: "down"}
	}
	return ctl.Port{Backend: "sim", Device: "veth0", Link: "up"}
}

func (d *fakeDaemon) VIFs() []ctl.VIF {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []ctl.VIF
	for v := range d.vifs {
		out = append(out, ctl.VIF{MAC: v.MAC, VLAN: uint16(v.VLAN)})
	}
	return out
}

func (d *fakeDaemon) AddVIF(r ctl.VIFRequest) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse != "" {
		return errors.New(d.refuse)
	}
	d.vifs[r] = true
	return nil
}

func (d *fakeDaemon) DelVIF(r ctl.VIFRequest) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.vifs, r)
	return nil
}

// serve runs a fake daemon on dir/eib1.sock until the test ends.
func serve(t *testing.T, dir string) *fakeDaemon {
	t.Helper()
	d := &fakeDaemon{vifs: map[ctl.VIFRequest]bool{}}
	s, err := ctl.Listen(ctl.Path(dir, "eib1"), d)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return d
}

// podArgs are the arguments of the runtime's call for the pod of
// chainedConf, its eipoibd's control socket and state file in dir, the
// plugin's records in dir/data.
func podArgs(dir string) *skel.CmdArgs {
	conf := strings.NewReplacer(`"/run/x"`, `"`+dir+`"`, `"/run/s/"`, `"`+dir+`","dataDir":"`+dir+`/data"`).Replace(chainedConf)
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/pod", IfName: "eth0", StdinData: []byte(conf)}
}

// podNS makes the pod's network namespace for args: its eth0 an
// Ethernet interface with the MAC of chainedConf's prevResult (or mac)
// and MTU 4092, as bridge leaves it.
func podNS(t *testing.T, args *skel.CmdArgs, mac ...string) {
	t.Helper()
	ns := fmt.Sprintf("eipoibcni%d-%d", os.Getpid(), podSeq.Add(1))
	nstest.Add(t, ns)
	addr := "0a:58:0a:4d:00:32"
	if len(mac) > 0 {
		addr = mac[0]
	}
	nstest.Must(t, "ip", "-n", ns, "link", "add", "eth0", "address", addr, "mtu", "4092", "type", "veth", "peer", "name", "host0")
	args.Netns = "/var/run/netns/" + ns
}

var podSeq atomic.Int32

// quiet sends what fn prints on standard output (the plugin's result)
// to a file, so that the test's output stays readable, and returns it.
func quiet(t *testing.T, fn func() error) (string, error) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = f
	err = fn()
	os.Stdout = old
	b, _ := os.ReadFile(f.Name())
	f.Close()
	return string(b), err
}

// TestAddDel: chained ADD declares the pod's MAC from the prevResult on
// the configured VLAN and prints the prevResult on. CHECK passes, and
// fails with code 101 once the VIF is gone or on another VLAN (naming
// it). DEL frees it, and a second DEL (nothing left) succeeds too. A
// refusal is a code 100 error quoting the daemon, and leaves no record.
func TestAddDel(t *testing.T) {
	nstest.Require(t) // the control socket serves root peers only
	dir := t.TempDir()
	d := serve(t, dir)
	args := podArgs(dir)
	podNS(t, args)
	out, err := quiet(t, func() error { return cmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	want := ctl.VIFRequest{MAC: "0a:58:0a:4d:00:32", VLAN: 10}
	if got := d.VIFs(); len(got) != 1 || got[0] != (ctl.VIF{MAC: want.MAC, VLAN: uint16(want.VLAN)}) {
		t.Errorf("after ADD the daemon holds %v, want %v", got, want)
	}
	var res current.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Interfaces) != 3 || *res.Interfaces[2] != (current.Interface{Name: "eth0", Mac: "0a:58:0a:4d:00:32", Mtu: 4092, Sandbox: "/var/run/netns/pod"}) ||
		*res.Interfaces[0] != (current.Interface{Name: "br0", Mac: "aa:bb:cc:dd:ee:01"}) || len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.77.0.50/24" {
		t.Errorf("ADD printed %s, want the prevResult passed on, the pod interface's MTU 4092 added", out)
	}
	if err := cmdCheck(args); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}
	d.DelVIF(want)
	d.AddVIF(ctl.VIFRequest{MAC: want.MAC, VLAN: 20})
	err = cmdCheck(args)
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrVIFMissing || !strings.Contains(ce.Msg, "no VIF for the pod's MAC 0a:58:0a:4d:00:32 on VLAN 10 (it has one on VLAN 20") {
		t.Errorf("CHECK with the VIF on another VLAN: %v, want code 101 naming both VLANs", err)
	}
	d.DelVIF(ctl.VIFRequest{MAC: want.MAC, VLAN: 20})
	if err := cmdCheck(args); !errors.As(err, &ce) || ce.Code != ErrVIFMissing || !strings.Contains(ce.Msg, "`eipoibd vif add 0a:58:0a:4d:00:32 --vlan 10 --name eib1`") {
		t.Errorf("CHECK without the VIF: %v, want code 101 saying how to declare it again", err)
	}
	d.AddVIF(want)
	for i := 0; i < 2; i++ {
		if err := cmdDel(args); err != nil {
			t.Fatalf("DEL %d: %v", i+1, err)
		}
		if got := d.VIFs(); len(got) != 0 {
			t.Errorf("after DEL %d the daemon holds %v, want nothing", i+1, got)
		}
	}
	d.mu.Lock()
	d.refuse = "shim: VLAN 10 has no P_Key"
	d.mu.Unlock()
	_, err = quiet(t, func() error { return cmdAdd(args) })
	if !errors.As(err, &ce) || ce.Code != ErrDaemonRefused || !strings.Contains(ce.Msg, "eipoibd eib1 refused vif-add of 0a:58:0a:4d:00:32 on VLAN 10: shim: VLAN 10 has no P_Key") {
		t.Errorf("ADD refused: %v, want code 100 quoting the daemon", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "ib", "c1:eth0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the refused ADD its record is there (%v), want none: nothing was declared", err)
	}
}

// TestNoDaemon: ADD fails with "try again later" (code 11) with no
// socket, a stale one nothing listens on, or a daemon that takes the
// connection and closes it without a reply (one stopping). The message
// names the socket, the system's error and the question to ask.
func TestNoDaemon(t *testing.T) {
	nstest.Require(t) // the pod's namespace
	dir := t.TempDir()
	args := podArgs(dir)
	podNS(t, args)
	_, err := quiet(t, func() error { return cmdAdd(args) })
	var ce *types.Error
	want := "eipoibd control socket " + filepath.Join(dir, "eib1.sock") + ": no such file or directory: is eipoibd running for eib1?"
	if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater || ce.Msg != want {
		t.Errorf("ADD without a daemon: %v, want code 11 %q", err, want)
	}
	staleSocket(t, dir)
	_, err = quiet(t, func() error { return cmdAdd(args) })
	want = "eipoibd control socket " + filepath.Join(dir, "eib1.sock") + ": connection refused: is eipoibd running for eib1?"
	if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater || ce.Msg != want {
		t.Errorf("ADD with a stale socket: %v, want code 11 %q", err, want)
	}
	os.Remove(filepath.Join(dir, "eib1.sock"))
	closingDaemon(t, dir)
	_, err = quiet(t, func() error { return cmdAdd(args) })
	want = "eipoibd control socket " + filepath.Join(dir, "eib1.sock") + ": no reply (EOF): is eipoibd running for eib1?"
	if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater || ce.Msg != want {
		t.Errorf("ADD to a daemon closing without a reply: %v, want code 11 %q", err, want)
	}
}

// closingDaemon serves dir/eib1.sock as a daemon stopping does: each
// connection is taken, its request read, and closed without a reply.
func closingDaemon(t *testing.T, dir string) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "eib1.sock"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			bufio.NewReader(c).ReadBytes('\n')
			c.Close()
		}
	}()
}

// staleSocket leaves dir/eib1.sock as a daemon that died does: a
// socket nothing listens on (connection refused).
func staleSocket(t *testing.T, dir string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "eib1.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

// TestDelNoDaemon: DEL while nothing answers on the control socket. With
// neither the daemon's control socket nor its state file there, the
// daemon is gone with its VIFs: DEL succeeds. With a stale socket (a
// crash), the state file (a stop with --persist: the VIFs come back at
// the next start) or both, DEL fails with "try again later" (code 11).
// The message gives the system's error, the pod's MAC and VLAN, and the
// files to remove if that eipoibd is gone for good. Once they are
// removed DEL succeeds.
func TestDelNoDaemon(t *testing.T) {
	dir := t.TempDir()
	args := podArgs(dir)
	sock, state := filepath.Join(dir, "eib1.sock"), filepath.Join(dir, "eib1.state")
	if err := cmdDel(args); err != nil {
		t.Errorf("DEL without a daemon, its socket or its state file: %v, want success", err)
	}
	for _, tc := range []struct {
		name        string
		sock, state bool
		why, remove string
	}{
		{"state file only", false, true, "no such file or directory", state},
		{"stale socket and state file", true, true, "connection refused", sock + " and " + state},
		{"stale socket only", true, false, "connection refused", sock},
	} {
		os.Remove(sock)
		os.Remove(state)
		if tc.sock {
			staleSocket(t, dir)
		}
		if tc.state && os.WriteFile(state, []byte("{}"), 0o600) != nil {
			t.Fatal("state file not written")
		}
		err := cmdDel(args)
		var ce *types.Error
		want := "eipoibd control socket " + sock + ": " + tc.why + ": is eipoibd running for eib1? The VIF of the pod's MAC 0a:58:0a:4d:00:32 on VLAN 10 is not freed yet: " +
			"eipoibd restores its VIFs when it starts and keeps a declared one until it is deleted. If eipoibd for eib1 is gone for good, remove " + tc.remove + ": the next DEL then succeeds"
		if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater || ce.Msg != want {
			t.Errorf("DEL, %s: %v, want code 11 %q", tc.name, err, want)
		}
	}
	os.Remove(sock)
	if err := cmdDel(args); err != nil {
		t.Errorf("DEL once the files are removed: %v, want success", err)
	}
}

// TestAddNoPodInterface: a prevResult without the pod's interface (the
// plugin listed first, or another IfName) is a configuration error
// saying where to list the plugin.
func TestAddNoPodInterface(t *testing.T) {
	args := &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/pod", IfName: "net1", StdinData: []byte(chainedConf)}
	_, err := quiet(t, func() error { return cmdAdd(args) })
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig || !strings.Contains(ce.Msg, `list "eipoib" after "bridge"`) {
		t.Errorf("ADD: %v, want code 7 naming the chain order", err)
	}
	args.StdinData = []byte(`{"cniVersion":"1.0.0","name":"ib","type":"eipoib"}`)
	_, err = quiet(t, func() error { return cmdAdd(args) })
	if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig || !strings.Contains(ce.Msg, "no prevResult") {
		t.Errorf("ADD without prevResult: %v, want code 7", err)
	}
}

// TestDelLiveDaemonsState: DEL for a configuration whose socketDir names
// no daemon (mistyped: ADD failed) while its stateDir holds the state
// file of a daemon that answers beside it. That state is the live
// daemon's, which ADD never reached: DEL succeeds, and advises removing
// nothing.
func TestDelLiveDaemonsState(t *testing.T) {
	nstest.Require(t) // the control socket serves root peers only
	live, wrong := t.TempDir(), t.TempDir()
	serve(t, live)
	if err := os.WriteFile(filepath.Join(live, "eib1.state"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer(`"/run/x"`, `"`+wrong+`"`, `"/run/s/"`, `"`+live+`","dataDir":"`+wrong+`/data"`).Replace(chainedConf)
	args := &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/pod", IfName: "eth0", StdinData: []byte(conf)}
	if err := cmdDel(args); err != nil {
		t.Errorf("DEL with a state file of a daemon that answers: %v, want success", err)
	}
}

// TestDelConfigNoLongerParses: ADD declares the VIF and records it. A
// DEL whose configuration no longer parses ("vlan":"10", a string, as a
// typo leaves it) frees the VIF from the record, succeeds, and leaves no
// record. A second such DEL succeeds with nothing to free.
func TestDelConfigNoLongerParses(t *testing.T) {
	nstest.Require(t)
	dir := t.TempDir()
	d := serve(t, dir)
	args := podArgs(dir)
	podNS(t, args)
	if _, err := quiet(t, func() error { return cmdAdd(args) }); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(dir, "data", "ib", "c1:eth0")
	if b, err := os.ReadFile(record); err != nil || !strings.Contains(string(b), `"mac":"0a:58:0a:4d:00:32","vlan":10`) {
		t.Fatalf("record after ADD: %s (%v), want the MAC on VLAN 10", b, err)
	}
	args.StdinData = []byte(strings.Replace(string(args.StdinData), `"vlan":10`, `"vlan":"10"`, 1))
	if _, err := ParseConf(args.StdinData); err == nil {
		t.Fatal("the mistyped configuration parses")
	}
	for i := range 2 {
		if err := cmdDel(args); err != nil {
			t.Errorf("DEL %d with a configuration that no longer parses: %v, want success", i+1, err)
		}
		if got := d.VIFs(); len(got) != 0 {
			t.Errorf("after DEL %d the daemon holds %v, want nothing", i+1, got)
		}
		if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after DEL %d the record is still there (%v)", i+1, err)
		}
	}
}

// gcConf is the GC request's configuration for network name on the
// daemon in dir, the valid attachments given.
func gcConf(dir, name, valid string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"eipoib","tap":"eib1","socketDir":%q,"dataDir":%q,"vlan":10,"cni.dev/valid-attachments":%s}`,
		name, dir, dir+"/data", valid))
}

// TestGC: two pods are ADDed on network "ib". GC of another network
// frees nothing of it. GC with the first pod as the only valid
// attachment frees the second's VIF and keeps the first's. GC with no
// valid attachment frees the first's too. Each record goes with its VIF.
func TestGC(t *testing.T) {
	nstest.Require(t)
	dir := t.TempDir()
	d := serve(t, dir)
	p1, p2 := podArgs(dir), podArgs(dir)
	p2.ContainerID = "c2"
	p2.StdinData = []byte(strings.Replace(string(p2.StdinData), "0a:58:0a:4d:00:32", "0a:58:0a:4d:00:33", 1))
	podNS(t, p1)
	podNS(t, p2, "0a:58:0a:4d:00:33")
	for _, a := range []*skel.CmdArgs{p1, p2} {
		if _, err := quiet(t, func() error { return cmdAdd(a) }); err != nil {
			t.Fatal(err)
		}
	}
	vif := func(mac string) ctl.VIF { return ctl.VIF{MAC: mac, VLAN: 10} }
	for _, step := range []struct {
		name, valid string
		want        []ctl.VIF
	}{
		{"other", `[]`, []ctl.VIF{vif("0a:58:0a:4d:00:32"), vif("0a:58:0a:4d:00:33")}},
		{"ib", `[{"containerID":"c1","ifname":"eth0"}]`, []ctl.VIF{vif("0a:58:0a:4d:00:32")}},
		{"ib", `[]`, nil},
	} {
		if err := cmdGC(&skel.CmdArgs{StdinData: gcConf(dir, step.name, step.valid)}); err != nil {
			t.Fatalf("GC of %s, valid %s: %v", step.name, step.valid, err)
		}
		got := d.VIFs()
		slices.SortFunc(got, func(a, b ctl.VIF) int { return strings.Compare(a.MAC, b.MAC) })
		if !slices.Equal(got, step.want) {
			t.Errorf("after GC of %s, valid %s, the daemon holds %v, want %v", step.name, step.valid, got, step.want)
		}
		records, _ := filepath.Glob(filepath.Join(dir, "data", "ib", "*"))
		if len(records) != len(step.want) {
			t.Errorf("after GC of %s, valid %s, records %v, want %d", step.name, step.valid, records, len(step.want))
		}
	}
}

// TestStatus: STATUS fails with code 50 while nothing answers on the
// control socket and while the daemon's fabric port is down, and
// succeeds once it is up.
func TestStatus(t *testing.T) {
	nstest.Require(t)
	dir := t.TempDir()
	args := &skel.CmdArgs{StdinData: gcConf(dir, "ib", `[]`)}
	var ce *types.Error
	want := "eipoibd control socket " + filepath.Join(dir, "eib1.sock") + ": no such file or directory: is eipoibd running for eib1?"
	if err := cmdStatus(args); !errors.As(err, &ce) || ce.Code != ErrNotAvailable || ce.Msg != want {
		t.Errorf("STATUS without a daemon: %v, want code 50 %q", err, want)
	}
	d := serve(t, dir)
	d.mu.Lock()
	d.down = true
	d.mu.Unlock()
	want = "eipoibd eib1 is not ready: its fabric port (sim veth0) is down"
	if err := cmdStatus(args); !errors.As(err, &ce) || ce.Code != ErrNotAvailable || ce.Msg != want {
		t.Errorf("STATUS with the port down: %v, want code 50 %q", err, want)
	}
	d.mu.Lock()
	d.down = false
	d.mu.Unlock()
	if err := cmdStatus(args); err != nil {
		t.Errorf("STATUS with the port up: %v", err)
	}
}

// sharedPods are the arguments of two ADDs of the pod of podArgs that
// declare one VIF: the pod re-created with its MAC under a new
// container ID (c2) while the first's (c1) DEL is still to come.
func sharedPods(t *testing.T, dir string) (p1, p2 *skel.CmdArgs) {
	t.Helper()
	p1, p2 = podArgs(dir), podArgs(dir)
	p2.ContainerID = "c2"
	podNS(t, p1)
	podNS(t, p2)
	return p1, p2
}

// holds asserts that the daemon holds exactly want.
func holds(t *testing.T, d *fakeDaemon, when string, want ...ctl.VIF) {
	t.Helper()
	got := d.VIFs()
	slices.SortFunc(got, func(a, b ctl.VIF) int { return strings.Compare(a.MAC, b.MAC) })
	if !slices.Equal(got, want) {
		t.Errorf("%s the daemon holds %v, want %v", when, got, want)
	}
}

// TestDelShared: two attachments (c1 and c2) declare the same VIF. DEL
// of c1 keeps it (c2 still declares it) and forgets c1's record, a
// second DEL of c1 succeeds and keeps it too; so does the DEL of an
// attachment without a record (c3, an ADD by a plugin without records:
// the MAC from its prevResult); DEL of c2 frees it, and a second DEL
// of c2 succeeds.
func TestDelShared(t *testing.T) {
	nstest.Require(t)
	dir := t.TempDir()
	d := serve(t, dir)
	p1, p2 := sharedPods(t, dir)
	for _, a := range []*skel.CmdArgs{p1, p2} {
		if _, err := quiet(t, func() error { return cmdAdd(a) }); err != nil {
			t.Fatal(err)
		}
	}
	vif := ctl.VIF{MAC: "0a:58:0a:4d:00:32", VLAN: 10}
	holds(t, d, "after both ADDs", vif)
	for i := range 2 {
		if err := cmdDel(p1); err != nil {
			t.Fatalf("DEL %d of c1: %v", i+1, err)
		}
		holds(t, d, fmt.Sprintf("after DEL %d of c1, c2 declaring the VIF still,", i+1), vif)
		if _, err := os.Stat(filepath.Join(dir, "data", "ib", "c1:eth0")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after DEL %d of c1 its record is still there (%v)", i+1, err)
		}
	}
	p3 := podArgs(dir)
	p3.ContainerID = "c3"
	if err := cmdDel(p3); err != nil {
		t.Fatalf("DEL of c3, not recorded: %v", err)
	}
	holds(t, d, "after DEL of c3, not recorded, c2 declaring the VIF still,", vif)
	for i := range 2 {
		if err := cmdDel(p2); err != nil {
			t.Fatalf("DEL %d of c2: %v", i+1, err)
		}
		holds(t, d, fmt.Sprintf("after DEL %d of c2, the last to declare the VIF,", i+1))
	}
}

// TestGCShared: c1 and c2 on network "ib" and c3 on network "ib2" (the
// same dataDir and daemon) declare the same VIF. GC of "ib" with c2
// valid forgets c1 and keeps the VIF; GC of "ib" with nothing valid
// forgets c2 and keeps it (c3 of "ib2" declares it); GC of "ib2" with
// nothing valid frees it.
func TestGCShared(t *testing.T) {
	nstest.Require(t)
	dir := t.TempDir()
	d := serve(t, dir)
	p1, p2 := sharedPods(t, dir)
	p3 := podArgs(dir)
	p3.ContainerID = "c3"
	p3.StdinData = []byte(strings.Replace(string(p3.StdinData), `"name":"ib"`, `"name":"ib2"`, 1))
	podNS(t, p3)
	for _, a := range []*skel.CmdArgs{p1, p2, p3} {
		if _, err := quiet(t, func() error { return cmdAdd(a) }); err != nil {
			t.Fatal(err)
		}
	}
	vif := ctl.VIF{MAC: "0a:58:0a:4d:00:32", VLAN: 10}
	holds(t, d, "after the three ADDs", vif)
	for _, step := range []struct {
		name, valid string
		want        []ctl.VIF
		left        []string
	}{
		{"ib", `[{"containerID":"c2","ifname":"eth0"}]`, []ctl.VIF{vif}, []string{"ib/c2:eth0", "ib2/c3:eth0"}},
		{"ib", `[]`, []ctl.VIF{vif}, []string{"ib2/c3:eth0"}},
		{"ib2", `[]`, nil, nil},
	} {
		if err := cmdGC(&skel.CmdArgs{StdinData: gcConf(dir, step.name, step.valid)}); err != nil {
			t.Fatalf("GC of %s, valid %s: %v", step.name, step.valid, err)
		}
		holds(t, d, fmt.Sprintf("after GC of %s, valid %s,", step.name, step.valid), step.want...)
		var left []string
		records, _ := filepath.Glob(filepath.Join(dir, "data", "*", "*"))
		for _, r := range records {
			rel, _ := filepath.Rel(filepath.Join(dir, "data"), r)
			left = append(left, rel)
		}
		if !slices.Equal(left, step.left) {
			t.Errorf("after GC of %s, valid %s, records %v, want %v", step.name, step.valid, left, step.left)
		}
	}
}

// TestRecordsLock: while an ADD, DEL or GC holds the records' lock,
// another process's exclusive flock of the dataDir is refused
// (EWOULDBLOCK), and granted once it is released.
func TestRecordsLock(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	unlock, err := records{filepath.Join(dataDir, "ib")}.lock()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("flock of the dataDir while the records are locked: %v, want EWOULDBLOCK", err)
	}
	unlock()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Errorf("flock of the dataDir once the records are unlocked: %v", err)
	}
}

// TestDelNoDataDir: a DEL whose dataDir is not there and cannot be made
// (under a file) finds no record, and, with no daemon and no daemon's
// files, succeeds.
func TestDelNoDataDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	args := podArgs(dir)
	args.StdinData = []byte(strings.Replace(string(args.StdinData), `"dataDir":"`+dir+`/data"`, `"dataDir":"`+file+`/data"`, 1))
	if c, err := ParseConf(args.StdinData); err != nil || c.DataDir != file+"/data" {
		t.Fatalf("configuration: %+v, %v", c, err)
	}
	if err := cmdDel(args); err != nil {
		t.Errorf("DEL with a dataDir under a file: %v, want success", err)
	}
}

// TestAddWrapFailsShared: wrapping an IPAM that fails, ADD frees the
// VIF it declared and forgets it, unless another attachment declares
// it too: with c2 (chained) declaring it, c1's failed ADD leaves it and
// no record of c1; once c2 is deleted, c1's failed ADD frees it.
func TestAddWrapFailsShared(t *testing.T) {
	nstest.Require(t)
	dir := t.TempDir()
	d := serve(t, dir)
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "failipam"), []byte("#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"no address today\"}'\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p1, p2 := sharedPods(t, dir)
	p1.Path = bin
	p1.StdinData = []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ib","type":"bridge","ipam":{"type":"eipoib","tap":"eib1","socketDir":%q,"dataDir":%q,"vlan":10,"ipam":{"type":"failipam"}}}`, dir, dir+"/data"))
	for k, v := range map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p1.ContainerID, "CNI_NETNS": p1.Netns, "CNI_IFNAME": p1.IfName, "CNI_PATH": bin} {
		t.Setenv(k, v)
	}
	if _, err := quiet(t, func() error { return cmdAdd(p2) }); err != nil {
		t.Fatal(err)
	}
	vif := ctl.VIF{MAC: "0a:58:0a:4d:00:32", VLAN: 10}
	record := filepath.Join(dir, "data", "ib", "c1:eth0")
	addFails := func(when string, want ...ctl.VIF) {
		t.Helper()
		_, err := quiet(t, func() error { return cmdAdd(p1) })
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater || ce.Msg != "no address today" {
			t.Fatalf("ADD of c1 %s: %v, want the IPAM's error", when, err)
		}
		holds(t, d, "after c1's failed ADD "+when, want...)
		if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after c1's failed ADD %s its record is still there (%v)", when, err)
		}
	}
	addFails("with c2 declaring the VIF", vif)
	if err := cmdDel(p2); err != nil {
		t.Fatal(err)
	}
	holds(t, d, "after DEL of c2, the VIF's last record,")
	addFails("alone")
}
