package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// tomlBlock is a fenced TOML block of a Markdown file.
var tomlBlock = regexp.MustCompile("(?ms)^```toml\n(.*?)^```$")

// TestDocConfigs: every TOML configuration the docs and the README show
// for eipoibd.toml is one "eipoibd run --config" accepts as written, and
// docs/libvirt.md shows Open vSwitch on the simulated fabric, to try
// without InfiniBand: its fabric, underlay and bridge as parsed.
func TestDocConfigs(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	simOVS := 0
	for _, doc := range append(docs, "../../README.md") {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tomlBlock.FindAllStringSubmatch(string(b), -1) {
			p := filepath.Join(t.TempDir(), "eib0.toml")
			if err := os.WriteFile(p, []byte(m[1]), 0o600); err != nil {
				t.Fatal(err)
			}
			o, err := parse([]string{"--config", p}, &bytes.Buffer{})
			if err != nil {
				t.Errorf("%s's\n%s\ndoes not parse: %v", doc, m[1], err)
				continue
			}
			if strings.HasSuffix(doc, "libvirt.md") && o.cfg.Fabric == "sim" && o.cfg.OVSBridge != "" {
				simOVS++
				if o.cfg.Underlay == "" || o.cfg.OVSBridge != "ovsbr0" {
					t.Errorf("%s's simulated-fabric OVS configuration: underlay %q, ovs-bridge %q", doc, o.cfg.Underlay, o.cfg.OVSBridge)
				}
			}
		}
	}
	if simOVS != 1 {
		t.Errorf("docs/libvirt.md shows %d Open vSwitch configurations on the simulated fabric, want 1", simOVS)
	}
}
