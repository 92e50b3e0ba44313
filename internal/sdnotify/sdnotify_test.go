package sdnotify

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/testutil"
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
	c.SetReadDeadline(time.Now().Add(testutil.Settle))
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

// TestRemoveFiles: RemoveFiles and RemoveFilesAt send FDSTOREREMOVE=1
// with the name, to $NOTIFY_SOCKET and to the socket given; without
// $NOTIFY_SOCKET RemoveFiles sends nothing and is no error.
func TestRemoveFiles(t *testing.T) {
	dir := t.TempDir()
	c := listen(t, filepath.Join(dir, "notify"))
	other := listen(t, filepath.Join(dir, "keeper"))
	t.Setenv("NOTIFY_SOCKET", filepath.Join(dir, "notify"))
	if err := RemoveFiles("tap-eib0"); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, c); got != "FDSTOREREMOVE=1\nFDNAME=tap-eib0" {
		t.Fatalf("systemd heard %q", got)
	}
	if err := RemoveFilesAt(filepath.Join(dir, "keeper"), "tap-eib1"); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, other); got != "FDSTOREREMOVE=1\nFDNAME=tap-eib1" {
		t.Fatalf("the other store heard %q", got)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := RemoveFiles("tap-eib0"); err != nil {
		t.Fatal("without a socket:", err)
	}
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("without a socket, systemd's still heard %d bytes", n)
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

// TestStoreFiles: the store first hears FDSTOREREMOVE=1 for the name,
// then FDSTORE=1 with the files, which arrive as descriptors of the same
// open files (a byte written through one reaches the pipe's reader), and
// a non-blocking file stays non-blocking.
func TestStoreFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv("NOTIFY_SOCKET", path)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if ok, err := StoreFiles("tap-eib0", []*os.File{w}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got := recv(t, c); got != "FDSTOREREMOVE=1\nFDNAME=tap-eib0" {
		t.Fatalf("first message %q", got)
	}
	got, fds := recvFDs(t, c)
	if got != "FDSTORE=1\nFDNAME=tap-eib0" || len(fds) != 1 {
		t.Fatalf("second message %q with %d descriptors", got, len(fds))
	}
	stored := os.NewFile(uintptr(fds[0]), "stored")
	defer stored.Close()
	if _, err := stored.Write([]byte{42}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := r.Read(b); err != nil || b[0] != 42 {
		t.Fatalf("read %v through the pipe, %v; want 42", b, err)
	}
	if fl, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("the pipe's flags %#x (%v): no longer non-blocking", fl, err)
	}
	for _, bad := range []string{"", "a:b", "a b", string(make([]byte, 256))} {
		if _, err := StoreFiles(bad, []*os.File{w}); err == nil {
			t.Errorf("name %q taken", bad)
		}
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if ok, err := StoreFiles("tap-eib0", []*os.File{w}); ok || err != nil {
		t.Fatal("without a socket:", ok, err)
	}
}

// TestStoreFilesMany: more files than one SCM_RIGHTS message carries
// (SCM_MAX_FD, 253) go in several FDSTORE=1 messages of at most 253
// descriptors each, all of them arriving.
func TestStoreFilesMany(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv("NOTIFY_SOCKET", path)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := make([]*os.File, 300)
	for i := range files {
		files[i] = f
	}
	if ok, err := StoreFiles("tap-eib0", files); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got := recv(t, c); got != "FDSTOREREMOVE=1\nFDNAME=tap-eib0" {
		t.Fatalf("first message %q", got)
	}
	for _, want := range []int{253, 47} {
		got, fds := recvFDs(t, c)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if got != "FDSTORE=1\nFDNAME=tap-eib0" || len(fds) != want {
			t.Fatalf("message %q with %d descriptors, want FDSTORE=1 with %d", got, len(fds), want)
		}
	}
}

// recvFDs reads one message from c with the descriptors it carries.
func recvFDs(t *testing.T, c *net.UnixConn) (string, []int) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(testutil.Settle))
	b, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4*MaxFDsPerMessage))
	n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		t.Fatal("descriptors cut off: more than SCM_MAX_FD in one message")
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for i := range msgs {
		more, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, more...)
	}
	return string(b[:n]), fds
}

