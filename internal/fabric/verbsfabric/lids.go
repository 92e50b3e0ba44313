package verbsfabric

// Senders without a GRH. On InfiniBand a UD packet carries a GRH only
// when its sender's address handle asked for one. Linux IPoIB asks only
// when the path record's hop_limit is above 0
// (drivers/infiniband/core/sa_query.c ib_init_ah_attr_from_path: "if
// (rec->hop_limit > 0 || sa_path_is_roce(rec))" sets the GRH), and
// OpenSM answers 0 inside a subnet. So unicast from a native IPoIB host,
// a router above all, comes without one: the receive buffer's first 40
// bytes are undefined and no source GID is known.
//
// The work completion still names the sender. Every UD receive
// completion reports its source QPN and source LID (libibverbs verbs.h
// struct ibv_wc: src_qp and slid; ibv_poll_cq(3): src_qp "valid only for
// UD QPs"). The kernel's own IPoIB tells its looped back multicast by
// them, GRH or not (ipoib_ib.c ipoib_ib_handle_rx_wc: "wc->slid ==
// priv->local_lid && wc->src_qp == priv->qp->qp_num").
//
// lidTable maps a LID to the GID of the port behind it. It learns where
// both are seen together: the path records the port resolves (DLID for a
// DGID) and received packets that do carry a GRH (multicast always does:
// the SLID and SGID). Only GIDs of the port's own subnet are learned. A
// packet from another subnet arrives through an IB router, whose LID
// (the SLID seen here) speaks for many GIDs. A packet without a GRH is
// then named by (source QPN, GID of its SLID), the address its ARP or
// NDP gives, so it gets the same REMAC. A LID never seen stays unknown
// (RxMeta.SrcUnknown, counted: rx_src_unknown). The subnet manager may
// give LIDs to other ports, so the table is emptied on every flush (LID
// change, SM change, client reregister, P_Key change, port active). It
// is bounded by the unicast LID space (0x0001-0xbfff).
//
// Two guards keep a wrong name out. A learn carries the table's epoch
// from before the SA query that taught it, and a clear in between (a
// flush while the query was out) voids it: that answer may name the
// LID's old owner. And a LID seen with two GIDs since the last clear
// names neither (SR-IOV VFs sharing their PF's LID, alias GUIDs). It is
// marked ambiguous, and its packets go to the shim's source-IP path as
// unknown senders.

import (
	"sync"

	"github.com/eipoib/eipoibd/ipoib"
)

// maxUnicastLID is the last unicast LID (IBA 4.1.3: 0xC000-0xFFFE are
// multicast, 0xFFFF the permissive LID).
const maxUnicastLID = 0xbfff

type lidTable struct {
	mu    sync.RWMutex
	m     map[uint16]lidEntry
	epoch uint64 // bumped by clear
}

// lidEntry is what a LID names: gid, unless ambiguous.
type lidEntry struct {
	gid       ipoib.GID
	ambiguous bool
}

// lookup returns the GID behind lid.
func (t *lidTable) lookup(lid uint16) (ipoib.GID, bool) {
	t.mu.RLock()
	e, ok := t.m[lid]
	t.mu.RUnlock()
	return e.gid, ok && !e.ambiguous
}

// now is the table's epoch, to pass to learnAt with what a query that
// starts now will teach.
func (t *lidTable) now() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.epoch
}

// learn records that gid is behind lid (see learnAt), from what was
// seen just now (a packet's SLID and SGID).
func (t *lidTable) learn(lid uint16, gid, local ipoib.GID) {
	t.learnAt(t.now(), lid, gid, local)
}

// learnAt records that gid is behind lid, when both are unicast, gid is
// in the subnet of local (the port's GID) and the table was not cleared
// since epoch; a LID already naming another GID becomes ambiguous.
func (t *lidTable) learnAt(epoch uint64, lid uint16, gid, local ipoib.GID) {
	if lid == 0 || lid > maxUnicastLID || gid.IsMulticast() || [8]byte(gid[:8]) != [8]byte(local[:8]) {
		return
	}
	t.mu.RLock()
	e, ok := t.m[lid]
	same := ok && (e.ambiguous || e.gid == gid) && epoch == t.epoch
	t.mu.RUnlock()
	if same {
		return // the hot case: known, unchanged; no write lock
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if epoch != t.epoch {
		return // cleared since: the answer may name the LID's old owner
	}
	if t.m == nil {
		t.m = make(map[uint16]lidEntry)
	}
	switch e, ok := t.m[lid]; {
	case !ok:
		t.m[lid] = lidEntry{gid: gid}
	case !e.ambiguous && e.gid != gid:
		t.m[lid] = lidEntry{ambiguous: true}
	}
}

// clear forgets every LID.
func (t *lidTable) clear() {
	t.mu.Lock()
	clear(t.m)
	t.epoch++
	t.mu.Unlock()
}
