package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b := make([]byte, 256)
	n, err := c.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

func TestNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv("NOTIFY_SOCKET", path)
	if ok, err := Notify("READY=1\nSTATUS=up"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got := recv(t, c); got != "READY=1\nSTATUS=up" {
		t.Fatalf("%q", got)
	}
	// An abstract socket, named with a leading @.
	name := "eipoibd-test-" + strconv.Itoa(os.Getpid())
	a := listen(t, "\x00"+name)
	t.Setenv("NOTIFY_SOCKET", "@"+name)
	if ok, err := Notify("WATCHDOG=1"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got := recv(t, a); got != "WATCHDOG=1" {
		t.Fatalf("%q", got)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if ok, err := Notify("READY=1"); ok || err != nil {
		t.Fatal("without a socket:", ok, err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "none"))
	if _, err := Notify("READY=1"); err == nil {
		t.Fatal("a missing socket is no error")
	}
}

func TestWatchdogInterval(t *testing.T) {
	t.Setenv("WATCHDOG_PID", "")
	t.Setenv("WATCHDOG_USEC", "30000000")
	if d, ok := WatchdogInterval(); !ok || d != 30*time.Second {
		t.Fatal(d, ok)
	}
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()+1))
	if _, ok := WatchdogInterval(); ok {
		t.Fatal("another process's watchdog taken")
	}
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	for _, bad := range []string{"", "0", "-5", "soon"} {
		t.Setenv("WATCHDOG_USEC", bad)
		if _, ok := WatchdogInterval(); ok {
			t.Errorf("WATCHDOG_USEC=%q taken", bad)
		}
	}
}
