// Package tap is the guest side of eipoibd: the Device interface the shim
// reads Ethernet frames from and writes them to, a Linux TAP device created
// over netlink and moved in batches, and an in-memory Device for tests.
package tap

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/ether"
)

// Device moves Ethernet frames in batches. Read fills bufs[i][offset:],
// sets sizes[i] and returns how many it filled, blocking for the first;
// offset leaves headroom (at least Headroom). Write sends bufs[i][offset:]
// and returns how many frames the device took; the Headroom bytes before
// offset are the device's scratch space. After Close both return
// net.ErrClosed.
type Device interface {
	Read(bufs [][]byte, sizes []int, offset int) (int, error)
	Write(bufs [][]byte, offset int) (int, error)
	BatchSize() int
	// SetCarrier reports the fabric port's state to the kernel.
	SetCarrier(up bool) error
	Close() error
}

// Config describes the TAP to create.
type Config struct {
	Name string
	MAC  ether.MAC // zero: keep the kernel's random one
	MTU  int       // the IPoIB MTU; segments are cut to fit it
	// LinkMTU, when above MTU, is the device's own MTU: a bridge drops
	// frames larger than a port's MTU before the TAP sees them, so
	// frames up to it must reach eipoibd, which answers or fragments
	// those larger than MTU instead of blackholing them.
	LinkMTU int
	// Offload turns on the vnet header with checksum offload and TSO:
	// TCP super-frames are read whole and cut here, partial checksums
	// completed here, and runs of received segments are written as
	// super-frames. Read buffers must then hold 64 KB plus headroom.
	Offload bool
	// TUN makes a layer-3 device instead (IFF_TUN): bare IP packets, no
	// MAC, no offloads. eipoibd's native IPoIB host uses it.
	TUN bool
}

// TAP is a Linux TAP device (IFF_TAP|IFF_NO_PI, not persistent: it goes
// away with the process). Read and Write may each be used by one goroutine
// at a time.
type TAP struct {
	name    string
	file    *os.File
	rc      syscall.RawConn
	mtu     int
	offload bool

	seg    segmenter // Read's super-frame being cut
	segBuf []byte    // its storage
	gro    coalescer // Write's super-frames

	drops                 [2]atomic.Uint64 // bad vnet header, bad GSO
	gsoRead, gsoCut       atomic.Uint64
	groWritten, groMerged atomic.Uint64

	// Read and Write state, used by the pre-bound callbacks below so that
	// a batch allocates nothing.
	rbufs  [][]byte
	rsizes []int
	roff   int
	rn     int
	rerr   error
	readFn func(fd uintptr) bool

	wbufs   [][]byte
	woff    int
	wn      int // frames dealt with
	wok     int // of which the kernel accepted
	wsingle int // frames before this index are written one by one
	writeFn func(fd uintptr) bool
}

var _ Device = (*TAP)(nil)

