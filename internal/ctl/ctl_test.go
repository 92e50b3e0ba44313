package ctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// fakeHandler answers each show with one entry naming the listing,
// refuses the MAC "bad", and captures count lines of "pkt\n".
type fakeHandler struct{ UnimplementedHandler }

func (fakeHandler) Port() Port {
	return Port{Name: "eib0", Backend: "sim", Link: "up", Partitions: []Partition{{VLAN: 0, PKey: "0xffff"}}}
}
func (fakeHandler) VIFs() []VIF {
	return []VIF{{MAC: "02:00:00:00:00:01", VLAN: 10, Origin: "declared"}}
}
func (fakeHandler) Neighbours() []Neigh {
	return []Neigh{{REMAC: "02:00:00:00:00:02", IPs: []string{"10.0.0.2"}}}
}
func (fakeHandler) Groups() []Group {
	return []Group{{MGID: "ff12:401b:ffff::ffff:ffff", Members: []Member{}}}
}
func (fakeHandler) Stats() Stats             { return Stats{"tx_frames": 7} }
func (fakeHandler) FlushNeighbours() Flushed { return Flushed{Flushed: 3} }
func (fakeHandler) AddVIF(r VIFRequest) error {
	if r.MAC == "bad" {
		return errors.New("MAC \"bad\": invalid")
	}
	return nil
}
func (fakeHandler) DelVIF(r VIFRequest) error { return fmt.Errorf("no VIF %s vlan %d", r.MAC, r.VLAN) }

func (fakeHandler) Capture(r CaptureRequest, w io.Writer, gone <-chan struct{}) error {
	for range r.Count {
		if _, err := io.WriteString(w, "pkt\n"); err != nil {
			return err
		}
	}
	return nil
}

func serve(t *testing.T) string {
	t.Helper()
	return serveWith(t, fakeHandler{})
}

// serveWith serves h on a socket of its own until the test ends.
func serveWith(t *testing.T, h Handler) string {
	t.Helper()
	nstest.RequireRoot(t) // the server admits root peers only
	path := filepath.Join(t.TempDir(), "x", "eib0.sock")
	s, err := Listen(path, h)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return path
}

