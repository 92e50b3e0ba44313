package ctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHandler answers show with what it was asked and captures count
// lines of "pkt\n".
type fakeHandler struct{}

func (fakeHandler) Do(r Request) (any, error) {
	if r.Cmd == "vif-add" && r.MAC == "bad" {
		return nil, errors.New("MAC \"bad\": invalid")
	}
	return map[string]string{"cmd": r.Cmd, "what": r.What}, nil
}

func (fakeHandler) Capture(r Request, w io.Writer, gone <-chan struct{}) error {
	for range r.Count {
		if _, err := io.WriteString(w, "pkt\n"); err != nil {
			return err
		}
	}
	return nil
}

func serve(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the server admits root peers only")
	}
	path := filepath.Join(t.TempDir(), "x", "eib0.sock")
	s, err := Listen(path, fakeHandler{})
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
	data, err := Do(path, Request{Cmd: "show", What: "vifs"})
	if err != nil || string(data) != `{"cmd":"show","what":"vifs"}` {
		t.Fatalf("show vifs: %s, %v", data, err)
	}
	if _, err := Do(path, Request{Cmd: "vif-add", MAC: "bad"}); err == nil || err.Error() != `MAC "bad": invalid` {
		t.Fatalf("refused vif-add: %v", err)
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
	if _, err := Do(path, Request{Cmd: "show", What: "port"}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Stream(path, Request{Cmd: "capture", Side: "fabric", Count: 3}, &buf); err != nil || buf.String() != "pkt\npkt\npkt\n" {
		t.Fatalf("capture: %q, %v", buf.String(), err)
	}
	// A second server on the same path is refused while the first runs.
	if _, err := Listen(path, fakeHandler{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Listen: %v", err)
	}
}

func TestNoDaemon(t *testing.T) {
	_, err := Do(filepath.Join(t.TempDir(), "eib0.sock"), Request{Cmd: "show", What: "port"})
	if err == nil || !strings.Contains(err.Error(), "no eipoibd at") {
		t.Fatalf("%v", err)
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
	for _, s := range []string{`{"v":1,"cmd":"show","what":"vifs"}`, `{"v":1,"cmd":"vif-add","mac":"02:00:00:00:00:01"}`,
		`{"v":1,"cmd":"capture","side":"fabric","count":10}`, `{"v":1}`, `garbage`, `{"v":1,"cmd":"show","what":"port"}{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		switch {
		case r.V != Version:
			t.Fatalf("version %d accepted", r.V)
		case r.Cmd == "capture" && (r.Side != "fabric" && r.Side != "tap" || r.Count < 0):
			t.Fatalf("bad capture accepted: %+v", r)
		case (r.Cmd == "vif-add" || r.Cmd == "vif-del") && (r.MAC == "" || r.VLAN < 0 || r.VLAN > 4094):
			t.Fatalf("bad vif accepted: %+v", r)
		}
	})
}