// Create makes the TAP, sets its MAC and MTU and brings it up.
func Create(cfg Config) (*TAP, error) {
	if cfg.Name == "" || len(cfg.Name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tap: bad interface name %q (1 to %d characters)", cfg.Name, unix.IFNAMSIZ-1)
	}
	if _, err := netlink.LinkByName(cfg.Name); err == nil {
		return nil, fmt.Errorf("tap: interface %s already exists", cfg.Name)
	}
	la := netlink.NewLinkAttrs()
	la.Name = cfg.Name
	mode := netlink.TUNTAP_MODE_TAP
	if cfg.TUN {
		if cfg.Offload || !cfg.MAC.IsZero() {
			return nil, fmt.Errorf("tap: %s: a TUN has neither offloads nor a MAC", cfg.Name)
		}
		mode = netlink.TUNTAP_MODE_TUN
	}
	tt := &netlink.Tuntap{
		LinkAttrs:  la,
		Mode:       mode,
		Flags:      netlink.TUNTAP_NO_PI | netlink.TUNTAP_TUN_EXCL,
		Queues:     1,
		NonPersist: true,
	}
	if cfg.Offload {
		tt.Flags |= netlink.TUNTAP_VNET_HDR
	}
	if err := netlink.LinkAdd(tt); err != nil {
		return nil, fmt.Errorf("tap: create %s: %w", cfg.Name, err)
	}
	t := &TAP{name: cfg.Name, file: tt.Fds[0], mtu: cfg.MTU, offload: cfg.Offload}
	fail := func(err error) (*TAP, error) { t.file.Close(); return nil, err }
	if cfg.Offload {
		if t.mtu <= 0 {
			return fail(fmt.Errorf("tap: %s: offloads need the MTU to cut segments to", cfg.Name))
		}
		// What the kernel may hand us: partial checksums and TCP
		// super-frames (and ECN on them). The bridge then forwards
		// guests' TSO frames whole instead of segmenting them first.
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, t.file.Fd(), unix.TUNSETOFFLOAD, tunFCsum|tunFTSO4|tunFTSO6|tunFTSOECN); errno != 0 {
			return fail(fmt.Errorf("tap: enable offloads on %s (TUNSETOFFLOAD): %w", cfg.Name, errno))
		}
		t.segBuf = make([]byte, maxSuperFrame)
	}
	rc, err := t.file.SyscallConn()
	if err != nil {
		return fail(fmt.Errorf("tap: %s: %w", cfg.Name, err))
	}
	t.rc = rc
	if !cfg.MAC.IsZero() {
		if err := netlink.LinkSetHardwareAddr(tt, net.HardwareAddr(cfg.MAC[:])); err != nil {
			return fail(fmt.Errorf("tap: set MAC of %s: %w", cfg.Name, err))
		}
	}
	if mtu := max(cfg.MTU, cfg.LinkMTU); mtu > 0 {
		if err := netlink.LinkSetMTU(tt, mtu); err != nil {
			return fail(fmt.Errorf("tap: set MTU %d on %s: %w", mtu, cfg.Name, err))
		}
	}
	if err := netlink.LinkSetUp(tt); err != nil {
		return fail(fmt.Errorf("tap: bring %s up: %w", cfg.Name, err))
	}
	t.readFn = t.readBatch
	t.writeFn = t.writeBatch
	return t, nil
}

// BatchSize is the largest batch per call.
func (t *TAP) BatchSize() int { return 64 }

