package kernelfabric_test

import (
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/internal/fabrictest"
	kf "github.com/eipoib/eipoibd/ipoib/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib/kernelfabric/fakekernel"
)

// TestSharedChecks runs the backends' shared conformance suite over a
// port on the fake kernel; packets are injected as a child's socket
// would read them (kf.Inject), so the unknown-QPN and other-partition
// cases, which no child's socket can receive, are not asked.
func TestSharedChecks(t *testing.T) {
	f := fakekernel.NewFabric()
	a, b := open(t, f.NewHost(gid("fe80::a"), "ib0", 2044)), open(t, f.NewHost(gid("fe80::b"), "ib0", 2044))
	fabrictest.Run(t, fabrictest.Backend{
		Port:   a,
		Peer:   b,
		Inject: func(payload []byte, m ipoib.RxMeta) bool { return kf.Inject(a, payload, m) },
	})
}

// TestFreeQPWaitsForBatch: FreeQP takes the child out of the table at
// once but deletes it (closing its socket) only once the batch under way
// has ended.
func TestFreeQPWaitsForBatch(t *testing.T) {
	k := fakekernel.NewFabric().NewHost(gid("fe80::a"), "ib0", 2044)
	p := open(t, k)
	q, err := p.AllocQP(ipoib.DefaultPKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := children(k)
	unlock := kf.LockTx(p)
	freed := make(chan error, 1)
	go func() { freed <- p.FreeQP(q) }()
	waitFor(t, func() bool { return !kf.HasQP(p, q) })
	during := children(k)
	unlock()
	if err := <-freed; err != nil || len(during) != len(child) {
		t.Fatalf("FreeQP: %v; children %v before, %v while a batch was under way", err, child, during)
	}
	if after := children(k); len(after) != len(child)-1 {
		t.Fatalf("children %v after FreeQP", after)
	}
}
