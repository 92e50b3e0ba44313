// Package sdnotify speaks systemd's notification protocol (sd_notify(3)):
// datagrams of "KEY=value" lines to the unix socket named by
// $NOTIFY_SOCKET, for a Type=notify service's READY=1, STOPPING=1,
// STATUS= and WATCHDOG=1. Outside systemd it does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

// Notify sends state (newline-separated assignments) to systemd and
// reports whether there was a socket to send it to.
func Notify(state string) (bool, error) {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return false, nil
	}
	if name[0] == '@' { // an abstract socket
		name = "\x00" + name[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	return true, nil
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