func closedErr(err error) error {
	if errors.Is(err, fs.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// readBatch reads frames until the batch is full or the queue is empty; it
// returns false to wait for readiness when it got nothing.
func (t *TAP) readBatch(fd uintptr) bool {
	for t.rn < len(t.rbufs) {
		if !t.seg.done() { // segments of a super-frame first
			t.rsizes[t.rn] = t.seg.cut(t.rbufs[t.rn][t.roff:])
			t.rn++
			t.gsoCut.Add(1)
			continue
		}
		start := t.roff
		if t.offload {
			start -= vnetHdrLen // the header lands in the headroom
		}
		n, err := unix.Read(int(fd), t.rbufs[t.rn][start:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return t.rn > 0
		}
		if err != nil {
			t.rerr = err
			return true
		}
		if t.offload {
			if err := t.unpack(t.rbufs[t.rn][start : start+n]); err != nil {
				t.drop(err)
				continue
			}
			if !t.seg.done() {
				continue // cut from the next turn on
			}
			n -= vnetHdrLen
		}
		t.rsizes[t.rn] = n
		t.rn++
	}
	return true
}

// unpack handles the vnet header of a frame read with offloads: a partial
// checksum is completed in place; a super-frame is moved out and handed
// to the segmenter.
func (t *TAP) unpack(b []byte) error {
	if len(b) < vnetHdrLen {
		return errBadVnet
	}
	h := decodeVnet(b)
	frame := b[vnetHdrLen:]
	if h.gsoType == unix.VIRTIO_NET_HDR_GSO_NONE {
		if h.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
			return completeChecksum(frame, h)
		}
		return nil
	}
	n := copy(t.segBuf, frame)
	if err := t.seg.start(t.segBuf[:n], h, t.mtu); err != nil {
		return err
	}
	t.gsoRead.Add(1)
	return nil
}

// drop counts a frame refused for err.
func (t *TAP) drop(err error) {
	if err == errBadGSO {
		t.drops[1].Add(1)
	} else {
		t.drops[0].Add(1)
	}
}

// Counters returns the offload counters: frames refused for a bad vnet
// header or an inconsistent super-frame, super-frames read and the
// segments cut from them, super-frames written and the segments merged
// into them.
func (t *TAP) Counters() map[string]uint64 {
	return map[string]uint64{
		"drop_" + errBadVnet.Error(): t.drops[0].Load(),
		"drop_" + errBadGSO.Error():  t.drops[1].Load(),
		"gso_frames_read":            t.gsoRead.Load(),
		"gso_segments_cut":           t.gsoCut.Load(),
		"gro_frames_written":         t.groWritten.Load(),
		"gro_segments_merged":        t.groMerged.Load(),
	}
}

// Read reads a batch of frames. With offloads, a super-frame becomes as
// many segments as it takes, across calls when the batch is full.
func (t *TAP) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if t.offload && offset < vnetHdrLen {
		return 0, fmt.Errorf("tap: read offset %d below the vnet header's %d bytes", offset, vnetHdrLen)
	}
	t.rbufs, t.rsizes, t.roff, t.rn, t.rerr = bufs, sizes, offset, 0, nil
	err := t.rc.Read(t.readFn)
	t.rbufs, t.rsizes = nil, nil
	if err != nil {
		return 0, closedErr(err)
	}
	if t.rn == 0 && t.rerr != nil {
		return 0, fmt.Errorf("tap: read %s: %w", t.name, t.rerr)
	}
	return t.rn, nil
}

func (t *TAP) writeBatch(fd uintptr) bool {
	for t.wn < len(t.wbufs) {
		out, k := t.wbufs[t.wn][t.woff:], 1
		if t.offload {
			var first tcpSeg
			if t.wn >= t.wsingle {
				k, first = run(t.wbufs[t.wn:], t.woff)
			}
			if k > 1 {
				out = t.gro.merge(first, t.wbufs[t.wn:t.wn+k], t.woff)
			} else {
				out = t.wbufs[t.wn][t.woff-vnetHdrLen:]
				clear(out[:vnetHdrLen]) // no offload asked for this one
			}
		}
		_, err := unix.Write(int(fd), out)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case nil:
			t.wok += k
			if k > 1 {
				t.groWritten.Add(1)
				t.groMerged.Add(uint64(k))
			}
		default:
			if k > 1 { // a merged run refused: try its frames one by one
				t.wsingle = t.wn + k
				continue
			}
			// the kernel refused this frame (e.g. EINVAL): skip it
		}
		t.wn += k
	}
	return true
}

// Write writes a batch of frames and returns how many the kernel
// accepted; refused ones are skipped, so the caller counts them.
func (t *TAP) Write(bufs [][]byte, offset int) (int, error) {
	if t.offload && offset < vnetHdrLen {
		return 0, fmt.Errorf("tap: write offset %d below the vnet header's %d bytes", offset, vnetHdrLen)
	}
	t.wbufs, t.woff, t.wn, t.wok, t.wsingle = bufs, offset, 0, 0, 0
	err := t.rc.Write(t.writeFn)
	t.wbufs = nil
	if err != nil {
		return t.wok, closedErr(err)
	}
	return t.wok, nil
}

// SetCarrier turns the TAP's carrier on or off (TUNSETCARRIER), so that
// the bridge and guests see the fabric port's state.
func (t *TAP) SetCarrier(up bool) error {
	var v int32
	if up {
		v = 1
	}
	var errno syscall.Errno
	if err := t.rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.TUNSETCARRIER, uintptr(unsafe.Pointer(&v)))
	}); err != nil {
		return closedErr(err)
	}
	if errno != 0 {
		return fmt.Errorf("tap: set carrier of %s: %w", t.name, errno)
	}
	return nil
}

// Close removes the TAP (it is not persistent).
func (t *TAP) Close() error { return t.file.Close() }
