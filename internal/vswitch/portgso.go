package vswitch

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Whether ovs-vswitchd runs a userspace bridge's ports with TSO.
//
// OVSDB's other_config:userspace-tso-enable is not what ovs-vswitchd
// runs with. bridge_run calls userspace_tso_init (lib/userspace-tso.c)
// on every configuration it reads, and the first that has the key set
// latches TSO on for the process's life (an ovsthread_once); turning
// it off takes a restart. And it only matters to a port when the port
// is added: netdev_linux_construct gives the port's netdev the TSO
// offload flags then, netdev_linux_rxq_construct sets PACKET_VNET_HDR
// on the packet socket it reads a system port through, and
// netdev_linux_tap_construct opens an internal port's TAP with
// IFF_VNET_HDR (lib/netdev-linux.c). A port added before TSO was
// latched keeps none of them, and netdev_send_prepare_packet
// (lib/netdev.c) drops every TSO packet sent to it ("Packet dropped: No
// TSO support"). So setting the key on a running switch leaves its
// ports as they were, and OVS 3.1 reports no TSO state in OVSDB.
//
// What each port got is visible from outside though: the kernel lists
// every packet socket, with the interface it is bound to and whether
// it has a vnet header (net/packet/diag.c, pdiag_put_info: PDI_VNETHDR
// when po->vnet_hdr_sz), and a TAP's flags, IFF_VNET_HDR among them,
// are in /sys/class/net/<name>/tun_flags (drivers/net/tun.c,
// tun_flags_show). A userspace bridge takes GSO super-frames from the
// TAP only if every one of its ports shows it.

// packet_diag's request and reply (include/uapi/linux/packet_diag.h).
const (
	packetShowInfo    = 0x1 // PACKET_SHOW_INFO
	packetDiagInfo    = 0   // PACKET_DIAG_INFO
	pdiVnetHdr        = 0x8 // PDI_VNETHDR
	packetDiagReqLen  = 20  // struct packet_diag_req
	packetDiagMsgLen  = 16  // struct packet_diag_msg
	packetDiagInfoLen = 24  // struct packet_diag_info
)

// packetSocket is one AF_PACKET socket as packet_diag lists it.
type packetSocket struct {
	ifindex uint32 // the interface it is bound to; 0 for every one
	vnetHdr bool   // it has PACKET_VNET_HDR
}

