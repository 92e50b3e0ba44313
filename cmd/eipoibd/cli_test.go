package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// TestCommandList: eipoibd alone, --help, -h and help list every command
// of the table, one line each ("  name  summary"), and the table holds
// every released command, in order (a command added anywhere does not
// fail it); alone it is a usage error ("missing command"), asked for it
// is help.
func TestCommandList(t *testing.T) {
	want := []string{"run", "host", "keeper", "show", "vif", "neigh", "capture", "version", "help"}
	var names []string
	i := 0
	for _, c := range commands {
		names = append(names, c.name)
		if i < len(want) && c.name == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Fatalf("commands %v lack %q or hold it out of order; want %v among them", names, want[i], want)
	}
	line := regexp.MustCompile(`(?m)^  ([a-z]+) +(.+)$`)
	for _, args := range [][]string{nil, {"--help"}, {"-h"}, {"help"}} {
		var stderr bytes.Buffer
		err := run(args, &stderr)
		if args == nil {
			var ue usageError
			if !errors.As(err, &ue) || err.Error() != "missing command (the list is above)" {
				t.Errorf("no arguments: %v", err)
			}
		} else if err != errHelp {
			t.Errorf("%v: %v", args, err)
		}
		got := line.FindAllStringSubmatch(stderr.String(), -1)
		if len(got) != len(commands) {
			t.Fatalf("%v: %d command lines, want %d:\n%s", args, len(got), len(commands), stderr.String())
		}
		for i, c := range commands {
			if got[i][1] != c.name || got[i][2] != c.summary {
				t.Errorf("%v: line %d %q, want %s %s", args, i, got[i][0], c.name, c.summary)
			}
		}
	}
}

// TestCommandUsage: "eipoibd help CMD" and "eipoibd CMD -h" print the
// same: the command's usage line, then its flags; an unknown command
// says so, whether run or asked about.
func TestCommandUsage(t *testing.T) {
	flagOf := map[string]string{"run": "-underlay", "host": "-neigh-file", "keeper": "-max-fds", "show": "-interval",
		"vif": "-vlan", "neigh": "-json", "capture": "-side", "version": "", "help": ""}
	for _, c := range commands {
		var h, help bytes.Buffer
		if err := run([]string{c.name, "-h"}, &h); err != errHelp {
			t.Errorf("%s -h: %v", c.name, err)
		}
		if err := run([]string{"help", c.name}, &help); err != errHelp {
			t.Errorf("help %s: %v", c.name, err)
		}
		if h.String() != help.String() {
			t.Errorf("%s -h and help %s differ:\n%s\n---\n%s", c.name, c.name, h.String(), help.String())
		}
		if first, _, _ := strings.Cut(h.String(), "\n"); first != "usage: eipoibd "+c.synopsis {
			t.Errorf("%s -h: first line %q", c.name, first)
		}
		f, ok := flagOf[c.name]
		if !ok && len(c.ctl) > 0 {
			f, ok = "-name", true // a client command added since
		}
		if !ok {
			t.Errorf("%s: no flag of it to look for in its usage", c.name)
		} else if f != "" && !regexp.MustCompile("\n  "+f+"[ \n]").MatchString(h.String()) {
			t.Errorf("%s -h lists no %s:\n%s", c.name, f, h.String())
		} else if f == "" && strings.Contains(h.String(), "Flags:") {
			t.Errorf("%s -h lists flags it has not:\n%s", c.name, h.String())
		}
	}
	for _, args := range [][]string{{"bogus"}, {"help", "bogus"}} {
		err := run(args, io.Discard)
		var ue usageError
		if !errors.As(err, &ue) || err.Error() != `unknown command "bogus" (eipoibd help lists the commands)` {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestEveryControlCommandHasACLI: the subcommands send, between them,
// every command of the control socket's table, each from one
// subcommand declared with its run function in clientCommands (ctl.go),
// and show offers every listing the table has.
func TestEveryControlCommandHasACLI(t *testing.T) {
	var sent []string
	for _, c := range commands {
		client := slices.ContainsFunc(clientCommands, func(k command) bool { return k.name == c.name })
		if client != (len(c.ctl) > 0) {
			t.Errorf("%s: sends %q, and is in clientCommands: %v (want both or neither)", c.name, c.ctl, client)
		}
		for _, cmd := range c.ctl {
			if slices.Contains(sent, cmd) {
				t.Errorf("%s sends %s, which another subcommand sends too", c.name, cmd)
			}
			sent = append(sent, cmd)
		}
	}
	if want := ctl.Commands(); !slices.Equal(sent, want) {
		t.Errorf("the subcommands send %q; the control socket's table has %q", sent, want)
	}
	show, _ := lookup("show")
	if want := "show port|vifs|neigh|groups|stats [--name eib0] [--json] [--interval 1s [--count N]]"; show.synopsis != want {
		t.Errorf("show's usage %q, want %q", show.synopsis, want)
	}
}

// TestClientChecksLocally: a listing show does not know, a MAC that does
// not parse and a VLAN out of range are one-line usage errors before any
// daemon is asked. No daemon answers in the empty --ctl-dir, so an error
// that tried would say "no eipoibd at".
func TestClientChecksLocally(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "bogus"}, `show "bogus": want port, vifs, neigh, groups, stats`},
		{[]string{"show"}, "show what? want port, vifs, neigh, groups, stats"},
		{[]string{"show", "vifs", "--interval", "1s"}, "--interval is for show stats"},
		{[]string{"vif", "add", "zz:zz"}, `MAC "zz:zz": want six colon-separated hex bytes, e.g. 02:00:00:00:00:01`},
		{[]string{"vif", "del", "02:00:00:00:00:01:02"}, `MAC "02:00:00:00:00:01:02": want six colon-separated hex bytes, e.g. 02:00:00:00:00:01`},
		{[]string{"vif", "add", "02:00:00:00:00:01", "--vlan", "4095"}, "--vlan 4095: want 0 (untagged) to 4094"},
		{[]string{"vif", "zap", "02:00:00:00:00:01"}, "want vif add|del MAC [--vlan N]"},
		{[]string{"neigh", "list"}, "want neigh flush"},
		{[]string{"capture"}, "capture needs -w FILE (- for standard output)"},
		{[]string{"capture", "-w", "-", "--side", "eth"}, `--side "eth": want fabric or tap`},
	} {
		err := run(append(tc.args, "--ctl-dir", dir), io.Discard)
		var ue usageError
		if !errors.As(err, &ue) || err.Error() != tc.want {
			t.Errorf("%v: %v, want the usage error %q", tc.args, err, tc.want)
		}
	}
	// A valid command does dial.
	if err := run([]string{"show", "vifs", "--ctl-dir", dir}, io.Discard); err == nil || !strings.HasPrefix(err.Error(), "no eipoibd at ") {
		t.Errorf("show vifs without a daemon: %v", err)
	}
}

