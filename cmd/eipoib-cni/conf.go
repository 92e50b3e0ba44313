package main

// The network configuration says which eipoibd to talk to (tap,
// socketDir) and where it keeps its --persist state (stateDir). It gives
// the VLAN the pod's VIF is declared on and where the plugin records
// what it declared (dataDir). It also says how the plugin was invoked:
// chained after bridge, or as bridge's IPAM wrapping the real IPAM.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// PluginType is the network configuration "type" of this plugin, and the
// name of its binary in the runtime's CNI_PATH.
const PluginType = "eipoib"

// DefaultTAP is the TAP (eipoibd --name) a configuration without "tap"
// talks to.
const DefaultTAP = "eib0"

// mode is how the plugin was invoked.
type mode int

const (
	// chained: listed after bridge in a conflist; it finds the pod's
	// interface in the prevResult and passes the prevResult on.
	chained mode = iota
	// ipamWrap: bridge's "ipam" is {"type": "eipoib", ..., "ipam": {the
	// real IPAM}}. Bridge runs it once the pod's veth exists and before
	// any address is asked for. So the VIF is declared before a DHCP
	// DISCOVER leaves the pod; under --learn declared, an undeclared
	// MAC's frames are dropped.
	ipamWrap
)

// Conf is what the plugin was told.
type Conf struct {
	// The plugin's own keys: the TAP of the eipoibd to talk to, the
	// directory of its control socket, the directory of its --persist
	// state file and the VLAN (0: untagged) the pod's VIF is declared
	// on. The first three are eipoibd's flags (--name, --ctl-dir,
	// --state-dir); stateDir defaults to socketDir, as eipoibd keeps
	// both in /run/eipoibd unless told otherwise, so that a socketDir
	// that names no daemon names no state file either. DataDir is where
	// the plugin records what each attachment's ADD declared (records).
	TAP       string
	SocketDir string
	StateDir  string
	VLAN      int
	DataDir   string

	mode mode
	// Net is the whole network configuration: its cniVersion, name and
	// (chained) prevResult, parsed.
	Net types.PluginConf
	// ipamType and delegate: in ipamWrap mode, the real IPAM's type and
	// the configuration it is run with (the network configuration with
	// "ipam" replaced by the real IPAM's section).
	ipamType string
	delegate []byte
}

// Socket is the control socket of the eipoibd the configuration names.
func (c *Conf) Socket() string { return ctl.Path(c.SocketDir, c.TAP) }

// StateFile is the --persist state file of the eipoibd the
// configuration names, from which it restores its VIFs when it starts
// (ctl.StatePath).
func (c *Conf) StateFile() string { return ctl.StatePath(c.StateDir, c.TAP) }

// keys are the plugin's own keys in a network configuration (chained)
// or its IPAM section (ipamWrap), each kept raw so that a value of the
// wrong type is refused naming its key (own).
type keys struct {
	Type      string          `json:"type"`
	TAP       json.RawMessage `json:"tap"`
	SocketDir json.RawMessage `json:"socketDir"`
	StateDir  json.RawMessage `json:"stateDir"`
	VLAN      json.RawMessage `json:"vlan"`
	DataDir   json.RawMessage `json:"dataDir"`
	IPAM      json.RawMessage `json:"ipam"`
}

// own sets c's keys from k, each left at its default when absent, and
// refuses a value of the wrong type naming the key and what it wants:
// a VLAN written "0" is an error here, before anything is declared.
func (k *keys) own(c *Conf) error {
	for _, s := range []struct {
		key  string
		raw  json.RawMessage
		to   *string
		want string
	}{{"tap", k.TAP, &c.TAP, "a string, eipoibd's --name"}, {"socketDir", k.SocketDir, &c.SocketDir, "a string, eipoibd's --ctl-dir"},
		{"stateDir", k.StateDir, &c.StateDir, "a string, eipoibd's --state-dir"}, {"dataDir", k.DataDir, &c.DataDir, "a string"}} {
		if given(s.raw) && json.Unmarshal(s.raw, s.to) != nil {
			return badConf("%s %s: want %s", s.key, s.raw, s.want)
		}
	}
	if given(k.VLAN) && json.Unmarshal(k.VLAN, &c.VLAN) != nil {
		return badConf("vlan %s: want a number, 0 (untagged) to 4094", k.VLAN)
	}
	return nil
}

// given reports whether a key was given a value: neither left out nor
// null.
func given(raw json.RawMessage) bool { return raw != nil && string(raw) != "null" }

