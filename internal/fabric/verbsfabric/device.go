package verbsfabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/eipoib/eipoibd/ipoib"
)

// device is the verbs boundary the Port drives: libibverbs through cgo
// (ibv.go, build tag verbs) or an in-memory fake in the tests. The Port
// serialises sends (postSend, pollSend, sendBuf) and receives (pollRecv,
// postRecv, waitRecv: its receiver goroutine); recvBuf of a buffer not
// posted, and the rest, may run concurrently with both.
type device interface {
	attr() devAttr
	// createQP creates a UD QP with Q_Key qkey in the P_Key table entry
	// pkeyIndex, in state RTS, on the shared CQs and receive queue.
	createQP(pkeyIndex int, qkey, psn uint32) (qpn uint32, err error)
	// setQKey changes a QP's Q_Key in RTS, as ipoib_mcast_attach does
	// (IB_QP_QKEY) when the broadcast group's Q_Key arrives.
	setQKey(qpn, qkey uint32) error
	destroyQP(qpn uint32) error
	// pkeys reads the port's P_Key table again (after a PKEY_CHANGE).
	pkeys() ([]ipoib.PKey, error)
	// createAH creates an address handle; it may block (RoCE resolves the
	// peer's MAC by neighbour discovery).
	createAH(p path) (handle, error)
	destroyAH(h handle)
	// attach and detach a QP to a group; mlid is the group's LID on IB
	// (from the SA join), 0 on RoCE.
	attach(qpn uint32, mgid ipoib.GID, mlid uint16) error
	detach(qpn uint32, mgid ipoib.GID, mlid uint16) error
	// sa is the port's subnet administrator on the IB link layer, nil on
	// RoCE (which has none: no path records, no SA joins).
	sa() subnetAdmin

	// sendBuf is send slot slot of the registered send memory.
	sendBuf(slot int) []byte
	// postSend posts the descriptors in order and returns how many were
	// posted.
	postSend(s []sendDesc) (int, error)
	// pollSend reaps send completions without blocking.
	pollSend(out []sendDone) int

	// recvBuf is receive buffer i of the registered receive memory: the
	// 40-byte GRH, then the packet.
	recvBuf(i int) []byte
	postRecv(bufs []uint32) error
	// pollRecv reaps receive completions without blocking.
	pollRecv(out []recvDone) int
	// waitRecv blocks until the receive CQ may have completions (true) or
	// wake was called (false).
	waitRecv() (bool, error)

	// waitEvent blocks until the next async event (true) or wake (false).
	// A port event carries the port it is about: one device context
	// reports every port's (libibverbs ibv_get_async_event sets
	// element.port_num for them).
	waitEvent() (asyncEvent, bool, error)
	// wake ends every waitRecv and waitEvent, the subnet administrator's
	// included, now and later.
	wake()
	close()
}

// devAttr is what the Port learns of its device at start.
type devAttr struct {
	port     int // the port number the Port uses (1 for the first)
	gid      ipoib.GID
	gidIndex int
	ifindex  int  // the RoCE netdev, 0 on IB
	ib       bool // InfiniBand link layer (else Ethernet: RoCE)
	mtu      int  // active IB MTU in bytes
	active   bool // port state ACTIVE
	pkeys    []ipoib.PKey
}

// layout sizes the registered memory: recvBufs receive buffers, of
// which at most srqDepth are posted on the shared receive queue (its
// size, and the receive CQ's: every receive completion is of a posted
// buffer).
type layout struct {
	sendSlots, slotSize int
	recvBufs, recvSize  int
	srqDepth            int
	batch               int
}

// handle names an address handle of the device.
type handle uint64

// path is what an address handle is made of: the destination GID, and on
// IB the DLID and SL a path record gives.
type path struct {
	gid    ipoib.GID
	global bool // carry a GRH (always on RoCE; multicast and off-subnet on IB)
	dlid   uint16
	sl     uint8
}

// sendDesc is one UD SEND: slot holds len bytes to QP rqpn through ah,
// with the remote Q_Key qkey.
type sendDesc struct {
	qpn    uint32
	ah     handle
	rqpn   uint32
	qkey   uint32
	slot   int
	len    int
	wrID   uint64
	signal bool
}

// sendDone is a send completion.
type sendDone struct {
	wrID uint64
	qpn  uint32
	ok   bool
}

// recvDone is a receive completion: buf holds len bytes (GRH included).
// srcQPN and slid name the sender, GRH or not (lids.go).
type recvDone struct {
	buf     int
	len     int
	srcQPN  uint32
	qpn     uint32
	slid    uint16
	ok, grh bool
}

// portEvent is an async event of the port.
type portEvent uint8

const (
	eventOther portEvent = iota
	eventPortActive
	eventPortDown
	eventGIDChange
	// The subnet manager's events (IB only): ipoib_event maps them to
	// the flushes the Port repeats.
	eventLIDChange
	eventPKeyChange
	eventSMChange
	eventClientReregister
)

// asyncEvent is an async event of the device: what it is and the port
// number it is about (0 for an event not of a port).
type asyncEvent struct {
	ev   portEvent
	port int
}

