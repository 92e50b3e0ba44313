package nstest

import (
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// TCPDigest sends n pseudo-random bytes (seeded by n and seed) over one
// TCP connection of network ("tcp", "tcp4" or "tcp6") from namespace from to a
// listener it opens on ip, any port, in namespace to, and fails unless
// the listener read exactly those n bytes: the count and the SHA-256 of
// what was sent. The connection gives up after two minutes.
func TCPDigest(t testing.TB, from, to, network, ip string, n int64, seed byte) {
	t.Helper()
	var ln net.Listener
	var err error
	Do(t, to, func() { ln, err = net.Listen(network, net.JoinHostPort(ip, "0")) })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		n   int64
		sum [32]byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(120 * time.Second))
		h := sha256.New()
		r, err := io.Copy(h, c)
		got <- result{n: r, sum: [32]byte(h.Sum(nil)), err: err}
	}()
	var conn net.Conn
	Do(t, from, func() { conn, err = net.DialTimeout(network, ln.Addr().String(), 10*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(120 * time.Second))
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{byte(n), seed}), n), h)
	sent, err := io.Copy(conn, src)
	if cerr := conn.(*net.TCPConn).CloseWrite(); err == nil {
		err = cerr
	}
	want := [32]byte(h.Sum(nil))
	r := <-got
	conn.Close()
	if err != nil || r.err != nil || sent != n || r.n != n || r.sum != want {
		t.Fatalf("TCP %s → %s in %s: sent %d (%v), received %d (%v), SHA-256 %x, want %d bytes with %x", from, ln.Addr(), to, sent, err, r.n, r.err, r.sum, n, want)
	}
}
