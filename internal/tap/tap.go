// Package tap is the guest side of eipoibd: the Device interface the shim
// reads Ethernet frames from and writes them to, a Linux TAP device created
// over netlink and moved in batches, and an in-memory Device for tests.
package tap

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fdio"
)

// Device moves Ethernet frames in batches. Read fills bufs[i][offset:],
// sets sizes[i] and returns how many it filled, blocking for the first;
// offset leaves headroom (at least Headroom). Write sends bufs[i][offset:]
// and returns how many frames the device took; the Headroom bytes before
// offset are the device's scratch space. After Close both return
// net.ErrClosed.
//
// What a device offers beyond that is in the interface, not found by type
// assertions: whether ReadSuper hands over super-frames (Caps), its
// queues (Queues, the device alone when it has one) and its counters
// (Counters, none when it keeps none).
type Device interface {
	Read(bufs [][]byte, sizes []int, offset int) (int, error)
	// ReadSuper is Read, except that on a device whose Caps report
	// SuperFrames a TCP or UDP super-frame comes whole with how to cut it in
	// super[i] (zero for an ordinary frame; bufs must then hold 64 KB
	// past offset). On another device it is Read, every super[i] zero.
	ReadSuper(bufs [][]byte, sizes []int, super []Super, offset int) (int, error)
	Write(bufs [][]byte, offset int) (int, error)
	BatchSize() int
	// SetCarrier reports the fabric port's state to the kernel.
	SetCarrier(up bool) error
	// OperUp reports whether the device is operationally up: the kernel
	// has acted on the carrier (linkwatch runs after SetCarrier returns,
	// and tells the bridge then), for work that must wait for that.
	OperUp() bool
	// Caps says what the device offers beyond ordinary frames.
	Caps() Caps
	// Queues are the device's queues, each a Device that one goroutine
	// reads; the first is the device's own, and a device with one queue
	// returns itself alone.
	Queues() []Device
	// Counters returns the device's counters by name (e.g. frames
	// refused for a bad vnet header); nil when it keeps none. Every
	// queue returns the whole device's. The names IsLevel reports are
	// levels (0 or 1 states), every other is a running total.
	Counters() map[string]uint64
	Close() error
}

// Caps says what a Device offers beyond ordinary frames.
type Caps struct {
	// SuperFrames: ReadSuper hands TCP super-frames over whole (a TAP
	// with the vnet header and TSO; see Config.Offload), and UDP ones
	// where the kernel took USO, for a fabric port that cuts them itself.
	SuperFrames bool
}

// Super says how to cut a TCP or UDP super-frame that ReadSuper returned
// whole; its zero value marks an ordinary frame. The frame's TCP (UDP)
// checksum field holds the pseudo-header sum over its whole TCP (UDP)
// length (see gso).
type Super struct {
	// L4 is the offset of the TCP (UDP) header in the frame.
	L4 uint16
	// Size is the TCP payload of each segment but the last, cut to the
	// TAP's MTU.
	Size uint16
	// V6 is set for IPv6, clear for IPv4.
	V6 bool
	// UDP marks a UDP super-frame (L4 the UDP header, Size the payload
	// of each datagram but the last, not cut to the MTU: a datagram
	// cannot be), which only a TAP whose kernel took UDP offloads hands
	// over.
	UDP bool
}

