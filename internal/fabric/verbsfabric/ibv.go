//go:build verbs

package verbsfabric

// The libibverbs boundary (rdma-core's verbs.h). Everything the Port
// does with the device goes through the C helpers below. They take and
// return plain integers and C memory only, so no Go pointer ever crosses
// into C. The send and receive buffers are one registered C allocation
// each; the work request descriptors are a C array the Go side fills.

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <infiniband/ib.h>
#include <rdma/rdma_cma.h>

// A send descriptor, filled by Go.
struct eib_send {
	struct ibv_qp *qp;
	struct ibv_ah *ah;
	uint32_t rqpn;
	uint32_t qkey;
	uint32_t len;
	uint64_t addr;
	uint64_t wr_id;
	int signal;
};

// A receive completion, returned to Go.
struct eib_recv {
	uint64_t wr_id;
	uint32_t status;
	uint32_t byte_len;
	uint32_t src_qp;
	uint32_t qp_num;
	uint32_t wc_flags;
	uint16_t pkey_index;
	uint16_t slid; // the sender's LID: UD reports it, GRH or not
};

// A send completion, returned to Go.
struct eib_sent {
	uint64_t wr_id;
	uint32_t status;
	uint32_t qp_num;
};

static struct ibv_context *eib_open(const char *name, int *err) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	if (!list) {
		*err = errno ? errno : ENODEV;
		return NULL;
	}
	*err = ENODEV;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			ctx = ibv_open_device(list[i]);
			*err = ctx ? 0 : (errno ? errno : EIO);
			break;
		}
	}
	ibv_free_device_list(list);
	return ctx;
}

static int eib_query_port(struct ibv_context *ctx, int port, int *state, int *mtu, int *link_layer, int *gid_len, int *pkey_len) {
	struct ibv_port_attr a;
	int r = ibv_query_port(ctx, port, &a);
	if (r) return r;
	*state = a.state;
	*mtu = a.active_mtu;
	*link_layer = a.link_layer;
	*gid_len = a.gid_tbl_len;
	*pkey_len = a.pkey_tbl_len;
	return 0;
}

static int eib_query_gid(struct ibv_context *ctx, int port, int index, uint8_t *gid, int *type, int *ifindex) {
	struct ibv_gid_entry e;
	int r = ibv_query_gid_ex(ctx, port, index, &e, 0);
	if (r) return r;
	memcpy(gid, e.gid.raw, 16);
	*type = e.gid_type;
	*ifindex = e.ndev_ifindex;
	return 0;
}

static int eib_query_pkey(struct ibv_context *ctx, int port, int index, uint16_t *pkey) {
	__be16 p;
	int r = ibv_query_pkey(ctx, port, index, &p);
	*pkey = be16toh(p);
	return r;
}

static int eib_max_wr(struct ibv_context *ctx, int *ports, int *qp_wr, int *srq_wr, int *cqe) {
	struct ibv_device_attr a;
	int r = ibv_query_device(ctx, &a);
	if (r) return r;
	*ports = a.phys_port_cnt;
	*qp_wr = a.max_qp_wr;
	*srq_wr = a.max_srq_wr;
	*cqe = a.max_cqe;
	return 0;
}

static int eib_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) return errno;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? errno : 0;
}

static struct ibv_qp *eib_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq,
		int send_wr, int port, int pkey_index, uint32_t qkey, uint32_t psn, int *err) {
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.srq = srq;
	ia.cap.max_send_wr = send_wr;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.qp_type = IBV_QPT_UD;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) {
		*err = errno ? errno : ENOMEM;
		return NULL;
	}
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = pkey_index;
	a.port_num = port;
	a.qkey = qkey;
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	if (!r) {
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTR;
		r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	}
	if (!r) {
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = psn;
		r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	if (r) {
		ibv_destroy_qp(qp);
		*err = r;
		return NULL;
	}
	*err = 0;
	return qp;
}

// eib_set_qkey changes a QP's Q_Key in RTS (ipoib_mcast_attach's
// ib_modify_qp with IB_QP_QKEY: RTS to RTS may change it on a UD QP).
static int eib_set_qkey(struct ibv_qp *qp, uint32_t qkey) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qkey = qkey;
	return ibv_modify_qp(qp, &a, IBV_QP_QKEY);
}

static struct ibv_ah *eib_create_ah(struct ibv_pd *pd, int port, const uint8_t *dgid, int global, int sgid_index,
		uint16_t dlid, uint8_t sl, int *err) {
	struct ibv_ah_attr a;
	memset(&a, 0, sizeof a);
	a.port_num = port;
	a.dlid = dlid;
	a.sl = sl;
	if (global) {
		a.is_global = 1;
		memcpy(a.grh.dgid.raw, dgid, 16);
		a.grh.sgid_index = sgid_index;
		a.grh.hop_limit = 64;
	}
	struct ibv_ah *ah = ibv_create_ah(pd, &a);
	*err = ah ? 0 : (errno ? errno : EINVAL);
	return ah;
}

