package keeper

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/sdnotify"
)

// Take asks the keeper at socket for the descriptors it holds under
// name and returns copies of them (close-on-exec); the keeper keeps its
// own. It passes one end of a SOCK_SEQPACKET pair with FDGET=1, reads
// the answers until the keeper closes its end, and checks that they
// came from root or this process's user and add up to the count they
// announce. On an error it returns none (and has closed any received).
func Take(socket, name string, timeout time.Duration) (fds []int, err error) {
	if !sdnotify.ValidName(name) {
		return nil, fmt.Errorf("keeper: bad file descriptor name %q", name)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	mine := pair[0]
	defer unix.Close(mine)
	defer func() {
		if err != nil {
			closeFDs(fds)
			fds = nil
		}
	}()
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(mine, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(pair[1])
		return nil, fmt.Errorf("keeper: %w", err)
	}
	if err := unix.SetsockoptInt(mine, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(pair[1])
		return nil, fmt.Errorf("keeper: %w", err)
	}
	theirs := os.NewFile(uintptr(pair[1]), "keeper reply")
	err = sdnotify.Send(socket, "FDGET=1\nFDNAME="+name, []*os.File{theirs})
	theirs.Close() // the keeper's copy alone is left: its close ends the answer
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	b := make([]byte, 512)
	oob := make([]byte, oobSize)
	want := -1
	for {
		n, oobn, flags, _, err := unix.Recvmsg(mine, b, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue // a signal; SO_RCVTIMEO waits are not restarted
		}
		if err == unix.EAGAIN {
			return fds, fmt.Errorf("keeper: no answer from %s within %v", socket, timeout)
		}
		if err != nil {
			return fds, fmt.Errorf("keeper: %s: %w", socket, err)
		}
		got, cred := parseControl(oob[:oobn])
		fds = append(fds, got...)
		if n == 0 && oobn == 0 {
			break // the keeper closed its end
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			return fds, fmt.Errorf("keeper: %s: answer cut off", socket)
		}
		if cred == nil || cred.Uid != 0 && cred.Uid != uint32(os.Geteuid()) {
			return fds, fmt.Errorf("keeper: %s answered from another user (%v): refused", socket, cred)
		}
		count, err := parseAnswer(b[:n], name)
		if err != nil {
			return fds, fmt.Errorf("keeper: %s: %w", socket, err)
		}
		if want >= 0 && count != want {
			return fds, fmt.Errorf("keeper: %s: answers announce %d and %d descriptors", socket, want, count)
		}
		want = count
	}
	if want < 0 || len(fds) != want {
		return fds, fmt.Errorf("keeper: %s passed %d descriptors of %d (it stopped answering)", socket, len(fds), max(want, 0))
	}
	return fds, nil
}

// answer is the keeper's answer to FDGET=1 for name when it holds n
// descriptors under it, which parseAnswer reads.
func answer(name string, n int) []byte {
	return []byte("FDNAME=" + name + "\nFDCOUNT=" + strconv.Itoa(n))
}

// parseAnswer reads "FDNAME=name\nFDCOUNT=n" and returns n.
func parseAnswer(b []byte, name string) (int, error) {
	n, c, ok := bytes.Cut(b, []byte("\n"))
	if !ok || string(n) != "FDNAME="+name || !bytes.HasPrefix(c, []byte("FDCOUNT=")) {
		return 0, fmt.Errorf("answer %q: want FDNAME=%s and FDCOUNT=", trim(string(b)), name)
	}
	count, err := strconv.Atoi(string(c[len("FDCOUNT="):]))
	if err != nil || count < 0 {
		return 0, fmt.Errorf("answer %q: bad FDCOUNT", trim(string(b)))
	}
	return count, nil
}
