package vswitch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
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
// TSO on (userspace-tso-enable, latched by userspace_tso_init) when the
// port was added, the socket has PACKET_VNET_HDR and a super-frame
// comes with its GSO metadata (see portsWithoutGSO for the rest);
// without it the buffer holds one frame of
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
	// PortsGSO is, on a userspace datapath with UserspaceTSO, whether
	// ovs-vswitchd runs every port of the bridge with TSO (they were
	// added after it took userspace-tso-enable); NoGSO says why not.
	PortsGSO bool
	NoGSO    string
}

// Kernel reports whether the datapath is the kernel's.
func (d Datapath) Kernel() bool { return d.Type == "" || d.Type == "system" }

// TakesGSO reports whether the bridge takes a port's GSO super-frames:
// the kernel datapath does, the userspace one only with
// userspace-tso-enable in OVSDB and TSO on each of its ports.
func (d Datapath) TakesGSO() bool { return d.Kernel() || d.UserspaceTSO && d.PortsGSO }

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
	d, err := parseDatapath(br, []byte(bridges), []byte(global))
	if err != nil || d.Kernel() || !d.UserspaceTSO {
		return d, err
	}
	why, err := o.portsWithoutGSO(br)
	if err != nil {
		why = err.Error()
	}
	d.PortsGSO, d.NoGSO = why == "", why
	return d, nil
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

// PortsRecheck is how often WatchDatapath reads a userspace bridge
// afresh while OVSDB has userspace-tso-enable but not every port has
// TSO: ovs-vswitchd gives it to them all when it restarts, which
// changes nothing in OVSDB.
const PortsRecheck = 5 * time.Second

// WatchDatapath calls fn with bridge br's datapath now and whenever it
// changes (its datapath_type, userspace-tso-enable, or whether its
// ports take GSO), until ctx ends; trouble is told to warn (which may
// be nil). It follows the Bridge, Open_vSwitch and Interface tables
// with ovsdb-client monitor, as Watch does: ovs-vswitchd sets a new
// interface's ofport once the port is in the datapath
// (dpif_netdev_port_add opens its packet socket before it returns).
// While the ports lack TSO that OVSDB asks for, it also reads them
// every PortsRecheck.
func (o OVS) WatchDatapath(ctx context.Context, br string, fn func(Datapath), warn func(err error)) error {
	var (
		mu          sync.Mutex // serializes reads and fn
		known       Datapath
		have, await bool
	)
	read := func() {
		mu.Lock()
		defer mu.Unlock()
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
		await = !d.Kernel() && d.UserspaceTSO && !d.PortsGSO
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(PortsRecheck)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				mu.Lock()
				again := await
				mu.Unlock()
				if again {
					read()
				}
			}
		}
	}()
	return o.follow(ctx, [][]string{{"Bridge", "name,datapath_type,ports"}, {"Open_vSwitch", "other_config"}, {"Interface", "name,type,ofport"}}, read, warn)
}