// captureHandler is a control socket's daemon whose capture writes
// pcap's bytes.
type captureHandler struct {
	ctl.UnimplementedHandler
	pcap []byte
}

func (h captureHandler) Capture(r ctl.CaptureRequest, w io.Writer, _ <-chan struct{}) error {
	_, err := w.Write(h.pcap)
	return err
}

// TestCaptureToStdout: "capture -w -" writes the daemon's pcap stream to
// standard output, byte for byte, and makes no file called "-"; -w FILE
// writes the same to FILE.
func TestCaptureToStdout(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the control socket admits root peers only")
	}
	dir := t.TempDir()
	pcap := []byte("\xd4\xc3\xb2\xa1 stands for a pcap stream")
	srv, err := ctl.Listen(ctl.Path(dir, "eib0"), captureHandler{pcap: pcap})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer srv.Close()
	t.Chdir(t.TempDir())

	var out bytes.Buffer
	stdout = &out
	defer func() { stdout = os.Stdout }()
	if err := run([]string{"capture", "-w", "-", "--ctl-dir", dir}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), pcap) {
		t.Errorf("standard output %q, want the %d bytes %q", out.Bytes(), len(pcap), pcap)
	}
	if _, err := os.Stat("-"); !os.IsNotExist(err) {
		t.Errorf(`a file "-" was made: %v`, err)
	}
	if err := run([]string{"capture", "-w", "x.pcap", "--ctl-dir", dir}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("x.pcap"); err != nil || !bytes.Equal(b, pcap) {
		t.Errorf("x.pcap: %q, %v", b, err)
	}
}

// TestVersionText: the version is the one make build stamps, else the
// module's; the VCS revision Go recorded, "(modified)" when the tree was;
// the Go version; the verbs backend only in a -tags verbs build.
func TestVersionText(t *testing.T) {
	goLine := fmt.Sprintf("go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	info := &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "-tags", Value: "netgo,verbs"}, {Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		v    string
		info *debug.BuildInfo
		want string
	}{
		{"v2.0.0-3-gabcdef", info, "eipoibd v2.0.0-3-gabcdef\nrevision: 0123456789abcdef (modified)\n" + goLine + "fabric backends: sim, kernel, verbs\n"},
		{"", info, "eipoibd v1.2.3\nrevision: 0123456789abcdef (modified)\n" + goLine + "fabric backends: sim, kernel, verbs\n"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "-tags", Value: "verbsx"}}},
			"eipoibd devel\n" + goLine + "fabric backends: sim, kernel\n"},
		{"", nil, "eipoibd devel\n" + goLine + "fabric backends: sim, kernel\n"},
	} {
		if got := versionText(tc.v, tc.info); got != tc.want {
			t.Errorf("versionText(%q, %v) =\n%s\nwant\n%s", tc.v, tc.info, got, tc.want)
		}
	}
}

// TestVersionBinary builds eipoibd as make build does, with a version
// stamped, and runs "version" and "--version": both print the stamp
// first, then the Go version and the backends of a build without verbs.
func TestVersionBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "eipoibd")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=v9.9.9-test", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).Output()
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if err != nil || lines[0] != "eipoibd v9.9.9-test" || !slices.Contains(lines, "fabric backends: sim, kernel") ||
			!slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "go: go1.") }) {
			t.Errorf("eipoibd %s: %v\n%s", arg, err, out)
		}
	}
}

// TestDocsNameCommands: every eipoibd command the README and docs/ cite,
// in a code block or an inline `eipoibd WORD` (not an error message
// quoted, which has ": "), is one the binary has.
func TestDocsNameCommands(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	cmdRe := regexp.MustCompile("(?m)^[ \t]*(?:\\$ |sudo )?(?:\\S*/)?eipoibd ([a-z][a-z-]*)")
	spanRe := regexp.MustCompile("`(?:\\S*/)?eipoibd ([a-z][a-z-]*)[^`]*`")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cited []string
		for i, block := range strings.Split(string(b), "```") {
			if i%2 == 1 { // inside a code block
				for _, m := range cmdRe.FindAllStringSubmatch(block, -1) {
					cited = append(cited, m[1])
				}
				continue
			}
			for _, m := range spanRe.FindAllStringSubmatch(block, -1) {
				if !strings.Contains(m[0], ": ") {
					cited = append(cited, m[1])
				}
			}
		}
		for _, c := range cited {
			if _, ok := lookup(c); !ok {
				t.Errorf("%s cites \"eipoibd %s\", which is no command", f, c)
			}
		}
	}
}
