package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/cli"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestParse: both names are required and must differ, and the IB MTU,
// queue count and TAP MTU are checked. Each refusal is a usage error
// naming the flag. A good command line gives eipoibd run's defaults,
// with 0 queues read as one per CPU.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" for success, else a part of the usage error
	}{
		{[]string{"--tap1", "a"}, "--tap1 and --tap2 are required"},
		{[]string{"--tap1", "a", "--tap2", "a"}, "two names"},
		{[]string{"--tap1", "a", "--tap2", "b", "--ib-mtu", "1500"}, "--ib-mtu 1500"},
		{[]string{"--tap1", "a", "--tap2", "b", "--queues", "-1"}, "--queues -1"},
		{[]string{"--tap1", "a", "--tap2", "b", "--tap-mtu", "1000"}, "--tap-mtu 1000"},
		{[]string{"--tap1", "a", "--tap2", "b", "--tap-queue-len", "-1"}, "--tap-queue-len -1: want 0 (the TAP's own, 1000) to 524288"},
		{[]string{"--tap1", "a", "--tap2", "b", "extra"}, "unexpected argument"},
		{[]string{"--tap1", "a", "--tap2", "b", "--offload=false"}, ""},
	} {
		o, err := parse(tc.args, io.Discard)
		if tc.want == "" {
			if err != nil {
				t.Fatalf("%v: %v", tc.args, err)
			}
			if o.names != [2]string{"a", "b"} || o.cfg.Offload || o.cfg.Queues < 1 || o.cfg.IBMTU != 4096 || o.cfg.TAPMTU != 9000 || o.cfg.TAPQueueLen != 8192 ||
				o.cfg.MaxVIFs != 1024 || o.cfg.MaxNeighbours != 65536 || o.cfg.VIFIdle != 300*time.Second {
				t.Fatalf("%v: %+v", tc.args, o)
			}
			continue
		}
		var ue cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: got %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
}

// TestLinkPing: the two TAPs taplink makes are joined. Each TAP is the
// only link of a namespace whose own stack is the guest. 10.89.0.1 is on
// tl1, left where taplink made it. 10.89.0.2 is on tl2, moved to a
// second namespace once link is ready, as bench.sh moves it. The first
// pings the second and is answered (ping's status), through both shims
// and the in-memory fabric. Once the context ends, link returns nil and
// both TAPs are gone.
func TestLinkPing(t *testing.T) {
	nstest.Require(t, "ping")
	a, b := "tlk-a", "tlk-b"
	nstest.Add(t, a)
	nstest.Add(t, b)
	o, err := parse([]string{"--tap1", "tl1", "--tap2", "tl2", "--queues", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- nstest.DoErr(a, func() error { return link(ctx, o, slog.New(slog.DiscardHandler), ready) })
	}()
	// tl2 moves only once link says it is ready, as bench.sh waits for
	// "taplink running". "ip link show tl2" succeeds as soon as
	// tap.Create has added the link, before it has set it up by name in
	// namespace a. A move in that window makes Create fail.
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("link stopped before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("link not ready after 10 s")
	}
	nstest.Must(t, nstest.In(a, "ip", "link", "set", "tl2", "netns", b)...)
	for ns, dev := range map[string]string{a: "tl1", b: "tl2"} {
		addr := "10.89.0.1/24"
		if ns == b {
			addr = "10.89.0.2/24"
		}
		nstest.Must(t, nstest.In(ns, "ip", "addr", "add", addr, "dev", dev)...)
		nstest.Must(t, nstest.In(ns, "ip", "link", "set", dev, "up")...)
	}
	// The first echo may wait for both guests' VIFs and ARP.
	nstest.Must(t, nstest.In(a, "ping", "-c", "3", "-i", "0.2", "-W", "5", "10.89.0.2")...)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("link: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("link did not stop 10 s after its context ended")
	}
	for ns, dev := range map[string]string{a: "tl1", b: "tl2"} {
		if out, err := nstest.Run(nstest.In(ns, "ip", "link", "show", dev)...); err == nil {
			t.Fatalf("%s still in %s after link returned:\n%s", dev, ns, out)
		}
	}
}
