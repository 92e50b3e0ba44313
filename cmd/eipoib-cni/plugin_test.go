package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// fakeDaemon answers vif-add and vif-del as eipoibd does, keeping the
// declared VIFs; refuse makes vif-add fail with that message.
type fakeDaemon struct {
	mu     sync.Mutex
	vifs   map[ctl.VIFRequest]bool
	refuse string
}

func (d *fakeDaemon) Port() ctl.Port               { return ctl.Port{} }
func (d *fakeDaemon) Neighbours() []ctl.Neigh      { return nil }
func (d *fakeDaemon) Groups() []ctl.Group          { return nil }
func (d *fakeDaemon) Stats() ctl.Stats             { return nil }
func (d *fakeDaemon) FlushNeighbours() ctl.Flushed { return ctl.Flushed{} }
func (d *fakeDaemon) Capture(ctl.CaptureRequest, io.Writer, <-chan struct{}) error {
	return errors.New("no capture")
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
// chainedConf, its eipoibd's control socket and state file in dir.
func podArgs(dir string) *skel.CmdArgs {
	conf := strings.NewReplacer(`"/run/x"`, `"`+dir+`"`, `"/run/s/"`, `"`+dir+`"`).Replace(chainedConf)
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/pod", IfName: "eth0", StdinData: []byte(conf)}
}

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
// the configured VLAN and prints the prevResult on; CHECK passes, and
// fails with code 101 once the VIF is gone or on another VLAN (naming
// it); DEL frees it, and a
// second DEL (nothing left) succeeds too; a refusal is a code 100 error
// quoting the daemon.
func TestAddDel(t *testing.T) {
	nstest.Require(t) // the control socket serves root peers only
	dir := t.TempDir()
	d := serve(t, dir)
	args := podArgs(dir)
	out, err := quiet(t, func() error { return cmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	want := ctl.VIFRequest{MAC: "0a:58:0a:4d:00:32", VLAN: 10}
	if got := d.VIFs(); len(got) != 1 || got[0] != (ctl.VIF{MAC: want.MAC, VLAN: uint16(want.VLAN)}) {
		t.Errorf("after ADD the daemon holds %v, want %v", got, want)
	}
	if !strings.Contains(out, `"0a:58:0a:4d:00:32"`) || !strings.Contains(out, `"10.77.0.50/24"`) {
		t.Errorf("ADD printed %s, want the prevResult passed on", out)
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
}

// TestNoDaemon: with no socket, a stale one nothing listens on, or a
// daemon that takes the connection and closes it without a reply (one
// stopping), ADD fails with "try again later" (code 11) and a message
// naming the socket, the system's error and the question to ask.
func TestNoDaemon(t *testing.T) {
	dir := t.TempDir()
	args := podArgs(dir)
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

// TestDelNoDaemon: DEL while nothing answers on the control socket.
// With neither the daemon's control socket nor its state file there,
// the daemon is gone with its VIFs: DEL succeeds. With a stale socket (a
// crash), the state file (a stop with --persist: the VIFs come back at
// the next start) or both, DEL fails with "try again later" (code 11):
// the system's error, the pod's MAC and VLAN, and the files to remove if
// that eipoibd is gone for good; once they are removed DEL succeeds.
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
