package verbsfabric

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/eipoib/eipoibd/ipoib"
)

// device is the verbs boundary the Port drives: libibverbs through cgo
// (ibv.go, build tag verbs) or an in-memory fake in the tests. The Port
// serialises sends (postSend, pollSend, sendBuf) and receives (pollRecv,
// postRecv, recvBuf, waitRecv); the rest may run concurrently with both.
type device interface {
	attr() devAttr
	// createQP creates a UD QP with the IPoIB Q_Key in the P_Key table
	// entry pkeyIndex, in state RTS, on the shared CQs and receive queue.
	createQP(pkeyIndex int, psn uint32) (qpn uint32, err error)
	destroyQP(qpn uint32) error
	// createAH creates an address handle; it may block (RoCE resolves the
	// peer's MAC by neighbour discovery).
	createAH(p path) (handle, error)
	destroyAH(h handle)
	// attach and detach a QP to a group; mlid is the group's LID on IB
	// (from saJoin), 0 on RoCE.
	attach(qpn uint32, mgid ipoib.GID, mlid uint16) error
	detach(qpn uint32, mgid ipoib.GID, mlid uint16) error

	// On the IB link layer: a path record from the subnet administrator
	// (DLID and SL of the path to dgid), and SA multicast memberships
	// (the group's MLID and SL). They block for up to a few seconds.
	pathRecord(dgid ipoib.GID, pkey ipoib.PKey) (dlid uint16, sl uint8, err error)
	saJoin(mgid ipoib.GID, pkey ipoib.PKey, sendOnly bool) (mlid uint16, sl uint8, err error)
	saLeave(mgid ipoib.GID, sendOnly bool)

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
	waitEvent() (portEvent, bool, error)
	// wake ends every waitRecv and waitEvent, now and later.
	wake()
	close()
}

// devAttr is what the Port learns of its device at start.
type devAttr struct {
	gid      ipoib.GID
	gidIndex int
	ifindex  int  // the RoCE netdev, 0 on IB
	ib       bool // InfiniBand link layer (else Ethernet: RoCE)
	mtu      int  // active IB MTU in bytes
	active   bool // port state ACTIVE
	pkeys    []ipoib.PKey
}

// layout sizes the registered memory.
type layout struct {
	sendSlots, slotSize int
	recvBufs, recvSize  int
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

// sendDesc is one UD SEND: slot holds len bytes to QP rqpn through ah.
type sendDesc struct {
	qpn    uint32
	ah     handle
	rqpn   uint32
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
type recvDone struct {
	buf     int
	len     int
	srcQPN  uint32
	qpn     uint32
	ok, grh bool
}

// portEvent is an async event of the port.
type portEvent uint8

const (
	eventOther portEvent = iota
	eventPortActive
	eventPortDown
	eventGIDChange
)

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

// parseGRH returns the source and destination GIDs of a received packet's
// GRH: on IB and RoCE v2 over IPv6 the 40 bytes are the GRH/IPv6 header
// (IP version 6, SGID at 8, DGID at 24); RoCE v2 over IPv4 leaves 20 bytes
// of zeros and the IPv4 header, whose addresses become IPv4-mapped GIDs
// (rdma-core's ibv_init_ah_from_wc does the same).
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
