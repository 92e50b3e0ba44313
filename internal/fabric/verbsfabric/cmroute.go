package verbsfabric

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/eipoib/eipoibd/ipoib"
)

// cmRoutes is the bookkeeping of the join ids on one rdma_cm event
// channel (ibv.go's ibvSA): which id each event belongs to, which id is
// the current membership of each group, and the MULTICAST_ERRORs the
// Port has still to take. It holds no C calls, so its rules are tested
// without librdmacm.
type cmRoutes struct {
	mu     sync.Mutex
	uid    uint64
	joins  map[uint64]*cmJoin // by uid (the ids' context)
	cur    map[saKey]uint64   // the current membership of each group
	errs   []mcastError
	notify chan struct{}
}

// saKey names an SA multicast membership.
type saKey struct {
	mgid     ipoib.GID
	sendOnly bool
}

// cmJoin is one join's id; ev gets its first event. taken: the first
// event was taken (any later one is not a join's answer); member: it
// was MULTICAST_JOIN, so the id holds a membership from then on, before
// join has made it current; joined: join has returned it.
type cmJoin struct {
	key                   saKey
	id                    unsafe.Pointer // its struct rdma_cm_id (C memory)
	ev                    chan cmEvent
	taken, member, joined bool
}

// cmKind is what an rdma_cm event means to a join's id.
type cmKind uint8

const (
	cmOther  cmKind = iota
	cmJoined        // RDMA_CM_EVENT_MULTICAST_JOIN
	cmError         // RDMA_CM_EVENT_MULTICAST_ERROR
)

// cmEvent is an rdma_cm event of a join's id, copied out before it is
// acked: its kind and type (enum rdma_cm_event_type), status, and for a
// MULTICAST_JOIN the group's MLID and SL (ah_attr) and Q_Key.
type cmEvent struct {
	kind   cmKind
	typ    int
	status int
	dlid   uint16
	sl     uint8
	qkey   uint32
}

func newCMRoutes() cmRoutes {
	return cmRoutes{joins: make(map[uint64]*cmJoin), cur: make(map[saKey]uint64), notify: make(chan struct{}, 1)}
}

// add registers a join of key and returns its uid, the context its id
// is made with.
func (r *cmRoutes) add(key saKey) (uint64, *cmJoin) {
	j := &cmJoin{key: key, ev: make(chan cmEvent, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.uid++
	r.joins[r.uid] = j
	return r.uid, j
}

// route hands the event of id uid on. The first goes to its join, which
// waits for it. A later MULTICAST_ERROR of a membership goes to the
// Port. The rest (ids left or replaced, and their errors) go nowhere. A
// MULTICAST_ERROR may come after the MULTICAST_JOIN but before join has
// made the id current (it asks a path record for the MTU in between).
// That error is the Port's too: dropped, the port would believe itself a
// member of a group the kernel dropped, and never rejoin.
func (r *cmRoutes) route(uid uint64, e cmEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.joins[uid]
	switch {
	case j == nil:
	case !j.taken:
		j.taken, j.member = true, e.kind == cmJoined
		j.ev <- e // buffered for this one event
	case e.kind == cmError && j.member && (!j.joined || r.cur[j.key] == uid):
		r.errs = append(r.errs, mcastError{mgid: j.key.mgid, sendOnly: j.key.sendOnly, err: cmErrno(e.status)})
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}
}

// drop forgets a join that failed.
func (r *cmRoutes) drop(uid uint64) {
	r.mu.Lock()
	delete(r.joins, uid)
	r.mu.Unlock()
}

// establish makes join uid, whose id is id, the current membership of
// its group and returns the one it replaces (nil: none), to be left.
func (r *cmRoutes) establish(uid uint64, id unsafe.Pointer) *cmJoin {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.joins[uid]
	j.id, j.joined = id, true
	oldUID, had := r.cur[j.key]
	r.cur[j.key] = uid
	if !had {
		return nil
	}
	old := r.joins[oldUID]
	delete(r.joins, oldUID)
	return old
}

// remove ends key's current membership and returns its join (nil:
// none), to be left.
func (r *cmRoutes) remove(key saKey) *cmJoin {
	r.mu.Lock()
	defer r.mu.Unlock()
	uid, ok := r.cur[key]
	j := r.joins[uid]
	delete(r.cur, key)
	delete(r.joins, uid)
	if !ok {
		return nil
	}
	return j
}

// next takes the oldest MULTICAST_ERROR for the Port.
func (r *cmRoutes) next() (mcastError, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) == 0 {
		return mcastError{}, false
	}
	e := r.errs[0]
	r.errs = r.errs[1:]
	return e, true
}

// takeAll removes and returns every current membership's join, for the
// close.
func (r *cmRoutes) takeAll() []*cmJoin {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*cmJoin
	for key, uid := range r.cur {
		if j := r.joins[uid]; j != nil {
			out = append(out, j)
		}
		delete(r.cur, key)
		delete(r.joins, uid)
	}
	return out
}

// errNoJoinAnswer is the error of a join of mgid whose id got no event
// within the join's time (twice saTimeout): the SA never answered, or
// the kernel sent nothing (a cma_ib_mc_handler whose cma_set_qkey failed
// sends no event on some kernels).
func errNoJoinAnswer(mgid ipoib.GID) error {
	return fmt.Errorf("verbsfabric: join of %s: no answer from the SA: %w", mgid, syscall.ETIMEDOUT)
}

// joinAnswer is what the first event of a join of mgid's id (named name,
// rdma_event_str) makes of the join. RDMA_CM_EVENT_MULTICAST_JOIN gives
// the group's MLID, SL and Q_Key (cma_make_mc_event: ah_attr and
// param.ud). RDMA_CM_EVENT_MULTICAST_ERROR gives a refusal
// (errJoinRefused) with the event's status as its errno. That is -EINVAL
// for an SA's answer with a MAD status (sa_query.c recv_handler) or for
// a group whose Q_Key is not the id's (cma_set_qkey). Any other event
// gives its status.
func joinAnswer(mgid ipoib.GID, ev cmEvent, name string) (mcMember, error) {
	if ev.kind == cmJoined {
		return mcMember{mlid: ev.dlid, sl: ev.sl, qkey: ev.qkey}, nil
	}
	err := fmt.Errorf("verbsfabric: join of %s: %s: %w", mgid, name, cmErrno(ev.status))
	if ev.kind == cmError {
		err = fmt.Errorf("%w: %w", errJoinRefused, err)
	}
	return mcMember{}, err
}

// cmErrno is an rdma_cm event's status as an errno: the kernel reports
// -errno (-ENETRESET from multicast.c), an SA's refusal may come as a
// positive MAD status.
func cmErrno(status int) syscall.Errno {
	if status < 0 {
		return syscall.Errno(-status)
	}
	if status == 0 {
		return syscall.EPROTO
	}
	return syscall.Errno(status)
}
