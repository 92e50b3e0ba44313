package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// Bad command lines are usage errors (exit status 2) of one line that
// names the flag and what it allows.
func TestBadCommandLines(t *testing.T) {
	send := []string{"send", "--to", "127.0.0.1:5300", "--rate", "1000", "--duration", "1s"}
	recv := []string{"recv", "--listen", "127.0.0.1:5300", "--duration", "1s"}
	with := func(base []string, more ...string) []string { return append(append([]string(nil), base...), more...) }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"blast"}, "missing command"},
		{[]string{"send", "--rate", "1", "--duration", "1s"}, "--to is required"},
		{[]string{"recv", "--duration", "1s"}, "--listen is required"},
		{[]string{"recv", "--listen", "127.0.0.1:5300"}, "--duration is required"},
		{[]string{"send", "--to", "127.0.0.1:5300", "--duration", "1s"}, "--rate is required"},
		{[]string{"send", "--to", "127.0.0.1:5300", "--rate", "1"}, "--duration or --count is required"},
		{with(send[:5], "--to", "10.0.0.1"), `--to "10.0.0.1": want ADDR:PORT`},
		{with(send, "--to", "127.0.0.1:0"), `--to "127.0.0.1:0": want a port from 1 to 65535`},
		{with(send, "--rate", "-5"), "--rate -5: want 0"},
		{with(send, "--size", "15"), "--size 15: want 16 to 65507"},
		{with(send, "--flows", "0"), "--flows 0: want 1 to 256"},
		{with(send, "--gso", "65"), "--gso 65: want 0 or 1 (off) to 64"},
		{with(send, "--size", "2000", "--gso", "64"), "--gso 64: want --gso × --size (2000) at most 65507"},
		{with(send, "--batch", "0"), "--batch 0: want 1 to 1024"},
		{with(send, "--duration", "-1s"), "--duration -1s: want a positive duration"},
		{with(recv, "--idle", "-1s"), "--idle -1s: want 0 (off)"},
		{with(recv, "--sockbuf", "-1"), "--sockbuf -1: want 0"},
		{with(recv, "--rate", "5"), "-rate"},
		{with(send, "extra"), `unexpected argument "extra"`},
	} {
		var stdout, stderr bytes.Buffer
		err := run(tc.args, &stdout, &stderr)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want a one-line usage error containing %q", tc.args, err, tc.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := run([]string{"send", "-h"}, &stdout, &stderr); err != errHelp || !strings.Contains(stderr.String(), "-gso") {
		t.Errorf("send -h: %v, usage %q; want errHelp and the flags", err, stderr.String())
	}
}
