package fastpath

import "fmt"

// Mode is the --fast-path setting: whether the kernel backend carries
// guests' ordinary unicast traffic with these programs.
type Mode uint8

// The modes.
const (
	// Off: never; every frame crosses user space (the default until the
	// hardware kit has validated the fast path).
	Off Mode = iota
	// Auto: when Probe passes; otherwise the daemon logs why not, once,
	// and runs the user-space path.
	Auto
	// On: the daemon refuses to start when Probe fails.
	On
)

var modeNames = [...]string{Off: "off", Auto: "auto", On: "on"}

// String is the mode as --fast-path takes it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses "off", "auto" or "on".
func ParseMode(s string) (Mode, bool) {
	for m, n := range modeNames {
		if n == s {
			return Mode(m), true
		}
	}
	return Off, false
}

// Valid reports whether m is one of the modes.
func (m Mode) Valid() bool { return int(m) < len(modeNames) }
