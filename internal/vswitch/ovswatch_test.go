package vswitch

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/eipoib/eipoibd/ether"
)

// The --format=json tables ovs-vsctl and ovsdb-client print, as this
// machine's Open vSwitch printed them.
const (
	interfaceTable = `{"data":[["vg1",["map",[["attached-mac","52:54:00:aa:bb:cc"],["iface-id","x"]]]],["obr",["map",[]]]],"headings":["name","external_ids"]}`
	portTable      = `{"data":[["vg1",10],["obr",["set",[]]]],"headings":["name","tag"]}`
)

func TestParseOVSTable(t *testing.T) {
	rows, err := parseOVSTable([]byte(interfaceTable))
	if err != nil || len(rows) != 2 {
		t.Fatalf("rows %v, err %v", rows, err)
	}
	m, err := ovsMap(rows[0]["external_ids"])
	if err != nil || m["attached-mac"] != "52:54:00:aa:bb:cc" || m["iface-id"] != "x" || len(m) != 2 {
		t.Fatalf("external_ids %v, err %v", m, err)
	}
	if m, err := ovsMap(rows[1]["external_ids"]); err != nil || len(m) != 0 {
		t.Fatalf("empty map %v, err %v", m, err)
	}
	ports, err := parseOVSTable([]byte(portTable))
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := ovsInt(ports[0]["tag"]); !ok || n != 10 {
		t.Fatalf("tag %d %v, want 10", n, ok)
	}
	if _, ok := ovsInt(ports[1]["tag"]); ok {
		t.Fatal("an empty set read as a tag")
	}
	for _, bad := range []string{`{"data":[["a"]],"headings":["name","tag"]}`, `{"data":`, `[]`} {
		if _, err := parseOVSTable([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	for _, bad := range []string{`["set",[]]`, `"map"`, `["map",[["a",1]]]`, `["map"]`} {
		if _, err := ovsMap(json.RawMessage(bad)); err == nil {
			t.Errorf("map %s parsed", bad)
		}
	}
}

// FuzzOVSTable: any output of ovs-vsctl, however garbled, is parsed or
// refused without a panic, and every row has every heading.
func FuzzOVSTable(f *testing.F) {
	f.Add([]byte(interfaceTable))
	f.Add([]byte(portTable))
	f.Add([]byte(`{"data":[],"headings":[]}`))
	f.Add([]byte(`{"data":[[1,2]],"headings":["a"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rows, err := parseOVSTable(b)
		if err != nil {
			return
		}
		var tbl ovsTable
		json.Unmarshal(b, &tbl)
		for _, r := range rows {
			for _, h := range tbl.Headings {
				if _, ok := r[h]; !ok {
					t.Fatalf("row %v lacks %q", r, h)
				}
			}
			for _, v := range r {
				ovsMap(v)
				ovsInt(v)
			}
		}
	})
}

// TestGuestSetRestored: a guest set seeded with restored guests reports,
// at the first listing, those not listed as lost and those listed
// anew as added, and nothing for a restored guest still there.
func TestGuestSetRestored(t *testing.T) {
	kept := Guest{MAC: ether.MAC{2, 0, 0, 0, 0, 1}, VLAN: 10, Static: true}
	gone := Guest{MAC: ether.MAC{2, 0, 0, 0, 0, 2}, Static: true}
	fresh := Guest{MAC: ether.MAC{2, 0, 0, 0, 0, 3}, Static: true}
	var got []string
	s := guestSet{kept: true, gone: true}.update([]Guest{kept, fresh}, func(g Guest, added bool) {
		got = append(got, fmt.Sprint(g.MAC, added))
	})
	want := []string{fmt.Sprint(fresh.MAC, true), fmt.Sprint(gone.MAC, false)}
	if !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	if len(s) != 2 || !s[kept] || !s[fresh] {
		t.Errorf("set after the listing %v, want the two listed", s)
	}
}
