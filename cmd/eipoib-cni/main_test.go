package main

import (
	"runtime/debug"
	"testing"
)

// TestPluginVersion: the version the Makefile stamps wins; without it,
// the module's version and the VCS revision Go recorded; without build
// information, nothing.
func TestPluginVersion(t *testing.T) {
	info := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "-tags", Value: "verbs"}, {Key: "vcs.revision", Value: "2d0ffc9abc"}}}
	for _, c := range []struct {
		v    string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"0.1.0-g2d0ffc9", info, true, "0.1.0-g2d0ffc9"},
		{"", info, true, "(devel) 2d0ffc9abc"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}}, true, "v0.2.0"},
		{"", nil, false, ""},
	} {
		if got := pluginVersion(c.v, c.info, c.ok); got != c.want {
			t.Errorf("pluginVersion(%q, %+v) = %q, want %q", c.v, c.info, got, c.want)
		}
	}
}
