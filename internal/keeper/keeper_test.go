package keeper

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/sdnotify"
	"github.com/eipoib/eipoibd/internal/testutil"
)

// start runs a keeper on a socket in a temporary directory and stops it
// when the test ends.
func start(t *testing.T, maxFDs, maxNames int) (*Keeper, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keeper.sock")
	k, err := Listen(Config{Socket: path, MaxFDs: maxFDs, MaxNames: maxNames})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- k.Serve() }()
	t.Cleanup(func() {
		k.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return k, path
}

// pipes returns n pipes' write ends, and their read ends.
func pipes(t *testing.T, n int) (w, r []*os.File) {
	t.Helper()
	for range n {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pr.Close(); pw.Close() })
		w, r = append(w, pw), append(r, pr)
	}
	return w, r
}

// held waits until the keeper holds exactly want (names to counts).
func held(t *testing.T, k *Keeper, want map[string]int) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("the keeper to hold %v", want), func() bool { return fmt.Sprint(k.Held()) == fmt.Sprint(want) })
}

// TestStoreTakeRemove: descriptors stored as sd_notify stores them come
// back from Take as descriptors of the same open files: a byte written
// through a returned one reaches the pipe's reader. They come back as
// often as asked, as the keeper keeps its copies. Two names stay apart,
// and FDSTOREREMOVE=1 lets go of one name only.
func TestStoreTakeRemove(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the keeper's Close
	k, path := start(t, DefaultMaxFDs, DefaultMaxNames)
	w, r := pipes(t, 3)
	if err := sdnotify.StoreFilesAt(path, "tap-eib0", w[:2]); err != nil {
		t.Fatal(err)
	}
	if err := sdnotify.StoreFilesAt(path, "tap-eib1", w[2:]); err != nil {
		t.Fatal(err)
	}
	held(t, k, map[string]int{"tap-eib0": 2, "tap-eib1": 1})
	for round := range 2 {
		fds, err := Take(path, "tap-eib0", testutil.Settle)
		if err != nil || len(fds) != 2 {
			t.Fatalf("round %d: Take: %v, %v", round, fds, err)
		}
		for i, fd := range fds {
			if _, err := unix.Write(fd, []byte{byte(10*round + i)}); err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			b := make([]byte, 1)
			if _, err := r[i].Read(b); err != nil || b[0] != byte(10*round+i) {
				t.Fatalf("round %d: pipe %d read %v, %v", round, i, b, err)
			}
		}
	}
	if err := sdnotify.Send(path, "FDSTOREREMOVE=1\nFDNAME=tap-eib0", nil); err != nil {
		t.Fatal(err)
	}
	held(t, k, map[string]int{"tap-eib1": 1})
	if fds, err := Take(path, "tap-eib0", testutil.Settle); err != nil || len(fds) != 0 {
		t.Fatalf("Take of a removed name: %v, %v", fds, err)
	}
	c := k.Counters()
	if c["stored"] != 3 || c["returned"] != 4 || c["removed"] != 2 {
		t.Errorf("counters %v: want 3 stored, 4 returned, 2 removed", c)
	}
}

// TestTakeUnreachable: without a keeper, Take fails at once and says
// where it looked.
func TestTakeUnreachable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keeper.sock")
	if _, err := Take(path, "tap-eib0", time.Second); err == nil {
		t.Fatal("Take without a keeper succeeded")
	}
	// A socket left by a keeper that is gone refuses too.
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := Take(path, "tap-eib0", time.Second); err == nil {
		t.Fatal("Take from a stale socket succeeded")
	}
	// and a keeper takes the stale socket over.
	k, err := Listen(Config{Socket: path, MaxFDs: 1, MaxNames: 1})
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	go k.Serve()
	defer k.Close()
	if _, err := Listen(Config{Socket: path, MaxFDs: 1, MaxNames: 1}); err == nil {
		t.Fatal("a second keeper took a live keeper's socket")
	}
	if fds, err := Take(path, "tap-eib0", testutil.Settle); err != nil || len(fds) != 0 {
		t.Fatalf("Take from the new keeper: %v, %v", fds, err)
	}
}

// TestLimits: descriptors past --max-fds and names past --max-names are
// closed and counted, not held.
func TestLimits(t *testing.T) {
	k, path := start(t, 3, 2)
	w, r := pipes(t, 5)
	for _, s := range []struct {
		name  string
		files []*os.File
	}{{"a", w[:2]}, {"b", w[2:4]}, {"c", w[4:]}} {
		if err := sdnotify.Send(path, "FDSTORE=1\nFDNAME="+s.name, s.files); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "two refusals", func() bool { return k.Counters()["over_limit"] == 2 })
	held(t, k, map[string]int{"a": 2, "b": 1})
	if fds, err := Take(path, "b", testutil.Settle); err != nil || len(fds) != 1 {
		t.Fatalf("Take b: %v, %v", fds, err)
	} else {
		closeFDs(fds)
	}
	// A refused descriptor was closed: only the keeper's copy of "b"'s
	// second pipe (past --max-fds) or of "c"'s (past --max-names) would
	// keep it open. Its reader sees end of file once the test closes its
	// own; the keeper closes refused ones just after counting them.
	for _, i := range []int{3, 4} {
		w[i].Close()
		r[i].SetReadDeadline(time.Now().Add(testutil.Settle))
		if n, err := r[i].Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("pipe %d, refused: read %d, %v; want end of file (the keeper closed its copy)", i, n, err)
		}
	}
}