// raw sends one line and returns the reply line.
func raw(t *testing.T, path, line string) Response {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, line)
	b, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no reply to %.40q: %v", line, err)
	}
	var r Response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestServer(t *testing.T) {
	path := serve(t)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v, %v; want a 0600 socket", fi.Mode(), err)
	}
	c := Client{Path: path}
	data, err := c.Show(ShowVIFs)
	if err != nil || string(data) != `[{"mac":"02:00:00:00:00:01","vlan":10,"pkey":"","qpn":"","address":"","origin":"declared","idle_s":0,"tx_packets":0,"tx_bytes":0,"rx_packets":0,"rx_bytes":0}]` {
		t.Fatalf("show vifs: %s, %v", data, err)
	}
	// Each typed call reaches its handler method and decodes its reply.
	if p, err := c.ShowPort(); err != nil || p.Name != "eib0" || p.Link != "up" || len(p.Partitions) != 1 || p.Partitions[0].PKey != "0xffff" {
		t.Errorf("ShowPort: %+v, %v", p, err)
	}
	if v, err := c.ShowVIFs(); err != nil || len(v) != 1 || v[0].VLAN != 10 || v[0].Origin != "declared" {
		t.Errorf("ShowVIFs: %+v, %v", v, err)
	}
	if n, err := c.ShowNeighbours(); err != nil || len(n) != 1 || n[0].IPs[0] != "10.0.0.2" {
		t.Errorf("ShowNeighbours: %+v, %v", n, err)
	}
	if g, err := c.ShowGroups(); err != nil || len(g) != 1 || g[0].MGID != "ff12:401b:ffff::ffff:ffff" {
		t.Errorf("ShowGroups: %+v, %v", g, err)
	}
	if st, err := c.ShowStats(); err != nil || len(st) != 1 || st["tx_frames"] != 7 {
		t.Errorf("ShowStats: %v, %v", st, err)
	}
	if f, err := c.FlushNeighbours(); err != nil || f.Flushed != 3 {
		t.Errorf("FlushNeighbours: %+v, %v", f, err)
	}
	if err := c.AddVIF(VIFRequest{MAC: "02:00:00:00:00:09", VLAN: 4094}); err != nil {
		t.Errorf("AddVIF: %v", err)
	}
	if err := c.AddVIF(VIFRequest{MAC: "bad"}); err == nil || err.Error() != `MAC "bad": invalid` {
		t.Fatalf("refused vif-add: %v", err)
	}
	if err := c.DelVIF(VIFRequest{MAC: "02:00:00:00:00:09", VLAN: 5}); err == nil || err.Error() != "no VIF 02:00:00:00:00:09 vlan 5" {
		t.Errorf("DelVIF reached the handler with %v", err)
	}
	if err := c.AddVIF(VIFRequest{MAC: "02:00:00:00:00:09", VLAN: 4095}); err == nil || err.Error() != "vif-add needs a MAC and a VLAN from 0 to 4094" {
		t.Errorf("AddVIF on VLAN 4095: %v", err)
	}
	for line, want := range map[string]string{
		"garbage\n": "malformed request",
		`{"v":2,"cmd":"show","what":"port"}` + "\n":       "protocol version 2, this daemon speaks 1",
		`{"v":1,"cmd":"reboot"}` + "\n":                   `unknown command "reboot"`,
		`{"v":1,"cmd":"show","what":"all"}` + "\n":        `show "all": want port, vifs, neigh, groups or stats`,
		`{"v":1,"cmd":"show","what":"port","x":1}` + "\n": "malformed request",
		`{"v":1,"cmd":"show","what":"port"} {}` + "\n":    "more than one JSON value",
		strings.Repeat("a", MaxRequest+10) + "\n":         "request longer than 65536 bytes",
	} {
		if r := raw(t, path, line); r.OK || !strings.Contains(r.Error, want) || r.V != Version {
			t.Errorf("%.40q: reply %+v, want an error containing %q", line, r, want)
		}
	}
	// The server still answers after all that.
	if _, err := c.ShowPort(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := c.Capture(CaptureRequest{Side: SideFabric, Count: 3}, &buf); err != nil || buf.String() != "pkt\npkt\npkt\n" {
		t.Fatalf("capture: %q, %v", buf.String(), err)
	}
	// A second server on the same path is refused while the first runs.
	if _, err := Listen(path, fakeHandler{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Listen: %v", err)
	}
}

// TestUnimplementedHandler: a handler that implements nothing itself
// answers the listings empty and refuses the other commands, each
// refusal naming its command, over the socket.
func TestUnimplementedHandler(t *testing.T) {
	c := Client{Path: serveWith(t, struct{ UnimplementedHandler }{})}
	for what, want := range map[string]string{
		ShowPort:   `{"name":"","backend":"","device":"","gid":"","ib_mtu":0,"ipoib_mtu":0,"link":"","partitions":null}`,
		ShowVIFs:   "null",
		ShowNeigh:  "null",
		ShowGroups: "null",
		ShowStats:  "null",
	} {
		if data, err := c.Show(what); err != nil || string(data) != want {
			t.Errorf("show %s: %s, %v; want %s", what, data, err, want)
		}
	}
	if f, err := c.FlushNeighbours(); err != nil || f != (Flushed{}) {
		t.Errorf("neigh-flush: %+v, %v; want nothing flushed", f, err)
	}
	v := VIFRequest{MAC: "02:00:00:00:00:01"}
	if err := c.AddVIF(v); err == nil || err.Error() != "vif-add: not implemented by this daemon" {
		t.Errorf("vif-add: %v", err)
	}
	if err := c.DelVIF(v); err == nil || err.Error() != "vif-del: not implemented by this daemon" {
		t.Errorf("vif-del: %v", err)
	}
	var buf bytes.Buffer
	if err := c.Capture(CaptureRequest{Side: SideTAP, Count: 1}, &buf); err != nil || buf.Len() != 0 {
		t.Errorf("capture: %d bytes, %v; want none", buf.Len(), err)
	}
	if err := (UnimplementedHandler{}).Capture(CaptureRequest{}, &buf, nil); !errors.Is(err, ErrUnimplemented) || err.Error() != "capture: not implemented by this daemon" {
		t.Errorf("Capture: %v", err)
	}
}

// TestTableNames: the wire names the table gives the CLI start with
// the released ones, in order: a rename or a removal fails, a command
// added at the end of the table does not.
func TestTableNames(t *testing.T) {
	if got, want := Commands(), []string{"show", "vif-add", "vif-del", "neigh-flush", "capture"}; len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Errorf("Commands() = %q, want it to start with %q", got, want)
	}
	if got, want := Listings(), []string{"port", "vifs", "neigh", "groups", "stats"}; len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Errorf("Listings() = %q, want it to start with %q", got, want)
	}
}

