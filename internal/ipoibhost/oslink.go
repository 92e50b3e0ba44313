package ipoibhost

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// OSLink returns a Config.Link for the device called name in the calling
// network namespace. Its addresses come from netlink, tentative ones
// left out. Its multicast memberships come from /proc/net/igmp and
// /proc/net/igmp6, where the kernel lists every group a socket joined on
// it, and the ones it joins itself (224.0.0.1, ff02::1, the
// solicited-node groups).
func OSLink(name string) func() (LinkState, error) {
	return func() (LinkState, error) {
		var st LinkState
		link, err := netlink.LinkByName(name)
		if err != nil {
			return st, fmt.Errorf("ipoibhost: %s: %w", name, err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return st, fmt.Errorf("ipoibhost: addresses of %s: %w", name, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
				continue
			}
			bits, _ := a.Mask.Size()
			st.Addrs = append(st.Addrs, netip.PrefixFrom(ip.Unmap(), bits))
		}
		for _, f := range []struct {
			path  string
			parse func([]byte, string) ([]netip.Addr, error)
		}{{"/proc/net/igmp", parseIGMP}, {"/proc/net/igmp6", parseIGMP6}} {
			b, err := os.ReadFile(f.path)
			if err != nil {
				if os.IsNotExist(err) {
					continue // that family is not built into the kernel
				}
				return st, fmt.Errorf("ipoibhost: %w", err)
			}
			g, err := f.parse(b, name)
			if err != nil {
				return st, err
			}
			st.Groups = append(st.Groups, g...)
		}
		return st, nil
	}
}

// parseIGMP returns the IPv4 groups of dev in /proc/net/igmp. The file
// has a line per device ("5\tib0       :     2      V3") followed by a
// line per group, indented by tabs. A group line's first field is the
// group as the kernel's u32 in host byte order, printed in hex:
// "010000E0" is 224.0.0.1 on a little-endian machine.
func parseIGMP(b []byte, dev string) ([]netip.Addr, error) {
	var groups []netip.Addr
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for first := true; sc.Scan(); first = false {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case first || len(f) == 0:
		case !strings.HasPrefix(line, "\t"):
			in = len(f) >= 2 && f[1] == dev
		case in:
			v, err := strconv.ParseUint(f[0], 16, 32)
			if err != nil || len(f[0]) != 8 {
				return nil, fmt.Errorf("ipoibhost: /proc/net/igmp: bad group %q", f[0])
			}
			var a [4]byte
			binary.NativeEndian.PutUint32(a[:], uint32(v))
			groups = append(groups, netip.AddrFrom4(a))
		}
	}
	return groups, sc.Err()
}

// parseIGMP6 returns the IPv6 groups of dev in /proc/net/igmp6: one line
// a membership, "5 ib0 ff020000000000000000000000000001 1 0000000C 0".
func parseIGMP6(b []byte, dev string) ([]netip.Addr, error) {
	var groups []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[1] != dev {
			continue
		}
		var a [16]byte
		if len(f[2]) != 2*len(a) {
			return nil, fmt.Errorf("ipoibhost: /proc/net/igmp6: bad group %q", f[2])
		}
		if _, err := hex.Decode(a[:], []byte(f[2])); err != nil {
			return nil, fmt.Errorf("ipoibhost: /proc/net/igmp6: bad group %q", f[2])
		}
		groups = append(groups, netip.AddrFrom16(a))
	}
	return groups, sc.Err()
}
