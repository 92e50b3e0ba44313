package nstest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BPFFS mounts a bpffs of the test's own in a temporary directory,
// unmounted when the test ends. A new bpffs is not empty: with
// bpf_preload it holds maps.debug and progs.debug (kernel/bpf/inode.c,
// populate_bpffs), so tests compare with Names of it when mounted.
func BPFFS(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount a bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Names returns the names in directory dir, sorted.
func Names(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
