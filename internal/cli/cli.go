// Package cli holds what the project's commands share about failing: a
// bad command line is a UsageError (exit status 2), anything else exits
// with 1, and ErrHelp ends a run that printed its usage.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrHelp ends the program successfully after it printed its usage.
var ErrHelp = errors.New("help")

// UsageError is a bad command line: one line naming the problem.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Exit ends the program as err says: nothing for nil or ErrHelp, else
// "name: err" on standard error and status 2 for a UsageError, 1 for
// anything else.
func Exit(name string, err error) {
	if err == nil || err == ErrHelp {
		return
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	var ue UsageError
	if errors.As(err, &ue) {
		os.Exit(2)
	}
	os.Exit(1)
}

// Parse parses args with fs (made with flag.ContinueOnError, its output
// discarded). -h prints usage and the flags' defaults to stderr and
// returns ErrHelp; a bad flag or a stray argument is a UsageError, a bad
// flag's ending with "(hint)".
func Parse(fs *flag.FlagSet, args []string, usage string, stderr io.Writer, hint string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usage)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return ErrHelp
		}
		return UsageError{Msg: err.Error() + " (" + hint + ")"}
	}
	if fs.NArg() > 0 {
		return UsageError{Msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// OrList is the choices a refusal offers, as "a, b or c".
func OrList(choices []string) string {
	if len(choices) < 2 {
		return strings.Join(choices, "")
	}
	return strings.Join(choices[:len(choices)-1], ", ") + " or " + choices[len(choices)-1]
}
