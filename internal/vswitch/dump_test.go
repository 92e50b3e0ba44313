package vswitch

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestDump: a dump interrupted twice is made a third time and its
// answer returned without error; one interrupted every time is given up
// after dumpTries, with an error that is ErrDumpInterrupted; another
// error is returned at once.
func TestDump(t *testing.T) {
	calls := 0
	list := func(fails int, err error) func() (int, error) {
		calls = 0
		return func() (int, error) {
			calls++
			if calls <= fails {
				return -1, err
			}
			return 42, nil
		}
	}
	if v, err := dump("x", list(2, netlink.ErrDumpInterrupted)); v != 42 || err != nil || calls != 3 {
		t.Errorf("interrupted twice: %d, %v after %d calls; want 42, nil after 3", v, err, calls)
	}
	if _, err := dump("x", list(dumpTries, netlink.ErrDumpInterrupted)); !errors.Is(err, netlink.ErrDumpInterrupted) || calls != dumpTries {
		t.Errorf("always interrupted: %v after %d calls; want ErrDumpInterrupted after %d", err, calls, dumpTries)
	}
	other := errors.New("EPERM")
	if _, err := dump("x", list(1, other)); !errors.Is(err, other) || calls != 1 {
		t.Errorf("another error: %v after %d calls; want it after 1", err, calls)
	}
}
