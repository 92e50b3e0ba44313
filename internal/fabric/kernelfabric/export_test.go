package kernelfabric

import (
	"log/slog"

	"github.com/eipoib/eipoibd/ipoib"
)

// The unexported pieces the external tests (conformance_test.go) check.
var (
	// HostOffSysctls is hostOffSysctls.
	HostOffSysctls = hostOffSysctls
	// SetOptions is setOptions.
	SetOptions = setOptions
	// SubscribeLinksBuf is subscribeLinks: System.SubscribeLinks with
	// a receive buffer of the given size.
	SubscribeLinksBuf = subscribeLinks
	// SendDrop is sendDrop.
	SendDrop = sendDrop
)

// FollowParent runs a Port's link following (follow, as New starts it)
// for parent over updates, a subscription of k ended by done, without
// making any child. It returns the port's Events. stop closes done,
// waits for follow to end and closes the events.
func FollowParent(k Kernel, parent Link, updates <-chan Link, done chan struct{}) (events <-chan ipoib.Event, stop func()) {
	p := &Port{k: k, log: slog.New(slog.DiscardHandler), parent: parent, done: done}
	p.down.Store(!parent.Carrier)
	p.events = ipoib.NewEventQueue(parent.Carrier)
	p.wg.Add(1)
	go p.follow(updates)
	return p.events.Events(), func() {
		close(done)
		p.wg.Wait()
		p.events.Close()
	}
}

// Inject hands p's receive path one packet (IPoIB header first) with
// metadata m as a child's socket would receive it: a multicast one on
// its partition's group child, a unicast one on the child of m.DstQPN.
// It reports false when no child's socket could receive it: the kernel
// gives each child only its own QPN's packets in its own partition.
func Inject(p *Port, payload []byte, m ipoib.RxMeta) bool {
	var c *child
	pkttype := uint8(PacketHost)
	if m.DstQPN == ipoib.MulticastQPN {
		p.mu.RLock()
		c = p.groupC[m.PKey.Full()]
		p.mu.RUnlock()
		pkttype = PacketMulticast
	} else if q, ok := p.qps.Lookup(m.DstQPN); ok && q.PKey == m.PKey {
		c = q.Data.(*child)
	}
	if c == nil {
		return false
	}
	var name [SockaddrLLIPoIBLen]byte
	PutSockaddrLL(&name, c.index, ipoib.Header(payload).EtherType(), ipoib.HwAddr{})
	name[10] = pkttype
	buf := p.pool.Get().(*[]byte)
	clear(*buf)
	at := rxHead
	if c.vnet {
		at += VnetHdrLen // a zero virtio_net_hdr: no GSO
	}
	n := copy((*buf)[at:], payload[ipoib.HeaderLen:])
	msg := Msg{Name: name[:], NameLen: len(name), Buf: (*buf)[rxHead:], N: at - rxHead + n}
	if pk, ok := p.accept(c, &msg, buf); ok {
		p.rx <- pk
	}
	return true
}

// LockTx holds p's transmit lock, as a Write under way does, until the
// returned function is called.
func LockTx(p *Port) (unlock func()) {
	p.txMu.Lock()
	return p.txMu.Unlock
}

// HasQP reports whether qpn is in p's QP table.
func HasQP(p *Port, qpn uint32) bool {
	_, ok := p.qps.Lookup(qpn)
	return ok
}