// request returns a request's control data as the kernel delivers it
// to the keeper: fds, and this process's credentials.
func request(fds ...int) []byte {
	cred := unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}
	return append(unix.UnixRights(fds...), unix.UnixCredentials(&cred)...)
}

// TestClosedTakesNothing: a request Serve read just before Close and
// handles after it takes nothing. A store's descriptors are handed back
// to be closed, none held or added to the closed epoll set. A get
// answers nothing: its socket is closed without a message.
func TestClosedTakesNothing(t *testing.T) {
	k, _ := start(t, DefaultMaxFDs, DefaultMaxNames)
	w, r := pipes(t, 1)
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(w[0].Fd()))
	if err != nil {
		t.Fatal(err)
	}
	left := k.handle([]byte("FDSTORE=1\nFDNAME=late"), request(fd), 0)
	closeFDs(left)
	if len(left) != 1 || len(k.Held()) != 0 {
		t.Errorf("store after Close: handed back %v of [%d], held %v; want all handed back, none held", left, fd, k.Held())
	}
	w[0].Close()
	r[0].SetReadDeadline(time.Now().Add(testutil.Settle))
	if n, err := r[0].Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("pipe stored after Close: read %d, %v; want end of file", n, err)
	}

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	closeFDs(k.handle([]byte("FDGET=1\nFDNAME=late"), request(pair[1]), 0))
	if n, _, _, _, err := unix.Recvmsg(pair[0], make([]byte, 64), nil, unix.MSG_DONTWAIT); n != 0 || err != nil {
		t.Errorf("get after Close: read %d bytes, %v; want the socket closed without an answer", n, err)
	}
}

// TestRemoveWinsOverStore: a message with FDSTOREREMOVE=1 and FDSTORE=1
// only removes, as systemd's service_notify_message does: what the name
// held goes, the descriptors passed along are closed, counted as
// unexpected_fds, and the log says why without claiming FDSTORE=1 was
// missing.
func TestRemoveWinsOverStore(t *testing.T) {
	// The keeper logs under its lock, which Counters and Held take: the
	// log is read after them, and before Close logs again.
	var logs bytes.Buffer
	path := filepath.Join(t.TempDir(), "keeper.sock")
	k, err := Listen(Config{Socket: path, MaxFDs: 4, MaxNames: 4, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go k.Serve()
	defer k.Close()
	w, r := pipes(t, 2)
	if err := sdnotify.Send(path, "FDSTORE=1\nFDNAME=x", w[:1]); err != nil {
		t.Fatal(err)
	}
	held(t, k, map[string]int{"x": 1})
	if err := sdnotify.Send(path, "FDSTOREREMOVE=1\nFDSTORE=1\nFDNAME=x", w[1:]); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the refusal", func() bool { return k.Counters()["unexpected_fds"] == 1 })
	held(t, k, map[string]int{})
	for i := range w {
		w[i].Close()
		r[i].SetReadDeadline(time.Now().Add(testutil.Settle))
		if n, err := r[i].Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("pipe %d: read %d, %v; want end of file (the keeper closed its copy)", i, n, err)
		}
	}
	if l := logs.String(); !strings.Contains(l, `msg="descriptors closed: only FDSTORE=1 without FDSTOREREMOVE=1 stores them" name=x count=1 store=true remove=true`) || strings.Contains(l, "without FDSTORE=1 closed") {
		t.Errorf("log:\n%s", l)
	}
}

// TestDropFailed: a held descriptor that reports EPOLLERR (a pipe's
// write end whose reader is gone) is dropped, as systemd's store drops
// it, unless it was stored with FDPOLL=0.
func TestDropFailed(t *testing.T) {
	k, path := start(t, DefaultMaxFDs, DefaultMaxNames)
	w, r := pipes(t, 2)
	if err := sdnotify.Send(path, "FDSTORE=1\nFDNAME=polled", w[:1]); err != nil {
		t.Fatal(err)
	}
	if err := sdnotify.Send(path, "FDSTORE=1\nFDNAME=unpolled\nFDPOLL=0", w[1:]); err != nil {
		t.Fatal(err)
	}
	held(t, k, map[string]int{"polled": 1, "unpolled": 1})
	// The unpolled pipe fails first, then the polled one, which is the
	// sentinel. epoll reports ready descriptors in the order they became
	// ready (ep_poll_callback queues at the ready list's tail). So once
	// the polled one is dropped, an unpolled one that was watched all
	// the same would already be gone too.
	r[1].Close()
	r[0].Close()
	testutil.WaitFor(t, "the polled descriptor's drop", func() bool { _, ok := k.Held()["polled"]; return !ok })
	if h := k.Held(); fmt.Sprint(h) != fmt.Sprint(map[string]int{"unpolled": 1}) {
		t.Errorf("held %v after the polled descriptor's drop; want the unpolled one still held", h)
	}
	if c := k.Counters(); c["dropped"] != 1 {
		t.Errorf("counters %v: want 1 dropped", c)
	}
}

// TestMalformed: each defective request is refused, counted by kind and
// its descriptors closed, and the keeper goes on serving.
func TestMalformed(t *testing.T) {
	k, path := start(t, DefaultMaxFDs, DefaultMaxNames)
	// A pipe of its own for each request that passes one, so that each
	// refusal's close is seen apart; the last one is stored at the end.
	w, r := pipes(t, 6)
	for _, s := range []struct {
		msg   string
		files []*os.File
	}{
		{"", nil},
		{"FDSTORE=1\nFDNAME=a:b", w[0:1]},
		{"FDSTORE=1\nFDNAME=a:b", w[1:2]},
		{"FDSTOREREMOVE=1", nil},
		{"FDGET=1\nFDNAME=x", nil},    // no socket to answer on
		{"FDGET=1\nFDNAME=x", w[2:3]}, // a pipe is no socket
		{"READY=1", w[3:4]},
		{"FDSTOREREMOVE=1\nFDNAME=x", w[4:5]},
		{string(make([]byte, MaxMessage+1)), nil},
	} {
		if err := sdnotify.Send(path, s.msg, s.files); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]uint64{"malformed_empty": 1, "malformed_bad_name": 2, "malformed_no_name": 1,
		"get_bad_socket": 2, "malformed_no_request": 1, "unexpected_fds": 1, "truncated": 1, "removed": 0}
	testutil.WaitFor(t, fmt.Sprintf("counters %v", want), func() bool {
		c := k.Counters()
		for kind, n := range want {
			if c[kind] != n {
				return false
			}
		}
		return true
	})
	// Each refused request's descriptor was closed: the pipe's reader
	// sees end of file once the test closes its own write end, which it
	// would not while the keeper kept a copy.
	for i := range 5 {
		w[i].Close()
		r[i].SetReadDeadline(time.Now().Add(testutil.Settle))
		if n, err := r[i].Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("pipe %d, refused: read %d, %v; want end of file (the keeper closed its copy)", i, n, err)
		}
	}
	if err := sdnotify.StoreFilesAt(path, "tap-eib0", w[5:]); err != nil {
		t.Fatal(err)
	}
	if fds, err := Take(path, "tap-eib0", testutil.Settle); err != nil || len(fds) != 1 {
		t.Fatalf("Take after the malformed requests: %v, %v", fds, err)
	} else {
		closeFDs(fds)
	}
	if h := k.Held(); fmt.Sprint(h) != fmt.Sprint(map[string]int{"tap-eib0": 1}) {
		t.Errorf("held %v: a refused request left descriptors", h)
	}
}