// subnetAdmin is the InfiniBand link layer's control side: path records
// and multicast memberships from the subnet administrator, through the
// kernel's rdma_cm (librdmacm in ibv.go; a fake that follows cma.c and
// multicast.c in the tests). Every call may block for seconds; the Port
// makes them off the data path.
type subnetAdmin interface {
	// pathRecord resolves the path q asks for: rdma_resolve_addr and
	// rdma_resolve_route with AF_IB addresses (cma_query_ib_route).
	pathRecord(q pathQuery) (pathRec, error)
	// join joins a group (rdma_join_multicast_ex) and returns its
	// MULTICAST_JOIN event's data. The membership lasts until leave or
	// until the kernel reports a MULTICAST_ERROR for it.
	join(r joinReq) (mcMember, error)
	// leave ends the membership join made (rdma_leave_multicast).
	leave(mgid ipoib.GID, sendOnly bool)
	// waitEvent blocks until an established membership's id reports a
	// MULTICAST_ERROR (true) or the device's wake (false).
	waitEvent() (mcastError, bool, error)
}

// portSpace is an rdma_cm port space (enum rdma_ucm_port_space).
type portSpace uint16

// The port spaces the backend uses.
const (
	// psIPoIB binds an id to an IPoIB interface's IP address; AF_IB
	// addresses refuse it (cma_select_ib_ps: -EPROTONOSUPPORT).
	psIPoIB portSpace = 0x0002
	// psIB is the port space cma_select_ib_ps accepts for an AF_IB
	// address whose service ID and mask are 0.
	psIB portSpace = 0x013F
)

// pathQuery asks for the path from sgid to dgid in partition pkey, with
// the id in port space ps. The query's service ID is the destination
// sockaddr_ib's sib_sid (rdma_get_service_id), which is 0: a plain path
// record, as IPoIB's path_rec_start asks (no service ID).
type pathQuery struct {
	sgid, dgid ipoib.GID
	pkey       ipoib.PKey
	ps         portSpace
}

// pathRec is what the Port takes from a path record.
type pathRec struct {
	dlid uint16
	sl   uint8
}

// joinReq asks to join mgid, from an id in port space ps bound to bind
// (an IPoIB interface's address), as a send-only full member or a full
// member.
type joinReq struct {
	mgid     ipoib.GID
	sendOnly bool
	ps       portSpace
	bind     ipoibBind
}

// ipoibBind is an IP address of the host's IPoIB interface in one
// partition, which a join's id binds to: rdma_translate_ip copies the
// interface's hardware and broadcast addresses into the id, and
// cma_join_ib_multicast reads the broadcast group from them.
type ipoibBind struct {
	ifname  string
	ifindex int
	addr    netip.Addr
	// mtu and connected are the interface's MTU and IPoIB mode: in
	// datagram mode the MTU is the broadcast group's (see ifaceGroupMTU).
	mtu       int
	connected bool
}

// mcMember is a join's MULTICAST_JOIN event data: the group's MLID and
// SL (event.param.ud.ah_attr), its Q_Key (event.param.ud.qkey) and its
// MTU in bytes (0 when the SA gave none). ifaceMTU is the IB MTU that
// the IPoIB interface the join was bound to shows for its broadcast
// group (ifaceGroupMTU; 0: it shows none).
type mcMember struct {
	mlid     uint16
	sl       uint8
	qkey     uint32
	mtu      int
	ifaceMTU int
}

// ifaceGroupMTU is the IB MTU of a partition's broadcast group as the
// kernel's IPoIB interface in it shows it. ipoib_mcast_join_finish sets
// priv->mcast_mtu to IPOIB_UD_MTU of the group's MTU (4 bytes less, the
// IPoIB header). In datagram mode only, ipoib_mcast_carrier_on_task sets
// the interface MTU to min(mcast_mtu, admin_mtu) before the carrier
// comes on; in connected mode the MTU is the CM's. So a datagram-mode
// interface's MTU is at most the group's. The largest IB MTU the backend
// supports whose IPoIB MTU fits in it is then at most the group's; an
// administrator's smaller MTU makes it smaller, never larger. It is 0
// when the interface tells nothing: connected mode, or an MTU below
// 2044.
func ifaceGroupMTU(b ipoibBind) int {
	switch {
	case b.connected:
		return 0
	case b.mtu >= 4096-ipoib.HeaderLen:
		return 4096
	case b.mtu >= 2048-ipoib.HeaderLen:
		return 2048
	}
	return 0
}

// errJoinRefused is a join whose id got a MULTICAST_ERROR instead of a
// MULTICAST_JOIN: the SA (or cma_make_mc_event) refused it.
var errJoinRefused = errors.New("verbsfabric: the join was refused (MULTICAST_ERROR)")

// mcastError is a MULTICAST_ERROR event of an established membership:
// multicast.c reports one to every member (-ENETRESET) when the port's
// LID, SM or registration changes, and when the group goes away.
type mcastError struct {
	mgid     ipoib.GID
	sendOnly bool
	err      error
}

// gidType is a GID table entry's type.
type gidType uint8

