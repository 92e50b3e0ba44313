package netns

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSystemdNotify: run as systemd runs a Type=notify service with
// WatchdogSec=2s, the daemon sends READY=1 (with its status) once eib0
// exists. Then it sends WATCHDOG=1 and nothing else, each within the
// watchdog's 2 s; it sends one every second, and the test does not time
// it closer. It sends STOPPING=1 when it is told to stop.
func TestSystemdNotify(t *testing.T) {
	tp := newTopo(t, 2, false)
	h := tp.hvs[0]
	h.stop(t, true)
	sock := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs := make(chan string, 64)
	go func() {
		b := make([]byte, 512)
		for {
			n, err := c.Read(b)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(b[:n])
		}
	}()
	next := func(within time.Duration) string {
		select {
		case m := <-msgs:
			return m
		case <-time.After(within):
			return ""
		}
	}
	h.env = []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=2000000"}
	h.start(t)
	ready := next(5 * time.Second)
	if !strings.HasPrefix(ready, "READY=1\nSTATUS=eib0 on sim ul1, GID fe80:") {
		t.Fatalf("first notification %q, want READY=1 with a status", ready)
	}
	if _, err := shErr(in(h.ns, "ip", "link", "show", "eib0")...); err != nil {
		t.Fatalf("READY=1 but no eib0: %v", err)
	}
	start := time.Now()
	for i := 0; i < 2; i++ {
		if m := next(2 * time.Second); m != "WATCHDOG=1" {
			t.Fatalf("notification %q after %v, want WATCHDOG=1 every second", m, time.Since(start))
		}
	}
	h.stop(t, true)
	for {
		m := next(3 * time.Second)
		if m == "STOPPING=1" {
			break
		}
		if m != "WATCHDOG=1" {
			t.Fatalf("notification %q on SIGTERM, want STOPPING=1", m)
		}
	}
}