// eib_post_send posts n descriptors, one ibv_post_send per run of
// consecutive descriptors on one QP (wrs and sges hold n entries each).
// It returns how many were posted and sets *err for the first failure.
static int eib_post_send(struct eib_send *d, int n, uint32_t lkey,
		struct ibv_send_wr *wrs, struct ibv_sge *sges, int *err) {
	*err = 0;
	int i = 0;
	while (i < n) {
		int j = i;
		for (; j < n && d[j].qp == d[i].qp; j++) {
			sges[j].addr = d[j].addr;
			sges[j].length = d[j].len;
			sges[j].lkey = lkey;
			memset(&wrs[j], 0, sizeof wrs[j]);
			wrs[j].wr_id = d[j].wr_id;
			wrs[j].sg_list = &sges[j];
			wrs[j].num_sge = 1;
			wrs[j].opcode = IBV_WR_SEND;
			wrs[j].send_flags = d[j].signal ? IBV_SEND_SIGNALED : 0;
			wrs[j].wr.ud.ah = d[j].ah;
			wrs[j].wr.ud.remote_qpn = d[j].rqpn;
			wrs[j].wr.ud.remote_qkey = d[j].qkey;
			wrs[j].next = j + 1 < n && d[j + 1].qp == d[i].qp ? &wrs[j + 1] : NULL;
		}
		struct ibv_send_wr *bad = NULL;
		int r = ibv_post_send(d[i].qp, &wrs[i], &bad);
		if (r) {
			*err = r;
			return bad ? (int)(bad - wrs) : i;
		}
		i = j;
	}
	return n;
}

static int eib_post_recv(struct ibv_srq *srq, const uint32_t *idx, int n, uint64_t base, uint32_t size, uint32_t lkey,
		struct ibv_recv_wr *wrs, struct ibv_sge *sges) {
	for (int i = 0; i < n; i++) {
		sges[i].addr = base + (uint64_t)idx[i] * size;
		sges[i].length = size;
		sges[i].lkey = lkey;
		wrs[i].wr_id = idx[i];
		wrs[i].sg_list = &sges[i];
		wrs[i].num_sge = 1;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	struct ibv_recv_wr *bad = NULL;
	return n ? ibv_post_srq_recv(srq, wrs, &bad) : 0;
}

static int eib_poll_recv(struct ibv_cq *cq, struct ibv_wc *wc, struct eib_recv *out, int n) {
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].byte_len = wc[i].byte_len;
		out[i].src_qp = wc[i].src_qp;
		out[i].qp_num = wc[i].qp_num;
		out[i].wc_flags = wc[i].wc_flags;
		out[i].pkey_index = wc[i].pkey_index;
		out[i].slid = wc[i].slid;
	}
	return got;
}

static int eib_poll_send(struct ibv_cq *cq, struct ibv_wc *wc, struct eib_sent *out, int n) {
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].qp_num = wc[i].qp_num;
	}
	return got;
}

// eib_poll waits until fd is readable (1) or wakefd is (0), or fails
// (-errno).
static int eib_poll(int fd, int wakefd) {
	struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = wakefd, .events = POLLIN}};
	for (;;) {
		int r = poll(p, 2, -1);
		if (r < 0) {
			if (errno == EINTR) continue;
			return -errno;
		}
		return p[1].revents ? 0 : 1;
	}
}

// eib_wait_cq waits for the receive CQ's next completion event or for
// wakefd, re-arming the CQ first. It returns 1 on an event, 0 on wakefd,
// -errno on failure.
static int eib_wait_cq(struct ibv_comp_channel *ch, struct ibv_cq *cq, int wakefd) {
	for (;;) {
		int r = eib_poll(ch->fd, wakefd);
		if (r <= 0) return r;
		struct ibv_cq *ecq;
		void *ectx;
		if (ibv_get_cq_event(ch, &ecq, &ectx) == 0) {
			ibv_ack_cq_events(ecq, 1);
			return 1;
		}
		if (errno != EAGAIN) return -errno;
	}
}

// eib_wait_async waits for one async event or wakefd: 1 and the event's
// type and port, 0 on wakefd, -errno on failure. libibverbs
// ibv_get_async_event sets element.port_num for every event that is not
// a CQ's, QP's, SRQ's or WQ's (the kernel's ib_uverbs_event_handler
// passes the event's port): the port events. For the others port is 0.
static int eib_wait_async(struct ibv_context *ctx, int wakefd, int *type, int *port) {
	for (;;) {
		int r = eib_poll(ctx->async_fd, wakefd);
		if (r <= 0) return r;
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev) == 0) {
			*type = ev.event_type;
			switch (ev.event_type) {
			case IBV_EVENT_PORT_ACTIVE:
			case IBV_EVENT_PORT_ERR:
			case IBV_EVENT_LID_CHANGE:
			case IBV_EVENT_PKEY_CHANGE:
			case IBV_EVENT_SM_CHANGE:
			case IBV_EVENT_CLIENT_REREGISTER:
			case IBV_EVENT_GID_CHANGE:
				*port = ev.element.port_num;
				break;
			default:
				*port = 0;
			}
			ibv_ack_async_event(&ev);
			return 1;
		}
		if (errno != EAGAIN) return -errno;
	}
}

// The IB link layer's subnet administrator, through librdmacm. Path
// records: a synchronous id (no event channel: librdmacm's ucma_complete
// waits for each call's event and rdma_destroy_id acks the last one)
// with AF_IB addresses in the port space the Go side gives (RDMA_PS_IB:
// cma_select_ib_ps refuses RDMA_PS_IPOIB for AF_IB). Joins: ids on one
// event channel the Go side reads, bound to an IP address of the host's
// IPoIB interface in the group's partition with RDMA_PS_IPOIB, so that
// cma_join_ib_multicast finds the interface's broadcast group. Unused
// on RoCE.

