package verbsfabric

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/fabrictest"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestSharedChecks runs the backends' shared conformance suite over a
// port on the fake device. Packets are injected as receive completions
// (the fake's complete). A unicast one has the GID of p1 as its
// destination; a multicast one comes on the partition's group QP with
// the MGID in its GRH. A packet in another partition than its QP's is
// not asked: the HCA's P_Key check drops it before any completion.
func TestSharedChecks(t *testing.T) {
	l := newLink(t)
	p, d := l.p1, l.d1
	fabrictest.Run(t, fabrictest.Backend{
		Port: p,
		Peer: l.p2,
		Inject: func(payload []byte, m ipoib.RxMeta) bool {
			qpn, dst := m.DstQPN, p.LocalGID()
			if m.DstQPN == ipoib.MulticastQPN {
				p.qpMu.RLock()
				g, ok := p.gqps[m.PKey.Full()]
				p.qpMu.RUnlock()
				if !ok {
					return false
				}
				qpn, dst = g, m.MGID
			} else if q := p.qp(qpn); q != nil && q.pkey != m.PKey {
				return false
			}
			d.mu.Lock()
			d.complete(m.Src.GID(), dst, m.Src.QPN(), qpn, payload)
			d.mu.Unlock()
			return true
		},
	})
}
