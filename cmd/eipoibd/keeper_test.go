package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// "eipoibd keeper": bad command lines are usage errors naming the flag;
// a socket in a place that is not a directory is a runtime error; -h
// lists the flags; the default socket is the one the DaemonSet shares.
func TestKeeperCommandLines(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"keeper", "--max-fds", "0"}, "--max-fds 0", true},
		{[]string{"keeper", "--max-names", "-1"}, "--max-names -1", true},
		{[]string{"keeper", "--socket", ""}, "--socket", true},
		{[]string{"keeper", "--log-format", "xml"}, "--log-format", true},
		{[]string{"keeper", "extra"}, `unexpected argument "extra"`, true},
		{[]string{"keeper", "--socket", filepath.Join(notDir, "x", "keeper.sock")}, "keeper:", false},
	} {
		err := run(tc.args, &bytes.Buffer{})
		var ue usageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.As(err, &ue) != tc.usage {
			t.Errorf("%v: error %v, want one containing %q (usage error: %v)", tc.args, err, tc.want, tc.usage)
		}
	}
	o, err := parseKeeper(nil, &bytes.Buffer{})
	if err != nil || o.cfg.Socket != "/run/eipoibd/keeper.sock" {
		t.Errorf("defaults: %+v, %v; want the socket /run/eipoibd/keeper.sock", o, err)
	}
	var stderr bytes.Buffer
	if err := run([]string{"keeper", "-h"}, &stderr); err != errHelp || !strings.Contains(stderr.String(), "-max-fds") {
		t.Errorf("keeper -h: %v\n%s", err, stderr.String())
	}
}
