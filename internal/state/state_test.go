package state

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/mactrans"
)

func sample() *State {
	return &State{
		TAP:       "eib0",
		VLANPKeys: "10=0x800a",
		Guests: []Guest{
			{MAC: ether.MAC{2, 0, 0, 0, 0, 1}, Origin: mactrans.OriginLearned, QPN: 0x12345,
				IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}},
			{MAC: ether.MAC{2, 0, 0, 0, 0, 2}, VLAN: 10, Origin: mactrans.OriginOVS, QPN: 0xfffffe},
		},
	}
}

// TestSaveLoad: a saved state loads back equal, the file is the only one
// left in its directory (no temporary file), and a missing file is
// os.ErrNotExist, not corruption.
func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "eib0.state")
	if err := Save(path, sample()); err != nil {
		t.Fatal(err)
	}
	if err := Save(path, sample()); err != nil { // over an existing one
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Fatalf("loaded %+v, want %+v", got, sample())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d files in the directory, want the state alone", len(ents))
	}
	_, err = Load(filepath.Join(dir, "none"))
	var ce *CorruptError
	if !errors.Is(err, os.ErrNotExist) || errors.As(err, &ce) {
		t.Fatalf("a missing file: %v", err)
	}
	if err := Save(filepath.Join(dir, "no", "such"), sample()); err == nil {
		t.Fatal("saved into a missing directory")
	}
}

// TestWriteErrorStable: a save that keeps failing (here the rename, over
// a directory) fails with the same words each time, naming the state
// file and the step, never the random temporary name, and leaves no
// temporary file behind.
func TestWriteErrorStable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "eib0.state")
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	e1, e2 := Save(path, sample()), Save(path, sample())
	if e1 == nil || e2 == nil || e1.Error() != e2.Error() ||
		!strings.Contains(e1.Error(), path+": rename: ") || strings.Contains(e1.Error(), ".tmp") {
		t.Fatalf("errors %q and %q; want the same, naming %s and the rename", e1, e2, path)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries in the directory, want the state's alone", len(ents))
	}
}

// TestCorrupt: each kind of bad file is a *CorruptError naming the file
// and the fault, and SetAside moves it out of the way.
func TestCorrupt(t *testing.T) {
	good, _ := Marshal(sample())
	for _, c := range []struct{ edit, want string }{
		{`{"version": 1,`, "unexpected EOF"},
		{"", "EOF"},
		{string(good) + "{}", "data after the JSON object"},
		{strings.Replace(string(good), `"version": 1`, `"version": 2`, 1), "version 2, want 1"},
		{strings.Replace(string(good), `"tap": "eib0"`, `"tap": ""`, 1), `bad TAP name ""`},
		{strings.Replace(string(good), `"tap": "eib0"`, `"tap": "eib0", "extra": 1`, 1), `unknown field "extra"`},
		{strings.Replace(string(good), `"02:00:00:00:00:01"`, `"01:00:00:00:00:01"`, 1), `guest 0: MAC "01:00:00:00:00:01": want a unicast MAC`},
		{strings.Replace(string(good), `"vlan": 10`, `"vlan": 4095`, 1), "guest 1: VLAN 4095: want 0 to 4094"},
		{strings.Replace(string(good), `"ovs"`, `"libvirt"`, 1), `guest 1: origin "libvirt": want learned, declared, bridge or ovs`},
		{strings.Replace(string(good), `16777214`, `16777215`, 1), "guest 1: QPN 0xffffff: want 0x2 to 0xfffffe"},
		{strings.Replace(string(good), `"10.0.0.1"`, `"fe80::1"`, 1), `guest 0: address "fe80::1": want a unicast address a guest claims`},
		{strings.Replace(string(good), `"10.0.0.1"`, `"10.0.0"`, 1), `ParseAddr("10.0.0")`},
		{strings.Replace(string(good), `"02:00:00:00:00:02"`, `"02:00:00:00:00:01"`, 1) + "", ""}, // another VLAN: fine
		{strings.Replace(strings.Replace(string(good), `"02:00:00:00:00:02"`, `"02:00:00:00:00:01"`, 1), `"vlan": 10`, `"vlan": 0`, 1), "guest 1: 02:00:00:00:00:01 on VLAN 0 twice"},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "eib0.state")
		os.WriteFile(path, []byte(c.edit), 0o600)
		_, err := Load(path)
		if c.want == "" {
			if err != nil {
				t.Errorf("%v", err)
			}
			continue
		}
		var ce *CorruptError
		if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60q: %v, want a CorruptError of %s with %q", c.edit, err, path, c.want)
			continue
		}
		to, err := SetAside(path)
		if err != nil || to != path+".corrupt" {
			t.Fatal(to, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the corrupt file is still at %s", path)
		}
		if b, _ := os.ReadFile(to); string(b) != c.edit {
			t.Errorf("set aside as %q, want the file's bytes", b)
		}
	}
	big := make([]byte, MaxSize+1)
	if _, err := Parse(big); err == nil || !strings.Contains(err.Error(), "over the 16777216 limit") {
		t.Errorf("a file over the size limit: %v", err)
	}
}

// FuzzParse: Parse never panics, and what it accepts marshals to a file
// it parses back to the same state.
func FuzzParse(f *testing.F) {
	good, _ := Marshal(sample())
	f.Add(good)
	f.Add([]byte(`{"version":1,"tap":"eib0","vlan_pkey":"","guests":[]}`))
	f.Add([]byte(`{"version":1,"tap":"x","guests":[{"mac":"02:00:00:00:00:09","vlan":0,"origin":"bridge","qpn":2,"ips":["::ffff:1.2.3.4"]}]}`))
	f.Add([]byte(`{"version":1,"tap":"eib0","guests":[{"mac":"02:00:00:00:00:01","origin":"learned","qpn":3,"ips":[""]}]}`))
	f.Add([]byte(`[]`))
	// Found by the fuzzer: an empty address list must survive a round trip.
	f.Add([]byte(`{"version":1,"tAp":"0","guests":[{"mAC":"00:00:00:00:00:01","vlAn":0,"origin":"bridge","qpn":2,"ips":[]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b)
		if err != nil {
			return
		}
		again, err := Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := Parse(again)
		if err != nil || !reflect.DeepEqual(s, s2) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, s, s2)
		}
	})
}
