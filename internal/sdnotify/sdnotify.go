// Package sdnotify speaks systemd's notification protocol
// (sd_notify(3)): datagrams of "KEY=value" lines to the unix socket
// named by $NOTIFY_SOCKET. It sends a Type=notify service's READY=1,
// STOPPING=1, STATUS= and WATCHDOG=1. It also sends file descriptors for
// the service's file descriptor store (FDSTORE=1), which come back at
// the next start as $LISTEN_FDS (sd_listen_fds(3)). Outside systemd it
// does nothing.
package sdnotify

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Notify sends state (newline-separated assignments) to systemd and
// reports whether there was a socket to send it to.
func Notify(state string) (bool, error) {
	return NotifyFiles(state, nil)
}

// NotifyFiles is Notify with files passed along (SCM_RIGHTS), as
// FDSTORE=1 needs them.
func NotifyFiles(state string, files []*os.File) (bool, error) {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return false, nil
	}
	return true, Send(name, state, files)
}

// sendTimeout bounds how long Send waits for room in a receiver's queue
// (a unix datagram sender blocks while it is full: unix_wait_for_peer,
// net/unix/af_unix.c, for SO_SNDTIMEO at most).
const sendTimeout = 5 * time.Second

// Send sends state to the datagram socket named socket (a path, or an
// abstract name with a leading @) with files passed along, as
// sd_pid_notify_with_fds does: Notify's protocol to any receiver of it,
// such as eipoibd keeper. The receiver learns the sender's credentials
// when it asks for them (SO_PASSCRED); files stay open here.
func Send(socket, state string, files []*os.File) error {
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			// Not f.Fd(): it would make a non-blocking file blocking.
			rc, err := f.SyscallConn()
			if err != nil {
				return fmt.Errorf("sdnotify: %s: %w", f.Name(), err)
			}
			if err := rc.Control(func(fd uintptr) { fds[i] = int(fd) }); err != nil {
				return fmt.Errorf("sdnotify: %s: %w", f.Name(), err)
			}
		}
		oob = unix.UnixRights(fds...)
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	defer unix.Close(s)
	tv := unix.NsecToTimeval(sendTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(s, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	// A leading @ names an abstract socket; unix.SockaddrUnix knows.
	if err := unix.Sendmsg(s, []byte(state), oob, &unix.SockaddrUnix{Name: socket}, 0); err != nil {
		return fmt.Errorf("sdnotify: %s: %w", socket, err)
	}
	return nil
}

// MaxFDsPerMessage is how many descriptors one SCM_RIGHTS message may
// carry: SCM_MAX_FD in the kernel's include/net/scm.h; scm_fp_copy
// refuses more with EINVAL.
const MaxFDsPerMessage = 253

// StoreFiles puts files into systemd's file descriptor store under name
// (FDSTORE=1 with FDNAME=), first taking out whatever the store holds
// under that name (FDSTOREREMOVE=1), so that the store holds exactly
// files. systemd sends no reply: it closes, silently, descriptors beyond
// the unit's FileDescriptorStoreMax=, so "stored" means sent.
// More files than one message carries go in several FDSTORE=1 messages
// under the same name, which the store adds up. Should a store fail
// after the removal, the store got none or part of files under name
// and the error says how many were sent. The service needs
// FileDescriptorStoreMax= at least len(files).
func StoreFiles(name string, files []*os.File) (bool, error) {
	socket := os.Getenv("NOTIFY_SOCKET")
	if socket == "" {
		if !ValidName(name) {
			return false, fmt.Errorf("sdnotify: bad file descriptor name %q", name)
		}
		return false, nil
	}
	return true, StoreFilesAt(socket, name, files)
}

// RemoveFiles tells systemd's file descriptor store to close what it
// holds under name (FDSTOREREMOVE=1 with FDNAME=); without
// $NOTIFY_SOCKET nothing is sent.
func RemoveFiles(name string) error {
	if socket := os.Getenv("NOTIFY_SOCKET"); socket != "" {
		return RemoveFilesAt(socket, name)
	}
	return nil
}

// RemoveFilesAt is RemoveFiles to the store at socket, systemd's or
// another speaking its protocol (eipoibd keeper).
func RemoveFilesAt(socket, name string) error {
	return Send(socket, "FDSTOREREMOVE=1\nFDNAME="+name, nil)
}

// StoreFilesAt is StoreFiles to the store at socket, systemd's or
// another speaking its protocol (eipoibd keeper).
func StoreFilesAt(socket, name string, files []*os.File) error {
	if !ValidName(name) {
		return fmt.Errorf("sdnotify: bad file descriptor name %q", name)
	}
	if err := RemoveFilesAt(socket, name); err != nil {
		return err
	}
	for i := 0; i < len(files); i += MaxFDsPerMessage {
		chunk := files[i:min(i+MaxFDsPerMessage, len(files))]
		if err := Send(socket, "FDSTORE=1\nFDNAME="+name, chunk); err != nil {
			return fmt.Errorf("%w (%d of %d files under %s sent to the store)", err, i, len(files), name)
		}
	}
	return nil
}

// ValidName reports whether name may name stored file descriptors: 1 to
// 255 printable ASCII characters other than a colon (LISTEN_FDNAMES is
// colon-separated).
func ValidName(name string) bool {
	if name == "" || len(name) > 255 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e || c == ':' {
			return false
		}
	}
	return true
}

