package vswitch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// Whether an Open vSwitch bridge takes GSO super-frames from a port.
//
// The kernel datapath (datapath_type "system", or empty:
// ofproto_normalize_type) forwards a port's GSO packets as the kernel
// does any: its MTU check drops only packets that are not GSO
// (net/openvswitch/vport.c, ovs_vport_send: packet_length > mtu &&
// !skb_is_gso), and dev_queue_xmit segments them for a port that takes
// no GSO (validate_xmit_skb), as the Linux bridge does. The userspace datapath ("netdev") reads
// a kernel port through a packet socket (lib/netdev-linux.c,
// netdev_linux_rxq_construct, netdev_linux_batch_rxq_recv_sock): with
// other_config:userspace-tso-enable=true (read once, at start:
// userspace_tso_init) the socket has PACKET_VNET_HDR and a super-frame
// comes with its GSO metadata; without it the buffer holds one frame of
// the link's MTU, a longer one is truncated and dropped ("Dropped
// packet: Too big. GRO/TSO enabled?"), and one that fits is sent on
// whole to ports that refuse it (netdev_linux_send: "error sending
// Ethernet packet on …: Message too long", the EMSGSIZE of
// net/packet/af_packet.c packet_snd for a frame longer than the device's
// MTU without a GSO header).

// Datapath is what an Open vSwitch bridge's datapath is, as OVSDB says.
type Datapath struct {
	// Type is the Bridge's datapath_type: "system" (or empty) for the
	// kernel datapath, "netdev" for the userspace one.
	Type string
	// UserspaceTSO is the Open_vSwitch table's
	// other_config:userspace-tso-enable (true or TRUE, as OVS's
	// smap_get_bool reads it).
	UserspaceTSO bool
}

// Kernel reports whether the datapath is the kernel's.
func (d Datapath) Kernel() bool { return d.Type == "" || d.Type == "system" }

// TakesGSO reports whether the bridge takes a port's GSO super-frames:
// the kernel datapath does, the userspace one only with
// userspace-tso-enable.
func (d Datapath) TakesGSO() bool { return d.Kernel() || d.UserspaceTSO }

// Datapath returns bridge br's datapath.
func (o OVS) Datapath(br string) (Datapath, error) {
	bridges, err := o.vsctl("--format=json", "--columns=name,datapath_type", "list", "Bridge")
	if err != nil {
		return Datapath{}, err
	}
	global, err := o.vsctl("--format=json", "--columns=other_config", "list", "Open_vSwitch")
	if err != nil {
		return Datapath{}, err
	}
	return parseDatapath(br, []byte(bridges), []byte(global))
}

// parseDatapath reads bridge br's datapath from the Bridge table (name
// and datapath_type) and the Open_vSwitch table (other_config), each
// as ovs-vsctl --format=json lists it.
func parseDatapath(br string, bridges, global []byte) (Datapath, error) {
	rows, err := parseOVSTable(bridges)
	if err != nil {
		return Datapath{}, fmt.Errorf("vswitch: ovs-vsctl list Bridge: %w", err)
	}
	var d Datapath
	found := false
	for _, r := range rows {
		var name string
		if json.Unmarshal(r["name"], &name) != nil || name != br {
			continue
		}
		if json.Unmarshal(r["datapath_type"], &d.Type) != nil {
			return Datapath{}, fmt.Errorf("vswitch: bridge %s: datapath_type %s is not a string", br, r["datapath_type"])
		}
		found = true
	}
	if !found {
		return Datapath{}, fmt.Errorf("vswitch: Open vSwitch bridge %q not found", br)
	}
	rows, err = parseOVSTable(global)
	if err != nil {
		return Datapath{}, fmt.Errorf("vswitch: ovs-vsctl list Open_vSwitch: %w", err)
	}
	if len(rows) != 1 {
		return Datapath{}, fmt.Errorf("vswitch: %d rows in the Open_vSwitch table, want 1", len(rows))
	}
	m, err := ovsMap(rows[0]["other_config"])
	if err != nil {
		return Datapath{}, fmt.Errorf("vswitch: Open_vSwitch other_config: %w", err)
	}
	d.UserspaceTSO = strings.EqualFold(m["userspace-tso-enable"], "true")
	return d, nil
}

// WatchDatapath calls fn with bridge br's datapath now and whenever it
// changes (its datapath_type, or userspace-tso-enable), until ctx ends;
// trouble is told to warn (which may be nil). It follows the Bridge and
// Open_vSwitch tables with ovsdb-client monitor, as Watch does.
func (o OVS) WatchDatapath(ctx context.Context, br string, fn func(Datapath), warn func(err error)) error {
	known, have := Datapath{}, false
	return o.follow(ctx, [][]string{{"Bridge", "name,datapath_type"}, {"Open_vSwitch", "other_config"}}, func() {
		d, err := o.Datapath(br)
		if err != nil {
			if warn != nil {
				warn(err)
			}
			return
		}
		if !have || d != known {
			fn(d)
		}
		known, have = d, true
	}, warn)
}
