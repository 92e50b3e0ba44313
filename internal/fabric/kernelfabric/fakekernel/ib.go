package fakekernel

// The IPoIB driver's readiness, as the fake models it, function by
// function (drivers/infiniband/ulp/ipoib, Linux 6.x):
//
//   - ipoib_open turns the carrier off and calls ipoib_ib_dev_open. That
//     refuses a P_Key not in the port's table
//     (ipoib_pkey_dev_check_presence, ib_find_pkey: the low 15 bits
//     match). ipoib_open then still returns 0, so the child is up with
//     no carrier and its QP never initialised (ipoib_init_qp): it
//     receives nothing.
//   - Otherwise ipoib_ib_dev_up starts ipoib_mcast_join_task, which
//     waits for the port to be ACTIVE and joins the broadcast group
//     through the SA. ipoib_mcast_join_finish takes the group's MTU
//     (mcast_mtu = IPOIB_UD_MTU(group MTU)) and attaches the QP.
//     ib_attach_mcast fails past the HCA's max_mcast_qp_attach; the join
//     is then retried with backoff and the carrier stays off.
//     ipoib_mcast_carrier_on_task then sets the MTU to min(mcast_mtu,
//     admin_mtu) and turns the carrier on. The fake joins after
//     JoinDelay, in a goroutine as the driver's workqueue does, and does
//     not retry a failed join.
//   - With the carrier off the qdisc is noop: dev_queue_xmit drops the
//     packet with NET_XMIT_CN, which packet_snd reports as success.
//   - A port going down turns every interface's carrier off (ipoib_event
//     → flush → ipoib_ib_dev_down); coming back, each joins again. A
//     P_Key leaving the table does the same to its children
//     (IB_EVENT_PKEY_CHANGE → __ipoib_ib_dev_flush heavy,
//     update_child_pkey).

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/ipoib"
)

// ibFabric is the subnet manager's partition configuration (in Fabric).
type ibFabric struct {
	smMu     sync.Mutex
	groupMTU map[ipoib.PKey]int
}

// SetGroupMTU sets the IB MTU (256 to 4096) of partition pkey's broadcast
// group, as the SM's partition configuration does (opensm
// partitions.conf "mtu="): each child of the partition joining after this
// takes it, capped by its parent's MTU. Unset, a group has the joining
// parent's MTU.
func (f *Fabric) SetGroupMTU(pkey ipoib.PKey, ibMTU int) {
	f.smMu.Lock()
	defer f.smMu.Unlock()
	if f.groupMTU == nil {
		f.groupMTU = make(map[ipoib.PKey]int)
	}
	f.groupMTU[pkey.Full()] = ibMTU
}

func (f *Fabric) groupIBMTU(pkey ipoib.PKey) (int, bool) {
	f.smMu.Lock()
	defer f.smMu.Unlock()
	m, ok := f.groupMTU[pkey.Full()]
	return m, ok
}

// IBKnobs are a host's InfiniBand test knobs (in Kernel), set before use.
type IBKnobs struct {
	// MaxQPPerGroup is the HCA's max_mcast_qp_attach: the most QPs of
	// this host attached to one multicast group. A child whose
	// broadcast join would attach one more never gets carrier. 0: no
	// limit. Only broadcast groups are limited (the join that decides
	// carrier).
	MaxQPPerGroup int
	// JoinDelay is how long a broadcast join takes.
	JoinDelay time.Duration

	pkeys       []ipoib.PKey
	pkeysSet    bool
	txNoCarrier uint64
}

// ibLink is a link's InfiniBand state.
type ibLink struct {
	joined bool // attached to its broadcast group (carrier on)
	gen    int  // bumped when the link goes down, so a stale join is void
}

// SetPKeys sets the port's P_Key table and raises the P_Key change event:
// the children of a P_Key no longer in it lose carrier; those of a P_Key
// now in it join. Unset, every P_Key is in the table but PKeys fails, as
// for a port whose table cannot be read.
func (k *Kernel) SetPKeys(pkeys ...ipoib.PKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pkeys, k.pkeysSet = append([]ipoib.PKey(nil), pkeys...), true
	var changed []kf.Link
	for _, l := range k.links {
		if l.ParentIndex == 0 || !l.Up {
			continue
		}
		if !k.pkeyPresent(l.pkey) {
			if l.Carrier || l.ib.joined {
				k.down(l)
				changed = append(changed, l.Link)
			}
		} else if !l.ib.joined {
			k.open(l)
		}
	}
	k.notify(changed)
}

