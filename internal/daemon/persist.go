package daemon

// --persist: the TAP outlives the daemon (a persistent TAP whose queues
// systemd's file descriptor store, or an eipoibd keeper with --fd-store,
// keeps open, so its carrier never drops), and the guests' VIFs come
// back from a state file.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/keeper"
	"github.com/eipoib/eipoibd/internal/sdnotify"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/state"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/warnlimit"
)

// fdName is the name the TAP's queues have in systemd's file descriptor
// store, and in the keeper's.
func fdName(tapName string) string { return "tap-" + tapName }

// keeperTimeout bounds the wait for the keeper's answer at start.
const keeperTimeout = 2 * time.Second

// keptQueues returns the TAP queues an earlier run left in a file
// descriptor store, and whether the keeper (--fd-store) holds them:
// systemd's passed back as $LISTEN_FDS (named fdName), or with
// --fd-store the keeper's, asked for. Without --persist (an earlier run
// had it) the store is told to let go of its copies, so that the TAP
// goes when tap.Create closes these.
func keptQueues(c *Config, log *slog.Logger) (queues []int, inKeeper bool) {
	queues = systemdQueues(c, log)
	if c.FDStore != "" {
		queues, inKeeper = keeperQueues(c, queues, log)
	}
	queues = liveQueues(c, queues, log)
	if len(queues) == 0 || c.Persist {
		return queues, inKeeper
	}
	log.Info("--persist is off: the TAP an earlier run kept is removed and made afresh (its link drops once)", "tap", c.Name)
	var err error
	switch {
	case inKeeper:
		err = sdnotify.RemoveFilesAt(c.FDStore, fdName(c.Name))
	case c.FDStore == "":
		err = sdnotify.RemoveFiles(fdName(c.Name))
	default:
		// The queues are systemd's, which keeperQueues has told to let
		// go of them already.
	}
	if err != nil {
		log.Warn("file descriptor store not told to let go of the TAP's queues", "err", err)
	}
	return queues, inKeeper
}

// liveQueues closes the kept queues whose TAP is gone ("ip link del"
// detached them: TUNGETIFF answers EBADFD, __tun_chr_ioctl in
// drivers/net/tun.c), so that the TAP is made afresh instead of refused.
// No store notices them: tun_detach_all wakes a queue's waiters
// (sk_data_ready: EPOLLIN, which ep_poll_callback passes over for a
// descriptor watched for EPOLLERR and EPOLLHUP only, as systemd's store
// and the keeper watch theirs) before it detaches the queue, and never
// after. Other errors are left to tap.Create.
func liveQueues(c *Config, fds []int, log *slog.Logger) []int {
	live := fds[:0]
	for _, fd := range fds {
		ifr, err := unix.NewIfreq("")
		if err == nil {
			err = unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr)
		}
		if errors.Is(err, unix.EBADFD) {
			unix.Close(fd)
			continue
		}
		live = append(live, fd)
	}
	if dead := len(fds) - len(live); dead > 0 {
		log.Warn("kept queues of a deleted TAP closed: the TAP is made afresh", "tap", c.Name, "closed", dead)
	}
	return live
}

// systemdQueues returns the TAP queues systemd passed; any other passed
// descriptor is closed, as nothing here listens on sockets.
func systemdQueues(c *Config, log *slog.Logger) []int {
	fds, err := sdnotify.ListenFDs()
	if err != nil {
		log.Warn("file descriptors passed by systemd ignored", "err", err)
		return nil
	}
	var queues []int
	for n, list := range fds {
		if n == fdName(c.Name) {
			queues = list
			continue
		}
		log.Warn("unexpected file descriptors from systemd closed", "name", n, "count", len(list))
		for _, fd := range list {
			os.NewFile(uintptr(fd), n).Close()
		}
	}
	return queues
}

// keeperQueues asks the keeper at --fd-store for the TAP's queues. An
// unreachable keeper is reported: a persistent TAP is then reopened,
// its carrier having dropped when the last run ended. Queues systemd
// passed as well (kept before --fd-store was set) are used when the
// keeper has none, and systemd is told to let go of them either way:
// the keeper keeps them from now on.
func keeperQueues(c *Config, fromSystemd []int, log *slog.Logger) ([]int, bool) {
	queues, err := keeper.Take(c.FDStore, fdName(c.Name), keeperTimeout)
	if err != nil {
		log.Warn("keeper unreachable: any TAP queues it kept are lost, so a persistent TAP is opened again and its carrier drops once (is \"eipoibd keeper\" running on --fd-store?)", "fd_store", c.FDStore, "err", err)
	} else if len(queues) > 0 {
		log.Info("TAP queues taken back from the keeper", "fd_store", c.FDStore, "queues", len(queues))
	}
	if len(fromSystemd) == 0 {
		return queues, len(queues) > 0
	}
	if err := sdnotify.RemoveFiles(fdName(c.Name)); err != nil {
		log.Warn("systemd file descriptor store", "err", err)
	}
	if len(queues) == 0 {
		log.Info("TAP queues passed by systemd taken: the keeper keeps them from now on", "queues", len(fromSystemd))
		return fromSystemd, false
	}
	log.Info("TAP queues passed by systemd closed: the keeper's are used", "queues", len(fromSystemd))
	for _, fd := range fromSystemd {
		os.NewFile(uintptr(fd), "systemd").Close()
	}
	return queues, true
}

