package shim

// The backends the shared tests run over: the in-memory fabric, and the
// kernel IPoIB backend on the fake kernel. A shared test takes a fabric
// from forEachBackend and must not be able to tell which it got, beyond
// the capabilities a backend declares.

import (
	"io"
	"log/slog"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/ipoib"
)

// testPort is what the tests ask of a port beyond ipoib.Port.
type testPort interface {
	ipoib.Port
	Joined(mgid ipoib.GID) bool
	SendOnly(mgid ipoib.GID) bool
}

// fabric makes the ports of one test's hypervisors.
type fabric interface {
	port(t *testing.T, gid ipoib.GID) testPort
	// hints: the backend honours AllocQP's QPN hint.
	hints() bool
	// countsPKeyDrops: the port counts packets of another partition
	// (the kernel's HCA drops them unseen).
	countsPKeyDrops() bool
	// hidesSources: the port cannot name a packet's sender
	// (RxMeta.SrcUnknown).
	hidesSources() bool
}

// memFabric is a memfabric.Fabric; its ports report their senders unless
// it hides them.
type memFabric struct {
	*memfabric.Fabric
	hidden bool
}

func memFab(t *testing.T, mtu int) memFabric {
	t.Helper()
	f, err := memfabric.New(mtu)
	if err != nil {
		t.Fatal(err)
	}
	return memFabric{Fabric: f}
}

// memFabHidden is a memfabric whose ports never name a sender, as the
// kernel's packet sockets do not.
func memFabHidden(t *testing.T, mtu int) memFabric {
	f := memFab(t, mtu)
	f.HideSources()
	f.hidden = true
	return f
}

func (f memFabric) port(t *testing.T, gid ipoib.GID) testPort {
	t.Helper()
	p, err := f.NewPort(gid)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (memFabric) hints() bool           { return true }
func (memFabric) countsPKeyDrops() bool { return true }
func (f memFabric) hidesSources() bool  { return f.hidden }

// kernelFabric is hosts on a fake kernel, each running the kernel backend
// on its ib0 (IB MTU 2048).
type kernelFabric struct{ f *fakekernel.Fabric }

func (f kernelFabric) port(t *testing.T, gid ipoib.GID) testPort {
	t.Helper()
	k := f.f.NewHost(gid, "ib0", 2044)
	p, err := kernelfabric.New(kernelfabric.Config{Kernel: k, Parent: "ib0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (kernelFabric) hints() bool           { return false }
func (kernelFabric) countsPKeyDrops() bool { return false }
func (kernelFabric) hidesSources() bool    { return true }

// forEachBackend runs test as a subtest over each backend.
func forEachBackend(t *testing.T, test func(t *testing.T, f fabric)) {
	t.Run("memfabric", func(t *testing.T) { test(t, memFab(t, 2048)) })
	t.Run("kernel", func(t *testing.T) { test(t, kernelFabric{fakekernel.NewFabric()}) })
}