// packetSockets lists the packet sockets of this network namespace.
func packetSockets() ([]packetSocket, error) {
	req := nl.NewNetlinkRequest(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
	// struct packet_diag_req: sdiag_family, sdiag_protocol (must be 0:
	// packet_diag_handler_dump), pad, pdiag_ino, pdiag_show, cookie.
	body := make([]byte, packetDiagReqLen)
	body[0] = unix.AF_PACKET
	binary.NativeEndian.PutUint32(body[8:], packetShowInfo)
	req.AddRawData(body)
	// A dump the kernel interrupted (ErrDumpInterrupted) may miss
	// sockets: an error too.
	msgs, err := req.Execute(unix.NETLINK_SOCK_DIAG, unix.SOCK_DIAG_BY_FAMILY)
	if err != nil {
		return nil, fmt.Errorf("vswitch: list packet sockets (packet_diag): %w", err)
	}
	socks := make([]packetSocket, 0, len(msgs))
	for _, m := range msgs {
		s, err := parsePacketDiag(m)
		if err != nil {
			return nil, err
		}
		socks = append(socks, s)
	}
	return socks, nil
}

// parsePacketDiag parses one packet_diag reply: a struct
// packet_diag_msg, then netlink attributes, of which PACKET_DIAG_INFO
// (struct packet_diag_info: pdi_index first, pdi_flags sixth) is
// required, in the host's byte order.
func parsePacketDiag(b []byte) (packetSocket, error) {
	if len(b) < packetDiagMsgLen {
		return packetSocket{}, fmt.Errorf("vswitch: packet_diag reply of %d bytes, want at least %d", len(b), packetDiagMsgLen)
	}
	if b[0] != unix.AF_PACKET {
		return packetSocket{}, fmt.Errorf("vswitch: packet_diag reply of family %d", b[0])
	}
	for a := b[packetDiagMsgLen:]; len(a) >= unix.SizeofNlAttr; {
		n := int(binary.NativeEndian.Uint16(a))
		typ := binary.NativeEndian.Uint16(a[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < unix.SizeofNlAttr || n > len(a) {
			return packetSocket{}, fmt.Errorf("vswitch: packet_diag attribute of length %d in %d bytes", n, len(a))
		}
		if typ == packetDiagInfo {
			v := a[unix.SizeofNlAttr:n]
			if len(v) < packetDiagInfoLen {
				return packetSocket{}, fmt.Errorf("vswitch: packet_diag_info of %d bytes, want %d", len(v), packetDiagInfoLen)
			}
			return packetSocket{
				ifindex: binary.NativeEndian.Uint32(v),
				vnetHdr: binary.NativeEndian.Uint32(v[20:])&pdiVnetHdr != 0,
			}, nil
		}
		a = a[min(len(a), (n+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1)):]
	}
	return packetSocket{}, errors.New("vswitch: packet_diag reply without packet_diag_info")
}

// portsWithoutGSO returns why ovs-vswitchd does not take GSO packets
// from every port of userspace bridge br ("" when it does). It reads a
// system port (type empty or "system") through a packet socket bound to
// it, which must have a vnet header; an internal port ("internal", a
// TAP on the userspace datapath: dpif_netdev_port_open_type) or a "tap"
// one through its TAP, which must have IFF_VNET_HDR. A port of any
// other type (patch, tunnels, DPDK) is not vouched for.
func (o OVS) portsWithoutGSO(br string) (string, error) {
	out, err := o.vsctl("list-ifaces", br)
	if err != nil {
		return "", err
	}
	types, err := o.column("Interface", "type")
	if err != nil {
		return "", err
	}
	socks, err := packetSockets()
	if err != nil {
		return "", err
	}
	// list-ifaces leaves out the bridge's own (internal) interface.
	for _, name := range append(strings.Fields(out), br) {
		if strings.ContainsRune(name, '/') {
			return "port " + name + " is no interface name", nil
		}
		var typ string
		if json.Unmarshal(types[name], &typ) != nil {
			return "port " + name + " has no type in OVSDB", nil
		}
		switch typ {
		case "", "system":
			ifi, err := net.InterfaceByName(name)
			if err != nil {
				return "port " + name + ": " + err.Error(), nil
			}
			if !hasVnetSocket(socks, ifi.Index) {
				return "ovs-vswitchd reads port " + name + " without a vnet header", nil
			}
		case "internal", "tap":
			vnet, err := tapVnetHdr(name)
			if err != nil {
				return "port " + name + ": " + err.Error(), nil
			}
			if !vnet {
				return "ovs-vswitchd reads port " + name + " without a vnet header", nil
			}
		default:
			return "port " + name + " is of type " + typ, nil
		}
	}
	return "", nil
}

// hasVnetSocket reports whether a packet socket bound to interface
// ifindex has a vnet header.
func hasVnetSocket(socks []packetSocket, ifindex int) bool {
	for _, s := range socks {
		if int(s.ifindex) == ifindex && s.vnetHdr {
			return true
		}
	}
	return false
}

// tapVnetHdr reports whether TAP name has IFF_VNET_HDR.
func tapVnetHdr(name string) (bool, error) {
	b, err := os.ReadFile("/sys/class/net/" + name + "/tun_flags")
	if err != nil {
		return false, err
	}
	flags, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
	if err != nil {
		return false, fmt.Errorf("tun_flags %q: %w", strings.TrimSpace(string(b)), err)
	}
	return flags&unix.IFF_VNET_HDR != 0, nil
}