static void eib_sib(struct sockaddr_ib *s, const uint8_t *gid, uint16_t pkey, uint64_t sid) {
	memset(s, 0, sizeof *s);
	s->sib_family = AF_IB;
	s->sib_pkey = htobe16(pkey);
	s->sib_sid = htobe64(sid);
	memcpy(&s->sib_addr, gid, 16);
}

// eib_path_record asks the SA for the path from sgid to dgid in pkey:
// rdma_resolve_addr binds the source (sid and mask 0) and resolves the
// destination (cma_resolve_ib_addr), rdma_resolve_route queries the SA
// (cma_query_ib_route: SGID, DGID and P_Key from the source, the service
// ID from the destination's sib_sid).
static int eib_path_record(int ps, const uint8_t *sgid, const uint8_t *dgid, uint16_t pkey, uint64_t sid, int ms,
		uint16_t *dlid, uint8_t *sl, int *mtu) {
	struct rdma_cm_id *id;
	if (rdma_create_id(NULL, &id, NULL, (enum rdma_port_space)ps)) return errno;
	struct sockaddr_ib src, dst;
	eib_sib(&src, sgid, pkey, 0);
	eib_sib(&dst, dgid, pkey, sid);
	int r = rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, ms);
	if (!r) r = rdma_resolve_route(id, ms);
	int e = r ? errno : 0;
	if (!r && id->route.num_paths < 1) e = EHOSTUNREACH;
	if (!e) {
		*dlid = be16toh(id->route.path_rec[0].dlid);
		*sl = id->route.path_rec[0].sl;
		*mtu = id->route.path_rec[0].mtu;
	}
	rdma_destroy_id(id);
	return e;
}

static int eib_cm_channel(struct rdma_event_channel **ch) {
	*ch = rdma_create_event_channel();
	if (!*ch) return errno ? errno : ENOMEM;
	return eib_nonblock((*ch)->fd);
}

// eib_cm_join creates an id on ch in port space ps whose context is
// uid, binds it to the IPoIB interface's address (family AF_INET or
// AF_INET6, with scope for a link-local one) and joins mgid as a full or
// send-only full member. The MULTICAST_JOIN or MULTICAST_ERROR event
// comes on ch.
static struct rdma_cm_id *eib_cm_join(struct rdma_event_channel *ch, int ps, int family, const uint8_t *addr,
		uint32_t scope, const uint8_t *mgid, uint16_t pkey, int sendonly, uint64_t uid, int *err) {
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, (void *)(uintptr_t)uid, (enum rdma_port_space)ps)) {
		*err = errno;
		return NULL;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	if (family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		in->sin_family = AF_INET;
		memcpy(&in->sin_addr, addr, 4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		in6->sin6_family = AF_INET6;
		memcpy(&in6->sin6_addr, addr, 16);
		in6->sin6_scope_id = scope;
	}
	int r = rdma_bind_addr(id, (struct sockaddr *)&ss);
	if (!r) {
		struct sockaddr_ib grp;
		eib_sib(&grp, mgid, pkey, 0);
		struct rdma_cm_join_mc_attr_ex a;
		memset(&a, 0, sizeof a);
		a.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
		a.join_flags = sendonly ? RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER : RDMA_MC_JOIN_FLAG_FULLMEMBER;
		a.addr = (struct sockaddr *)&grp;
		r = rdma_join_multicast_ex(id, &a, (void *)(uintptr_t)uid);
	}
	if (r) {
		*err = errno;
		rdma_destroy_id(id);
		return NULL;
	}
	*err = 0;
	return id;
}

// eib_cm_leave ends a join's membership and frees its id: librdmacm
// cma.c rdma_leave_multicast unlinks the join's struct cma_multicast
// from the id's mc_list and frees it; rdma_destroy_id (ucma_free_id)
// frees only the id, so a join's id is always left first, failed or not.
static void eib_cm_leave(struct rdma_cm_id *id, const uint8_t *mgid, uint16_t pkey) {
	struct sockaddr_ib grp;
	eib_sib(&grp, mgid, pkey, 0);
	rdma_leave_multicast(id, (struct sockaddr *)&grp);
	rdma_destroy_id(id);
}

// A communication event, copied out of librdmacm's before it is acked.
struct eib_cm_event {
	int type;
	int status;
	uint64_t uid;
	uint16_t dlid;
	uint8_t sl;
	uint32_t qkey;
};

// eib_cm_wait waits for ch's next event or wakefd: 1 and the event
// (acked at once: rdma_leave_multicast and rdma_destroy_id wait for every
// reported event to be acked), 0 on wakefd, -errno on failure.
static int eib_cm_wait(struct rdma_event_channel *ch, int wakefd, struct eib_cm_event *out) {
	for (;;) {
		int r = eib_poll(ch->fd, wakefd);
		if (r <= 0) return r;
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev)) {
			if (errno == EAGAIN) continue;
			return -errno;
		}
		out->type = ev->event;
		out->status = ev->status;
		out->uid = (uint64_t)(uintptr_t)ev->id->context;
		out->dlid = ev->param.ud.ah_attr.dlid;
		out->sl = ev->param.ud.ah_attr.sl;
		out->qkey = ev->param.ud.qkey;
		rdma_ack_cm_event(ev);
		return 1;
	}
}

static void *eib_alloc(size_t n) {
	void *p = NULL;
	if (posix_memalign(&p, 4096, n)) return NULL;
	memset(p, 0, n);
	return p;
}
*/
import "C"

import (
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ipoib"
)

