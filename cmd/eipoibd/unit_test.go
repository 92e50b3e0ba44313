package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unitKeys returns the unit file's assignments by key (the last wins).
func unitKeys(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			m[k] = v
		}
	}
	return m
}

// TestSystemdUnit: dist/systemd/eipoibd@.service is a Type=notify
// service with a watchdog. Its command line, with the instance name
// substituted for %i, is one eipoibd's own parser accepts, given a
// config file holding the underlay. systemd-analyze verifies the unit
// with the binary in place.
func TestSystemdUnit(t *testing.T) {
	const unit = "../../dist/systemd/eipoibd@.service"
	k := unitKeys(t, unit)
	if k["Type"] != "notify" || k["NotifyAccess"] != "main" || k["WatchdogSec"] == "" || k["ExecReload"] != "/bin/kill -HUP $MAINPID" ||
		k["CapabilityBoundingSet"] != "CAP_NET_ADMIN CAP_NET_RAW CAP_BPF CAP_PERFMON" || k["LimitMEMLOCK"] != "infinity" || k["DeviceAllow"] != "/dev/net/tun rw" || k["RuntimeDirectory"] != "eipoibd" {
		t.Fatalf("unit keys: %v", k)
	}
	// Documentation= names what the install steps (the unit's comment,
	// docs/libvirt.md, the README) put in /usr/local/share/doc/eipoibd:
	// README.md and docs/*.md.
	const install = "install -D -m 644 -t /usr/local/share/doc/eipoibd README.md docs/*.md"
	for _, f := range []string{unit, "../../docs/libvirt.md", "../../README.md"} {
		if b, err := os.ReadFile(f); err != nil || !bytes.Contains(b, []byte(install)) {
			t.Errorf("%s does not say %q (%v)", f, install, err)
		}
	}
	for _, u := range strings.Fields(k["Documentation"]) {
		name, ok := strings.CutPrefix(u, "file:///usr/local/share/doc/eipoibd/")
		src := filepath.Join("../../docs", name)
		if name == "README.md" {
			src = "../../README.md"
		}
		if _, err := os.Stat(src); !ok || err != nil {
			t.Errorf("Documentation=%s: not a file the install steps install (%v)", u, err)
		}
	}
	args := strings.Fields(strings.ReplaceAll(k["ExecStart"], "%i", "eib0"))
	if args[0] != "/usr/local/bin/eipoibd" {
		t.Fatalf("ExecStart %v", args)
	}
	cfg := filepath.Join(t.TempDir(), "eib0.toml")
	os.WriteFile(cfg, []byte("underlay = \"ul1\"\n"), 0o600)
	for i, a := range args {
		if a == "/etc/eipoibd/eib0.toml" {
			args[i] = cfg
		}
	}
	if args[1] != "run" {
		t.Fatalf("ExecStart %v: not eipoibd run", args)
	}
	o, err := parse(args[2:], &bytes.Buffer{})
	if err != nil || o.cfg.Name != "eib0" || o.cfg.Underlay != "ul1" || o.cfg.CtlDir != "/run/eipoibd" {
		t.Fatalf("ExecStart %v: %+v, %v", args, o, err)
	}
	// systemd-analyze verify needs no running systemd (it loads the unit
	// offline), so it runs in a container too; scripts/deps.sh installs
	// it (Debian's systemd package).
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("no systemd-analyze to verify the unit with (make test installs it: scripts/deps.sh)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "eipoibd"), ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	inst := filepath.Join(dir, "eipoibd@eib0.service")
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(inst, bytes.ReplaceAll(b, []byte("/usr/local/bin/eipoibd"), []byte(filepath.Join(dir, "eipoibd"))), 0o644)
	if out, err := exec.Command("systemd-analyze", "verify", inst).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
