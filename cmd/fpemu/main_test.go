package main

import (
	"errors"
	"io"
	"testing"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/emuib/testbed"
)

// TestParse: a full command line gives the test bed's configuration; a
// bad one is a usage error (exit status 2).
func TestParse(t *testing.T) {
	o, err := parse([]string{"--fabric", "f", "--hosts", "h1,h2", "--guests", "g1:eth0,g2:eth1", "--offload=false", "--prefix", "x", "--plain"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := testbed.Config{Fabric: "f", Prefix: "x", MTU: 4092, Hosts: [2]testbed.Host{
		{NS: "h1", Bridge: "br0", GuestNS: "g1", GuestDev: "eth0"},
		{NS: "h2", Bridge: "br0", GuestNS: "g2", GuestDev: "eth1"},
	}}
	if o.cfg != want || !o.plain {
		t.Errorf("config %+v (plain %v), want %+v (plain)", o.cfg, o.plain, want)
	}
	for _, args := range [][]string{
		{"--hosts", "h1,h2", "--guests", "g1:e,g2:e"},
		{"--fabric", "f", "--hosts", "h1", "--guests", "g1:e,g2:e"},
		{"--fabric", "f", "--hosts", "h1,h1", "--guests", "g1:e,g2:e"},
		{"--fabric", "f", "--hosts", "h1,h2", "--guests", "g1:e"},
		{"--fabric", "f", "--hosts", "h1,h2", "--guests", "g1,g2:e"},
		{"--fabric", "f", "--hosts", "h1,h2", "--guests", "g1:e,g2:e", "--mtu", "9000"},
		{"--fabric", "f", "--hosts", "h1,h2", "--guests", "g1:e,g2:e", "--prefix", ""},
	} {
		if _, err := parse(args, io.Discard); !errors.As(err, &cli.UsageError{}) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
