package verbsfabric

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/eipoib/eipoibd/ipoib"
)

// ipoibIf is a network interface as pickIPoIB sees it. It holds its
// 20-byte hardware address (flags and QPN, then the port GID), its
// state, MTU and mode, and its IP addresses. It also holds its broadcast
// address, whose bytes 8 and 9 hold the partition's P_Key with the full
// member bit (ipoib_main.c ipoib_ndo_init writes them into the broadcast
// MGID).
type ipoibIf struct {
	name      string
	index     int
	hw, bcast []byte
	addrs     []netip.Addr
	// up is IFF_UP (ip link set up). joined is operstate "up". An IPoIB
	// interface's carrier comes on only once its broadcast group is
	// joined with the port ACTIVE: ipoib_mcast_join_complete queues
	// ipoib_mcast_carrier_on_task for priv->broadcast, which checks the
	// port and calls netif_carrier_on. The operstate follows the carrier
	// (net/core/link_watch.c rfc2863_policy).
	up, joined bool
	// mtu is the interface MTU; connected is mode "connected"
	// (ipoib_cm.c show_mode).
	mtu       int
	connected bool
}

// pickIPoIB finds, among ifs, the IPoIB interface of the port with GID
// gid in partition pkey that a join can go through. It also returns the
// address a join's rdma_cm id binds to: an IPv4 address first, else an
// IPv6 one (a link-local one with the interface as its scope,
// cma_check_linklocal).
//
// The interface must be up, have an address (rdma_bind_addr) and have
// joined its broadcast group. cma_join_ib_multicast asks
// ib_sa_get_mcmember_rec for the broadcast group's record, which
// multicast.c has only while a member of the port, the kernel's IPoIB,
// holds it. The first interface that has all three is chosen, not merely
// the first of the partition. When none has, the error says what the one
// closest to it lacks, and what the operator has to do.
func pickIPoIB(ifs []ipoibIf, gid ipoib.GID, pkey ipoib.PKey) (ipoibBind, error) {
	var best *ipoibIf
	bestScore := -1
	for i := range ifs {
		f := &ifs[i]
		if len(f.hw) != ipoib.HwAddrLen || len(f.bcast) != ipoib.HwAddrLen || !bytes.Equal(f.hw[4:], gid[:]) {
			continue
		}
		if ipoib.PKey(uint16(f.bcast[8])<<8|uint16(f.bcast[9])).Full() != pkey.Full() {
			continue
		}
		score := 0
		for _, ok := range []bool{f.up, f.up && f.joined, slices.ContainsFunc(f.addrs, netip.Addr.IsValid)} {
			if ok {
				score++
			}
		}
		if score == 3 {
			return bindOf(f), nil
		}
		if score > bestScore {
			best, bestScore = f, score
		}
	}
	switch {
	case best == nil:
		return ipoibBind{}, fmt.Errorf("verbsfabric: no IPoIB interface of port GID %s is in partition %s; the kernel's rdma_cm joins multicast groups through one (create it, e.g. ip link add link ib0 name ib0.%04x type ipoib pkey %s, give it an IP address and bring it up)",
			gid, pkey.Full(), uint16(pkey.Full()), pkey.Full())
	case !best.up:
		return ipoibBind{}, fmt.Errorf("verbsfabric: IPoIB interface %s (partition %s) is down; the kernel's rdma_cm joins multicast groups through it once it is up and has joined its broadcast group (ip link set %s up)",
			best.name, pkey.Full(), best.name)
	case !best.joined:
		return ipoibBind{}, fmt.Errorf("verbsfabric: IPoIB interface %s (partition %s) has not joined its broadcast group (no carrier: its operstate is not up); the kernel's rdma_cm needs that membership for every join (check the port and the subnet manager with ibstat, and the partition in the subnet manager's partitions)",
			best.name, pkey.Full())
	}
	return ipoibBind{}, fmt.Errorf("verbsfabric: IPoIB interface %s (partition %s) has no IP address; the kernel's rdma_cm binds multicast joins to one (ip addr add ADDR dev %s)",
		best.name, pkey.Full(), best.name)
}

// bindOf is the address of f a join binds to, with f's MTU and mode.
func bindOf(f *ipoibIf) ipoibBind {
	b := ipoibBind{ifname: f.name, ifindex: f.index, mtu: f.mtu, connected: f.connected}
	var v6 netip.Addr
	for _, a := range f.addrs {
		if a.Is4() || a.Is4In6() {
			b.addr = a.Unmap()
			return b
		}
		if !v6.IsValid() || (v6.IsLinkLocalUnicast() && !a.IsLinkLocalUnicast()) {
			v6 = a
		}
	}
	if v6.IsLinkLocalUnicast() {
		v6 = v6.WithZone(f.name)
	}
	b.addr = v6
	return b
}

// hostIPoIB is pickIPoIB over the host's interfaces: their flags, MTUs
// and addresses from the kernel (rtnetlink), their broadcast addresses,
// operstates and IPoIB modes from sysfs.
func hostIPoIB(gid ipoib.GID, pkey ipoib.PKey) (ipoibBind, error) {
	nifs, err := net.Interfaces()
	if err != nil {
		return ipoibBind{}, fmt.Errorf("verbsfabric: listing network interfaces: %w", err)
	}
	var ifs []ipoibIf
	for _, n := range nifs {
		if len(n.HardwareAddr) != ipoib.HwAddrLen {
			continue
		}
		f := ipoibIf{name: n.Name, index: n.Index, hw: n.HardwareAddr, up: n.Flags&net.FlagUp != 0, mtu: n.MTU}
		sys := func(attr string) string {
			b, _ := os.ReadFile(filepath.Join("/sys/class/net", n.Name, attr))
			return strings.TrimSpace(string(b))
		}
		f.bcast, _ = net.ParseMAC(sys("broadcast"))
		f.joined = sys("operstate") == "up"      // net-sysfs.c operstate_show
		f.connected = sys("mode") == "connected" // ipoib_cm.c show_mode
		addrs, _ := n.Addrs()
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil {
				f.addrs = append(f.addrs, pfx.Addr())
			}
		}
		ifs = append(ifs, f)
	}
	return pickIPoIB(ifs, gid, pkey)
}