// TestListenFDs runs this test binary again with two pipes as
// descriptors 3 and 4, as systemd passes them, and checks what
// ListenFDs makes of the environment there (see listenHelper).
func TestListenFDs(t *testing.T) {
	for _, c := range []struct {
		name, env, want string
	}{
		{"named", "LISTEN_FDS=2 LISTEN_FDNAMES=tap-eib0:tap-eib0", "tap-eib0=[3 4] cloexec unset"},
		{"unnamed", "LISTEN_FDS=2", "unknown=[3 4] cloexec unset"},
		{"another process's", "LISTEN_FDS=2 LISTEN_PID=1", "none unset"},
		{"none", "", "none unset"},
		{"bad count", "LISTEN_FDS=two", `error: sdnotify: LISTEN_FDS="two": want a count of file descriptors`},
		// Wrong names or a closed descriptor fail, but leave none of
		// the passed descriptors inheritable.
		{"names and count differ", "LISTEN_FDS=2 LISTEN_FDNAMES=a", "error: sdnotify: LISTEN_FDNAMES names 1 file descriptors, LISTEN_FDS=2 (3 4 cloexec)"},
		// The child's runtime holds a few descriptors past 4; the
		// first closed one fails.
		{"closed descriptor", "LISTEN_FDS=200", "error: sdnotify: passed file descriptor * bad file descriptor (3 4 cloexec)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestListenHelper$")
			cmd.Env = append(os.Environ(), "SDNOTIFY_LISTEN_HELPER=1")
			if c.env != "" {
				cmd.Env = append(cmd.Env, strings.Fields(c.env)...)
			}
			var files []*os.File
			for i := 0; i < 2; i++ {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer w.Close()
				files = append(files, r)
			}
			cmd.ExtraFiles = files
			out, err := cmd.CombinedOutput()
			got, _, _ := strings.Cut(string(out), "\n")
			if pre, post, ok := strings.Cut(c.want, "*"); ok && strings.HasPrefix(got, pre) && strings.HasSuffix(got, post) {
				got = c.want
			}
			if err != nil || got != c.want {
				t.Fatalf("ListenFDs: %q (%v), want %q\n%s", got, err, c.want, out)
			}
		})
	}
}

// TestListenHelper is the child of TestListenFDs: it claims
// $LISTEN_PID (unless that names PID 1), calls ListenFDs and prints what
// it found.
func TestListenHelper(t *testing.T) {
	if os.Getenv("SDNOTIFY_LISTEN_HELPER") != "1" {
		t.Skip("the child process of TestListenFDs")
	}
	if os.Getenv("LISTEN_PID") != "1" {
		os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	}
	fds, err := ListenFDs()
	var out string
	switch {
	case err != nil:
		out = "error: " + err.Error()
		if cloexec(3) && cloexec(4) {
			out += " (3 4 cloexec)"
		}
	case len(fds) == 0:
		out = "none"
	default:
		for name, list := range fds {
			out = fmt.Sprintf("%s=%v", name, list)
			for _, fd := range list {
				if !cloexec(fd) {
					out += " inheritable"
				}
			}
			out += " cloexec"
		}
	}
	if err == nil {
		out += " unset"
		for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
			if _, ok := os.LookupEnv(k); ok {
				out = strings.TrimSuffix(out, " unset") + " " + k + " left"
			}
		}
	}
	fmt.Println(out)
}

// cloexec reports whether descriptor fd is open and close-on-exec.
func cloexec(fd int) bool {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil && fl&unix.FD_CLOEXEC != 0
}
