package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// "eipoibd host": bad command lines are usage errors naming the problem;
// a missing underlay is a runtime error.
func TestHostCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"host"}, "--underlay is required", true},
		{[]string{"host", "--underlay", "x", "--ib-mtu", "1500"}, "--ib-mtu 1500", true},
		{[]string{"host", "--underlay", "x", "--pkey", "0x8000"}, "invalid partition", true},
		{[]string{"host", "--underlay", "x", "--max-neighbours", "0"}, "--max-neighbours 0", true},
		{[]string{"host", "--underlay", "x", "--log-level", "loud"}, "--log-level", true},
		{[]string{"host", "--underlay", "x", "extra"}, `unexpected argument "extra"`, true},
		{[]string{"host", "--underlay", "no-such-if0"}, `underlay interface "no-such-if0" not found`, false},
	} {
		err := run(tc.args, &bytes.Buffer{})
		var ue usageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.As(err, &ue) != tc.usage {
			t.Errorf("%v: error %v, want one containing %q (usage error: %v)", tc.args, err, tc.want, tc.usage)
		}
	}
	var stderr bytes.Buffer
	if err := run([]string{"host", "-h"}, &stderr); err != errHelp || !strings.Contains(stderr.String(), "-neigh-file") {
		t.Errorf("host -h: %v\n%s", err, stderr.String())
	}
}
