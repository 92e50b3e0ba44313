// Package keeper is "eipoibd keeper": a small process that holds file
// descriptors for daemons. They so outlive a daemon's restart or crash
// where no systemd keeps them (a container, a pod). eipoibd --persist
// --fd-store PATH keeps its TAP queues here. The kernel turns a TAP's
// carrier off as soon as its last queue closes (__tun_detach,
// drivers/net/tun.c), and a bridge then flushes the port's FDB.
//
// Storing is systemd's notify protocol (sd_notify(3), as
// sd_pid_notify_with_fds sends it). Daemons send datagrams of KEY=value
// lines to the keeper's socket: FDSTORE=1 with FDNAME= and the
// descriptors as SCM_RIGHTS, FDSTOREREMOVE=1 with FDNAME=, FDPOLL=0.
// Their meaning follows service_notify_message and service_add_fd_store
// (src/core/service.c).
//
// Taking them back is the keeper's own request: FDGET=1 with FDNAME= and
// one end of a SOCK_SEQPACKET socket pair passed along. The keeper
// writes "FDNAME=name\nFDCOUNT=n" messages with the descriptors (at most
// SCM_MAX_FD each) to it and closes it. It keeps its own copies, as
// systemd keeps its store across a restart. Only root and the keeper's
// own user may ask (SO_PASSCRED: the kernel stamps every message with
// its sender's credentials).
package keeper

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/sdnotify"
)

// The defaults of Config's bounds.
const (
	DefaultMaxFDs   = 1024
	DefaultMaxNames = 64
)

// oobSize holds the control data of one message either way: the most
// descriptors a message carries and the sender's credentials.
var oobSize = unix.CmsgSpace(4*sdnotify.MaxFDsPerMessage) + unix.CmsgSpace(unix.SizeofUcred)

// Config is what a keeper runs with.
type Config struct {
	Socket   string // path of its datagram socket (made with mode 0600)
	MaxFDs   int    // most descriptors held, all names together
	MaxNames int    // most names
	Logger   *slog.Logger
}

// entry is one held descriptor: its number here, and its key in the
// epoll set (0 when it is not watched).
type entry struct {
	fd  int
	key int32
}

// Keeper holds descriptors by name until told to let go, or until they
// report EPOLLHUP or EPOLLERR (a socket whose peer is gone, a pipe
// whose reader is), as systemd's store does (on_fd_store_io,
// src/core/service.c). A TAP queue whose TAP was deleted is not
// noticed (tun_detach_all wakes its waiters with EPOLLIN, which
// ep_poll_callback passes over here, before it detaches it): eipoibd
// closes such queues when it takes them back.
type Keeper struct {
	cfg  Config
	log  *slog.Logger
	conn *net.UnixConn
	ep   int // epoll set of the watched descriptors
	uid  uint32
	done chan struct{}
	wg   sync.WaitGroup // the watcher
	stop sync.Once

	mu       sync.Mutex
	closed   bool // Close dropped what was held: nothing more is taken
	held     map[string][]entry
	count    int
	nextKey  int32
	counters map[string]uint64
	warned   map[string]bool
}

// Listen binds the keeper's socket. A socket file left by a keeper that
// is gone is replaced; one a live keeper answers on is refused.
func Listen(cfg Config) (*Keeper, error) {
	if cfg.MaxFDs < 1 || cfg.MaxNames < 1 {
		return nil, fmt.Errorf("keeper: --max-fds %d and --max-names %d: want at least 1", cfg.MaxFDs, cfg.MaxNames)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o700); err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	if err := removeStale(cfg.Socket); err != nil {
		return nil, err
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: cfg.Socket, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	k := &Keeper{cfg: cfg, log: cfg.Logger, conn: conn, uid: uint32(os.Geteuid()), done: make(chan struct{}),
		held: map[string][]entry{}, counters: map[string]uint64{}, warned: map[string]bool{}}
	fail := func(err error) (*Keeper, error) {
		conn.Close()
		os.Remove(cfg.Socket)
		return nil, fmt.Errorf("keeper: %w", err)
	}
	if err := os.Chmod(cfg.Socket, 0o600); err != nil {
		return fail(err)
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return fail(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		// The kernel stamps each message with its sender's pid, uid and
		// gid (maybe_add_creds, unix_maybe_add_creds in newer kernels,
		// net/unix/af_unix.c), as systemd's notify socket asks for them.
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil || serr != nil {
		return fail(errors.Join(err, serr))
	}
	if k.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fail(err)
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		k.watch()
	}()
	return k, nil
}

// removeStale removes a socket file at path that no keeper answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("keeper: %w", err)
	case fi.Mode().Type() != os.ModeSocket:
		return fmt.Errorf("keeper: %s exists and is not a socket: remove it or give another --socket", path)
	}
	if c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"}); err == nil {
		c.Close()
		return fmt.Errorf("keeper: another keeper serves %s: stop it first (its descriptors go with it)", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("keeper: stale socket: %w", err)
	}
	return nil
}

