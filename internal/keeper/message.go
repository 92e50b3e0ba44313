package keeper

import (
	"bytes"
	"fmt"

	"github.com/eipoib/eipoibd/internal/sdnotify"
)

// MaxMessage is the longest message the keeper reads, as systemd's
// notify socket (NOTIFY_BUFFER_MAX, PIPE_BUF): a longer one is cut off
// by the kernel and refused as truncated.
const MaxMessage = 4096

// DefaultName is the name of descriptors stored without FDNAME=, as
// systemd calls them (service_add_fd_store, src/core/service.c).
const DefaultName = "stored"

// Message is one request to the keeper, a datagram of newline-separated
// KEY=value assignments as sd_notify(3) sends them.
type Message struct {
	// Store: FDSTORE=1, keep the descriptors passed along under Name.
	Store bool
	// Remove: FDSTOREREMOVE=1, close those kept under Name. As in
	// systemd's service_notify_message, it wins over FDSTORE=1 in the
	// same message (whose descriptors are then closed).
	Remove bool
	// Get: FDGET=1, the keeper's own request (systemd has none): pass
	// back those kept under Name over the one socket passed along (a
	// SOCK_SEQPACKET end).
	Get bool
	// NoPoll: FDPOLL=0, do not drop the stored descriptors when they
	// report EPOLLHUP or EPOLLERR.
	NoPoll bool
	// Name is FDNAME=, or DefaultName for a store without one.
	Name string
	// Other counts the assignments with other keys (READY=1, STATUS=…
	// from a notify client pointed here), which the keeper ignores.
	Other int
}

// MalformedError is a message the keeper refuses; Kind names the
// defect for the counters and the log.
type MalformedError struct {
	Kind string // short, for a counter name: "bad_name", "no_assignment", …
	Msg  string
}

func (e *MalformedError) Error() string { return "keeper: " + e.Kind + ": " + e.Msg }

func malformed(kind, format string, a ...any) error {
	return &MalformedError{Kind: kind, Msg: fmt.Sprintf(format, a...)}
}

// The kinds of MalformedError.
const (
	KindEmpty        = "empty"         // no bytes, or only newlines
	KindNUL          = "nul_byte"      // a NUL byte in the text
	KindNoAssignment = "no_assignment" // a line without "="
	KindRepeated     = "repeated_key"  // a key of the keeper's given twice
	KindBadValue     = "bad_value"     // FDSTORE, FDSTOREREMOVE, FDGET not 1; FDPOLL not 0 or 1
	KindBadName      = "bad_name"      // FDNAME= not 1 to 255 printable ASCII characters, colon excluded
	KindNoName       = "no_name"       // FDSTOREREMOVE=1 or FDGET=1 without FDNAME=
	KindConflict     = "conflict"      // FDGET=1 with FDSTORE=1 or FDSTOREREMOVE=1
	KindNoRequest    = "no_request"    // none of FDSTORE=1, FDSTOREREMOVE=1, FDGET=1
)

// Parse reads one message. Empty lines are skipped; a trailing newline
// is usual. Keys other than the keeper's are counted in Other and
// otherwise ignored, as systemd ignores those it does not know. Names
// follow sd_notify(3) (fdname_is_valid: 1 to 255 printable ASCII
// characters other than a colon). systemd logs and ignores a bad
// FDNAME=; here the whole message is refused instead, so that no
// descriptor lands under a name its sender did not mean.
func Parse(b []byte) (Message, error) {
	var m Message
	if bytes.IndexByte(b, 0) >= 0 {
		return m, malformed(KindNUL, "a NUL byte at %d", bytes.IndexByte(b, 0))
	}
	seen := map[string]bool{}
	lines := 0
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		lines++
		k, v, ok := bytes.Cut(line, []byte("="))
		if !ok {
			return m, malformed(KindNoAssignment, "line %d is not KEY=value", lines)
		}
		key := string(k)
		switch key {
		case "FDSTORE", "FDSTOREREMOVE", "FDGET", "FDPOLL", "FDNAME":
		default:
			m.Other++
			continue
		}
		if seen[key] {
			return m, malformed(KindRepeated, "%s given twice", key)
		}
		seen[key] = true
		val := string(v)
		switch key {
		case "FDNAME":
			if !sdnotify.ValidName(val) {
				return m, malformed(KindBadName, "FDNAME=%q: want 1 to 255 printable ASCII characters, no colon", trim(val))
			}
			m.Name = val
			continue
		case "FDPOLL":
			if val != "0" && val != "1" {
				return m, malformed(KindBadValue, "FDPOLL=%q: want 0 or 1", trim(val))
			}
			m.NoPoll = val == "0"
			continue
		}
		if val != "1" {
			return m, malformed(KindBadValue, "%s=%q: want 1", key, trim(val))
		}
		switch key {
		case "FDSTORE":
			m.Store = true
		case "FDSTOREREMOVE":
			m.Remove = true
		case "FDGET":
			m.Get = true
		}
	}
	switch {
	case lines == 0:
		return m, malformed(KindEmpty, "no assignment")
	case m.Get && (m.Store || m.Remove):
		return m, malformed(KindConflict, "FDGET=1 goes alone, without FDSTORE=1 or FDSTOREREMOVE=1")
	case (m.Get || m.Remove) && m.Name == "":
		return m, malformed(KindNoName, "FDGET=1 and FDSTOREREMOVE=1 need FDNAME=")
	case !m.Store && !m.Remove && !m.Get:
		return m, malformed(KindNoRequest, "none of FDSTORE=1, FDSTOREREMOVE=1, FDGET=1")
	case m.Name == "":
		m.Name = DefaultName
	}
	return m, nil
}

// trim shortens a value quoted in an error.
func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
