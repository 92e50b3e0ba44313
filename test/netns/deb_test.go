package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// debTools are what building the packages (scripts/mkdeb.sh), their
// root (scripts/mkbase.sh) and TestDebPackage need.
var debTools = []string{"dpkg", "dpkg-deb", "dpkg-shlibdeps", "fakeroot", "lintian", "debootstrap", "systemd-analyze", "tar", "chroot"}

// long runs a command that may take minutes on a busy machine (nstest's
// helpers allow one) with env added, within limit, and returns its
// standard output, trimmed; the test fails with its standard error on
// failure.
func long(t *testing.T, limit time.Duration, env []string, argv ...string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	timer := time.AfterFunc(limit, func() { cmd.Process.Kill() })
	defer timer.Stop()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// script runs one of the repository's scripts (scripts/NAME) as long
// does.
func script(t *testing.T, limit time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	return long(t, limit, env, append([]string{filepath.Join("../../scripts", name)}, args...)...)
}

// baseRoot unpacks the cached Debian root of scripts/mkbase.sh (the
// image's base) into a new directory and returns it.
func baseRoot(t *testing.T) string {
	t.Helper()
	tar := script(t, 30*time.Minute, nil, "mkbase.sh")
	root := t.TempDir()
	long(t, 10*time.Minute, nil, "tar", "-C", root, "-xf", tar)
	return root
}

// tree lists a root's files, directories and links with their modes,
// the dpkg database and log left out.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "var/lib/dpkg" || rel == "var/log" {
			return filepath.SkipDir
		}
		out = append(out, rel+" "+fi.Mode().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDebPackage: make deb's packages (scripts/mkdeb.sh, lintian clean
// of errors) install with dpkg into a Debian root: the image's
// debootstrap base, which has eipoibd-verbs's libraries. There, eipoibd,
// eipoibd-verbs and the CNI plugin report the version the packages
// carry. systemd-analyze verifies the installed unit with the verbs
// drop-in. An upgrade keeps the operator's change to the conffile, and a
// purge leaves the root as it was.
func TestDebPackage(t *testing.T) {
	require(t, debTools...)
	version := script(t, time.Minute, nil, "version.sh")
	debs := strings.Fields(script(t, 30*time.Minute, []string{"VERSION=" + version}, "mkdeb.sh", t.TempDir()))
	if len(debs) != 2 || !strings.Contains(debs[0], "/eipoibd_") || !strings.Contains(debs[1], "/eipoibd-verbs_") {
		t.Fatalf("mkdeb.sh made %v, want eipoibd and eipoibd-verbs", debs)
	}
	debver := strings.ReplaceAll(version, "-", "+")
	for _, d := range debs {
		if v := strings.TrimSpace(sh(t, "dpkg-deb", "-f", d, "Version")); v != debver {
			t.Fatalf("%s: Version %q, want %q", d, v, debver)
		}
	}
	root := baseRoot(t)
	before := tree(t, root)
	dpkg := func(args ...string) string {
		return long(t, 10*time.Minute, nil, append([]string{"dpkg", "--root=" + root, "--force-unsafe-io"}, args...)...)
	}
	dpkg("-i", debs[0], debs[1])

	// Each binary, run in the root, says the version.
	for bin, want := range map[string]string{
		"/usr/bin/eipoibd":       "eipoibd " + version + "\n",
		"/usr/bin/eipoibd-verbs": "eipoibd " + version + "\n",
		"/usr/lib/cni/eipoib":    "eipoib " + version + "\n",
	} {
		arg := "version"
		if strings.HasSuffix(bin, "/eipoib") {
			arg = "--version"
		}
		out, err := exec.Command("chroot", root, bin, arg).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s %s: %v\n%s\nwant it to start %q", bin, arg, err, out, want)
		}
	}

	// The unit as installed, the verbs drop-in applied: ExecStart runs
	// eipoibd-verbs, and systemd-analyze verify finds nothing to say.
	// The root has no systemd, whose units (sysinit.target, …) verify
	// needs: it reads a copy of the installed files, found before the
	// host's units, with their executables' paths in the root.
	cat := sh(t, "systemd-analyze", "cat-config", "--root="+root, "systemd/system/eipoibd@.service")
	if !strings.Contains(cat, "\nExecStart=\nExecStart=/usr/bin/eipoibd-verbs run --name %i --config /etc/eipoibd/%i.toml\n") {
		t.Errorf("the unit and its drop-ins:\n%s", cat)
	}
	units := t.TempDir()
	for _, f := range []string{"eipoibd@.service", "eipoibd@.service.d/verbs.conf"} {
		b, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(units, f)), 0o755)
		os.WriteFile(filepath.Join(units, f), []byte(strings.ReplaceAll(string(b), "/usr/bin/", root+"/usr/bin/")), 0o644)
	}
	verify := exec.Command("systemd-analyze", "verify", "eipoibd@eib0.service")
	verify.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+units+":")
	if out, err := verify.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("systemd-analyze verify eipoibd@eib0.service: %v\n%s", err, out)
	}

	// An upgrade keeps the operator's change to the conffile: the next
	// version is the same package with its version raised.
	const conf = "/etc/eipoibd/example.toml"
	if st := dpkg("-s", "eipoibd"); !strings.Contains(st, "\nConffiles:\n "+conf+" ") {
		t.Fatalf("eipoibd's conffiles:\n%s", st)
	}
	mine := []byte("# the operator's\nunderlay = \"eth1\"\n")
	if err := os.WriteFile(filepath.Join(root, conf), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(t.TempDir(), "eipoibd-next.deb")
	x := t.TempDir()
	long(t, 10*time.Minute, nil, "dpkg-deb", "-R", debs[0], x)
	ctl := filepath.Join(x, "DEBIAN/control")
	b, err := os.ReadFile(ctl)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(ctl, []byte(strings.Replace(string(b), "Version: "+debver, "Version: "+debver+".1", 1)), 0o644)
	long(t, 10*time.Minute, nil, "fakeroot", "dpkg-deb", "-Znone", "-b", x, next)
	dpkg("-i", next)
	if got, err := os.ReadFile(filepath.Join(root, conf)); err != nil || string(got) != string(mine) {
		t.Errorf("after the upgrade %s holds %q (%v), want the operator's %q", conf, got, err, mine)
	}
	if st := dpkg("-s", "eipoibd"); !strings.Contains(st, "\nVersion: "+debver+".1\n") {
		t.Fatalf("after the upgrade:\n%s", st)
	}

	// A purge leaves nothing: the tree is as it was before, conffile
	// and /etc/eipoibd included.
	dpkg("--purge", "eipoibd-verbs", "eipoibd")
	if after := tree(t, root); !slices.Equal(before, after) {
		var added, gone []string
		for _, f := range after {
			if !slices.Contains(before, f) {
				added = append(added, f)
			}
		}
		for _, f := range before {
			if !slices.Contains(after, f) {
				gone = append(gone, f)
			}
		}
		t.Errorf("after the purge: left %v, gone %v", added, gone)
	}
}
