package memfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/ipoib/internal/fabrictest"
)

// TestSharedChecks runs the backends' shared conformance suite: packets
// are injected at the receiving port past the switch (deliver).
func TestSharedChecks(t *testing.T) {
	f, err := New(2048)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.NewPort(ipoib.GID{0xfe, 0x80, 15: 1})
	b, _ := f.NewPort(ipoib.GID{0xfe, 0x80, 15: 2})
	t.Cleanup(func() { a.Close(); b.Close() })
	fabrictest.Run(t, fabrictest.Backend{
		Port: a,
		Peer: b,
		Inject: func(payload []byte, m ipoib.RxMeta) bool {
			a.deliver(payload, m)
			return true
		},
	})
}
