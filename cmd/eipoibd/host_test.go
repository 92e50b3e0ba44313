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

// TestHostConfigAndLogFormat: "eipoibd host" takes --config and
// --log-format as "run" does: the file's values apply, the command line
// wins, a bad value from the file is one line naming the file, and the
// JSON format writes JSON lines.
func TestHostConfigAndLogFormat(t *testing.T) {
	p := writeConfig(t, "underlay = \"ul9\"\nib-mtu = 2048\npkey = \"0x800a\"\nlog-format = \"json\"\n")
	o, err := parseHost([]string{"--config", p}, &bytes.Buffer{})
	if err != nil || o.underlay != "ul9" || o.ibMTU != 2048 || o.pkeyV != 0x800a || o.logFormat != "json" {
		t.Fatalf("from the file: %+v, %v", o, err)
	}
	o, err = parseHost([]string{"--config", p, "--ib-mtu", "4096", "--log-format", "text"}, &bytes.Buffer{})
	if err != nil || o.ibMTU != 4096 || o.logFormat != "text" || o.underlay != "ul9" {
		t.Fatalf("flags over the file: %+v, %v", o, err)
	}
	for _, c := range []struct{ text, want string }{
		{"bogus = 1\n", `--config P: unknown key "bogus" (eipoibd host -h lists the keys, without the dashes)`},
		{"underlay = \"u\"\nib-mtu = 1000\n", "--config P: --ib-mtu 1000: want 2048 or 4096"},
		{"underlay = \"u\"\nlog-format = \"xml\"\n", `--config P: --log-format "xml": want text or json`},
	} {
		p := writeConfig(t, c.text)
		_, err := parseHost([]string{"--config", p}, &bytes.Buffer{})
		want := strings.ReplaceAll(c.want, "P", p)
		if err == nil || err.Error() != want {
			t.Errorf("%q: error %v, want %q", c.text, err, want)
		}
	}
	if _, err := parseHost([]string{"--underlay", "x", "--log-format", "xml"}, &bytes.Buffer{}); err == nil || err.Error() != `--log-format "xml": want text or json` {
		t.Errorf("--log-format xml: %v", err)
	}
	var out bytes.Buffer
	o, _ = parseHost([]string{"--underlay", "x", "--log-format", "json"}, &bytes.Buffer{})
	newLogger(o.logFormat, &out, o.level).Info("hello", "k", 1)
	if line := out.String(); !strings.HasPrefix(line, `{"time":`) || !strings.Contains(line, `"msg":"hello","k":1}`) {
		t.Errorf("JSON log line: %q", line)
	}
}
