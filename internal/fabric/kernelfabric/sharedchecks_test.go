package kernelfabric_test

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/fabrictest"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/fabric/parked"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestSharedChecks runs the backends' shared conformance suite over a
// port on the fake kernel; packets are injected as a child's socket
// would read them (kf.Inject), so the unknown-QPN and other-partition
// cases, which no child's socket can receive, are not asked.
func TestSharedChecks(t *testing.T) {
	f := fakekernel.NewFabric()
	a, b := open(t, f.NewHost(testutil.GID("fe80::a"), "ib0", 2044)), open(t, f.NewHost(testutil.GID("fe80::b"), "ib0", 2044))
	fabrictest.Run(t, fabrictest.Backend{
		Port:   a,
		Peer:   b,
		Inject: func(payload []byte, m ipoib.RxMeta) bool { return kf.Inject(a, payload, m) },
	})
}

// TestFreeQPWaitsForBatch: FreeQP takes the child out of the table at
// once but deletes it (closing its socket) only once the batch under way
// has ended: a hook in the kernel's DelLink records whether the batch
// was still under way. The test holds the transmit lock as a batch does
// and ends the batch once FreeQP is blocked waiting for it, or has
// reached DelLink without waiting (the failure the hook records).
func TestFreeQPWaitsForBatch(t *testing.T) {
	k := &delHook{Kernel: fakekernel.NewFabric().NewHost(testutil.GID("fe80::a"), "ib0", 2044), deleted: make(chan int, 8)}
	p, err := kf.New(kf.Config{Kernel: k, Parent: "ib0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	q, err := p.AllocQP(ipoib.DefaultPKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := children(k.Kernel)
	unlock := kf.LockTx(p)
	k.batch.Store(true)
	freed := make(chan error, 1)
	go func() { freed <- p.FreeQP(q) }()
	testutil.WaitFor(t, "the QP deleted or FreeQP waiting for the batch", func() bool { return len(k.deleted) > 0 || parked.OnMutex("kernelfabric.(*Port).waitBatch") })
	inTable := kf.HasQP(p, q)
	k.batch.Store(false)
	unlock()
	if err := <-freed; err != nil || inTable || k.during.Load() {
		t.Fatalf("FreeQP: %v; in the table while waiting for the batch: %v; deleted while the batch was under way: %v", err, inTable, k.during.Load())
	}
	if after := children(k.Kernel); len(after) != len(child)-1 {
		t.Fatalf("children %v after FreeQP", after)
	}
}

// delHook is the fake kernel with a DelLink that records whether it ran
// while batch was set.
type delHook struct {
	*fakekernel.Kernel
	batch, during atomic.Bool
	deleted       chan int
}

// DelLink records the call, then deletes.
func (k *delHook) DelLink(index int) error {
	if k.batch.Load() {
		k.during.Store(true)
	}
	select {
	case k.deleted <- index:
	default:
	}
	return k.Kernel.DelLink(index)
}
