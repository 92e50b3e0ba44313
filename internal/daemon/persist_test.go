package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/keeper"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/sdnotify"
)

// isOpen reports whether fd is an open descriptor.
func isOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

// TestKeeperQueues: with --fd-store, the queues come from the keeper.
// Queues systemd passed as well are closed when the keeper has some and
// used when it has none. Either way systemd is told to let go of them.
// An unreachable keeper is a warning, never an error.
func TestKeeperQueues(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "keeper.sock")
	k, err := keeper.Listen(keeper.Config{Socket: sock, MaxFDs: 16, MaxNames: 4})
	if err != nil {
		t.Fatal(err)
	}
	go k.Serve()
	defer k.Close()
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	t.Setenv("NOTIFY_SOCKET", filepath.Join(dir, "notify"))
	heard := func() string {
		notify.SetReadDeadline(time.Now().Add(20 * time.Second)) // a message the test expects: generous for a loaded machine
		b := make([]byte, 256)
		n, err := notify.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		return string(b[:n])
	}
	pipe := func() (r, w *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		return r, w
	}
	// systemdFDs returns two descriptors as systemd passes them.
	systemdFDs := func() []int {
		_, w := pipe()
		var fds []int
		for range 2 {
			fd, err := unix.Dup(int(w.Fd()))
			if err != nil {
				t.Fatal(err)
			}
			fds = append(fds, fd)
		}
		return fds
	}
	var logs bytes.Buffer
	c := &Config{Name: "eib0", Persist: true, FDStore: sock}
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// The keeper has none: systemd's are used, and let go by systemd.
	fromSystemd := systemdFDs()
	got, inKeeper := keeperQueues(c, fromSystemd, log)
	if inKeeper || len(got) != 2 || got[0] != fromSystemd[0] || !isOpen(got[0]) {
		t.Errorf("empty keeper: queues %v (in keeper %v), want systemd's %v open", got, inKeeper, fromSystemd)
	}
	if m := heard(); m != "FDSTOREREMOVE=1\nFDNAME=tap-eib0" {
		t.Errorf("systemd heard %q, want it told to let go", m)
	}
	for _, fd := range got {
		unix.Close(fd)
	}

	// The keeper has some: they are used, systemd's closed and let go.
	_, w := pipe()
	if err := sdnotify.StoreFilesAt(sock, "tap-eib0", []*os.File{w, w}); err != nil {
		t.Fatal(err)
	}
	fromSystemd = systemdFDs()
	got, inKeeper = keeperQueues(c, fromSystemd, log)
	if !inKeeper || len(got) != 2 {
		t.Errorf("keeper with queues: %v (in keeper %v), want its 2", got, inKeeper)
	}
	// The keeper's answer came before systemd's were closed, so no
	// number of theirs was reused.
	for _, fd := range fromSystemd {
		if isOpen(fd) {
			t.Errorf("systemd's descriptor %d left open", fd)
		}
	}
	if m := heard(); m != "FDSTOREREMOVE=1\nFDNAME=tap-eib0" {
		t.Errorf("systemd heard %q, want it told to let go", m)
	}
	for _, fd := range got {
		unix.Close(fd)
	}

	// Unreachable: a warning, and no queues.
	c.FDStore = filepath.Join(dir, "none.sock")
	if got, inKeeper := keeperQueues(c, nil, log); len(got) != 0 || inKeeper {
		t.Errorf("unreachable keeper: %v, %v", got, inKeeper)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="keeper unreachable`) {
		t.Errorf("no warning of the unreachable keeper:\n%s", logs.String())
	}
}