// ibvDevice is a verbs device: one protection domain, a shared receive
// queue with its CQ and completion channel, a send CQ, and the registered
// send and receive buffers.
type ibvDevice struct {
	ctx     *C.struct_ibv_context
	pd      *C.struct_ibv_pd
	ch      *C.struct_ibv_comp_channel
	rcq     *C.struct_ibv_cq
	scq     *C.struct_ibv_cq
	srq     *C.struct_ibv_srq
	sendMem unsafe.Pointer
	recvMem unsafe.Pointer
	sendMR  *C.struct_ibv_mr
	recvMR  *C.struct_ibv_mr
	lay     layout
	a       devAttr
	sendWR  int
	wakeFD  int

	mu   sync.Mutex
	qps  map[uint32]*C.struct_ibv_qp
	ahs  map[handle]*C.struct_ibv_ah
	next handle
	cm   *ibvSA // IB only

	// C scratch arrays, one set per direction (the Port serialises each).
	sd      *C.struct_eib_send
	swr     *C.struct_ibv_send_wr
	ssge    *C.struct_ibv_sge
	swc     *C.struct_ibv_wc
	sent    *C.struct_eib_sent
	rwc     *C.struct_ibv_wc
	recv    *C.struct_eib_recv
	rwr     *C.struct_ibv_recv_wr
	rsge    *C.struct_ibv_sge
	ridx    *C.uint32_t
	scratch []unsafe.Pointer
}

func errnoErr(what string, r C.int) error {
	if r < 0 {
		r = -r
	}
	return fmt.Errorf("verbsfabric: %s: %w", what, syscall.Errno(r))
}

// sysRDMA is where the kernel lists the RDMA devices by the names
// libibverbs opens them by (ib_core's "infiniband" class; rdma-core's
// find_sysfs_devs, libibverbs/init.c, reads a device's ibdev_path there).
const sysRDMA = "/sys/class/infiniband"