// listenFDsStart is the first file descriptor systemd passes
// (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// ListenFDs takes the file descriptors systemd passed this process
// ($LISTEN_FDS for $LISTEN_PID, named by $LISTEN_FDNAMES), by name, and
// unsets those variables so child processes do not take them too. The
// descriptors are made close-on-exec, also when $LISTEN_FDNAMES is
// wrong, and otherwise left as they are (blocking or not). Without
// passed descriptors (no $LISTEN_FDS, or another process's $LISTEN_PID)
// it returns none.
func ListenFDs() (map[string][]int, error) {
	defer func() {
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_FDNAMES")
	}()
	pid, nfds := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	if nfds == "" || pid != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(nfds)
	if err != nil || n < 0 || n > 1<<16 {
		return nil, fmt.Errorf("sdnotify: LISTEN_FDS=%q: want a count of file descriptors", nfds)
	}
	// Every passed descriptor is made close-on-exec before anything else
	// can fail, so that none leaks into a child process even when the
	// names are wrong. On an error they stay open: with a wrong
	// $LISTEN_FDS, closing by number could close this process's own.
	for i := 0; i < n; i++ {
		fd := listenFDsStart + i
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return nil, fmt.Errorf("sdnotify: passed file descriptor %d: %w", fd, err)
		}
		unix.CloseOnExec(fd)
	}
	var names []string
	if v, ok := os.LookupEnv("LISTEN_FDNAMES"); ok {
		names = strings.Split(v, ":")
		if len(names) != n {
			return nil, fmt.Errorf("sdnotify: LISTEN_FDNAMES names %d file descriptors, LISTEN_FDS=%d", len(names), n)
		}
	}
	fds := make(map[string][]int)
	for i := 0; i < n; i++ {
		name := "unknown" // sd_listen_fds_with_names' name for an unnamed one
		if names != nil {
			name = names[i]
		}
		fds[name] = append(fds[name], listenFDsStart+i)
	}
	return fds, nil
}

// WatchdogInterval is the watchdog timeout systemd asks this process to
// keep (WatchdogSec=, given as $WATCHDOG_USEC, for the process
// $WATCHDOG_PID when set); ok is false when there is none. Send
// WATCHDOG=1 at least every half of it.
func WatchdogInterval() (d time.Duration, ok bool) {
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0, false
	}
	us, err := strconv.ParseUint(os.Getenv("WATCHDOG_USEC"), 10, 63)
	if err != nil || us == 0 {
		return 0, false
	}
	return time.Duration(us) * time.Microsecond, true
}