// TestKeeperLink: the daemon checks that its keeper holds the queues it
// sent, as the keeper answers no store. A keeper past --max-fds, or one
// that takes the datagrams and keeps nothing (as a keeper of another
// user refuses), is warned of once, however often the next checks retry
// it. A keeper started anew with room gets them and says so, and then
// nothing more is sent.
func TestKeeperLink(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "keeper.sock")
	listen := func(maxFDs int) *keeper.Keeper {
		k, err := keeper.Listen(keeper.Config{Socket: sock, MaxFDs: maxFDs, MaxNames: 4})
		if err != nil {
			t.Fatal(err)
		}
		go k.Serve()
		return k
	}
	var files []*os.File
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		files = append(files, w)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	c := &Config{Name: "eib0", Persist: true, FDStore: sock}
	warnings := func() int { return strings.Count(logs.String(), `level=WARN msg="TAP queues not kept by the keeper`) }

	small := listen(1)
	l := &keeperLink{}
	l.send(c, files, "sent", log)
	if l.holds || l.last != socketOf(sock) || warnings() != 1 || !strings.Contains(logs.String(), "the keeper holds 1 of the 2 queues sent") {
		t.Fatalf("keeper past --max-fds: holds %v, last %v (socket %v); log:\n%s", l.holds, l.last, socketOf(sock), logs.String())
	}
	for range 2 {
		l.check(c, files, log)
	}
	if n := small.Counters()["over_limit"]; n != 3 || l.holds || warnings() != 1 {
		t.Errorf("two checks of a keeper past --max-fds: it refused %d times (want 3: each check retries), holds %v, %d warnings (want 1):\n%s", n, l.holds, warnings(), logs.String())
	}
	small.Close()

	roomy := listen(16)
	defer roomy.Close()
	l.check(c, files, log)
	if !l.holds || !strings.Contains(logs.String(), "msg=\"the keeper started anew: TAP queues sent to it again") || fmt.Sprint(roomy.Held()) != "map[tap-eib0:2]" {
		t.Errorf("a new keeper with room: holds %v, it holds %v; log:\n%s", l.holds, roomy.Held(), logs.String())
	}
	l.check(c, files, log)
	if n := roomy.Counters()["stored"]; n != 2 {
		t.Errorf("a keeper holding the queues was sent them again: %d stored, want 2", n)
	}

	// A socket that takes the datagrams, closes what comes with them and
	// answers nothing, as a keeper does to another user.
	c.FDStore = filepath.Join(dir, "deaf.sock")
	deaf, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: c.FDStore, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	go func() {
		b, oob := make([]byte, 512), make([]byte, 512)
		for {
			_, oobn, _, _, err := deaf.ReadMsgUnix(b, oob)
			if err != nil {
				return
			}
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for i := range msgs {
				fds, _ := unix.ParseUnixRights(&msgs[i])
				for _, fd := range fds {
					unix.Close(fd)
				}
			}
		}
	}()
	l = &keeperLink{}
	l.send(c, files, "sent", log)
	if l.holds || warnings() != 2 {
		t.Errorf("a keeper that keeps nothing: holds %v, %d warnings (want 2):\n%s", l.holds, warnings(), logs.String())
	}
}

// TestLiveQueues: a queue of no TAP (a TUN descriptor detached, or never
// attached: TUNGETIFF answers EBADFD) is closed and reported; other
// descriptors are left for tap.Create to judge.
func TestLiveQueues(t *testing.T) {
	nstest.Require(t)
	tun, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var logs bytes.Buffer
	got := liveQueues(&Config{Name: "eib0"}, []int{tun, int(w.Fd())}, slog.New(slog.NewTextHandler(&logs, nil)))
	if len(got) != 1 || got[0] != int(w.Fd()) {
		t.Errorf("live queues %v, want only the pipe's %d", got, w.Fd())
	}
	if isOpen(tun) {
		t.Errorf("the detached TUN descriptor %d was not closed", tun)
		unix.Close(tun)
	}
	if !strings.Contains(logs.String(), `msg="kept queues of a deleted TAP closed: the TAP is made afresh" tap=eib0 closed=1`) {
		t.Errorf("not reported:\n%s", logs.String())
	}
}