// openDevice opens port port of the verbs device name and sets up its
// queues and buffers.
func openDevice(name string, port int, lay layout) (_ device, err error) {
	d := &ibvDevice{lay: lay, qps: make(map[uint32]*C.struct_ibv_qp), ahs: make(map[handle]*C.struct_ibv_ah),
		wakeFD: -1}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var e C.int
	if d.ctx = C.eib_open(cname, &e); d.ctx == nil {
		if e == C.ENODEV || e == C.ENOSYS {
			return nil, noDevice(name, sysRDMA)
		}
		return nil, errnoErr("open "+name, e)
	}
	var ports, qpWR, srqWR, cqe C.int
	if r := C.eib_max_wr(d.ctx, &ports, &qpWR, &srqWR, &cqe); r != 0 {
		return nil, errnoErr("query device", r)
	}
	if port < 1 || port > int(ports) {
		return nil, fmt.Errorf("verbsfabric: %s has %d port(s); there is no port %d (see ibstat %s)", name, ports, port, name)
	}
	d.a.port = port
	if err := d.query(); err != nil {
		return nil, err
	}
	if int(srqWR) < lay.srqDepth || int(cqe) < lay.srqDepth || int(cqe) < lay.sendSlots {
		return nil, fmt.Errorf("verbsfabric: %s takes at most %d receive WRs and %d CQEs; want %d (the receive queue depth, --verbs-recv-depth) and %d", name, srqWR, cqe, lay.srqDepth, max(lay.srqDepth, lay.sendSlots))
	}
	d.sendWR = min(lay.sendSlots, int(qpWR))
	if d.pd = C.ibv_alloc_pd(d.ctx); d.pd == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_alloc_pd failed")
	}
	if d.ch = C.ibv_create_comp_channel(d.ctx); d.ch == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_create_comp_channel failed")
	}
	if r := C.eib_nonblock(d.ch.fd); r != 0 {
		return nil, errnoErr("completion channel", r)
	}
	if r := C.eib_nonblock(d.ctx.async_fd); r != 0 {
		return nil, errnoErr("async event fd", r)
	}
	if d.rcq = C.ibv_create_cq(d.ctx, C.int(lay.srqDepth), nil, d.ch, 0); d.rcq == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_create_cq (receive) failed")
	}
	if d.scq = C.ibv_create_cq(d.ctx, C.int(lay.sendSlots), nil, nil, 0); d.scq == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_create_cq (send) failed")
	}
	var sa C.struct_ibv_srq_init_attr
	sa.attr.max_wr = C.uint32_t(lay.srqDepth)
	sa.attr.max_sge = 1
	if d.srq = C.ibv_create_srq(d.pd, &sa); d.srq == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_create_srq failed")
	}
	sendLen, recvLen := lay.sendSlots*lay.slotSize, lay.recvBufs*lay.recvSize
	if d.sendMem = C.eib_alloc(C.size_t(sendLen)); d.sendMem == nil {
		return nil, fmt.Errorf("verbsfabric: out of memory for %d send bytes", sendLen)
	}
	if d.recvMem = C.eib_alloc(C.size_t(recvLen)); d.recvMem == nil {
		return nil, fmt.Errorf("verbsfabric: out of memory for %d receive bytes", recvLen)
	}
	if d.sendMR = C.ibv_reg_mr(d.pd, d.sendMem, C.size_t(sendLen), C.IBV_ACCESS_LOCAL_WRITE); d.sendMR == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_reg_mr (send, %d bytes) failed", sendLen)
	}
	if d.recvMR = C.ibv_reg_mr(d.pd, d.recvMem, C.size_t(recvLen), C.IBV_ACCESS_LOCAL_WRITE); d.recvMR == nil {
		return nil, fmt.Errorf("verbsfabric: ibv_reg_mr (receive, %d bytes) failed", recvLen)
	}
	n := max(lay.recvBufs, lay.sendSlots, lay.batch)
	alloc := func(size uintptr) unsafe.Pointer {
		p := C.calloc(C.size_t(n), C.size_t(size))
		d.scratch = append(d.scratch, p)
		return p
	}
	d.sd = (*C.struct_eib_send)(alloc(unsafe.Sizeof(C.struct_eib_send{})))
	d.swr = (*C.struct_ibv_send_wr)(alloc(unsafe.Sizeof(C.struct_ibv_send_wr{})))
	d.ssge = (*C.struct_ibv_sge)(alloc(unsafe.Sizeof(C.struct_ibv_sge{})))
	d.swc = (*C.struct_ibv_wc)(alloc(unsafe.Sizeof(C.struct_ibv_wc{})))
	d.sent = (*C.struct_eib_sent)(alloc(unsafe.Sizeof(C.struct_eib_sent{})))
	d.rwc = (*C.struct_ibv_wc)(alloc(unsafe.Sizeof(C.struct_ibv_wc{})))
	d.recv = (*C.struct_eib_recv)(alloc(unsafe.Sizeof(C.struct_eib_recv{})))
	d.rwr = (*C.struct_ibv_recv_wr)(alloc(unsafe.Sizeof(C.struct_ibv_recv_wr{})))
	d.rsge = (*C.struct_ibv_sge)(alloc(unsafe.Sizeof(C.struct_ibv_sge{})))
	d.ridx = (*C.uint32_t)(alloc(4))
	for _, p := range d.scratch {
		if p == nil {
			return nil, fmt.Errorf("verbsfabric: out of memory for work requests")
		}
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("verbsfabric: eventfd: %w", err)
	}
	d.wakeFD = fd
	if r := C.ibv_req_notify_cq(d.rcq, 0); r != 0 {
		return nil, errnoErr("ibv_req_notify_cq", r)
	}
	if d.a.ib {
		if d.cm, err = newIBVSA(d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// query reads the port: state, MTU, link layer, the GID to use and the
// P_Key table.
func (d *ibvDevice) query() error {
	var state, mtu, ll, gidLen, pkeyLen C.int
	if r := C.eib_query_port(d.ctx, C.int(d.a.port), &state, &mtu, &ll, &gidLen, &pkeyLen); r != 0 {
		return errnoErr("ibv_query_port", r)
	}
	d.a.active = state == C.IBV_PORT_ACTIVE
	d.a.mtu = mtuOf(int(mtu))
	d.a.ib = ll != C.IBV_LINK_LAYER_ETHERNET
	var entries []gidEntry
	for i := 0; i < int(gidLen); i++ {
		var g [16]C.uint8_t
		var typ, ifindex C.int
		if C.eib_query_gid(d.ctx, C.int(d.a.port), C.int(i), &g[0], &typ, &ifindex) != 0 {
			continue // an empty entry
		}
		var e gidEntry
		for j := range g {
			e.gid[j] = byte(g[j])
		}
		e.index, e.ifindex = i, int(ifindex)
		switch typ {
		case C.IBV_GID_TYPE_ROCE_V2:
			e.typ = gidRoCEv2
		case C.IBV_GID_TYPE_ROCE_V1:
			e.typ = gidRoCEv1
		default:
			e.typ = gidIB
		}
		entries = append(entries, e)
	}
	e, err := pickGID(entries, d.a.ib)
	if err != nil {
		return err
	}
	d.a.gid, d.a.gidIndex, d.a.ifindex = e.gid, e.index, e.ifindex
	d.a.pkeys, err = d.pkeys()
	return err
}

// pkeys reads the port's P_Key table.
func (d *ibvDevice) pkeys() ([]ipoib.PKey, error) {
	var state, mtu, ll, gidLen, pkeyLen C.int
	if r := C.eib_query_port(d.ctx, C.int(d.a.port), &state, &mtu, &ll, &gidLen, &pkeyLen); r != 0 {
		return nil, errnoErr("ibv_query_port", r)
	}
	var t []ipoib.PKey
	for i := 0; i < int(pkeyLen); i++ {
		var pk C.uint16_t
		if C.eib_query_pkey(d.ctx, C.int(d.a.port), C.int(i), &pk) != 0 {
			break
		}
		t = append(t, ipoib.PKey(pk))
	}
	return t, nil
}

func (d *ibvDevice) sa() subnetAdmin {
	if d.cm == nil {
		return nil
	}
	return d.cm
}

func (d *ibvDevice) attr() devAttr { return d.a }

func (d *ibvDevice) sendBuf(slot int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(d.sendMem, slot*d.lay.slotSize)), d.lay.slotSize)
}

func (d *ibvDevice) recvBuf(i int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(d.recvMem, i*d.lay.recvSize)), d.lay.recvSize)
}

func (d *ibvDevice) createQP(pkeyIndex int, qkey, psn uint32) (uint32, error) {
	var e C.int
	qp := C.eib_create_qp(d.pd, d.scq, d.rcq, d.srq, C.int(d.sendWR), C.int(d.a.port), C.int(pkeyIndex), C.uint32_t(qkey), C.uint32_t(psn&0xffffff), &e)
	if qp == nil {
		return 0, errnoErr("create UD QP", e)
	}
	d.mu.Lock()
	d.qps[uint32(qp.qp_num)] = qp
	d.mu.Unlock()
	return uint32(qp.qp_num), nil
}

