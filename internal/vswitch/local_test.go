package vswitch

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestLocalMACs (root) uses a namespace with bridge br0 holding a veth
// port p1 and a TAP eib0, and a veth "other" outside it.
// LocalMACs("eib0", "br0") is br0's and eib0's MACs, not p1's (the
// host's frames sent on a port never enter the bridge) nor other's.
// WatchLocalMACs reports that set at once, and again with br0's new MAC
// when it changes, and nothing when p2 joins the bridge before that.
func TestLocalMACs(t *testing.T) {
	nstest.Require(t, "ip")
	ns := fmt.Sprintf("vsw%d", os.Getpid())
	nstest.Add(t, ns)
	run := func(args ...string) { nstest.Must(t, nstest.In(ns, args...)...) }
	run("ip", "link", "add", "br0", "address", "02:00:00:00:00:b0", "type", "bridge")
	run("ip", "link", "add", "p1", "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", "p1x", "address", "02:00:00:00:01:01")
	run("ip", "tuntap", "add", "eib0", "mode", "tap")
	run("ip", "link", "set", "eib0", "address", "02:00:00:00:00:e0")
	run("ip", "link", "add", "other", "address", "02:00:00:00:00:0f", "type", "veth", "peer", "name", "otherx", "address", "02:00:00:00:01:0f")
	run("ip", "link", "set", "p1", "master", "br0")
	run("ip", "link", "set", "eib0", "master", "br0")
	set := func(macs ...string) []string { slices.Sort(macs); return macs }
	str := func(macs []ether.MAC) []string {
		var s []string
		for _, m := range macs {
			s = append(s, net.HardwareAddr(m[:]).String())
		}
		return set(s...)
	}
	want := set("02:00:00:00:00:b0", "02:00:00:00:00:e0")
	var got []ether.MAC
	var err error
	nstest.Do(t, ns, func() { got, err = LocalMACs("eib0", "br0") })
	if err != nil || !slices.Equal(str(got), want) {
		t.Fatalf("LocalMACs: %v, %v; want %v", str(got), err, want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	sets := make(chan []string, 16)
	done := make(chan error, 1)
	go func() {
		done <- nstest.DoErr(ns, func() error {
			return WatchLocalMACs(ctx, func(m []ether.MAC) { sets <- str(m) }, func(err error) { t.Error(err) }, "eib0", "br0")
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	next := func(want []string) {
		t.Helper()
		select {
		case s := <-sets:
			if !slices.Equal(s, want) {
				t.Fatalf("WatchLocalMACs reported %s, want %s", strings.Join(s, " "), strings.Join(want, " "))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("WatchLocalMACs did not report %s within 5 s", strings.Join(want, " "))
		}
	}
	next(want)
	run("ip", "link", "add", "p2", "address", "02:00:00:00:00:02", "type", "veth", "peer", "name", "p2x", "address", "02:00:00:00:01:02")
	run("ip", "link", "set", "p2", "master", "br0")
	run("ip", "link", "set", "br0", "address", "02:00:00:00:00:b1")
	next(set("02:00:00:00:00:b1", "02:00:00:00:00:e0"))
}