// Serve answers requests until Close; it returns nil then.
func (k *Keeper) Serve() error {
	k.log.Info("keeper serving", "socket", k.cfg.Socket, "max_fds", k.cfg.MaxFDs, "max_names", k.cfg.MaxNames)
	b := make([]byte, MaxMessage)
	oob := make([]byte, oobSize)
	for {
		// net's ReadMsgUnix receives with MSG_CMSG_CLOEXEC.
		n, oobn, flags, _, err := k.conn.ReadMsgUnix(b, oob)
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			k.bad("read_error", "reading a request failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		closeFDs(k.handle(b[:n], oob[:oobn], flags))
	}
}

// handle carries out one request and returns the descriptors that came
// with it and were not taken, for the caller to close.
func (k *Keeper) handle(b, oob []byte, flags int) []int {
	fds, cred := parseControl(oob)
	switch {
	case flags&unix.MSG_CTRUNC != 0:
		k.bad("truncated", "request refused: its control data was cut off (more than SCM_MAX_FD descriptors?)")
		return fds
	case flags&unix.MSG_TRUNC != 0:
		k.bad("truncated", "request refused: longer than the keeper reads", "max_bytes", MaxMessage)
		return fds
	case cred == nil:
		k.bad("no_credentials", "request refused: it came without its sender's credentials")
		return fds
	case cred.Uid != 0 && cred.Uid != k.uid:
		k.bad("refused", "request refused: only root and the keeper's own user may store and take descriptors", "uid", cred.Uid, "pid", cred.Pid)
		return fds
	}
	m, err := Parse(b)
	var me *MalformedError
	if errors.As(err, &me) {
		k.bad("malformed_"+me.Kind, "malformed request refused", "err", err, "pid", cred.Pid)
		return fds
	}
	who := []any{"pid", cred.Pid, "uid", cred.Uid}
	switch {
	case m.Get:
		k.get(m.Name, fds, who)
		return fds
	case m.Remove:
		k.remove(m.Name, who)
	case m.Store:
		return k.store(m, fds, who)
	}
	if len(fds) > 0 {
		// With FDSTOREREMOVE=1, FDSTORE=1 is not acted on: systemd's
		// service_notify_message carries out only the remove then.
		k.bad("unexpected_fds", "descriptors closed: only FDSTORE=1 without FDSTOREREMOVE=1 stores them", "name", m.Name, "count", len(fds), "store", m.Store, "remove", m.Remove, "pid", cred.Pid)
	}
	return fds
}

// parseControl returns the descriptors and the credentials of a
// message's control data.
func parseControl(oob []byte) (fds []int, cred *unix.Ucred) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, nil
	}
	for i := range msgs {
		if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, r...)
		} else if c, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
			cred = c
		}
	}
	return fds, cred
}

// store keeps fds under m.Name, within the bounds, and returns those it
// did not take: all of them once Close has begun (a request read just
// before it), whose epoll set is gone and whose held descriptors are
// closed.
func (k *Keeper) store(m Message, fds []int, who []any) []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(fds) == 0 || k.closed {
		return fds
	}
	list, ok := k.held[m.Name]
	if !ok && len(k.held) >= k.cfg.MaxNames {
		k.badLocked("over_limit", "descriptors refused: the keeper holds its most names (--max-names)", append([]any{"name", m.Name, "count", len(fds)}, who...)...)
		return fds
	}
	take := min(len(fds), k.cfg.MaxFDs-k.count)
	for _, fd := range fds[:take] {
		e := entry{fd: fd}
		if !m.NoPoll {
			k.nextKey++
			// No events asked: EPOLLERR and EPOLLHUP come anyway. A
			// descriptor epoll cannot watch (EPERM: a regular file) is
			// kept unwatched, as service_add_fd_store does.
			if err := unix.EpollCtl(k.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Fd: k.nextKey}); err == nil {
				e.key = k.nextKey
			}
		}
		list = append(list, e)
	}
	if take > 0 {
		k.held[m.Name] = list
		k.count += take
		k.counters["stored"] += uint64(take)
		k.log.Info("stored", append([]any{"name", m.Name, "fds", take, "held", len(list)}, who...)...)
	}
	if take < len(fds) {
		k.badLocked("over_limit", "descriptors refused: the keeper holds its most descriptors (--max-fds)", append([]any{"name", m.Name, "refused", len(fds) - take}, who...)...)
	}
	return fds[take:]
}

// remove closes what is held under name; after Close there is nothing.
func (k *Keeper) remove(name string, who []any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	n := k.dropLocked(name)
	k.counters["removed"] += uint64(n)
	k.log.Info("removed", append([]any{"name", name, "fds", n}, who...)...)
}

// dropLocked closes and forgets what is held under name and returns
// how many descriptors that was.
func (k *Keeper) dropLocked(name string) int {
	list := k.held[name]
	for _, e := range list {
		k.closeEntryLocked(e)
	}
	delete(k.held, name)
	return len(list)
}