func (d *ibvDevice) setQKey(qpn, qkey uint32) error {
	qp := d.qp(qpn)
	if qp == nil {
		return fmt.Errorf("verbsfabric: no QP %#x", qpn)
	}
	if r := C.eib_set_qkey(qp, C.uint32_t(qkey)); r != 0 {
		return errnoErr("ibv_modify_qp (Q_Key)", r)
	}
	return nil
}

func (d *ibvDevice) qp(qpn uint32) *C.struct_ibv_qp {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.qps[qpn]
}

func (d *ibvDevice) destroyQP(qpn uint32) error {
	d.mu.Lock()
	qp := d.qps[qpn]
	delete(d.qps, qpn)
	d.mu.Unlock()
	if qp == nil {
		return fmt.Errorf("verbsfabric: no QP %#x", qpn)
	}
	if r := C.ibv_destroy_qp(qp); r != 0 {
		return errnoErr("ibv_destroy_qp", r)
	}
	return nil
}

func (d *ibvDevice) createAH(p path) (handle, error) {
	var e C.int
	var g [16]C.uint8_t
	for i := range g {
		g[i] = C.uint8_t(p.gid[i])
	}
	global := C.int(0)
	if p.global {
		global = 1
	}
	ah := C.eib_create_ah(d.pd, C.int(d.a.port), &g[0], global, C.int(d.a.gidIndex), C.uint16_t(p.dlid), C.uint8_t(p.sl), &e)
	if ah == nil {
		return 0, errnoErr("ibv_create_ah "+p.gid.String(), e)
	}
	d.mu.Lock()
	d.next++
	h := d.next
	d.ahs[h] = ah
	d.mu.Unlock()
	return h, nil
}

func (d *ibvDevice) destroyAH(h handle) {
	d.mu.Lock()
	ah := d.ahs[h]
	delete(d.ahs, h)
	d.mu.Unlock()
	if ah != nil {
		C.ibv_destroy_ah(ah)
	}
}

func (d *ibvDevice) attach(qpn uint32, mgid ipoib.GID, mlid uint16) error {
	return d.mcast(qpn, mgid, mlid, true)
}

func (d *ibvDevice) detach(qpn uint32, mgid ipoib.GID, mlid uint16) error {
	return d.mcast(qpn, mgid, mlid, false)
}

// saTimeout bounds each SA query and join (ms).
const saTimeout = 2000

// ibvSA is the port's subnet administrator through librdmacm. Path
// records go on synchronous ids. Joins go on ids of one event channel,
// whose events a reader goroutine takes (and acks) as they come and
// routes (cmRoutes). A join waits for its id's MULTICAST_JOIN or
// MULTICAST_ERROR; a later MULTICAST_ERROR of a membership goes to
// waitEvent.
type ibvSA struct {
	d  *ibvDevice
	ch *C.struct_rdma_event_channel
	ev *C.struct_eib_cm_event
	wg sync.WaitGroup
	cmRoutes
	woke chan struct{}
}

func newIBVSA(d *ibvDevice) (*ibvSA, error) {
	s := &ibvSA{d: d, cmRoutes: newCMRoutes(), woke: make(chan struct{})}
	if r := C.eib_cm_channel(&s.ch); r != 0 {
		return nil, errnoErr("rdma_create_event_channel (is rdma_ucm loaded?)", r)
	}
	s.ev = (*C.struct_eib_cm_event)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_eib_cm_event{}))))
	if s.ev == nil {
		C.rdma_destroy_event_channel(s.ch)
		return nil, fmt.Errorf("verbsfabric: out of memory for rdma_cm events")
	}
	s.wg.Add(1)
	go s.read()
	return s, nil
}

// read takes every event of the join ids' channel until the device's
// wake and routes it.
func (s *ibvSA) read() {
	defer s.wg.Done()
	defer close(s.woke)
	for {
		r := C.eib_cm_wait(s.ch, C.int(s.d.wakeFD), s.ev)
		if r <= 0 {
			return
		}
		e := cmEvent{typ: int(s.ev._type), status: int(s.ev.status), dlid: uint16(s.ev.dlid), sl: uint8(s.ev.sl), qkey: uint32(s.ev.qkey)}
		switch s.ev._type {
		case C.RDMA_CM_EVENT_MULTICAST_JOIN:
			e.kind = cmJoined
		case C.RDMA_CM_EVENT_MULTICAST_ERROR:
			e.kind = cmError
		}
		s.route(uint64(s.ev.uid), e)
	}
}

func (s *ibvSA) pathRecord(q pathQuery) (pathRec, error) {
	r, _, err := s.path(q)
	return r, err
}

// path is pathRecord with the path's MTU in bytes.
func (s *ibvSA) path(q pathQuery) (pathRec, int, error) {
	sg, dg := gidBytes(q.sgid), gidBytes(q.dgid)
	defer C.free(unsafe.Pointer(sg))
	defer C.free(unsafe.Pointer(dg))
	var dlid C.uint16_t
	var sl C.uint8_t
	var mtu C.int
	if r := C.eib_path_record(C.int(q.ps), sg, dg, C.uint16_t(q.pkey), 0, saTimeout, &dlid, &sl, &mtu); r != 0 {
		return pathRec{}, 0, errnoErr("path record for "+q.dgid.String(), r)
	}
	return pathRec{dlid: uint16(dlid), sl: uint8(sl)}, mtuOf(int(mtu)), nil
}