// storeQueues puts the TAP's queues into the keeper (--fd-store) or
// systemd's file descriptor store (with --persist) and says what a
// restart will do to the link. With --fd-store it returns what the
// daemon knows of its keeper, for watchKeeper; nil otherwise.
func storeQueues(c *Config, dev *tap.TAP, kept []int, inKeeper bool, log *slog.Logger) *keeperLink {
	if !c.Persist {
		return nil
	}
	if c.FDStore != "" {
		l := &keeperLink{}
		files := dev.Files()
		if inKeeper && dev.Start() == tap.Kept && sameFDs(files, kept) {
			// The keeper's copies never closed, so a daemon killed at
			// any point of its start leaves them held.
			log.Info("the keeper still holds the TAP's queues: a restart keeps the link up", "tap", c.Name, "fd_store", c.FDStore, "queues", len(files))
			l.last, l.holds = socketOf(c.FDStore), true
			return l
		}
		l.send(c, files, "TAP queues sent to the keeper: a restart keeps the link up", log)
		return l
	}
	ok, err := sdnotify.StoreFiles(fdName(c.Name), dev.Files())
	switch {
	case err != nil:
		log.Warn("TAP queues not kept by systemd: a restart drops the carrier", "err", err)
	case ok:
		log.Info("TAP queues sent to systemd's file descriptor store: a restart keeps the link up (the unit needs FileDescriptorStoreMax= of at least the queue count)", "tap", c.Name, "queues", len(dev.Files()))
	default:
		log.Info("no systemd file descriptor store: the TAP survives a restart, but its carrier drops while no eipoibd holds it", "tap", c.Name)
	}
	return nil
}

// keeperCheck is how often a daemon with --fd-store looks whether its
// keeper's socket was made anew, or retries a keeper that did not hold
// the queues.
const keeperCheck = 2 * time.Second

// keeperLink is what a daemon with --fd-store knows of its keeper.
type keeperLink struct {
	last  socketID        // the socket the queues were last sent to
	holds bool            // and the keeper there holds all of them
	warn  warnlimit.Limit // the warnings of failed sends, retried every keeperCheck
}

// send has the keeper hold exactly files, the TAP's queues, and checks
// that it does. The keeper answers no store: over --max-fds or
// --max-names, or from a user other than its own and root, it closes the
// descriptors and only logs. So the queues are asked back (Take returns
// copies, closed here) and counted. send logs done on success and a
// warning otherwise, at most one a warnlimit.Interval.
func (l *keeperLink) send(c *Config, files []*os.File, done string, log *slog.Logger) {
	l.last, l.holds = socketOf(c.FDStore), false
	name := fdName(c.Name)
	err := sdnotify.StoreFilesAt(c.FDStore, name, files)
	if err == nil {
		var held []int
		held, err = keeper.Take(c.FDStore, name, keeperTimeout)
		for _, fd := range held {
			unix.Close(fd)
		}
		if err == nil && len(held) != len(files) {
			err = fmt.Errorf("daemon: the keeper holds %d of the %d queues sent: its log says why (over --max-fds or --max-names?)", len(held), len(files))
		}
	}
	if err != nil {
		if l.warn.Allow(time.Now()) {
			log.Warn("TAP queues not kept by the keeper: a restart drops the carrier (is \"eipoibd keeper\" running on --fd-store, as root or as eipoibd's user? they are sent again every "+keeperCheck.String()+" until it holds them)",
				"fd_store", c.FDStore, "err", err, "suppressed", l.warn.Suppressed())
		}
		return
	}
	l.holds = true
	log.Info(done, "tap", c.Name, "fd_store", c.FDStore, "queues", len(files))
}

// check sends files to the keeper again when its socket is another than
// the one last used (a keeper started anew holds nothing, and the next
// restart would drop the carrier), or when the keeper there did not
// hold them.
func (l *keeperLink) check(c *Config, files []*os.File, log *slog.Logger) {
	now := socketOf(c.FDStore)
	switch {
	case now == socketID{} || now == l.last && l.holds:
	case now != l.last:
		l.send(c, files, "the keeper started anew: TAP queues sent to it again, a restart keeps the link up", log)
	default:
		l.send(c, files, "the keeper holds the TAP's queues now: a restart keeps the link up", log)
	}
}