// Config describes the TAP to create.
type Config struct {
	Name string
	MAC  ether.MAC // zero: keep the kernel's random one
	MTU  int       // the IPoIB MTU; segments are cut to fit it
	// LinkMTU is the TAP's own MTU, when larger than MTU. A bridge drops
	// frames longer than a port's MTU without a word, so guests with
	// jumbo frames would meet a black hole. With the TAP at their MTU
	// the frames reach the shim, which fragments them or answers ICMP
	// "too big" with the IPoIB MTU. 0 means MTU.
	LinkMTU int
	// TxQueueLen is the TAP's txqueuelen: how many frames each queue
	// holds for its reader. tun_net_xmit (drivers/net/tun.c) puts a
	// frame into the queue's ring (ptr_ring_produce), and drops one
	// that finds it full, counted in the TAP's TX "dropped";
	// tun_device_event resizes the rings to a new txqueuelen
	// (NETDEV_CHANGE_TX_QUEUE_LEN, tun_queue_resize). It must cover what
	// guests send while the reader is not running. 0 leaves what the
	// TAP has.
	TxQueueLen int
	// Queues is the number of queues (IFF_MULTI_QUEUE when more than
	// one): the kernel spreads guests' flows over them by hash, so that
	// as many goroutines can read them in parallel. 0 means 1.
	Queues int
	// Offload turns on the vnet header with checksum offload, TSO and,
	// where the kernel takes it (Linux 6.2), USO. TCP and UDP
	// super-frames are then read whole and cut here, and partial
	// checksums completed here. Runs of received segments (datagrams)
	// are written as super-frames. Read buffers must then hold 64 KB
	// plus headroom.
	Offload bool
	// TUN makes a layer-3 device instead (IFF_TUN): bare IP packets, no
	// MAC, no offloads. eipoibd's native IPoIB host uses it.
	TUN bool
	// Persist makes the TAP persistent (TUNSETPERSIST, always
	// multi-queue): it outlives the process with its ifindex, MAC, MTU
	// and bridge membership, and a persistent TAP of the name that no
	// process holds is taken over instead of refused. Its carrier still
	// drops while no queue is open (__tun_detach, drivers/net/tun.c),
	// unless the queues themselves outlive the process: see FDs.
	Persist bool
	// FDs are open queues of the TAP kept from an earlier run (systemd's
	// file descriptor store passes them back). With Persist they are
	// taken over, so no queue ever detaches and the carrier stays on;
	// queues are added or closed to match Queues. Offload cannot change
	// while a queue is open (tun_set_iff updates the flags only for the
	// first queue): the kept TAP's setting stays, as Offload reports,
	// until the TAP is reopened without kept queues. Without Persist
	// the kept TAP is made non-persistent and closed, and a new one is
	// created. Create owns the descriptors either way.
	FDs []int
	// BusyPoll makes a queue's reader spin on non-blocking reads for up
	// to this long after finding the queue empty, before it waits in
	// the netpoller; 0 waits at once.
	BusyPoll time.Duration
}

// Start says how Create came by the TAP.
type Start int

// The ways: a new TAP; a persistent TAP left by an earlier run, opened
// again (its carrier had dropped with its last queue); or one whose
// queues were kept open across the restart, so its link never changed.
const (
	Created Start = iota
	Reopened
	Kept
)

// String names the way.
func (s Start) String() string {
	switch s {
	case Reopened:
		return "reopened"
	case Kept:
		return "kept"
	}
	return "created"
}

// LogValue logs the way by its name in every log format (a JSON log
// would otherwise show the number).
func (s Start) LogValue() slog.Value { return slog.StringValue(s.String()) }

// TAP is a Linux TAP device (IFF_TAP|IFF_NO_PI; unless persistent, it
// goes away with the process), with one or more queues (IFF_MULTI_QUEUE). The
// TAP's own Read, ReadSuper and Write use its first queue; Queue gives
// each queue as a device of its own. Each queue may be read by one
// goroutine and written by one goroutine at a time.
type TAP struct {
	name    string
	mtu     int
	linkMTU int // the link's own MTU: max(Config.LinkMTU, Config.MTU)
	offload bool
	queues  []*Queue
	start   Start
	// gro: Write merges runs of segments into super-frames (see
	// SetWriteSuper).
	gro atomic.Bool

	drops                 [2]atomic.Uint64 // bad vnet header, bad GSO
	gsoRead, gsoCut       atomic.Uint64
	groWritten, groMerged atomic.Uint64
	overMTU               atomic.Uint64 // frames written longer than linkMTU
	uso                   usoState
}

// Queue is one queue of a TAP: its own file descriptor, which the kernel
// feeds with the frames of the flows it hashes to it. Closing the TAP
// closes every queue. Read and Write go through internal/fdio: with
// Config.BusyPoll a reader spins before it waits, and a write to a full
// queue waits at most writeTimeout.
type Queue struct {
	t    *TAP
	file *os.File
	rc   syscall.RawConn
	io   *fdio.FD

	seg    segmenter // Read's super-frame being cut
	segBuf []byte    // its storage
	gro    coalescer // Write's super-frames

	// Read and Write state, used by readBatch and writeBatch (bound once
	// in io) so that a batch allocates nothing.
	rbufs  [][]byte
	rsizes []int
	rsuper []Super // nil: cut super-frames here
	roff   int
	rn     int
	rerr   error

	wbufs   [][]byte
	woff    int
	wgro    bool // this Write may merge
	wn      int  // frames dealt with
	wok     int  // of which the kernel accepted
	wsingle int  // frames before this index are written one by one
}