// join joins r.mgid and waits for its id's first event. The group's MTU
// is not in the event (struct rdma_ud_param has none): it comes from a
// path record to the MGID, which the SA is expected to answer with the
// group's (OpenSM pr_process_multicast; not checked against an SA here).
// When that query fails the MTU is 0 and the Port uses the port's.
func (s *ibvSA) join(r joinReq) (mcMember, error) {
	uid, j := s.add(saKey{r.mgid, r.sendOnly})
	family, addr := C.int(C.AF_INET6), r.bind.addr.As16()
	if r.bind.addr.Is4() {
		family = C.AF_INET
		a4 := r.bind.addr.As4()
		copy(addr[:], a4[:])
	}
	a, g := C.CBytes(addr[:]), gidBytes(r.mgid)
	defer C.free(a)
	defer C.free(unsafe.Pointer(g))
	so := C.int(0)
	if r.sendOnly {
		so = 1
	}
	pkey := C.uint16_t(ipoib.MGIDPKey(r.mgid))
	var e C.int
	id := C.eib_cm_join(s.ch, C.int(r.ps), family, (*C.uint8_t)(a), C.uint32_t(r.bind.ifindex), g, pkey, so, C.uint64_t(uid), &e)
	if id == nil {
		s.drop(uid)
		return mcMember{}, errnoErr(fmt.Sprintf("rdma_join_multicast of %s bound to %s (%s)", r.mgid, r.bind.addr, r.bind.ifname), e)
	}
	// A failed join leaves before the id is destroyed: librdmacm's
	// rdma_destroy_id (ucma_free_id) does not free the id's mc_list,
	// rdma_leave_multicast unlinks and frees the join's struct
	// cma_multicast (and cancels a join still under way).
	fail := func(err error) (mcMember, error) {
		s.drop(uid)
		C.eib_cm_leave(id, g, pkey)
		return mcMember{}, err
	}
	var ev cmEvent
	select {
	case ev = <-j.ev:
	case <-time.After(2 * saTimeout * time.Millisecond):
		return fail(errNoJoinAnswer(r.mgid))
	case <-s.woke:
		return fail(net.ErrClosed)
	}
	m, err := joinAnswer(r.mgid, ev, C.GoString(C.rdma_event_str(uint32(ev.typ))))
	if err != nil {
		return fail(err)
	}
	if _, mtu, err := s.path(pathQuery{sgid: s.d.a.gid, dgid: r.mgid, pkey: ipoib.MGIDPKey(r.mgid), ps: psIB}); err == nil {
		m.mtu = mtu
	}
	if old := s.establish(uid, unsafe.Pointer(id)); old != nil {
		C.eib_cm_leave((*C.struct_rdma_cm_id)(old.id), g, pkey)
	}
	return m, nil
}

func (s *ibvSA) leave(mgid ipoib.GID, sendOnly bool) {
	if j := s.remove(saKey{mgid, sendOnly}); j != nil {
		s.leaveJoin(j)
	}
}

// leaveJoin leaves a membership and frees its id.
func (s *ibvSA) leaveJoin(j *cmJoin) {
	g := gidBytes(j.key.mgid)
	C.eib_cm_leave((*C.struct_rdma_cm_id)(j.id), g, C.uint16_t(ipoib.MGIDPKey(j.key.mgid)))
	C.free(unsafe.Pointer(g))
}

func (s *ibvSA) waitEvent() (mcastError, bool, error) {
	for {
		if e, ok := s.next(); ok {
			return e, true, nil
		}
		select {
		case <-s.notify:
		case <-s.woke:
			return mcastError{}, false, nil
		}
	}
}

// close leaves every membership and frees the channel; the device has
// been woken, so the reader has ended or ends, and the Port holds its
// control lock (no join or leave is under way).
func (s *ibvSA) close() {
	s.wg.Wait()
	for _, j := range s.takeAll() {
		s.leaveJoin(j)
	}
	C.rdma_destroy_event_channel(s.ch)
	C.free(unsafe.Pointer(s.ev))
}

func gidBytes(g ipoib.GID) *C.uint8_t { return (*C.uint8_t)(C.CBytes(g[:])) }

func (d *ibvDevice) mcast(qpn uint32, mgid ipoib.GID, mlid uint16, attach bool) error {
	qp := d.qp(qpn)
	if qp == nil {
		return fmt.Errorf("verbsfabric: no QP %#x", qpn)
	}
	var g C.union_ibv_gid
	*(*[16]byte)(unsafe.Pointer(&g)) = mgid
	if attach {
		if r := C.ibv_attach_mcast(qp, &g, C.uint16_t(mlid)); r != 0 {
			return errnoErr("ibv_attach_mcast "+mgid.String(), r)
		}
		return nil
	}
	if r := C.ibv_detach_mcast(qp, &g, C.uint16_t(mlid)); r != 0 {
		return errnoErr("ibv_detach_mcast "+mgid.String(), r)
	}
	return nil
}

func (d *ibvDevice) postSend(s []sendDesc) (int, error) {
	if len(s) == 0 {
		return 0, nil
	}
	descs := unsafe.Slice(d.sd, len(s))
	base := uintptr(d.sendMem)
	d.mu.Lock()
	for i := range s {
		descs[i] = C.struct_eib_send{
			qp: d.qps[s[i].qpn], ah: d.ahs[s[i].ah], rqpn: C.uint32_t(s[i].rqpn), qkey: C.uint32_t(s[i].qkey), len: C.uint32_t(s[i].len),
			addr: C.uint64_t(base + uintptr(s[i].slot*d.lay.slotSize)), wr_id: C.uint64_t(s[i].wrID),
		}
		if s[i].signal {
			descs[i].signal = 1
		}
		if descs[i].qp == nil || descs[i].ah == nil {
			d.mu.Unlock()
			return 0, fmt.Errorf("verbsfabric: send on a freed QP or address handle")
		}
	}
	d.mu.Unlock()
	var e C.int
	n := int(C.eib_post_send(d.sd, C.int(len(s)), d.sendMR.lkey, d.swr, d.ssge, &e))
	if e != 0 {
		return n, errnoErr("ibv_post_send", e)
	}
	return n, nil
}

