package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// chainedConf is a chained configuration as libcni hands it to the
// second plugin of a conflist: bridge's result as prevResult.
const chainedConf = `{"cniVersion":"1.0.0","name":"ib","type":"eipoib","tap":"eib1","socketDir":"/run/x","stateDir":"/run/s/","vlan":10,
"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"br0","mac":"aa:bb:cc:dd:ee:01"},
{"name":"veth1","mac":"aa:bb:cc:dd:ee:02"},{"name":"eth0","mac":"0a:58:0a:4d:00:32","sandbox":"/var/run/netns/pod"}],
"ips":[{"address":"10.77.0.50/24","interface":2}]}}`

// TestParseConfChained: the plugin's keys at the top, the prevResult
// parsed; the defaults where keys are left out.
func TestParseConfChained(t *testing.T) {
	c, err := ParseConf([]byte(chainedConf))
	if err != nil {
		t.Fatal(err)
	}
	if c.mode != chained || c.TAP != "eib1" || c.SocketDir != "/run/x" || c.VLAN != 10 || c.Socket() != "/run/x/eib1.sock" || c.StateFile() != "/run/s/eib1.state" {
		t.Errorf("parsed %+v, want chained, tap eib1, socketDir /run/x, stateDir /run/s, vlan 10", c)
	}
	if c.Net.PrevResult == nil || c.Net.CNIVersion != "1.0.0" {
		t.Errorf("prevResult %v, cniVersion %q: want the parsed result of version 1.0.0", c.Net.PrevResult, c.Net.CNIVersion)
	}
	c, err = ParseConf([]byte(`{"cniVersion":"0.4.0","name":"ib","type":"eipoib"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.TAP != "eib0" || c.SocketDir != "/run/eipoibd" || c.StateFile() != "/run/eipoibd/eib0.state" || c.VLAN != 0 || c.DataDir != "/var/lib/cni/eipoib" || c.Net.PrevResult != nil {
		t.Errorf("defaults %+v, want tap eib0, socketDir and stateDir /run/eipoibd (eipoibd's defaults), vlan 0, dataDir /var/lib/cni/eipoib, no prevResult", c)
	}
	// stateDir follows socketDir: a socketDir naming no daemon names no
	// state file of another (DEL would wait for it for good).
	for _, in := range []string{`{"type":"eipoib","socketDir":"/run/x/"}`, `{"type":"eipoib","socketDir":"/run/x","stateDir":null}`} {
		c, err = ParseConf([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if c.StateDir != "/run/x" || c.StateFile() != "/run/x/eib0.state" {
			t.Errorf("%s: stateDir %q, want socketDir's /run/x", in, c.StateDir)
		}
	}
}

// TestParseConfIPAMWrap: bridge's configuration with an "eipoib" IPAM
// section: the plugin's keys come from that section, and the real IPAM
// runs with the same configuration, its "ipam" replaced by the wrapped
// one and every other key (numbers too) kept as written.
func TestParseConfIPAMWrap(t *testing.T) {
	in := `{"cniVersion":"1.0.0","name":"ib","type":"bridge","bridge":"br0","mtu":9000,"tap":"ignored",
"ipam":{"type":"eipoib","tap":"eib2","vlan":20,"ipam":{"type":"dhcp","daemonSocketPath":"/run/d.sock"}}}`
	c, err := ParseConf([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if c.mode != ipamWrap || c.TAP != "eib2" || c.VLAN != 20 || c.SocketDir != "/run/eipoibd" || c.ipamType != "dhcp" {
		t.Errorf("parsed %+v, want ipamWrap, tap eib2, vlan 20, default socketDir, inner dhcp", c)
	}
	var got, want map[string]any
	if err := json.Unmarshal(c.delegate, &got); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(`{"cniVersion":"1.0.0","name":"ib","type":"bridge","bridge":"br0","mtu":9000,"tap":"ignored",
"ipam":{"type":"dhcp","daemonSocketPath":"/run/d.sock"}}`), &want)
	if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
		t.Errorf("delegate configuration\n%s\nwant\n%s", g, w)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestParseConfErrors: each bad configuration is a CNI error of code 7
// (invalid network configuration) whose message names the problem.
func TestParseConfErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`not json`, "not JSON"},
		{`{"type":"bridge","ipam":{"type":"host-local"}}`, `want type "eipoib"`},
		{`{"type":"eipoib","tap":""}`, `tap "": empty`},
		{`{"type":"eipoib","tap":"averyveryverylongname"}`, "longer than 15 bytes"},
		{`{"type":"eipoib","tap":"a/b"}`, "contains '/'"},
		{`{"type":"eipoib","tap":".."}`, "not an interface name"},
		{`{"type":"eipoib","socketDir":"run/eipoibd"}`, "want an absolute directory"},
		{`{"type":"eipoib","stateDir":""}`, `stateDir "": want an absolute directory`},
		{`{"type":"eipoib","vlan":4095}`, "vlan 4095: want 0 (untagged) to 4094"},
		{`{"type":"eipoib","vlan":-1}`, "vlan -1"},
		{`{"type":"eipoib","vlan":"10"}`, `vlan "10": want a number, 0 (untagged) to 4094`},
		{`{"type":"eipoib","vlan":1.5}`, `vlan 1.5: want a number`},
		{`{"type":"eipoib","tap":5}`, `tap 5: want a string, eipoibd's --name`},
		{`{"type":"bridge","ipam":{"type":"eipoib","socketDir":["/run"],"ipam":{"type":"static"}}}`, `socketDir ["/run"]: want a string`},
		{`{"type":"eipoib","dataDir":"cni"}`, `dataDir "cni": want an absolute directory`},
		{`{"type":"eipoib","prevResult":{"cniVersion":"9.9.9"}}`, "prevResult"},
		{`{"type":"bridge","ipam":{"type":"eipoib"}}`, "wraps the real IPAM"},
		{`{"type":"bridge","ipam":{"type":"eipoib","ipam":{"type":"eipoib"}}}`, "wraps the real IPAM"},
		{`{"type":"bridge","ipam":{"type":"eipoib","vlan":5000,"ipam":{"type":"static"}}}`, "vlan 5000"},
	} {
		_, err := ParseConf([]byte(tc.in))
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig || !strings.Contains(ce.Msg, tc.want) {
			t.Errorf("ParseConf(%s) = %v, want a code 7 error containing %q", tc.in, err, tc.want)
		}
	}
}

// FuzzParseConf: any input is parsed or refused with a code 7 error,
// never a panic. What is accepted holds: a valid TAP name, an absolute
// clean socketDir and stateDir, a VLAN from 0 to 4094, and in ipamWrap
// mode a delegate configuration that parses with a real IPAM type. The
// records' location found without parsing (recordsIn) is the one parsed.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{chainedConf, `{"type":"eipoib"}`, `{"type":"eipoib","vlan":4094,"tap":"x","socketDir":"/a/../b/","stateDir":"/c/./d"}`,
		`{"type":"bridge","ipam":{"type":"eipoib","ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/24"}]]}}}`,
		`{"type":"bridge","ipam":{"type":"eipoib","ipam":{}}}`, `{"type":"eipoib","prevResult":{"cniVersion":"0.3.1","ips":[]}}`,
		`{"type":"eipoib","prevResult":null}`, `[]`, `{"type":"eipoib","tap":"é"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ParseConf(in)
		if err != nil {
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("error %v, want a code 7 CNI error", err)
			}
			return
		}
		if checkIfName(c.TAP) != nil || !filepath.IsAbs(c.SocketDir) || filepath.Clean(c.SocketDir) != c.SocketDir ||
			!filepath.IsAbs(c.DataDir) || filepath.Clean(c.DataDir) != c.DataDir ||
			!filepath.IsAbs(c.StateDir) || filepath.Clean(c.StateDir) != c.StateDir || c.VLAN < 0 || c.VLAN > 4094 {
			t.Fatalf("accepted %+v", c)
		}
		if rs, ok := recordsIn(in); c.Net.Name != "" && (!ok || rs != recordsOf(c)) {
			t.Fatalf("records in %+v (found %v), parsed %+v", rs, ok, recordsOf(c))
		}
		if c.mode == ipamWrap {
			var d struct {
				IPAM struct {
					Type string `json:"type"`
				} `json:"ipam"`
			}
			if err := json.Unmarshal(c.delegate, &d); err != nil || d.IPAM.Type != c.ipamType || d.IPAM.Type == "" || d.IPAM.Type == PluginType {
				t.Fatalf("delegate %s (%v), ipam type %q", c.delegate, err, c.ipamType)
			}
		}
	})
}
