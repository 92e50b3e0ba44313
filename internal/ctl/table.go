package ctl

// What the command table's entries are, and what derives from them: the
// server's checks (ParseRequest) and dispatch, the Client's typed calls,
// and the lists of names the CLI shows.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/eipoib/eipoibd/internal/cli"
)

// none is the arguments of a command that takes none, and the reply of
// one that answers no data.
type none = struct{}

// A command is an entry of the table: a request carrying an A, answered
// with a reply whose data is an R (none: no data).
type command[A, R any] struct {
	cmd  string // Request.Cmd
	what string // Request.What of a listing of show; empty for the others
	// put writes the arguments into a request and get reads them from a
	// checked one; nil for none.
	put func(A, *Request)
	get func(Request) A
	// check refuses a request whose arguments are wrong; nil for none.
	check func(Request) error
	// answer answers a request; stream, instead, streams what follows an
	// empty reply (a capture).
	answer func(Handler, A) (R, error)
	stream func(h Handler, a A, w io.Writer, gone <-chan struct{}) error
}

// entry is a command as the server dispatches it, whatever its types.
type entry interface {
	names() (cmd, what string)
	checkArgs(r Request) error
	streams() bool
	serve(h Handler, r Request) (any, error)
	serveStream(h Handler, r Request, w io.Writer, gone <-chan struct{}) error
}

// listing is the show command listing what with m.
func listing[R any](what string, m func(Handler) R) command[none, R] {
	return command[none, R]{cmd: CmdShow, what: what, answer: func(h Handler, _ none) (R, error) { return m(h), nil }}
}

// noData is a command's answer from a Handler method that returns only
// an error.
func noData[A any](m func(Handler, A) error) func(Handler, A) (none, error) {
	return func(h Handler, a A) (none, error) { return none{}, m(h, a) }
}

func (c command[A, R]) names() (string, string) { return c.cmd, c.what }

func (c command[A, R]) String() string {
	if c.what != "" {
		return c.what
	}
	return c.cmd
}

func (c command[A, R]) checkArgs(r Request) error {
	if c.check == nil {
		return nil
	}
	return c.check(r)
}

func (c command[A, R]) streams() bool { return c.stream != nil }

func (c command[A, R]) args(r Request) A {
	var a A
	if c.get != nil {
		a = c.get(r)
	}
	return a
}

// serve answers r with h: the reply's data, nil for none.
func (c command[A, R]) serve(h Handler, r Request) (any, error) {
	rep, err := c.answer(h, c.args(r))
	if _, ok := any(rep).(none); ok {
		return nil, err
	}
	return rep, err
}

func (c command[A, R]) serveStream(h Handler, r Request, w io.Writer, gone <-chan struct{}) error {
	return c.stream(h, c.args(r), w, gone)
}

// request is the command with arguments a, as the Client sends it.
func (c command[A, R]) request(a A) Request {
	r := Request{Cmd: c.cmd, What: c.what}
	if c.put != nil {
		c.put(a, &r)
	}
	return r
}

// call sends the command with arguments a to the daemon cl talks to and
// decodes the reply's data.
func (c command[A, R]) call(cl Client, a A) (R, error) {
	var rep R
	data, err := cl.Do(c.request(a))
	if err != nil {
		return rep, err
	}
	if _, ok := any(rep).(none); ok {
		return rep, nil
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return rep, fmt.Errorf("ctl: bad %s reply from eipoibd: %w", c, err)
	}
	return rep, nil
}

// streamTo sends the command with arguments a to the daemon cl talks to
// and copies the stream that follows the reply to w until the daemon
// ends it.
func (c command[A, R]) streamTo(cl Client, a A, w io.Writer) error {
	conn, err := dial(cl.Path, c.request(a))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, rest, err := readReply(cl.Path, conn)
	if err != nil {
		return err
	}
	_, err = io.Copy(w, io.MultiReader(rest, conn))
	return err
}

// ParseRequest parses and checks one request line.
func ParseRequest(line []byte) (Request, error) {
	r, _, err := parseRequest(line)
	return r, err
}

// parseRequest parses and checks one request line, and finds its entry.
func parseRequest(line []byte) (Request, entry, error) {
	var r Request
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		return r, nil, fmt.Errorf("malformed request: %v", err)
	}
	if d.More() {
		return r, nil, errors.New("malformed request: more than one JSON value")
	}
	if r.V != Version {
		return r, nil, fmt.Errorf("protocol version %d, this daemon speaks %d", r.V, Version)
	}
	e, err := lookup(r)
	if err != nil {
		return r, nil, err
	}
	return r, e, e.checkArgs(r)
}

// lookup finds r's entry in the table. Request.What names the entry of
// a command with several (show), and is ignored by the others.
func lookup(r Request) (entry, error) {
	var whats []string
	for _, e := range table {
		cmd, what := e.names()
		if cmd != r.Cmd {
			continue
		}
		if what == "" || what == r.What {
			return e, nil
		}
		whats = append(whats, what)
	}
	if whats == nil {
		return nil, fmt.Errorf("unknown command %q", r.Cmd)
	}
	return nil, fmt.Errorf("%s %q: want %s", r.Cmd, r.What, cli.OrList(whats))
}

// Commands are the commands' wire names (Request.Cmd), each once, in
// the table's order.
func Commands() []string {
	var out []string
	for _, e := range table {
		if cmd, _ := e.names(); !slices.Contains(out, cmd) {
			out = append(out, cmd)
		}
	}
	return out
}

// Listings are what show lists (Request.What), in the table's order.
func Listings() []string {
	var out []string
	for _, e := range table {
		if cmd, what := e.names(); cmd == CmdShow {
			out = append(out, what)
		}
	}
	return out
}