func (d *ibvDevice) pollSend(out []sendDone) int {
	n := int(C.eib_poll_send(d.scq, d.swc, d.sent, C.int(min(len(out), d.lay.sendSlots))))
	sent := unsafe.Slice(d.sent, max(n, 0))
	for i := range sent {
		out[i] = sendDone{wrID: uint64(sent[i].wr_id), qpn: uint32(sent[i].qp_num), ok: sent[i].status == C.IBV_WC_SUCCESS}
	}
	return max(n, 0)
}

func (d *ibvDevice) pollRecv(out []recvDone) int {
	n := int(C.eib_poll_recv(d.rcq, d.rwc, d.recv, C.int(min(len(out), d.lay.recvBufs))))
	recv := unsafe.Slice(d.recv, max(n, 0))
	for i := range recv {
		r := &recv[i]
		out[i] = recvDone{buf: int(r.wr_id), len: int(r.byte_len), srcQPN: uint32(r.src_qp), qpn: uint32(r.qp_num),
			slid: uint16(r.slid), ok: r.status == C.IBV_WC_SUCCESS, grh: r.wc_flags&C.IBV_WC_GRH != 0}
	}
	return max(n, 0)
}

func (d *ibvDevice) postRecv(bufs []uint32) error {
	idx := unsafe.Slice(d.ridx, len(bufs))
	for i, b := range bufs {
		idx[i] = C.uint32_t(b)
	}
	r := C.eib_post_recv(d.srq, d.ridx, C.int(len(bufs)), C.uint64_t(uintptr(d.recvMem)), C.uint32_t(d.lay.recvSize), d.recvMR.lkey, d.rwr, d.rsge)
	if r != 0 {
		return errnoErr("ibv_post_srq_recv", r)
	}
	return nil
}

func (d *ibvDevice) waitRecv() (bool, error) {
	r := C.eib_wait_cq(d.ch, d.rcq, C.int(d.wakeFD))
	switch {
	case r < 0:
		return false, errnoErr("wait for completions", r)
	case r == 0:
		return false, nil
	}
	if r := C.ibv_req_notify_cq(d.rcq, 0); r != 0 {
		return false, errnoErr("ibv_req_notify_cq", r)
	}
	return true, nil
}

func (d *ibvDevice) waitEvent() (asyncEvent, bool, error) {
	var typ, port C.int
	r := C.eib_wait_async(d.ctx, C.int(d.wakeFD), &typ, &port)
	switch {
	case r < 0:
		return asyncEvent{}, false, errnoErr("wait for async events", r)
	case r == 0:
		return asyncEvent{}, false, nil
	}
	e := asyncEvent{ev: eventOther, port: int(port)}
	switch typ {
	case C.IBV_EVENT_PORT_ACTIVE:
		e.ev = eventPortActive
	case C.IBV_EVENT_PORT_ERR:
		e.ev = eventPortDown
	case C.IBV_EVENT_GID_CHANGE:
		e.ev = eventGIDChange
	case C.IBV_EVENT_LID_CHANGE:
		e.ev = eventLIDChange
	case C.IBV_EVENT_PKEY_CHANGE:
		e.ev = eventPKeyChange
	case C.IBV_EVENT_SM_CHANGE:
		e.ev = eventSMChange
	case C.IBV_EVENT_CLIENT_REREGISTER:
		e.ev = eventClientReregister
	}
	return e, true, nil
}

func (d *ibvDevice) wake() {
	if d.wakeFD >= 0 {
		var one = [8]byte{1}
		unix.Write(d.wakeFD, one[:])
	}
}

// close frees everything in reverse order; the Port has stopped using
// the device.
func (d *ibvDevice) close() {
	if d.cm != nil {
		d.wake()
		d.cm.close()
	}
	for _, qp := range d.qps {
		C.ibv_destroy_qp(qp)
	}
	for _, ah := range d.ahs {
		C.ibv_destroy_ah(ah)
	}
	clear(d.qps)
	clear(d.ahs)
	if d.srq != nil {
		C.ibv_destroy_srq(d.srq)
	}
	if d.sendMR != nil {
		C.ibv_dereg_mr(d.sendMR)
	}
	if d.recvMR != nil {
		C.ibv_dereg_mr(d.recvMR)
	}
	if d.scq != nil {
		C.ibv_destroy_cq(d.scq)
	}
	if d.rcq != nil {
		C.ibv_destroy_cq(d.rcq)
	}
	if d.ch != nil {
		C.ibv_destroy_comp_channel(d.ch)
	}
	if d.pd != nil {
		C.ibv_dealloc_pd(d.pd)
	}
	if d.ctx != nil {
		C.ibv_close_device(d.ctx)
	}
	C.free(d.sendMem)
	C.free(d.recvMem)
	for _, p := range d.scratch {
		C.free(p)
	}
	if d.wakeFD >= 0 {
		unix.Close(d.wakeFD)
	}
	*d = ibvDevice{wakeFD: -1}
}
