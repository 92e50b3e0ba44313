// Package ctl is eipoibd's control socket: a Unix stream socket per
// daemon (/run/eipoibd/NAME.sock, mode 0600, root peers only, checked
// with SO_PEERCRED) speaking newline-delimited JSON. A client sends one
// request line and reads one reply line:
//
//	→ {"v":1,"cmd":"show","what":"vifs"}
//	← {"v":1,"ok":true,"data":[...]}
//	← {"v":1,"ok":false,"error":"..."}
//
// A capture request's reply is followed by the capture itself, a pcap
// stream, until the count is reached or the client hangs up. Requests
// are at most MaxRequest bytes; a malformed, oversized or unknown one
// gets an error reply and the connection is closed. The server never
// touches the data path itself: its handler reads the shim's snapshots.
//
// The commands are declared once, in a table (commands.go): their wire
// names (Cmd*, Show*, Side*), their checks and their Handler methods; the
// server's dispatch and the Client's typed calls derive from it. The
// replies' types (Port, VIF, Neigh, Group, Stats, Flushed) and their JSON
// are declared beside them, for the daemon's Handler, the CLI and
// the tests, which all talk through a Client.
package ctl

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Version is the protocol version; a request of another is refused.
const Version = 1

// MaxRequest bounds a request line.
const MaxRequest = 64 << 10

// DefaultDir holds the daemons' sockets.
const DefaultDir = "/run/eipoibd"

// Path is the socket of the daemon whose TAP is name.
func Path(dir, name string) string { return filepath.Join(dir, name+".sock") }

// StatePath is the --persist state file, in state directory dir, of the
// daemon whose TAP is name: the daemon restores its guests' VIFs from it
// at start (and the CNI plugin's DEL looks for it).
func StatePath(dir, name string) string { return filepath.Join(dir, name+".state") }

// Response is the reply to a request.
type Response struct {
	V     int             `json:"v"`
	OK    bool            `json:"ok"`
	Error string          `json:"error,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// Server serves one socket.
type Server struct {
	ln   *net.UnixListener
	path string
	h    Handler
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn map[net.Conn]bool // open connections, under mu
	shut bool              // Close has begun: no new connection, under mu
}

// Listen creates the socket at path (its directory too, mode 0755),
// mode 0600, replacing a stale one that nothing listens on.
func Listen(path string, h Handler) (*Server, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("ctl: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("ctl: %s is in use: another eipoibd serves this name", path)
	}
	os.Remove(path)
	old := unix.Umask(0o177) // the socket is born 0600
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("ctl: %w", err)
	}
	return &Server{ln: ln, path: path, h: h, conn: map[net.Conn]bool{}}, nil
}

// Serve accepts connections until Close.
func (s *Server) Serve() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		// A connection accepted while Close runs is closed; the others
		// are counted under mu, so that Close's Wait follows every Add.
		s.mu.Lock()
		if s.shut {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conn[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serve(c)
			s.mu.Lock()
			delete(s.conn, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops serving, ends open connections (captures included) and
// removes the socket.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.shut = true
	for c := range s.conn {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	os.Remove(s.path)
	return err
}

// AllowPeer is the access rule: root only (the socket is 0600 as well).
func AllowPeer(uid uint32) error {
	if uid != 0 {
		return fmt.Errorf("permission denied: uid %d is not root", uid)
	}
	return nil
}

func peerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// serve answers one connection's request.
func (s *Server) serve(c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	reply := func(data any, err error) bool {
		r := Response{V: Version, OK: err == nil}
		if err != nil {
			r.Error = err.Error()
		} else if data != nil {
			b, merr := json.Marshal(data)
			if merr != nil {
				r.OK, r.Error = false, "encode reply: "+merr.Error()
			} else {
				r.Data = b
			}
		}
		b, _ := json.Marshal(r)
		_, werr := c.Write(append(b, '\n'))
		return werr == nil && r.OK
	}
	uid, err := peerUID(c)
	if err == nil {
		err = AllowPeer(uid)
	}
	if err != nil {
		reply(nil, err)
		return
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, MaxRequest+1), 4096).ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) || len(line) > MaxRequest {
		reply(nil, fmt.Errorf("request longer than %d bytes", MaxRequest))
		return
	}
	if err != nil && len(line) == 0 {
		return // the client went without asking
	}
	req, e, err := parseRequest(line)
	if err != nil {
		reply(nil, err)
		return
	}
	if !e.streams() {
		reply(e.serve(s.h, req))
		return
	}
	if !reply(nil, nil) {
		return
	}
	c.SetDeadline(time.Time{})
	gone := make(chan struct{})
	go func() { // the client hanging up (or Close) ends the capture
		io.Copy(io.Discard, c)
		close(gone)
	}()
	e.serveStream(s.h, req, c, gone)
}

// Client talks to the control socket at Path, one connection a request.
type Client struct {
	Path string // Path(dir, name)
}

// Do sends req and returns the reply's data as the daemon wrote it; a
// refusal is an error with the daemon's message.
func (c Client) Do(req Request) (json.RawMessage, error) {
	conn, err := dial(c.Path, req)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, _, err := readReply(c.Path, conn)
	return r, err
}

// NoDaemonError is a request's error when no daemon answered on the
// control socket at Path. Either the dial failed (Connected false):
// ENOENT is no socket there, ECONNREFUSED a socket no daemon listens on,
// e.g. one left by a crash. Or the connection ended before any reply
// (Connected): a daemon stopping took the connection into its listen
// backlog, then closed it. Err is the system's reason.
type NoDaemonError struct {
	Path      string
	Connected bool
	Err       error
}

func (e *NoDaemonError) Error() string {
	switch {
	case e.Connected:
		return fmt.Sprintf("no reply from eipoibd at %s: %v", e.Path, e.Err)
	case errors.Is(e.Err, os.ErrNotExist) || errors.Is(e.Err, unix.ECONNREFUSED):
		return fmt.Sprintf("no eipoibd at %s (is it running, with this --name?)", e.Path)
	}
	return e.Err.Error() // net.OpError's, which names the path
}

// Unwrap returns the system's reason.
func (e *NoDaemonError) Unwrap() error { return e.Err }

func dial(path string, req Request) (net.Conn, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return nil, &NoDaemonError{Path: path, Err: err}
	}
	req.V = Version
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		// A daemon that refuses the peer (not root) replies and closes
		// before reading the request: its reply says why.
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, _, rerr := readReply(path, c)
		c.Close()
		var re replyError
		if errors.As(rerr, &re) {
			return nil, rerr
		}
		return nil, &NoDaemonError{Path: path, Connected: true, Err: err}
	}
	return c, nil
}

// replyError is an error the daemon replied with.
type replyError string

func (e replyError) Error() string { return string(e) }

// readReply reads the reply line of the daemon at path from c; rest
// holds what was read past it.
func readReply(path string, c net.Conn) (json.RawMessage, io.Reader, error) {
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return nil, nil, &NoDaemonError{Path: path, Connected: true, Err: err}
	}
	var r Response
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, nil, fmt.Errorf("bad reply from eipoibd: %q", strings.TrimSpace(string(line)))
	}
	if !r.OK {
		return nil, nil, replyError(r.Error)
	}
	return r.Data, br, nil
}