var (
	_ Device = (*TAP)(nil)
	_ Device = (*Queue)(nil)
)

// Create makes the TAP (or, with Persist, takes over the one an earlier
// run left), sets its MAC and MTU and brings it up.
func Create(cfg Config) (*TAP, error) {
	if cfg.Name == "" || len(cfg.Name) >= unix.IFNAMSIZ {
		closeFDs(cfg.FDs)
		return nil, fmt.Errorf("tap: bad interface name %q (1 to %d characters)", cfg.Name, unix.IFNAMSIZ-1)
	}
	if cfg.TUN && (cfg.Offload || !cfg.MAC.IsZero() || cfg.Persist) {
		closeFDs(cfg.FDs)
		return nil, fmt.Errorf("tap: %s: a TUN has neither offloads, a MAC nor persistence here", cfg.Name)
	}
	if cfg.MTU <= 0 && (cfg.Offload || len(cfg.FDs) > 0) {
		closeFDs(cfg.FDs)
		return nil, fmt.Errorf("tap: %s: offloads, and kept queues (which may have them), need the MTU to cut segments to", cfg.Name)
	}
	queues := max(cfg.Queues, 1)
	la := netlink.NewLinkAttrs()
	la.Name = cfg.Name
	mode := netlink.TUNTAP_MODE_TAP
	if cfg.TUN {
		mode = netlink.TUNTAP_MODE_TUN
	}
	tt := &netlink.Tuntap{
		LinkAttrs:  la,
		Mode:       mode,
		Flags:      netlink.TUNTAP_NO_PI | netlink.TUNTAP_TUN_EXCL,
		NonPersist: !cfg.Persist,
	}
	if queues > 1 || cfg.Persist {
		// Each queue attaches to the device the first one made, which
		// IFF_TUN_EXCL refuses; the name was checked free below. A
		// persistent TAP is always multi-queue, so that a later run
		// may attach another number of queues.
		tt.Flags = netlink.TUNTAP_MULTI_QUEUE_DEFAULTS
	}
	if cfg.Offload {
		tt.Flags |= netlink.TUNTAP_VNET_HDR
	}
	kept, spare, start, err := takeOver(cfg, tt)
	if err != nil {
		return nil, err
	}
	if start == Kept {
		// New queues, and the segmenting, follow the TAP's own vnet
		// header setting.
		cfg.Offload = tt.Flags&netlink.TUNTAP_VNET_HDR != 0
	}
	// Kept queues not taken close once the new ones are attached, so
	// that the TAP never has none.
	defer closeFDs(spare)
	if len(kept) < queues {
		tt.Queues = queues - len(kept)
		if err := netlink.LinkAdd(tt); err != nil {
			closeFiles(kept)
			if start == Created {
				return nil, fmt.Errorf("tap: create %s (%d queues): %w", cfg.Name, queues, err)
			}
			return nil, fmt.Errorf("tap: open %d more queues of %s: %w (the kernel refuses a TAP whose flags differ: delete it with \"ip link del %s\")", tt.Queues, cfg.Name, err, cfg.Name)
		}
	}
	files := append(kept, tt.Fds...)
	t := &TAP{name: cfg.Name, mtu: cfg.MTU, linkMTU: max(cfg.LinkMTU, cfg.MTU), offload: cfg.Offload, start: start}
	t.gro.Store(cfg.Offload)
	fail := func(err error) (*TAP, error) {
		for _, q := range t.queues {
			q.Close()
		}
		closeFiles(files) // those not yet queues; the rest say "closed"
		return nil, err
	}
	for _, f := range files {
		q := &Queue{t: t, file: f}
		rc, err := f.SyscallConn()
		if err != nil {
			return fail(fmt.Errorf("tap: %s: %w", cfg.Name, err))
		}
		q.rc = rc
		// A queue is readable when its ring has a frame (tun_chr_poll,
		// drivers/net/tun.c: EPOLLIN when the ptr_ring is not empty). It
		// is writable while the socket's send buffer is not full and the
		// device is up: tun_chr_poll reports EPOLLOUT when
		// tun_sock_writeable, (tun->dev->flags & IFF_UP) &&
		// sock_writeable(sk). A write to a down TAP fails at once with
		// EIO (tun_get_user), so a write waits at most writeTimeout.
		if q.io, err = fdio.New(rc, q.readBatch, q.writeBatch, writeTimeout); err != nil {
			return fail(fmt.Errorf("tap: %s: %w", cfg.Name, err))
		}
		q.io.SetBusyPoll(cfg.BusyPoll)
		if cfg.Offload {
			q.segBuf = make([]byte, maxSuperFrame)
		}
		t.queues = append(t.queues, q)
	}
	// What the kernel may hand us: partial checksums and TCP
	// super-frames (and ECN on them). The bridge then forwards guests'
	// TSO frames whole instead of segmenting them first. The features
	// are the device's (one queue sets them for all) and outlive the
	// queues. A reopened persistent TAP still has the last run's
	// (drivers/net/tun.c, tun_net_fix_features masks with set_features),
	// so they are set, or cleared, every time. Without a vnet header to
	// describe them, super-frames must never come.
	var features uintptr
	if cfg.Offload {
		features = tunFCsum | tunFTSO4 | tunFTSO6 | tunFTSOECN | tunFUSO
	}
	err = t.queues[0].ioctl(unix.TUNSETOFFLOAD, features)
	if err == unix.EINVAL && features&tunFUSO != 0 {
		// Before Linux 6.2 set_offload refuses the UDP flags: UDP
		// crosses datagram by datagram, as Counters' "uso" 0 says.
		features &^= tunFUSO
		err = t.queues[0].ioctl(unix.TUNSETOFFLOAD, features)
	}
	if err != nil {
		return fail(fmt.Errorf("tap: set offloads %#x on %s (TUNSETOFFLOAD): %w", features, cfg.Name, err))
	}
	t.uso.on = features&tunFUSO != 0
	link, err := netlink.LinkByName(cfg.Name)
	if err != nil {
		return fail(fmt.Errorf("tap: %s: %w", cfg.Name, err))
	}
	if !cfg.MAC.IsZero() && !bytes.Equal(link.Attrs().HardwareAddr, cfg.MAC[:]) {
		if err := netlink.LinkSetHardwareAddr(link, net.HardwareAddr(cfg.MAC[:])); err != nil {
			return fail(fmt.Errorf("tap: set MAC of %s: %w", cfg.Name, err))
		}
	}
	if mtu := max(cfg.LinkMTU, cfg.MTU); mtu > 0 && mtu != link.Attrs().MTU {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return fail(fmt.Errorf("tap: set MTU %d on %s: %w", mtu, cfg.Name, err))
		}
	}
	if t.linkMTU <= 0 {
		t.linkMTU = link.Attrs().MTU // the kernel's, left as it is
	}
	if cfg.TxQueueLen > 0 && cfg.TxQueueLen != link.Attrs().TxQLen {
		if err := netlink.LinkSetTxQLen(link, cfg.TxQueueLen); err != nil {
			return fail(fmt.Errorf("tap: set txqueuelen %d on %s: %w", cfg.TxQueueLen, cfg.Name, err))
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fail(fmt.Errorf("tap: bring %s up: %w", cfg.Name, err))
	}
	return t, nil
}

