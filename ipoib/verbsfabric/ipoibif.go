package verbsfabric

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/eipoib/eipoibd/ipoib"
)

// ipoibIf is a network interface as pickIPoIB sees it: its 20-byte
// hardware address (flags and QPN, then the port GID), its broadcast
// address (bytes 8 and 9 hold the partition's P_Key with the full
// member bit: ipoib_main.c ipoib_ndo_init writes them into the broadcast
// MGID) and its IP addresses.
type ipoibIf struct {
	name      string
	index     int
	hw, bcast []byte
	addrs     []netip.Addr
}

// pickIPoIB finds, among ifs, the IPoIB interface of the port with GID
// gid in partition pkey, and the address a join's rdma_cm id binds to:
// an IPv4 address first, else an IPv6 one (a link-local one with the
// interface as its scope, cma_check_linklocal). When there is none it
// says what the operator has to create.
func pickIPoIB(ifs []ipoibIf, gid ipoib.GID, pkey ipoib.PKey) (ipoibBind, error) {
	var found *ipoibIf
	for i := range ifs {
		f := &ifs[i]
		if len(f.hw) != ipoib.HwAddrLen || len(f.bcast) != ipoib.HwAddrLen || !bytes.Equal(f.hw[4:], gid[:]) {
			continue
		}
		if ipoib.PKey(uint16(f.bcast[8])<<8|uint16(f.bcast[9])).Full() != pkey.Full() {
			continue
		}
		found = f
		break
	}
	if found == nil {
		return ipoibBind{}, fmt.Errorf("verbsfabric: no IPoIB interface of port GID %s is in partition %s; the kernel's rdma_cm joins multicast groups through one (create it, e.g. ip link add link ib0 name ib0.%04x type ipoib pkey %s, give it an IP address and bring it up)",
			gid, pkey.Full(), uint16(pkey.Full()), pkey.Full())
	}
	var v6 netip.Addr
	for _, a := range found.addrs {
		if a.Is4() || a.Is4In6() {
			return ipoibBind{ifname: found.name, ifindex: found.index, addr: a.Unmap()}, nil
		}
		if !v6.IsValid() || (v6.IsLinkLocalUnicast() && !a.IsLinkLocalUnicast()) {
			v6 = a
		}
	}
	if !v6.IsValid() {
		return ipoibBind{}, fmt.Errorf("verbsfabric: IPoIB interface %s (partition %s) has no IP address; the kernel's rdma_cm binds multicast joins to one (ip addr add ADDR dev %s, ip link set %s up)",
			found.name, pkey.Full(), found.name, found.name)
	}
	if v6.IsLinkLocalUnicast() {
		v6 = v6.WithZone(found.name)
	}
	return ipoibBind{ifname: found.name, ifindex: found.index, addr: v6}, nil
}

// hostIPoIB is pickIPoIB over the host's interfaces: their addresses
// from the kernel, their broadcast addresses from sysfs.
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
		f := ipoibIf{name: n.Name, index: n.Index, hw: n.HardwareAddr}
		if b, err := os.ReadFile(filepath.Join("/sys/class/net", n.Name, "broadcast")); err == nil {
			f.bcast, _ = net.ParseMAC(strings.TrimSpace(string(b)))
		}
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