const (
	gidIB gidType = iota
	gidRoCEv1
	gidRoCEv2
)

// gidEntry is one GID table entry.
type gidEntry struct {
	gid     ipoib.GID
	index   int
	typ     gidType
	ifindex int
}

// pickGID chooses the port GID: on IB the table's first entry (the
// default GID, subnet prefix + port GUID); on RoCE the entry of type RoCE
// v2 holding the netdev's IPv6 link-local address, the shape the
// simulated fabric's GIDs have.
func pickGID(entries []gidEntry, ib bool) (gidEntry, error) {
	for _, e := range entries {
		if ib && e.typ == gidIB {
			return e, nil
		}
		if !ib && e.typ == gidRoCEv2 && e.gid[0] == 0xfe && e.gid[1]&0xc0 == 0x80 {
			return e, nil
		}
	}
	if ib {
		return gidEntry{}, errors.New("verbsfabric: the port's GID table is empty")
	}
	return gidEntry{}, fmt.Errorf("verbsfabric: no RoCE v2 GID with an IPv6 link-local address among %d entries (is the netdev up with IPv6?)", len(entries))
}

// grhLen is the Global Route Header a UD receive buffer starts with.
const grhLen = 40

// errGRH is a receive buffer whose GRH is neither an IPv6 header nor the
// RoCE v2 IPv4 form.
var errGRH = errors.New("verbsfabric: bad GRH")

// parseGRH returns the source and destination GIDs of a received
// packet's GRH. On IB and RoCE v2 over IPv6 the 40 bytes are the
// GRH/IPv6 header (IP version 6, SGID at 8, DGID at 24). RoCE v2 over
// IPv4 leaves 20 bytes of zeros and the IPv4 header, whose addresses
// become IPv4-mapped GIDs (rdma-core's ibv_init_ah_from_wc does the
// same).
func parseGRH(b []byte) (src, dst ipoib.GID, err error) {
	if len(b) < grhLen {
		return src, dst, errGRH
	}
	if b[0]>>4 == 6 {
		copy(src[:], b[8:24])
		copy(dst[:], b[24:40])
		return src, dst, nil
	}
	v4 := b[20:40]
	for _, z := range b[:20] {
		if z != 0 {
			return src, dst, errGRH
		}
	}
	if v4[0] != 0x45 || binary.BigEndian.Uint16(v4[2:4]) < 20 {
		return src, dst, errGRH
	}
	src[10], src[11], dst[10], dst[11] = 0xff, 0xff, 0xff, 0xff
	copy(src[12:], v4[12:16])
	copy(dst[12:], v4[16:20])
	return src, dst, nil
}

// mtuOf maps the verbs MTU enum (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5) to
// bytes.
func mtuOf(enum int) int {
	if enum < 1 || enum > 5 {
		return 0
	}
	return 128 << enum
}

// MaxPortNum is the largest port number of a verbs device (port_num is
// a u8 in struct ibv_port_attr's calls, and ports count from 1).
const MaxPortNum = 255

// ParseDevice splits the verbs device of --ib-dev, NAME or NAME:PORT
// (e.g. mlx5_0:2), into the device name and the port number, 1 when
// none is given. The name is what ibv_devices lists; the port is the
// HCA port whose GID, P_Keys, QPs and events the backend uses.
func ParseDevice(s string) (name string, port int, err error) {
	name, num, ok := strings.Cut(s, ":")
	switch {
	case name == "":
		return "", 0, fmt.Errorf("no device name before the port: want NAME or NAME:PORT, e.g. mlx5_0 or mlx5_0:2")
	case !ok:
		return name, 1, nil
	}
	port, err = strconv.Atoi(num)
	if err != nil || port < 1 || port > MaxPortNum || strings.ContainsAny(num, "+-") {
		return "", 0, fmt.Errorf("port %q: want a number from 1 to %d (the HCA's port, as ibstat lists it)", num, MaxPortNum)
	}
	return name, port, nil
}

// noDevice is the error for a verbs device name libibverbs could not
// find (ENODEV), or could not list at all. It names the RDMA devices
// listed in sysDir. ENOSYS means there is no
// /sys/class/infiniband_verbs, as without ib_uverbs or any RDMA driver:
// find_sysfs_devs and check_abi_version in rdma-core's libibverbs/init.c
// answer it then.
func noDevice(name, sysDir string) error {
	ents, _ := os.ReadDir(sysDir)
	var have []string
	for _, e := range ents {
		have = append(have, e.Name())
	}
	switch {
	case slices.Contains(have, name):
		return fmt.Errorf("verbsfabric: RDMA device %q exists, but libibverbs finds no verbs device of it: is ib_uverbs loaded?", name)
	case len(have) == 0:
		return fmt.Errorf("verbsfabric: there is no RDMA device %q: this host has none (%s is empty or absent: no RDMA driver such as mlx5_ib is loaded, nor an rxe link made with rdma link add)", name, sysDir)
	}
	return fmt.Errorf("verbsfabric: there is no RDMA device %q; the RDMA devices here: %s", name, strings.Join(have, ", "))
}