// takeOver deals with a TAP of the name that exists already.
//
// With Persist, it returns the kept queues that fit tt, the kept ones
// that do not (for the caller to close once new queues are attached) and
// how the TAP is being started. It makes tt's flags those that attach to
// it: no IFF_TUN_EXCL, and a kept TAP's own IFF_VNET_HDR.
//
// Without Persist an existing TAP is an error, except one whose queues
// were kept, which is made non-persistent and closed. Create then waits
// up to 2 s for it to go, as the store that kept the queues closes its
// copies when told.
func takeOver(cfg Config, tt *netlink.Tuntap) (kept []*os.File, spare []int, start Start, err error) {
	defer func() {
		if err != nil {
			closeFiles(kept)
			closeFDs(spare)
			kept, spare = nil, nil
		}
	}()
	want := (uint16(tt.Flags) | uint16(tt.Mode)) &^ (unix.IFF_TUN_EXCL | unix.IFF_VNET_HDR)
	vnet := -1 // the kept TAP's IFF_VNET_HDR
	for i, fd := range cfg.FDs {
		name, got, err := tunIff(fd)
		switch {
		case err != nil:
			closeFDs(cfg.FDs[i:])
			return kept, spare, 0, fmt.Errorf("tap: kept descriptor %d of %s: %w", fd, cfg.Name, err)
		case name != cfg.Name:
			closeFDs(cfg.FDs[i:])
			return kept, spare, 0, fmt.Errorf("tap: kept descriptor %d is a queue of %s, not of %s", fd, name, cfg.Name)
		case !cfg.Persist:
			unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 0) // gone with its last queue
			unix.Close(fd)
			continue
		case got&^(unix.IFF_PERSIST|unix.IFF_VNET_HDR) != want || len(kept) >= max(cfg.Queues, 1):
			// Other flags, or more queues than wanted.
			spare = append(spare, fd)
			continue
		}
		vnet = int(got & unix.IFF_VNET_HDR)
		if err := unix.SetNonblock(fd, true); err != nil {
			closeFDs(cfg.FDs[i:])
			return kept, spare, 0, fmt.Errorf("tap: kept descriptor %d of %s: %w", fd, cfg.Name, err)
		}
		kept = append(kept, os.NewFile(uintptr(fd), "/dev/net/tun"))
	}
	if !cfg.Persist && len(cfg.FDs) > 0 {
		// The TAP goes with its last queue, once the store that kept
		// them (told to let go first) has closed its copies.
		if err := waitGone(cfg.Name, 2*time.Second); err != nil {
			return nil, nil, 0, err
		}
	}
	link, err := netlink.LinkByName(cfg.Name)
	if err != nil {
		if len(cfg.FDs) > 0 && cfg.Persist {
			return kept, spare, 0, fmt.Errorf("tap: %s has kept queues but no link: %w", cfg.Name, err)
		}
		return nil, nil, Created, nil // free, as it should be
	}
	cur, isTun := link.(*netlink.Tuntap)
	switch {
	case !cfg.Persist:
		return kept, spare, 0, fmt.Errorf("tap: interface %s already exists (left by eipoibd --persist? \"ip link del %s\" removes it)", cfg.Name, cfg.Name)
	case !isTun || cur.Mode != tt.Mode:
		return kept, spare, 0, fmt.Errorf("tap: interface %s already exists and is a %s, not a %s", cfg.Name, link.Type(), map[bool]string{true: "TUN", false: "TAP"}[cfg.TUN])
	case len(cfg.FDs) == 0 && cur.Queues > 0:
		return kept, spare, 0, fmt.Errorf("tap: %s is in use: %d queues attached by another process", cfg.Name, cur.Queues)
	}
	tt.Flags &^= netlink.TUNTAP_TUN_EXCL
	if len(cfg.FDs) > 0 {
		if vnet >= 0 {
			tt.Flags = tt.Flags&^netlink.TUNTAP_VNET_HDR | netlink.TuntapFlag(vnet)
		}
		return kept, spare, Kept, nil
	}
	return nil, nil, Reopened, nil
}

