package fakekernel

import (
	"maps"
	"net"
	"net/netip"
	"sync"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/ipoib"
)

// FastSender is a key of the RX program's senders map: the receiving
// child's ifindex and the source IP (unmapped).
type FastSender struct {
	Child uint32
	IP    netip.Addr
}

// FastMaps are the fast path's maps (kernelfabric.FastPathMaps) in Go
// maps, as the programs' maps behave: a put entry's hit count starts at
// 0, and a deleted entry's is gone. It counts the calls that change the
// maps, and Hit plays the programs redirecting a frame. It is safe for
// concurrent use; read the fields with Lock held when others may call.
type FastMaps struct {
	sync.Mutex
	Guests   map[ether.MAC]fastpath.Guest
	REMACs   map[ether.MAC]ipoib.HwAddr
	Children map[int]fastpath.RXGuest
	Senders  map[FastSender]ether.MAC
	// The entries' hit counts, by the maps' keys (HitTX, HitRX).
	guestHits  map[ether.MAC]uint64
	childHits  map[int]uint64
	remacHits  map[ether.MAC]uint64
	senderHits map[FastSender]uint64
	Calls      int   // puts and deletes
	Fail       error // returned by every put while set
	TX         [fastpath.NumReasons]uint64
	RX         [fastpath.NumRXReasons]uint64
}

// NewFastMaps returns empty maps.
func NewFastMaps() *FastMaps {
	return &FastMaps{Guests: map[ether.MAC]fastpath.Guest{}, REMACs: map[ether.MAC]ipoib.HwAddr{},
		Children: map[int]fastpath.RXGuest{}, Senders: map[FastSender]ether.MAC{},
		guestHits: map[ether.MAC]uint64{}, childHits: map[int]uint64{}, remacHits: map[ether.MAC]uint64{}, senderHits: map[FastSender]uint64{}}
}

// HitTX plays the TX program redirecting n frames from the guest mac to
// the REMAC remac: both entries count them, if both are there (else it
// would have fallen back).
func (m *FastMaps) HitTX(mac, remac ether.MAC, n uint64) {
	m.Lock()
	defer m.Unlock()
	if _, ok := m.Guests[mac]; !ok {
		return
	}
	if _, ok := m.REMACs[remac]; !ok {
		return
	}
	m.guestHits[mac] += n
	m.remacHits[remac] += n
}

// HitRX plays the RX program redirecting n packets from ip that the
// child received, if the child's guest and the sender are there.
func (m *FastMaps) HitRX(child int, ip netip.Addr, n uint64) {
	m.Lock()
	defer m.Unlock()
	k := FastSender{uint32(child), ip.Unmap()}
	if _, ok := m.Children[child]; !ok {
		return
	}
	if _, ok := m.Senders[k]; !ok {
		return
	}
	m.childHits[child] += n
	m.senderHits[k] += n
}

// Counts returns TX and RX.
func (m *FastMaps) Counts() ([fastpath.NumReasons]uint64, [fastpath.NumRXReasons]uint64, error) {
	m.Lock()
	defer m.Unlock()
	return m.TX, m.RX, nil
}

// put counts a put and returns Fail; call with the lock held.
func (m *FastMaps) put() error {
	m.Calls++
	return m.Fail
}

// PutGuest puts the guest's TX entry.
func (m *FastMaps) PutGuest(mac net.HardwareAddr, g fastpath.Guest) error {
	m.Lock()
	defer m.Unlock()
	if err := m.put(); err != nil {
		return err
	}
	m.Guests[ether.MAC(mac)], m.guestHits[ether.MAC(mac)] = g, 0
	return nil
}

// DeleteGuest deletes the guest's TX entry.
func (m *FastMaps) DeleteGuest(mac net.HardwareAddr) error {
	m.Lock()
	defer m.Unlock()
	m.Calls++
	delete(m.Guests, ether.MAC(mac))
	delete(m.guestHits, ether.MAC(mac))
	return nil
}

// PutREMAC puts the REMAC's entry.
func (m *FastMaps) PutREMAC(mac net.HardwareAddr, a ipoib.HwAddr) error {
	m.Lock()
	defer m.Unlock()
	if err := m.put(); err != nil {
		return err
	}
	m.REMACs[ether.MAC(mac)], m.remacHits[ether.MAC(mac)] = a, 0
	return nil
}

// DeleteREMAC deletes the REMAC's entry.
func (m *FastMaps) DeleteREMAC(mac net.HardwareAddr) error {
	m.Lock()
	defer m.Unlock()
	m.Calls++
	delete(m.REMACs, ether.MAC(mac))
	delete(m.remacHits, ether.MAC(mac))
	return nil
}

// PutChild puts the child's RX entry.
func (m *FastMaps) PutChild(child int, g fastpath.RXGuest) error {
	m.Lock()
	defer m.Unlock()
	if err := m.put(); err != nil {
		return err
	}
	m.Children[child], m.childHits[child] = g, 0
	return nil
}

// DeleteChild deletes the child's RX entry.
func (m *FastMaps) DeleteChild(child int) error {
	m.Lock()
	defer m.Unlock()
	m.Calls++
	delete(m.Children, child)
	delete(m.childHits, child)
	return nil
}

// PutSender puts a sender's entry.
func (m *FastMaps) PutSender(child uint32, ip netip.Addr, remac net.HardwareAddr) error {
	m.Lock()
	defer m.Unlock()
	if err := m.put(); err != nil {
		return err
	}
	k := FastSender{child, ip.Unmap()}
	m.Senders[k], m.senderHits[k] = ether.MAC(remac), 0
	return nil
}

// DeleteSender deletes a sender's entry.
func (m *FastMaps) DeleteSender(child uint32, ip netip.Addr) error {
	m.Lock()
	defer m.Unlock()
	m.Calls++
	k := FastSender{child, ip.Unmap()}
	delete(m.Senders, k)
	delete(m.senderHits, k)
	return nil
}

// GuestHits sums the guest's and its child's hit counts.
func (m *FastMaps) GuestHits(mac net.HardwareAddr, child int) (uint64, error) {
	m.Lock()
	defer m.Unlock()
	return m.guestHits[ether.MAC(mac)] + m.childHits[child], nil
}

// REMACHits is the REMAC's hit count.
func (m *FastMaps) REMACHits(mac net.HardwareAddr) (uint64, error) {
	m.Lock()
	defer m.Unlock()
	return m.remacHits[ether.MAC(mac)], nil
}

// SenderHits is the sender's hit count.
func (m *FastMaps) SenderHits(child uint32, ip netip.Addr) (uint64, error) {
	m.Lock()
	defer m.Unlock()
	return m.senderHits[FastSender{child, ip.Unmap()}], nil
}

// Entries is what the maps hold, as fastpath.Attached.Entries reads
// pinned maps an earlier process filled.
func (m *FastMaps) Entries() (fastpath.Entries, error) {
	m.Lock()
	defer m.Unlock()
	e := fastpath.Entries{Guests: map[[6]byte]fastpath.Guest{}, REMACs: map[[6]byte]ipoib.HwAddr{}, Children: map[int]fastpath.RXGuest{}, Senders: map[fastpath.Sender][6]byte{}}
	for mac, g := range m.Guests {
		e.Guests[mac] = g
	}
	for mac, a := range m.REMACs {
		e.REMACs[mac] = a
	}
	maps.Copy(e.Children, m.Children)
	for k, remac := range m.Senders {
		e.Senders[fastpath.Sender{Child: int(k.Child), IP: k.IP}] = remac
	}
	return e, nil
}