// TestRefusedUser: a request from another user than the keeper's (and
// not root) is refused by its credentials, even where the socket's mode
// would let it through. The sender is this test binary run again as
// nobody (see TestSendHelper).
func TestRefusedUser(t *testing.T) {
	nstest.Require(t)
	k, path := start(t, DefaultMaxFDs, DefaultMaxNames)
	// The test's temporary directories are root's alone: open them.
	for _, dir := range []string{filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	// A copy of this test binary that nobody may run (go test's own
	// directory is root's alone).
	bin := filepath.Join(filepath.Dir(path), "sender")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestSendHelper$")
	cmd.Env = append(os.Environ(), "KEEPER_SEND_TO="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sender as nobody: %v\n%s", err, out)
	}
	testutil.WaitFor(t, "the refusal", func() bool { return k.Counters()["refused"] == 1 })
	if len(k.Held()) != 0 {
		t.Errorf("held %v from another user", k.Held())
	}
}

// TestSendHelper stores its standard input under "intruder" at
// $KEEPER_SEND_TO, for TestRefusedUser; without it, it does nothing.
func TestSendHelper(t *testing.T) {
	path := os.Getenv("KEEPER_SEND_TO")
	if path == "" {
		return
	}
	if err := sdnotify.Send(path, "FDSTORE=1\nFDNAME=intruder", []*os.File{os.Stdin}); err != nil {
		t.Fatal(err)
	}
}

// TestTakeMany: more descriptors than one SCM_RIGHTS message carries
// (SCM_MAX_FD, 253) are stored in several messages and come back in
// several answers, all of them.
func TestTakeMany(t *testing.T) {
	k, path := start(t, DefaultMaxFDs, DefaultMaxNames)
	w, _ := pipes(t, 1)
	if err := sdnotify.StoreFilesAt(path, "many", slices.Repeat(w, 300)); err != nil {
		t.Fatal(err)
	}
	held(t, k, map[string]int{"many": 300})
	fds, err := Take(path, "many", testutil.Settle)
	closeFDs(fds)
	if err != nil || len(fds) != 300 {
		t.Fatalf("Take: %d descriptors, %v; want 300", len(fds), err)
	}
}
