package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzRecordFile: whatever an attachment's record file holds, it is
// loaded or refused with a CNI I/O error (code 5), never a panic. A
// loaded record belongs to the attachment its file is named after, not
// to the names written in it, and listing the network finds it so.
func FuzzRecordFile(f *testing.F) {
	for _, s := range []string{
		`{"containerID":"c1","ifname":"eth0","declared":[{"tap":"eib0","socketDir":"/run/eipoibd","stateDir":"/run/eipoibd","mac":"0a:58:0a:4d:00:32","vlan":0}]}`,
		`{"containerID":"other","ifname":"net9","declared":[]}`, `{}`, `[]`, `null`, ``, `{"declared":[{"vlan":"1"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rs := records{t.TempDir()}
		if err := os.WriteFile(rs.path("c1", "eth0"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := rs.load("c1", "eth0")
		if err != nil {
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != types.ErrIOFailure {
				t.Fatalf("error %v, want a code 5 CNI error", err)
			}
			return
		}
		if r.ContainerID != "c1" || r.IfName != "eth0" {
			t.Fatalf("record of c1 eth0 loaded as %s %s", r.ContainerID, r.IfName)
		}
		all, err := rs.all()
		if err != nil || len(all) != 1 || all[0].ContainerID != "c1" || all[0].IfName != "eth0" {
			t.Fatalf("listing: %+v, %v", all, err)
		}
	})
}

// TestSaveFailsLeavesNoTemp: a record whose rename fails (its name taken
// by a directory that is not empty) is refused with a CNI I/O error and
// leaves no temporary file behind.
func TestSaveFailsLeavesNoTemp(t *testing.T) {
	rs := records{t.TempDir()}
	r := record{ContainerID: "c1", IfName: "eth0", Declared: []decl{{TAP: "eib0", MAC: "0a:58:0a:4d:00:32"}}}
	if err := os.MkdirAll(filepath.Join(rs.path("c1", "eth0"), "in-the-way"), 0o700); err != nil {
		t.Fatal(err)
	}
	var ce *types.Error
	if err := rs.save(r); !errors.As(err, &ce) || ce.Code != types.ErrIOFailure {
		t.Fatalf("save over a directory: %v, want a code 5 CNI error", err)
	}
	if left, _ := filepath.Glob(filepath.Join(rs.dir, "*"+tmpSuffix)); len(left) != 0 {
		t.Fatalf("temporary files left after the failed save: %v", left)
	}
}

// TestGCRemovesStaleTemps: GC removes the temporary files of writers
// killed before their rename once they are older than tmpStale, and
// keeps a younger one (a writer may still be at it) and the records.
func TestGCRemovesStaleTemps(t *testing.T) {
	rs := records{t.TempDir()}
	stale := rs.path("c1", "eth0") + ".123" + tmpSuffix
	fresh := rs.path("c2", "eth0") + ".456" + tmpSuffix
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte(`{"declared":[]}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * tmpStale)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if err := rs.save(record{ContainerID: "c3", IfName: "eth0", Declared: []decl{{TAP: "eib0", MAC: "0a:58:0a:4d:00:32"}}}); err != nil {
		t.Fatal(err)
	}
	if err := rs.gc([]types.GCAttachment{{ContainerID: "c3", IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	got, _ := filepath.Glob(filepath.Join(rs.dir, "*"))
	want := []string{fresh, rs.path("c3", "eth0")}
	if !slices.Equal(got, want) {
		t.Fatalf("after GC the network holds %v, want %v", got, want)
	}
}