// socketID tells one socket file from another at the same path: a
// keeper started anew binds a new one.
type socketID struct {
	ino   uint64
	ctime unix.Timespec
}

// socketOf returns the identity of the socket at path; zero when there
// is none.
func socketOf(path string) socketID {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return socketID{}
	}
	return socketID{st.Ino, st.Ctim}
}

// watchKeeper checks every keeperCheck that the keeper holds the TAP's
// queues (keeperLink.check), until ctx ends.
func watchKeeper(ctx context.Context, c *Config, dev *tap.TAP, l *keeperLink, log *slog.Logger) {
	t := time.NewTicker(keeperCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.check(c, dev.Files(), log)
	}
}

// sameFDs reports whether files are exactly the descriptors fds: the
// TAP took over every kept queue (tap.Create keeps their numbers) and
// opened none.
func sameFDs(files []*os.File, fds []int) bool {
	if len(files) != len(fds) {
		return false
	}
	for _, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return false
		}
		var fd int
		// Not f.Fd(): it would make the non-blocking queue blocking.
		if rc.Control(func(u uintptr) { fd = int(u) }) != nil || !slices.Contains(fds, fd) {
			return false
		}
	}
	return true
}

// statePath is where --persist keeps the guests of TAP name.
func statePath(c *Config) string { return ctl.StatePath(c.StateDir, c.Name) }

// vlanMap is the shim's VLAN to P_Key map as --vlan-pkey writes it,
// sorted by VLAN, untagged left out.
func vlanMap(sh *shim.Shim) string {
	parts := sh.Port().Partitions // a fresh map every call
	delete(parts, 0)
	return formatVLANPKeys(parts)
}

// restoreState reads the saved state and restores its guests' VIFs,
// whose addresses are then announced. A corrupt file is reported and set
// aside, never trusted.
func restoreState(c *Config, sh *shim.Shim, log *slog.Logger) {
	path := statePath(c)
	st, err := state.Load(path)
	var ce *state.CorruptError
	switch {
	case errors.Is(err, os.ErrNotExist):
		log.Info("no saved state", "path", path)
		return
	case errors.As(err, &ce):
		to, serr := state.SetAside(path)
		if serr != nil {
			log.Error("state file corrupt, and not set aside: fix or remove it", "err", err, "set_aside", serr)
			return
		}
		log.Warn("state file corrupt: set aside, not trusted", "err", err, "moved_to", to)
		return
	case err != nil:
		log.Warn("state file unreadable: guests are learned afresh", "err", err)
		return
	case st.TAP != c.Name:
		log.Warn("state file is another TAP's: ignored", "path", path, "tap", st.TAP)
		return
	}
	if cur := vlanMap(sh); st.VLANPKeys != cur {
		log.Info("VLAN map changed since the state was saved", "saved", st.VLANPKeys, "now", cur)
	}
	vifs, addrs, skipped := sh.RestoreGuests(st.Guests)
	for _, err := range skipped {
		log.Info("saved guest not restored", "reason", err)
	}
	log.Info("state restored", "path", path, "vifs", vifs, "addresses_announced", addrs, "skipped", len(skipped))
}

// stateSaver writes the state file whenever the guests change (checked
// every second), and once more when asked to stop, before the shim frees
// the VIFs. The control socket's handler has it save at once after a
// declared guest is added or removed. Once the shim has begun to free
// them (Run ended on its own) it saves nothing more: the file keeps the
// guests a restart restores.
type stateSaver struct {
	path, tap string
	sh        *shim.Shim
	log       *slog.Logger
	mu        sync.Mutex // save's, called from run and from the handler
	last      []byte
	lastErr   string
}

// run saves until ctx ends, then saves a last time and returns.
func (s *stateSaver) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.save() // a failure is logged once, and tried again next round
			return
		case <-t.C:
			s.save() // a failure is logged once, and tried again next round
		}
	}
}

// save writes the state if it changed; a failure is logged when it
// differs from the last one.
func (s *stateSaver) save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	guests, ok := s.sh.Guests()
	if !ok {
		return nil
	}
	b, err := state.Marshal(&state.State{TAP: s.tap, VLANPKeys: vlanMap(s.sh), Guests: guests})
	if err == nil && bytes.Equal(b, s.last) {
		return nil
	}
	if err == nil {
		err = state.Write(s.path, b)
	}
	if err != nil {
		if err.Error() != s.lastErr {
			s.log.Warn("state not saved", "err", err)
			s.lastErr = err.Error()
		}
		return err
	}
	if s.lastErr != "" {
		s.log.Info("state saved again", "path", s.path)
	}
	s.last, s.lastErr = b, ""
	return nil
}
