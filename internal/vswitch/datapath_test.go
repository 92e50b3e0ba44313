package vswitch

import (
	"testing"
)

// The Bridge and Open_vSwitch tables as this machine's Open vSwitch
// (3.1) lists them: a userspace bridge obr and a kernel bridge kbr;
// other_config empty and with userspace-tso-enable.
const (
	bridgeTable = `{"data":[["obr","netdev"],["kbr",""]],"headings":["name","datapath_type"]}`
	globalNoTSO = `{"data":[[["map",[]]]],"headings":["other_config"]}`
	globalTSO   = `{"data":[[["map",[["userspace-tso-enable","true"]]]]],"headings":["other_config"]}`
)

// TestParseDatapath: each bridge's datapath and userspace-tso-enable
// are read (the value as OVS's smap_get_bool reads it), and whether the
// bridge takes GSO super-frames follows: the kernel datapath always,
// the userspace one only with TSO enabled and on every port, which the
// tables alone never say; a missing bridge and malformed tables are
// errors.
func TestParseDatapath(t *testing.T) {
	for _, c := range []struct {
		br, global string
		want       Datapath
		gso        bool
	}{
		{"obr", globalNoTSO, Datapath{Type: "netdev"}, false},
		{"obr", globalTSO, Datapath{Type: "netdev", UserspaceTSO: true}, false},
		{"obr", `{"data":[[["map",[["userspace-tso-enable","TRUE"]]]]],"headings":["other_config"]}`, Datapath{Type: "netdev", UserspaceTSO: true}, false},
		{"obr", `{"data":[[["map",[["userspace-tso-enable","yes"]]]]],"headings":["other_config"]}`, Datapath{Type: "netdev"}, false},
		{"kbr", globalNoTSO, Datapath{}, true},
		{"kbr", globalTSO, Datapath{UserspaceTSO: true}, true},
	} {
		d, err := parseDatapath(c.br, []byte(bridgeTable), []byte(c.global))
		if err != nil || d != c.want || d.TakesGSO() != c.gso {
			t.Errorf("%s with %s: %+v (takes GSO %v), %v; want %+v (%v)", c.br, c.global, d, d.TakesGSO(), err, c.want, c.gso)
		}
	}
	if d := (Datapath{Type: "system"}); !d.Kernel() || !d.TakesGSO() {
		t.Errorf("%+v: not the kernel's, or takes no GSO", d)
	}
	for _, c := range []struct {
		d   Datapath
		gso bool
	}{
		{Datapath{Type: "netdev", UserspaceTSO: true, PortsGSO: true}, true},
		{Datapath{Type: "netdev", PortsGSO: true}, false},
		{Datapath{Type: "netdev", UserspaceTSO: true, NoGSO: "ovs-vswitchd reads port vg1 without a vnet header"}, false},
	} {
		if c.d.TakesGSO() != c.gso {
			t.Errorf("%+v: takes GSO %v, want %v", c.d, c.d.TakesGSO(), c.gso)
		}
	}
	for _, c := range []struct{ br, bridges, global string }{
		{"nobr", bridgeTable, globalNoTSO},
		{"obr", `{"data":[["obr",["set",[]]]],"headings":["name","datapath_type"]}`, globalNoTSO},
		{"obr", bridgeTable, `{"data":[],"headings":["other_config"]}`},
		{"obr", bridgeTable, `{"data":[["x"]],"headings":["other_config"]}`},
		{"obr", `[`, globalNoTSO},
		{"obr", bridgeTable, `{`},
	} {
		if d, err := parseDatapath(c.br, []byte(c.bridges), []byte(c.global)); err == nil {
			t.Errorf("%s in %s, %s: %+v, want an error", c.br, c.bridges, c.global, d)
		}
	}
}

// FuzzDatapath: any Bridge and Open_vSwitch listing, however garbled,
// gives a datapath or an error without a panic, and a datapath given
// takes GSO exactly when it is the kernel's (the listing alone never
// vouches for a userspace one's ports).
func FuzzDatapath(f *testing.F) {
	f.Add("obr", []byte(bridgeTable), []byte(globalNoTSO))
	f.Add("kbr", []byte(bridgeTable), []byte(globalTSO))
	f.Add("obr", []byte(`{"data":[["obr",1]],"headings":["name","datapath_type"]}`), []byte(`{"data":[[["map",[["a","b"]]]]],"headings":["other_config"]}`))
	f.Fuzz(func(t *testing.T, br string, bridges, global []byte) {
		d, err := parseDatapath(br, bridges, global)
		if err != nil {
			if d != (Datapath{}) {
				t.Fatalf("error %v with a datapath %+v", err, d)
			}
			return
		}
		if d.TakesGSO() != (d.Type == "" || d.Type == "system") {
			t.Fatalf("%+v: takes GSO %v", d, d.TakesGSO())
		}
	})
}