// waitGone waits up to limit for the interface name to disappear, and
// says why not when it does not.
func waitGone(name string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		_, err := netlink.LinkByName(name)
		var notFound netlink.LinkNotFoundError
		switch {
		case errors.As(err, &notFound):
			return nil
		case err != nil:
			return fmt.Errorf("tap: waiting for %s to go: %w", name, err)
		case !time.Now().Before(deadline):
			return fmt.Errorf("tap: %s still exists %v after its kept queues were let go (another process holds a queue, or systemd kept its copies)", name, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tunIff returns the interface name and flags of a TUN/TAP queue
// (TUNGETIFF).
func tunIff(fd int) (string, uint16, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return "", 0, fmt.Errorf("not a TUN/TAP queue (TUNGETIFF): %w", err)
	}
	return ifr.Name(), ifr.Uint16(), nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// Start says how Create came by the TAP.
func (t *TAP) Start() Start { return t.start }

// Offload reports whether the TAP has the vnet header and offloads on:
// Config.Offload, except for a TAP whose queues were kept.
func (t *TAP) Offload() bool { return t.offload }

// SetWriteSuper sets whether Write may merge runs of received segments
// into super-frames. It is on by default with offloads; without them it
// has no effect. Turned off, every frame written is one the sender made,
// no longer than the MTU.
//
// That is for a reader of the TAP that takes no GSO metadata, as Open
// vSwitch's userspace datapath reads a port without
// userspace-tso-enable. lib/netdev-linux.c
// netdev_linux_batch_rxq_recv_sock reads with a packet socket without
// PACKET_VNET_HDR and a buffer of the link's MTU. A super-frame is then
// truncated and dropped ("Dropped packet: Too big"), or, where it fits,
// sent on whole to ports that refuse it (EMSGSIZE). The kernel's own
// readers (a Linux bridge, Open vSwitch's kernel datapath) take GSO
// frames and segment them for ports that need it.
//
// The TAP's offload flags (TUNSETOFFLOAD) cannot say this. They are the
// features of the TAP's link, what the kernel may hand eipoibd to read
// (drivers/net/tun.c, set_offload). A GSO vnet header that eipoibd
// writes is taken whatever they are (tun_get_user,
// virtio_net_hdr_to_skb). The setting may be changed while the TAP runs;
// a Write under way finishes as it started.
func (t *TAP) SetWriteSuper(on bool) { t.gro.Store(on) }

// WriteSuper reports whether Write merges runs into super-frames: with
// offloads, unless SetWriteSuper turned it off.
func (t *TAP) WriteSuper() bool { return t.offload && t.gro.Load() }

// Files returns the queues' files, for a file descriptor store to keep
// open across a restart (see Config.FDs); the TAP still owns them.
func (t *TAP) Files() []*os.File {
	files := make([]*os.File, len(t.queues))
	for i, q := range t.queues {
		files[i] = q.file
	}
	return files
}

// ioctl issues a TUN ioctl whose argument is an integer, not a pointer,
// on the queue's file.
func (q *Queue) ioctl(req uint, arg uintptr) error {
	var errno syscall.Errno
	if err := q.rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), arg)
	}); err != nil {
		return closedErr(err)
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// Queues returns the TAP's queues.
func (t *TAP) Queues() []Device {
	qs := make([]Device, len(t.queues))
	for i, q := range t.queues {
		qs[i] = q
	}
	return qs
}

// Queues returns the queue alone.
func (q *Queue) Queues() []Device { return []Device{q} }

// Caps reports super-frames when the TAP has offloads.
func (t *TAP) Caps() Caps { return Caps{SuperFrames: t.offload} }

// Caps is the TAP's Caps.
func (q *Queue) Caps() Caps { return q.t.Caps() }

// Counters is the TAP's Counters.
func (q *Queue) Counters() map[string]uint64 { return q.t.Counters() }

// BatchSize is the largest batch per call.
func (t *TAP) BatchSize() int { return batchSize }

// BatchSize is the largest batch per call.
func (q *Queue) BatchSize() int { return batchSize }

const batchSize = 64

// writeTimeout bounds how long a Write waits for a queue that does not
// take frames; the frames left are then refused.
const writeTimeout = 100 * time.Millisecond

func closedErr(err error) error {
	if errors.Is(err, fs.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// readBatch reads frames until the batch is full or the queue is empty; it
// returns false to wait for readiness when it got nothing.
func (q *Queue) readBatch(fd uintptr) bool {
	for q.rn < len(q.rbufs) {
		if !q.seg.Done() { // segments of a super-frame first
			q.rsizes[q.rn] = q.seg.Cut(q.rbufs[q.rn][q.roff:])
			q.rn++
			q.t.gsoCut.Add(1)
			continue
		}
		start := q.roff
		if q.t.offload {
			start -= vnetHdrLen // the header lands in the headroom
		}
		n, err := fdio.RawRead(fd, q.rbufs[q.rn][start:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return q.rn > 0
		}
		if err != nil {
			q.rerr = err
			return true
		}
		var sup Super
		if q.t.offload {
			if sup, err = q.unpack(q.rbufs[q.rn][start : start+n]); err != nil {
				q.t.drop(err)
				continue
			}
			if !q.seg.Done() {
				continue // cut from the next turn on
			}
			n -= vnetHdrLen
		}
		q.rsizes[q.rn] = n
		if q.rsuper != nil {
			q.rsuper[q.rn] = sup
		}
		q.rn++
	}
	return true
}

// unpack handles the vnet header of a frame read with offloads: a partial
// checksum is completed in place; a super-frame is checked and, for
// ReadSuper, described in place, else moved out and handed to the
// segmenter.
func (q *Queue) unpack(b []byte) (Super, error) {
	if len(b) < vnetHdrLen {
		return Super{}, errBadVnet
	}
	h := decodeVnet(b)
	frame := b[vnetHdrLen:]
	if h.gsoType == unix.VIRTIO_NET_HDR_GSO_NONE {
		if h.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
			return Super{}, completeChecksum(frame, h)
		}
		return Super{}, nil
	}
	if q.rsuper != nil {
		var s segmenter // checks only: nothing is cut
		sup, err := s.start(frame, h, q.t.mtu)
		if err == nil {
			q.t.countRead(sup)
		}
		return sup, err
	}
	n := copy(q.segBuf, frame)
	sup, err := q.seg.start(q.segBuf[:n], h, q.t.mtu)
	if err != nil {
		return Super{}, err
	}
	q.t.countRead(sup)
	return Super{}, nil
}

// countRead counts a super-frame read.
func (t *TAP) countRead(sup Super) {
	t.gsoRead.Add(1)
	if sup.UDP {
		t.uso.read.Add(1)
	}
}

// drop counts a frame refused for err.
func (t *TAP) drop(err error) {
	if err == errBadGSO {
		t.drops[1].Add(1)
	} else {
		t.drops[0].Add(1)
	}
}

// IsLevel reports whether a name Counters returns is a level, a state
// that goes up and down ("gro", "uso"), rather than a running total, so
// that an exporter makes it a gauge rather than a counter.
func IsLevel(name string) bool { return name == "gro" || name == "uso" }

// Counters returns the offload counters:
//   - frames refused for a bad vnet header or an inconsistent
//     super-frame;
//   - super-frames read and the segments cut from them;
//   - super-frames written and the segments merged into them;
//   - frames written whose IP packet is longer than the link's MTU
//     (super-frames, which a reader that takes no GSO metadata cannot
//     pass on);
//   - "gro", 1 while Write merges (WriteSuper).
func (t *TAP) Counters() map[string]uint64 {
	gro := uint64(0)
	if t.WriteSuper() {
		gro = 1
	}
	m := map[string]uint64{
		"gro":                        gro,
		"frames_over_mtu_written":    t.overMTU.Load(),
		"drop_" + errBadVnet.Error(): t.drops[0].Load(),
		"drop_" + errBadGSO.Error():  t.drops[1].Load(),
		"gso_frames_read":            t.gsoRead.Load(),
		"gso_segments_cut":           t.gsoCut.Load(),
		"gro_frames_written":         t.groWritten.Load(),
		"gro_segments_merged":        t.groMerged.Load(),
	}
	t.uso.counters(m)
	return m
}

// Read reads a batch of frames from the first queue. With offloads, a
// super-frame becomes as many segments as it takes, across calls when the
// batch is full.
func (t *TAP) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return t.queues[0].Read(bufs, sizes, offset)
}

// ReadSuper is the first queue's ReadSuper.
func (t *TAP) ReadSuper(bufs [][]byte, sizes []int, super []Super, offset int) (int, error) {
	return t.queues[0].ReadSuper(bufs, sizes, super, offset)
}

// Write writes a batch of frames to the first queue (see Queue.Write).
func (t *TAP) Write(bufs [][]byte, offset int) (int, error) {
	return t.queues[0].Write(bufs, offset)
}

// Read reads a batch of frames. With offloads, a super-frame becomes as
// many segments as it takes, across calls when the batch is full.
func (q *Queue) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return q.read(bufs, sizes, nil, offset)
}

// ReadSuper reads a batch of frames, super-frames whole (bufs must then
// hold 64 KB past offset): super[i] says how to cut frame i. Segments
// still pending from an earlier Read come first, as ordinary frames.
// Without offloads it is Read.
func (q *Queue) ReadSuper(bufs [][]byte, sizes []int, super []Super, offset int) (int, error) {
	if len(super) < len(bufs) {
		return 0, fmt.Errorf("tap: read of %d frames with %d super entries", len(bufs), len(super))
	}
	clear(super[:len(bufs)])
	return q.read(bufs, sizes, super, offset)
}

func (q *Queue) read(bufs [][]byte, sizes []int, super []Super, offset int) (int, error) {
	if q.t.offload && offset < vnetHdrLen {
		return 0, fmt.Errorf("tap: read offset %d below the vnet header's %d bytes", offset, vnetHdrLen)
	}
	q.rbufs, q.rsizes, q.rsuper, q.roff, q.rn, q.rerr = bufs, sizes, super, offset, 0, nil
	err := q.io.Read()
	q.rbufs, q.rsizes, q.rsuper = nil, nil, nil
	if err != nil {
		return 0, err // fdio says net.ErrClosed for a closed queue
	}
	if q.rn == 0 && q.rerr != nil {
		return 0, fmt.Errorf("tap: read %s: %w", q.t.name, q.rerr)
	}
	return q.rn, nil
}

func (q *Queue) writeBatch(fd uintptr) bool {
	for q.wn < len(q.wbufs) {
		out, k := q.wbufs[q.wn][q.woff:], 1
		var first seg
		if q.t.offload {
			if q.wgro && q.wn >= q.wsingle {
				k, first = run(q.wbufs[q.wn:], q.woff, q.t.uso.on)
			}
			if k > 1 {
				out = q.gro.merge(first, q.wbufs[q.wn:q.wn+k], q.woff)
			} else {
				out = q.wbufs[q.wn][q.woff-vnetHdrLen:]
				clear(out[:vnetHdrLen]) // no offload asked for this one
			}
		}
		_, err := fdio.RawWrite(fd, out)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case nil:
			q.wok += k
			q.t.countLong(out)
			if k > 1 {
				q.t.groWritten.Add(1)
				q.t.groMerged.Add(uint64(k))
				if first.udp {
					q.t.uso.written.Add(1)
					q.t.uso.merged.Add(uint64(k))
				}
			}
		default:
			if k > 1 { // a merged run refused: try its frames one by one
				q.wsingle = q.wn + k
				continue
			}
			// the kernel refused this frame (e.g. EINVAL): skip it
		}
		q.wn += k
	}
	return true
}

