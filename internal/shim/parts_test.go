package shim

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// partRig is the surroundings of one of the shim's parts (groups,
// resolver, mobility) in its own tests: the untagged partition, a port,
// a control plane the test plays, and what the part sends, recorded.
type partRig struct {
	sh     shared
	ctr    counters
	clk    *clock.Fake
	port   *memfabric.Port
	ctl    *control
	p      *partition
	byVLAN [4096]atomic.Pointer[partition]
	posted []intent

	sent   [][]byte // packets handed to the port, ipoib.Headroom into each
	meta   []ipoib.TxMeta
	guests [][]byte // frames written to the guests, tap.Headroom into each
}

// newPartRig returns a rig on a fresh memfabric port with GID gid.
func newPartRig(t *testing.T, gid string) *partRig {
	t.Helper()
	f := memFab(t, 2048)
	port, err := f.NewPort(testutil.GID(gid))
	if err != nil {
		t.Fatal(err)
	}
	r := &partRig{clk: clock.NewFake(time.Unix(1e6, 0)), port: port, ctl: &control{port: port}}
	r.ctl.init(16)
	bcast := ipoib.BroadcastMGID(ipoib.DefaultPKey, ipoib.ScopeLinkLocal)
	r.p = &partition{pkey: ipoib.DefaultPKey, bcast: bcast, anon: mactrans.DeriveREMAC(bcast, ipoib.MulticastQPN, 0)}
	r.p.ipMTU.Store(2044)
	r.byVLAN[0].Store(r.p)
	r.sh = shared{
		ctr: &r.ctr, log: slog.New(slog.NewTextHandler(io.Discard, nil)), clk: r.clk,
		vifs: mactrans.NewVIFTable(port.LocalGID(), 16),
		toPort: func(bufs [][]byte, meta []ipoib.TxMeta) {
			r.sent, r.meta = append(r.sent, bufs...), append(r.meta, meta...)
		},
		toGuests: func(frames [][]byte) { r.guests = append(r.guests, frames...) },
	}
	return r
}

// post records an intent for the test to carry out.
func (r *partRig) post(it intent, _ bool) bool {
	r.posted = append(r.posted, it)
	return true
}

// parts returns the rig's partitions by P_Key.
func (r *partRig) parts() map[ipoib.PKey]*partition {
	return map[ipoib.PKey]*partition{r.p.pkey: r.p}
}

// vif makes and publishes a VIF of mac on the untagged partition.
func (r *partRig) vif(t *testing.T, mac [6]byte) *mactrans.VIF {
	t.Helper()
	qpn, err := r.port.AllocQP(r.p.pkey, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := r.sh.vifs.NewVIF(mactrans.VIFKey{MAC: mac}, r.p.pkey, qpn, mactrans.OriginDeclared, r.clk.Now())
	r.sh.vifs.Publish(v)
	return v
}
