package daemon

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
	"github.com/eipoib/eipoibd/internal/nstest"
)

// TestToggleDown: SIGUSR1's toggle reaches the simulated port through
// the faultport that --fault puts in front of it (down, then up again,
// each logged once), and a port without a toggle (one on a real link)
// ignores it.
func TestToggleDown(t *testing.T) {
	nstest.Require(t)
	ns := underlayNS(t)
	c := Config{Fabric: FabricSim, Underlay: "ula", IBMTU: 2048, Queues: 1, Faults: faultport.Faults{Loss: 0.1}}
	var fab fabric
	if err := nstest.DoErr(ns, func() (err error) { fab, err = openFabric(&c, nil); return err }); err != nil {
		t.Fatal(err)
	}
	defer fab.port.Close()
	fp, ok := fab.port.(*faultport.Port)
	if !ok {
		t.Fatalf("--fault: the port is a %T, want a *faultport.Port", fab.port)
	}
	sp := fp.Unwrap().(*simfabric.Port)
	if fab.device != "ula" {
		t.Errorf("device %q, want the underlay ula", fab.device)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, want := range []string{"down=true", "down=false"} {
		toggleDown(fab, log)
		if sp.IsDown() != (want == "down=true") || strings.Count(logs.String(), `msg="simulated port state toggled" `+want+"\n") != 1 {
			t.Fatalf("after a toggle the port is down=%t; the log:\n%s", sp.IsDown(), logs.String())
		}
	}
	toggleDown(fabric{port: fab.port, device: "ib0"}, log)
	if sp.IsDown() || strings.Count(logs.String(), `msg="SIGUSR1 ignored: only the simulated port can be toggled"`) != 1 {
		t.Errorf("a port without a toggle: down=%t; the log:\n%s", sp.IsDown(), logs.String())
	}
}

// TestBackends: the registry holds the three backends in the order the
// version lists them, and only verbs needs a build tag.
func TestBackends(t *testing.T) {
	var got []string
	for _, b := range Backends() {
		got = append(got, b.Name+"/"+b.Tag)
	}
	if want := "sim/ kernel/ verbs/verbs"; strings.Join(got, " ") != want {
		t.Errorf("Backends: %q, want %q", got, want)
	}
}