// countLong counts a frame written (behind its vnet header, with
// offloads) whose IP packet is longer than the link's MTU.
func (t *TAP) countLong(out []byte) {
	f := ether.Frame(out)
	if t.offload {
		f = f[vnetHdrLen:]
	}
	if f.IsValid() && len(f)-f.HeaderLen() > t.linkMTU {
		t.overMTU.Add(1)
	}
}

// Write writes a batch of frames and returns how many the kernel
// accepted; refused ones are skipped, so the caller counts them, and so
// are those left when the queue stays unwritable for writeTimeout.
func (q *Queue) Write(bufs [][]byte, offset int) (int, error) {
	if q.t.offload && offset < vnetHdrLen {
		return 0, fmt.Errorf("tap: write offset %d below the vnet header's %d bytes", offset, vnetHdrLen)
	}
	q.wbufs, q.woff, q.wn, q.wok, q.wsingle, q.wgro = bufs, offset, 0, 0, 0, q.t.WriteSuper()
	err := q.io.Write()
	q.wbufs = nil
	if err == fdio.ErrTimeout {
		return q.wok, nil // the rest refused: the caller counts them
	}
	if err != nil {
		return q.wok, err // fdio says net.ErrClosed for a closed queue
	}
	return q.wok, nil
}

// SetCarrier turns the TAP's carrier on or off (TUNSETCARRIER), so that
// the bridge and guests see the fabric port's state.
func (t *TAP) SetCarrier(up bool) error {
	var v int32
	if up {
		v = 1
	}
	var errno syscall.Errno
	if err := t.queues[0].rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.TUNSETCARRIER, uintptr(unsafe.Pointer(&v)))
	}); err != nil {
		return closedErr(err)
	}
	if errno != 0 {
		return fmt.Errorf("tap: set carrier of %s: %w", t.name, errno)
	}
	return nil
}

