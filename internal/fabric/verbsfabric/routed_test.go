package verbsfabric

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/eipoib/eipoibd/internal/routedtest"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestRoutedWithoutGRH runs the routed topology (internal/routedtest)
// with the shim on a verbs port of an IB fake whose unicast comes
// without a GRH, as from a Linux IPoIB router. The router's broadcast
// ARP, which has a GRH, shows its LID with its GID. So what it forwards
// from the other subnet arrives named by source QPN and SLID, from the
// router's REMAC. None of it is left to the shim's unknown-source path.
func TestRoutedWithoutGRH(t *testing.T) {
	n := newIBNet(t, newSM(), []ipoib.PKey{0xffff}, 0xffff)
	n.hub.mu.Lock()
	n.hub.noGRH = true
	n.hub.mu.Unlock()
	dev := tap.NewMem(256)
	s, err := shim.New(shim.Config{Device: dev, Port: n.p1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("shim: %v", err)
		}
	})
	testutil.WaitFor(t, "the guest's carrier", dev.Carrier)
	routedtest.Run(t, routedtest.Setup{Guest: dev, Counters: s.Counters, Joined: n.p1.groups.Full, Router: n.p2})
}
