package verbsfabric

// Senders without a GRH. On InfiniBand a UD packet carries a GRH only
// when its sender's address handle asked for one; Linux IPoIB asks only
// when the path record's hop_limit is above 0
// (drivers/infiniband/core/sa_query.c ib_init_ah_attr_from_path:
// "if (rec->hop_limit > 0 || sa_path_is_roce(rec))" sets the GRH), and
// OpenSM answers 0 inside a subnet. So unicast from a native IPoIB host,
// a router above all, comes without one: the receive buffer's first 40
// bytes are undefined and no source GID is known. The work completion
// still names the sender: every UD receive completion reports its
// source QPN and source LID (libibverbs verbs.h struct ibv_wc: src_qp and
// slid; ibv_poll_cq(3): src_qp "valid only for UD QPs"); the kernel's
// own IPoIB tells its looped back multicast by them, GRH or not
// (ipoib_ib.c ipoib_ib_handle_rx_wc:
// "wc->slid == priv->local_lid && wc->src_qp == priv->qp->qp_num").
//
// lidTable maps a LID to the GID of the port behind it, learned where
// both are seen together: the path records the port resolves (DLID for a
// DGID) and received packets that do carry a GRH (multicast always does:
// the SLID and SGID). Only GIDs of the port's own subnet are learned: a
// packet from another subnet arrives through an IB router, whose LID
// (the SLID seen here) speaks for many GIDs. A packet without a GRH is
// then named by (source QPN, GID of its SLID), the address its ARP or
// NDP gives, so it gets the same REMAC. A LID never seen stays unknown
// (RxMeta.SrcUnknown, counted: rx_src_unknown). The subnet manager may
// give LIDs to other ports: the table is emptied on every flush (LID
// change, SM change, client reregister, P_Key change, port active). It
// is bounded by the unicast LID space (0x0001-0xbfff).

import (
	"sync"

	"github.com/eipoib/eipoibd/ipoib"
)

// maxUnicastLID is the last unicast LID (IBA 4.1.3: 0xC000-0xFFFE are
// multicast, 0xFFFF the permissive LID).
const maxUnicastLID = 0xbfff

type lidTable struct {
	mu sync.RWMutex
	m  map[uint16]ipoib.GID
}

// lookup returns the GID behind lid.
func (t *lidTable) lookup(lid uint16) (ipoib.GID, bool) {
	t.mu.RLock()
	g, ok := t.m[lid]
	t.mu.RUnlock()
	return g, ok
}

// learn records that gid is behind lid, when both are unicast and gid
// is in the subnet of local (the port's GID).
func (t *lidTable) learn(lid uint16, gid, local ipoib.GID) {
	if lid == 0 || lid > maxUnicastLID || gid.IsMulticast() || [8]byte(gid[:8]) != [8]byte(local[:8]) {
		return
	}
	if g, ok := t.lookup(lid); ok && g == gid {
		return // the hot case: known, unchanged; no write lock
	}
	t.mu.Lock()
	if t.m == nil {
		t.m = make(map[uint16]ipoib.GID)
	}
	t.m[lid] = gid
	t.mu.Unlock()
}

// clear forgets every LID.
func (t *lidTable) clear() {
	t.mu.Lock()
	clear(t.m)
	t.mu.Unlock()
}