// SetCarrier is the TAP's SetCarrier.
func (q *Queue) SetCarrier(up bool) error { return q.t.SetCarrier(up) }

// OperUp asks netlink for the TAP's operational state (IFLA_OPERSTATE),
// which net/core/link_watch.c linkwatch_do_dev sets (rfc2863_policy) just
// before it tells the bridge of the carrier change (netdev_state_change).
// Netlink answers for the caller's network namespace, where sysfs would
// answer for the namespace it was mounted in. A TAP whose carrier never
// changed has had no link-watch event and reads "unknown" (the kernel's
// IF_OPER_UNKNOWN, which ip(8) shows as state UNKNOWN): up as well.
func (t *TAP) OperUp() bool {
	l, err := netlink.LinkByName(t.name)
	if err != nil {
		return false
	}
	st := l.Attrs().OperState
	return st == netlink.OperUp || st == netlink.OperUnknown
}

// OperUp is the TAP's OperUp.
func (q *Queue) OperUp() bool { return q.t.OperUp() }

// Close closes every queue, which removes the TAP unless it is
// persistent; blocked reads and writes return net.ErrClosed.
func (t *TAP) Close() error {
	var first error
	for _, q := range t.queues {
		if err := q.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Close closes this queue only; the device goes when the TAP is closed.
// A reader or writer blocked in it is woken first, and the descriptor is
// closed once it has left its system call.
func (q *Queue) Close() error { return q.io.Close(q.file.Close) }