// TestNoDaemon: a request with no socket at the path, and one to a
// socket nobody listens on, fail with a NoDaemonError that says so and
// keeps the system's reason (ENOENT, ECONNREFUSED). One to a daemon that
// takes the connection and closes it without a reply (one stopping)
// fails with a NoDaemonError, Connected, saying "no reply".
func TestNoDaemon(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: stale}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd) // bound, never listened on: what a crash leaves
	for _, c := range []struct {
		path  string
		errno unix.Errno
	}{{filepath.Join(dir, "eib0.sock"), unix.ENOENT}, {stale, unix.ECONNREFUSED}} {
		_, err := Client{Path: c.path}.ShowPort()
		var de *NoDaemonError
		if !errors.As(err, &de) || de.Path != c.path || de.Connected || !errors.Is(err, c.errno) || !strings.Contains(err.Error(), "no eipoibd at "+c.path) {
			t.Fatalf("%s: %v, want a NoDaemonError for it, %v, saying \"no eipoibd at\"", c.path, err, c.errno)
		}
	}
	closing := filepath.Join(dir, "closing.sock")
	ln, err := net.Listen("unix", closing)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			bufio.NewReader(c).ReadBytes('\n')
			c.Close()
		}
	}()
	_, err = Client{Path: closing}.ShowPort()
	var de *NoDaemonError
	if !errors.As(err, &de) || de.Path != closing || !de.Connected || !strings.Contains(err.Error(), "no reply from eipoibd at "+closing) {
		t.Fatalf("a daemon closing without a reply: %v, want a NoDaemonError, Connected, saying \"no reply from eipoibd at\"", err)
	}
}

func TestAllowPeer(t *testing.T) {
	if err := AllowPeer(0); err != nil {
		t.Fatal(err)
	}
	if err := AllowPeer(1000); err == nil || err.Error() != "permission denied: uid 1000 is not root" {
		t.Fatalf("uid 1000: %v", err)
	}
}

func TestParseRequest(t *testing.T) {
	good := []string{
		`{"v":1,"cmd":"show","what":"stats"}`, `{"v":1,"cmd":"vif-add","mac":"02:00:00:00:00:01","vlan":10}`,
		`{"v":1,"cmd":"neigh-flush"}`, `{"v":1,"cmd":"capture","side":"tap","count":5}`,
		// Only show reads what.
		`{"v":1,"cmd":"neigh-flush","what":"x"}`, `{"v":1,"cmd":"vif-del","mac":"x","what":"port"}`,
	}
	for _, l := range good {
		if _, err := ParseRequest([]byte(l)); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
	bad := []string{
		`{"v":1,"cmd":"vif-add","vlan":10}`, `{"v":1,"cmd":"vif-del","mac":"x","vlan":4095}`,
		`{"v":1,"cmd":"capture","side":"both"}`, `{"v":1,"cmd":"capture","side":"tap","count":-1}`, `[]`, ``,
	}
	for _, l := range bad {
		if _, err := ParseRequest([]byte(l)); err == nil {
			t.Errorf("%s: accepted", l)
		}
	}
}

// FuzzParseRequest: any line is parsed or refused without a panic, and
// what is accepted is one of the commands with valid arguments.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{`{"v":1}`, `garbage`, `{"v":1,"cmd":"show","what":"port"}{}`, `{"v":1,"cmd":"vif-add","vlan":-1,"mac":"x"}`} {
		f.Add([]byte(s))
	}
	// Every command, as the Client writes it.
	for _, r := range []Request{
		{Cmd: CmdShow, What: ShowPort}, {Cmd: CmdShow, What: ShowVIFs}, {Cmd: CmdShow, What: ShowNeigh}, {Cmd: CmdShow, What: ShowGroups},
		{Cmd: CmdShow, What: ShowStats}, {Cmd: CmdVIFAdd, MAC: "02:00:00:00:00:01", VLAN: 10}, {Cmd: CmdVIFDel, MAC: "02:00:00:00:00:01"},
		{Cmd: CmdNeighFlush}, {Cmd: CmdCapture, Side: SideFabric, Count: 10}, {Cmd: CmdCapture, Side: SideTAP},
	} {
		r.V = Version
		b, _ := json.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		switch {
		case r.V != Version:
			t.Fatalf("version %d accepted", r.V)
		case r.Cmd == CmdCapture && (r.Side != SideFabric && r.Side != SideTAP || r.Count < 0):
			t.Fatalf("bad capture accepted: %+v", r)
		case (r.Cmd == CmdVIFAdd || r.Cmd == CmdVIFDel) && (r.MAC == "" || r.VLAN < 0 || r.VLAN > 4094):
			t.Fatalf("bad vif accepted: %+v", r)
		case r.Cmd == CmdShow && !slices.Contains([]string{ShowPort, ShowVIFs, ShowNeigh, ShowGroups, ShowStats}, r.What):
			t.Fatalf("bad show accepted: %+v", r)
		case !slices.Contains([]string{CmdShow, CmdVIFAdd, CmdVIFDel, CmdNeighFlush, CmdCapture}, r.Cmd):
			t.Fatalf("unknown command accepted: %+v", r)
		}
	})
}