// badConf is a configuration error as CNI reports it.
func badConf(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, "eipoib: "+fmt.Sprintf(format, a...), "")
}

// ParseConf parses the network configuration given on standard input.
// With "type": "eipoib" the plugin is chained after bridge and its keys
// are at the top; with bridge's "ipam": {"type": "eipoib", ...} it wraps
// the IPAM section's own "ipam". Any other configuration is an error
// that names both ways.
func ParseConf(stdin []byte) (*Conf, error) {
	c := &Conf{}
	if err := json.Unmarshal(stdin, &c.Net); err != nil {
		return nil, badConf("network configuration is not JSON: %v", err)
	}
	var top keys
	if err := json.Unmarshal(stdin, &top); err != nil {
		return nil, badConf("network configuration: %v", err)
	}
	own := top
	switch {
	case top.Type == PluginType:
		c.mode = chained
		if c.Net.RawPrevResult != nil {
			if err := version.ParsePrevResult(&c.Net); err != nil {
				return nil, badConf("prevResult: %v", err)
			}
		}
	case ipamType(top.IPAM) == PluginType:
		c.mode = ipamWrap
		if err := json.Unmarshal(top.IPAM, &own); err != nil {
			return nil, badConf("ipam: %v", err)
		}
		inner := ipamType(own.IPAM)
		if inner == "" || inner == PluginType {
			return nil, badConf(`ipam of type "eipoib" wraps the real IPAM: give it an "ipam" section with a type such as "dhcp" or "host-local"`)
		}
		c.ipamType = inner
		var err error
		if c.delegate, err = replaceIPAM(stdin, own.IPAM); err != nil {
			return nil, badConf("ipam: %v", err)
		}
	default:
		return nil, badConf(`network configuration of type %q (ipam %q): want type "eipoib", listed after "bridge" in a conflist, or "bridge" with ipam type "eipoib" wrapping the real IPAM`,
			top.Type, ipamType(top.IPAM))
	}
	c.TAP, c.SocketDir, c.DataDir = DefaultTAP, ctl.DefaultDir, DefaultDataDir
	if err := own.own(c); err != nil {
		return nil, err
	}
	if !given(own.StateDir) {
		c.StateDir = c.SocketDir
	}
	if err := checkIfName(c.TAP); err != nil {
		return nil, badConf("tap %q: %v (eipoibd's --name)", c.TAP, err)
	}
	if !filepath.IsAbs(c.SocketDir) {
		return nil, badConf("socketDir %q: want an absolute directory such as %s (eipoibd's --ctl-dir)", c.SocketDir, ctl.DefaultDir)
	}
	c.SocketDir = filepath.Clean(c.SocketDir)
	if !filepath.IsAbs(c.StateDir) {
		return nil, badConf("stateDir %q: want an absolute directory such as %s (eipoibd's --state-dir)", c.StateDir, ctl.DefaultDir)
	}
	c.StateDir = filepath.Clean(c.StateDir)
	if !filepath.IsAbs(c.DataDir) {
		return nil, badConf("dataDir %q: want an absolute directory such as %s", c.DataDir, DefaultDataDir)
	}
	c.DataDir = filepath.Clean(c.DataDir)
	if c.VLAN < 0 || c.VLAN > 4094 {
		return nil, badConf("vlan %d: want 0 (untagged) to 4094", c.VLAN)
	}
	return c, nil
}

// ipamType is the "type" of an IPAM section, or "".
func ipamType(section json.RawMessage) string {
	var t struct {
		Type string `json:"type"`
	}
	if len(section) == 0 || json.Unmarshal(section, &t) != nil {
		return ""
	}
	return t.Type
}

// replaceIPAM returns the network configuration stdin with its "ipam"
// section replaced by inner, every other key kept as it was.
func replaceIPAM(stdin []byte, inner json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(stdin))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	m["ipam"] = inner
	return json.Marshal(m)
}

// checkIfName applies the kernel's rule for interface names
// (net/core/dev.c dev_valid_name): 1 to 15 bytes, not "." or "..", no
// '/', ':' or white space.
func checkIfName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty")
	case len(name) > 15:
		return fmt.Errorf("longer than 15 bytes")
	case name == "." || name == "..":
		return fmt.Errorf("not an interface name")
	case strings.ContainsAny(name, "/: \t\n\v\f\r"):
		return fmt.Errorf("contains '/', ':' or white space")
	}
	return nil
}