func (k *Keeper) closeEntryLocked(e entry) {
	if e.key != 0 {
		unix.EpollCtl(k.ep, unix.EPOLL_CTL_DEL, e.fd, nil)
	}
	unix.Close(e.fd)
	k.count--
}

// get passes what is held under name over the socket that came with the
// request, and keeps it held. After Close it answers nothing: the
// requester sees the socket closed without an answer.
func (k *Keeper) get(name string, fds []int, who []any) {
	if len(fds) != 1 || !isSeqpacket(fds[0]) {
		k.bad("get_bad_socket", "FDGET=1 refused: it needs exactly one SOCK_SEQPACKET unix socket passed along", append([]any{"name", name, "fds", len(fds)}, who...)...)
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	list := k.held[name]
	head := answer(name, len(list))
	for i := 0; i == 0 || i < len(list); i += sdnotify.MaxFDsPerMessage {
		var oob []byte
		if len(list) > 0 {
			chunk := list[i:min(i+sdnotify.MaxFDsPerMessage, len(list))]
			out := make([]int, len(chunk))
			for j, e := range chunk {
				out[j] = e.fd
			}
			oob = unix.UnixRights(out...)
		}
		// The pair's buffer holds a few small messages; a requester
		// that does not read is not waited for.
		if err := unix.Sendmsg(fds[0], head, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); err != nil {
			k.badLocked("reply_failed", "passing descriptors back failed", append([]any{"name", name, "err", err}, who...)...)
			return
		}
	}
	k.counters["returned"] += uint64(len(list))
	k.log.Info("returned", append([]any{"name", name, "fds", len(list)}, who...)...)
}

// isSeqpacket reports whether fd is a unix SOCK_SEQPACKET socket.
func isSeqpacket(fd int) bool {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_SEQPACKET {
		return false
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	return err == nil && dom == unix.AF_UNIX
}

// watch drops the held descriptors that report EPOLLHUP or EPOLLERR,
// until Close.
func (k *Keeper) watch() {
	events := make([]unix.EpollEvent, 16)
	for {
		select {
		case <-k.done:
			return
		default:
		}
		n, err := unix.EpollWait(k.ep, events, 200)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			k.bad("watch_error", "watching the held descriptors failed: they are no longer dropped when they fail", "err", err)
			return
		}
		for _, ev := range events[:n] {
			k.dropKey(ev.Fd, ev.Events)
		}
	}
}

// dropKey drops the held descriptor watched as key.
func (k *Keeper) dropKey(key int32, ev uint32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, list := range k.held {
		i := slices.IndexFunc(list, func(e entry) bool { return e.key == key })
		if i < 0 {
			continue
		}
		k.closeEntryLocked(list[i])
		if list = slices.Delete(list, i, i+1); len(list) == 0 {
			delete(k.held, name)
		} else {
			k.held[name] = list
		}
		k.counters["dropped"]++
		k.log.Info("dropped: the descriptor failed (EPOLLHUP or EPOLLERR)", "name", name, "events", fmt.Sprintf("%#x", ev), "held", len(list))
		return
	}
}

// bad counts a refused request of kind and logs the first of each kind.
func (k *Keeper) bad(kind, msg string, args ...any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.badLocked(kind, msg, args...)
}

func (k *Keeper) badLocked(kind, msg string, args ...any) {
	k.counters[kind]++
	if k.warned[kind] {
		return
	}
	k.warned[kind] = true
	k.log.Warn(msg, append(args, "counter", kind, "note", "logged once per kind; SIGUSR2 logs the counters")...)
}

// Counters returns the keeper's counters: descriptors stored, returned,
// removed and dropped, and refused requests by kind.
func (k *Keeper) Counters() map[string]uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.counters)
}

// Held returns how many descriptors are held, by name.
func (k *Keeper) Held() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	m := make(map[string]int, len(k.held))
	for name, list := range k.held {
		m[name] = len(list)
	}
	return m
}

// Close stops serving, closes every held descriptor and removes the
// socket. A TAP whose queues only the keeper held loses its carrier.
// Closing again does nothing.
func (k *Keeper) Close() error {
	err := net.ErrClosed
	k.stop.Do(func() { err = k.close() })
	return err
}

func (k *Keeper) close() error {
	close(k.done)
	err := k.conn.Close()
	k.wg.Wait()
	os.Remove(k.cfg.Socket)
	k.mu.Lock()
	defer k.mu.Unlock()
	// Serve may still be handling a request it read before conn
	// closed: from here on it takes nothing (store, get, remove look).
	k.closed = true
	released := map[string]int{}
	for name := range k.held {
		released[name] = k.dropLocked(name)
	}
	unix.Close(k.ep)
	if len(released) > 0 {
		k.log.Warn("keeper stopped: descriptors released (a TAP whose eipoibd is not running loses its carrier now)", "released", fmt.Sprint(released))
	} else {
		k.log.Info("keeper stopped")
	}
	return err
}

// closeFDs closes fds.
func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
