package simfabric

// UDP GRO and the other receive control messages: a merged train's
// segment size (UDP_GRO), the destination address (IPV6_PKTINFO) and the
// kernel's receive-queue drops (SO_RXQ_OVFL).

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// oobInfo is what the control messages of a received datagram say.
type oobInfo struct {
	dst     [16]byte // destination address (IPV6_PKTINFO)
	ok      bool     // dst was there
	ovfl    uint32   // the kernel's cumulative receive-queue drops (SO_RXQ_OVFL)
	hasOvfl bool
	seg     int // the datagrams' size when UDP GRO merged several (UDP_GRO), else 0
}

// parseOOB reads the control messages of a datagram.
func parseOOB(oob []byte) (o oobInfo) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			copy(o.dst[:], data)
			o.ok = true
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			o.ovfl, o.hasOvfl = *(*uint32)(unsafe.Pointer(&data[0])), true
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			o.seg = int(*(*int32)(unsafe.Pointer(&data[0])))
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return
}