// PKeys returns the table SetPKeys set, as System reads it from sysfs.
func (k *Kernel) PKeys(parent string) (kf.PKeyTable, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.byName(parent)
	if p == nil {
		return kf.PKeyTable{}, unix.ENODEV
	}
	if !k.pkeysSet {
		return kf.PKeyTable{}, unix.ENOENT
	}
	return kf.PKeyTable{Device: "fake_0", Port: 1, Path: "/sys/class/infiniband/fake_0/ports/1/pkeys",
		PKeys: append([]ipoib.PKey(nil), k.pkeys...)}, nil
}

// TxNoCarrier counts the packets sent on interfaces without carrier
// (dropped by the noop qdisc, reported as sent).
func (k *Kernel) TxNoCarrier() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.txNoCarrier
}

// pkeyPresent is ib_find_pkey: the low 15 bits match.
func (k *Kernel) pkeyPresent(pkey ipoib.PKey) bool {
	return !k.pkeysSet || kf.PKeyTable{PKeys: k.pkeys}.Has(pkey)
}

func (k *Kernel) parent() *link {
	for _, l := range k.links {
		if l.ParentIndex == 0 {
			return l
		}
	}
	return nil
}

// open is ipoib_open on a child just set up (k.mu held): carrier off,
// and the broadcast join started when the P_Key is in the table and the
// port is active.
func (k *Kernel) open(l *link) {
	if l.ParentIndex == 0 {
		return
	}
	l.Carrier = false
	p := k.parent()
	if !k.pkeyPresent(l.pkey) || p == nil || !p.Carrier {
		return
	}
	gen := l.ib.gen
	go k.join(l, gen)
}

// down is ipoib_ib_dev_down (k.mu held).
func (k *Kernel) down(l *link) {
	l.Carrier, l.ib.joined = false, false
	l.ib.gen++
}

// join completes a broadcast join: the attach limit, then the group's
// MTU and the carrier (ipoib_mcast_join_finish,
// ipoib_mcast_carrier_on_task).
func (k *Kernel) join(l *link, gen int) {
	if k.JoinDelay > 0 {
		time.Sleep(k.JoinDelay)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.parent()
	if k.links[l.Index] != l || !l.Up || l.ib.gen != gen || l.ib.joined || p == nil || !p.Carrier {
		return
	}
	if k.MaxQPPerGroup > 0 {
		n := 0
		for _, o := range k.links {
			if o.attached() && o.pkey == l.pkey {
				n++
			}
		}
		if n >= k.MaxQPPerGroup {
			return // ib_attach_mcast failed: "couldn't attach QP to multicast group"
		}
	}
	mtu := k.udMTU
	if g, ok := k.f.groupIBMTU(l.pkey); ok {
		mtu = min(mtu, g-ipoib.HeaderLen)
	}
	l.MTU, l.Carrier, l.ib.joined = mtu, true, true
	k.notify([]kf.Link{l.Link})
}

// portState is the port going down or up (k.mu held): every interface's
// carrier follows, and the children join again when it is back.
func (k *Kernel) portState(up bool) {
	var changed []kf.Link
	for _, l := range k.links {
		switch {
		case l.ParentIndex == 0:
			l.Carrier = up
		case !l.Up:
			continue
		case !up:
			k.down(l)
		}
		changed = append(changed, l.Link)
	}
	k.notify(changed)
	if up {
		for _, l := range k.links {
			if l.ParentIndex != 0 && l.Up {
				k.open(l)
			}
		}
	}
}

// notify queues link changes to the subscribers (k.mu held); a
// subscription whose queue is full is overrun (netlink_overrun).
func (k *Kernel) notify(changed []kf.Link) {
	if k.overrun {
		return
	}
	for _, s := range append([]*sub(nil), k.subs...) {
		for _, l := range changed {
			select {
			case s.ch <- l:
				continue
			default:
			}
			k.endSub(s, unix.ENOBUFS)
			break
		}
	}
}

// attached reports whether the link's QP is attached to its broadcast
// group: the parent while it has carrier, a child once it joined.
func (l *link) attached() bool {
	if l.ParentIndex == 0 {
		return l.Up && l.Carrier
	}
	return l.ib.joined
}

// dropNoCarrier counts a packet the noop qdisc of an interface without
// carrier drops (k.mu held); packet_snd reports it sent.
func (k *Kernel) dropNoCarrier(dev *link) bool {
	if dev.Carrier {
		return false
	}
	k.txNoCarrier++
	return true
}

// receives reports whether the link's QP was initialised and receives
// unicast: it is up and its P_Key is in the table (ipoib_init_qp).
func (k *Kernel) receives(l *link) bool {
	return l.Up && (l.ParentIndex == 0 || k.pkeyPresent(l.pkey))
}
