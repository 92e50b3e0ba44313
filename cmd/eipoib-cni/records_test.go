package main

import (
	"errors"
	"os"
	"testing"

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
