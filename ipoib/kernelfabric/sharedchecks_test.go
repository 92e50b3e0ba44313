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
