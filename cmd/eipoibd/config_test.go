package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// TestReferenceConfig: docs/eipoibd.toml lists every flag of "run" but
// config itself, each with the flag's default, so the reference cannot
// drift from the code.
func TestReferenceConfig(t *testing.T) {
	var m map[string]any
	if _, err := toml.DecodeFile("../../docs/eipoibd.toml", &m); err != nil {
		t.Fatal(err)
	}
	fs := runFlags(&options{})
	var flags, keys []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" {
			flags = append(flags, f.Name)
		}
	})
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(flags)
	sort.Strings(keys)
	if strings.Join(keys, " ") != strings.Join(flags, " ") {
		t.Fatalf("reference keys\n%v\nflags\n%v", keys, flags)
	}
	for _, k := range keys {
		v, err := configValue(m[k])
		if def := fs.Lookup(k).DefValue; err != nil || v != def {
			t.Errorf("%s = %q in the reference, default %q (%v)", k, v, def, err)
		}
	}
	// And the reference as a whole is a valid configuration, for every
	// backend: it writes out the other backends' settings, at their
	// defaults, which a backend that does not use them accepts.
	o, err := parse([]string{"--config", "../../docs/eipoibd.toml", "--underlay", "ul1"}, &bytes.Buffer{})
	if err != nil || o.cfg.Queues != runtime.NumCPU() {
		t.Fatalf("the reference does not parse: %v", err)
	}
	for _, args := range [][]string{{"--fabric", "kernel", "--ib-dev", "ib0"}, {"--fabric", "verbs", "--ib-dev", "rxe0"}} {
		if _, err := parse(append([]string{"--config", "../../docs/eipoibd.toml"}, args...), &bytes.Buffer{}); err != nil {
			t.Errorf("the reference with %s does not parse: %v", strings.Join(args, " "), err)
		}
	}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "eipoibd.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigFile: the file's values apply, the command line wins over it,
// and each mistake is one line naming the file, the key, the value and
// what is allowed.
func TestConfigFile(t *testing.T) {
	p := writeConfig(t, "underlay = \"ul9\"\nib-mtu = 2048\nvif-idle = \"90s\"\noffload = false\nvlan-pkey = \"10=0x800a\"\n")
	o, err := parse([]string{"--config", p}, &bytes.Buffer{})
	if err != nil || o.cfg.Underlay != "ul9" || o.cfg.IBMTU != 2048 || o.cfg.VIFIdle != 90*time.Second || o.cfg.Offload || len(o.cfg.Partitions) != 1 || o.cfg.Partitions[10] != 0x800a {
		t.Fatalf("from the file: %+v, %v", o, err)
	}
	o, err = parse([]string{"--config", p, "--ib-mtu", "4096", "--offload=true"}, &bytes.Buffer{})
	if err != nil || o.cfg.IBMTU != 4096 || !o.cfg.Offload || o.cfg.Underlay != "ul9" {
		t.Fatalf("flags over the file: %+v, %v", o, err)
	}
	for _, c := range []struct{ text, want string }{
		{"bogus = 1\n", `--config P: unknown key "bogus" (eipoibd run -h lists the keys, without the dashes)`},
		{"config = \"x\"\n", `--config P: unknown key "config"`},
		{"underlay = \"u\"\nib-mtu = \"big\"\n", `--config P: key "ib-mtu" = "big": want an integer`},
		{"underlay = \"u\"\nib-mtu = 1000\n", "--config P: --ib-mtu 1000: want 2048 or 4096"},
		{"underlay = \"u\"\nvif-idle = \"soon\"\n", `--config P: key "vif-idle" = "soon": want a duration like "90s" or "5m"`},
		{"underlay = \"u\"\noffload = \"maybe\"\n", `--config P: key "offload" = "maybe": want true or false`},
		{"underlay = [\"u\"]\n", `--config P: key "underlay": a []interface {}; want a string, a number or a boolean`},
		{"underlay = \"u\"\nib-mtu = \n", `--config P: line 3 (last key "ib-mtu"): expected value`},
		{"underlay = \"u\"\nlog-format = \"xml\"\n", `--config P: --log-format "xml": want text or json`},
		{"underlay = \"u\"\nverbs-recv-depth = 2048\n", "--config P: --verbs-recv-depth 2048 is for --fabric verbs, not --fabric sim"},
	} {
		p := writeConfig(t, c.text)
		_, err := parse([]string{"--config", p}, &bytes.Buffer{})
		want := strings.ReplaceAll(c.want, "P", p)
		if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want %q", c.text, err, want)
		}
	}
	missing := filepath.Join(t.TempDir(), "none.toml")
	if _, err := parse([]string{"--config", missing}, &bytes.Buffer{}); err == nil || err.Error() != "--config "+missing+": no such file or directory" {
		t.Errorf("missing file: %v", err)
	}
	// A file of no bytes is one being rewritten in place, or not the one
	// meant: refused, never run as the defaults. Comments alone are the
	// defaults.
	empty := writeConfig(t, "")
	if _, err := parse([]string{"--config", empty, "--underlay", "ul1"}, &bytes.Buffer{}); err == nil || err.Error() != "--config "+empty+": empty file (0 bytes): being written, or not the one meant? (a file of comments only runs with the defaults)" {
		t.Errorf("empty file: %v", err)
	}
	comments := writeConfig(t, "# the defaults\n")
	if o, err := parse([]string{"--config", comments, "--underlay", "ul1"}, &bytes.Buffer{}); err != nil || o.cfg.Bridge != "" || o.logFormat != "text" {
		t.Errorf("a file of comments only: %+v, %v", o, err)
	}
}

// TestLogFormatJSON: --log-format json writes one JSON object a line.
func TestLogFormatJSON(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger("json", &buf, slog.LevelInfo)
	log.Info("started", "tap", "eib0", "ib_mtu", 4096)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "started" || rec["tap"] != "eib0" || rec["ib_mtu"] != float64(4096) || rec["level"] != "INFO" {
		t.Fatalf("%q: %v %v", buf.String(), rec, err)
	}
}
