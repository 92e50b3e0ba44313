package netns

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// guestTCPBytes is what each guest-to-guest TCP test sends each way.
const guestTCPBytes = 32 << 20

// ovsLog returns the ovs-vswitchd log of hypervisor h's Open vSwitch
// (startOVS's directory, where its OVSDB socket is).
func (h *hypervisor) ovsLog(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(strings.TrimPrefix(h.ovsDB(), "unix:"))
	b, err := os.ReadFile(filepath.Join(dir, "ovs-vswitchd.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// linkMTU returns the MTU of interface dev in namespace ns.
func linkMTU(t *testing.T, ns, dev string) int {
	t.Helper()
	out := strings.TrimSpace(sh(t, in(ns, "cat", "/sys/class/net/"+dev+"/mtu")...))
	mtu, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("MTU of %s in %s: %q", dev, ns, out)
	}
	return mtu
}

// setGuestMTU sets the MTU of every guest's eth0 and of its port on
// the hypervisor's switch.
func setGuestMTU(t *testing.T, tp *topo, mtu int) {
	t.Helper()
	for _, h := range tp.hvs {
		for i, g := range h.guests {
			sh(t, in(h.ns, "ip", "link", "set", "vg"+strconv.Itoa(i+1), "mtu", strconv.Itoa(mtu))...)
			sh(t, in(g.ns, "ip", "link", "set", "eth0", "mtu", strconv.Itoa(mtu))...)
		}
	}
}

// TestOVSGuestTCP: guests on access ports of VLAN 20 (P_Key 0x8014) of
// Open vSwitch bridges with the userspace datapath, whose ports have
// the IPoIB MTU (4092) while the TAP has 9000, send 32 MiB of TCP each
// way, and both ends count exactly 32 MiB (iperf 2, within its 60 s),
// with the TAP's offloads on and off. The userspace datapath without
// userspace-tso-enable takes no GSO super-frames from the TAP (it
// truncates those longer than the TAP's MTU, "Dropped packet: Too
// big", and passes the rest whole to the guest's port, which refuses
// them, "Message too long"): so no frame longer than the TAP's MTU and
// no super-frame may have been written to the TAP, and ovs-vswitchd
// must have logged neither. With userspace-tso-enable, as the operator
// may turn it on, the TAP writes super-frames again (tap_gro 1, and
// some were written) and the bytes still cross exactly. No drop counter
// rises. The log says what the daemon found, and it follows
// userspace-tso-enable as it changes in OVSDB.
func TestOVSGuestTCP(t *testing.T) {
	for _, c := range []struct {
		offload, tso bool
	}{{true, false}, {false, false}, {true, true}} {
		t.Run("offload="+strconv.FormatBool(c.offload)+",userspace-tso="+strconv.FormatBool(c.tso), func(t *testing.T) {
			tp := newTopoOpts(t, topoOpts{
				n: 2, ovs: []bool{true, true}, tags: [][]int{{20}, {20}}, ovsTSO: c.tso,
				extra: []string{"--vlan-pkey", "20=0x8014", "--offload=" + strconv.FormatBool(c.offload)},
			})
			h1, h2 := tp.hvs[0], tp.hvs[1]
			g1, g2 := h1.guests[0], h2.guests[0]
			setGuestMTU(t, tp, 4092)
			ping(t, g1, g2.ip4)
			drops := watchDrops(t, h1, h2)
			tcpBytes(t, g2, g1, guestTCPBytes)
			tcpBytes(t, g1, g2, guestTCPBytes)
			drops.check(t)
			superFrames := c.offload && c.tso
			for _, h := range tp.hvs {
				m := h.metrics(t)
				over, ok := m["tap_frames_over_mtu_written"]
				if !ok {
					t.Fatalf("%s: no tap_frames_over_mtu_written counter", h.name)
				}
				if !superFrames && (over != 0 || m["tap_gro_frames_written"] != 0 || m["tap_gro"] != 0) {
					t.Errorf("%s: userspace datapath without TSO, but %v frames over the TAP's MTU and %v super-frames were written to it (tap_gro %v); want none",
						h.name, over, m["tap_gro_frames_written"], m["tap_gro"])
				}
				if superFrames && (m["tap_gro"] != 1 || m["tap_gro_frames_written"] < 1) {
					t.Errorf("%s: userspace TSO on, but tap_gro %v and %v super-frames written; want 1 and some", h.name, m["tap_gro"], m["tap_gro_frames_written"])
				}
				log := h.ovsLog(t)
				for _, bad := range []string{"Message too long", "Dropped packet: Too big"} {
					if strings.Contains(log, bad) {
						t.Errorf("%s: ovs-vswitchd logged %q:\n%s", h.name, bad, abridge(log, 0, 20))
					}
				}
				if want := fmt.Sprintf("datapath_type=netdev userspace_tso=%v write_super_frames=%v", c.tso, superFrames); c.offload && !strings.Contains(h.log(), want) {
					t.Errorf("%s: the log does not say %q", h.name, want)
				}
			}
			if c.offload && !c.tso {
				// The daemon follows OVSDB: userspace-tso-enable set
				// and cleared on a running bridge turns merging on and
				// off again (no traffic: OVS itself takes the setting
				// only when restarted).
				db := "--db=" + h1.ovsDB()
				for _, on := range []bool{true, false} {
					sh(t, "ovs-vsctl", "--timeout=10", db, "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable="+strconv.FormatBool(on))
					want := map[bool]float64{true: 1, false: 0}[on]
					for deadline := time.Now().Add(10 * time.Second); h1.metrics(t)["tap_gro"] != want; time.Sleep(50 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("userspace-tso-enable=%v in OVSDB, but tap_gro stayed %v", on, h1.metrics(t)["tap_gro"])
						}
					}
				}
			}
		})
	}
}

// TestBridgeGuestTCPPortMTU: guests behind Linux bridges whose ports
// (and the guests) keep MTU 1500 while the TAP has 9000 send 32 MiB of
// TCP each way and both ends count exactly 32 MiB, with the TAP's
// offloads on and off. The kernel's bridge takes the TAP's super-frames
// and segments them for the smaller port: with offloads on the TAP
// keeps writing them (tap_gro 1, and some were written). No drop
// counter rises.
func TestBridgeGuestTCPPortMTU(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run("offload="+strconv.FormatBool(on), func(t *testing.T) {
			tp := newTopo(t, 2, false, "--offload="+strconv.FormatBool(on))
			h1, h2 := tp.hvs[0], tp.hvs[1]
			g1, g2 := h1.guests[0], h2.guests[0]
			for _, h := range tp.hvs {
				if port, tap := linkMTU(t, h.ns, "vg1"), linkMTU(t, h.ns, "eib0"); port != 1500 || tap != 9000 {
					t.Fatalf("%s: bridge port MTU %d, TAP MTU %d; want 1500 and 9000", h.name, port, tap)
				}
			}
			ping(t, g1, g2.ip4)
			drops := watchDrops(t, h1, h2)
			tcpBytes(t, g2, g1, guestTCPBytes)
			tcpBytes(t, g1, g2, guestTCPBytes)
			drops.check(t)
			for _, h := range tp.hvs {
				m := h.metrics(t)
				if on && (m["tap_gro"] != 1 || m["tap_gro_frames_written"] < 1) {
					t.Errorf("%s: Linux bridge with offloads, but tap_gro %v and %v super-frames written; want 1 and some", h.name, m["tap_gro"], m["tap_gro_frames_written"])
				}
				if !on && m["tap_gro_frames_written"]+m["tap_frames_over_mtu_written"] != 0 {
					t.Errorf("%s: offloads off, but %v super-frames and %v frames over the MTU written", h.name, m["tap_gro_frames_written"], m["tap_frames_over_mtu_written"])
				}
			}
		})
	}
}

// ovsKernelTopo, run in the QEMU guest: a fabric bridge joining the
// underlays of hypervisor hv and native host n0; in hv, Open vSwitch
// (its daemons' files in /tmp/ovs) with the kernel datapath, bridge
// obr, and guest g1 on an access port of VLAN 20.
const ovsKernelTopo = `set -e
for n in hv n0 g1; do
  ip netns add $n
  ip -n $n link set lo up
  ip netns exec $n sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
ip link add fab mtu 9000 type bridge
ip link set fab up
for n in hv n0; do
  ip link add u$n mtu 9000 type veth peer name ul mtu 9000 netns $n
  ip link set u$n master fab up
  ip -n $n link set ul up
done
mkdir -p /tmp/ovs
ovsdb-tool create /tmp/ovs/conf.db /usr/share/openvswitch/vswitch.ovsschema
ip netns exec hv ovsdb-server /tmp/ovs/conf.db --remote=punix:/tmp/ovs/db.sock --pidfile=/tmp/ovs/ovsdb-server.pid --unixctl=/tmp/ovs/ovsdb-server.ctl --log-file=/tmp/ovs/ovsdb-server.log --detach
ovs-vsctl --timeout=10 --db=unix:/tmp/ovs/db.sock --no-wait init
ip netns exec hv env OVS_RUNDIR=/tmp/ovs ovs-vswitchd unix:/tmp/ovs/db.sock --pidfile=/tmp/ovs/ovs-vswitchd.pid --unixctl=/tmp/ovs/ovs-vswitchd.ctl --log-file=/tmp/ovs/ovs-vswitchd.log --detach
ovs-vsctl --timeout=30 --db=unix:/tmp/ovs/db.sock add-br obr
ip -n hv link set obr up
ip -n g1 link add eth0 type veth peer name vg1 netns hv
ovs-vsctl --timeout=30 --db=unix:/tmp/ovs/db.sock add-port obr vg1 tag=20
ip -n hv link set vg1 up
ip -n g1 link set eth0 up
ip -n g1 addr add 10.78.20.1/24 dev eth0
`

// TestOVSKernelDatapathVM: in the QEMU guest, whose Debian kernel has
// the openvswitch module this host lacks, a guest on an access port of
// VLAN 20 of an Open vSwitch bridge with the kernel datapath gets 8 MiB
// of TCP from a native IPoIB host in partition 0x8014 and sends it 8
// MiB, each counted exactly at both ends (iperf 2). eipoibd found the
// kernel datapath and kept writing super-frames into the TAP (the log
// says so, tap_gro is 1 and some were written), which the kernel
// datapath segmented for the guest's port; ovs-vswitchd refused
// nothing. Slow (a TCG boot): in ONCE_TESTS.
func TestOVSKernelDatapathVM(t *testing.T) {
	require(t, append([]string{"iperf", "ping"}, ovsTools...)...)
	_, ns := vmNamespace(t)
	v := startVM(t, ns, "ubr")
	v.copyDaemon(t)
	v.must(t, "modprobe -d /run/kernel openvswitch")
	v.must(t, ovsKernelTopo)
	const ctlDir = "/run/eipoibd-hv"
	hv := v.start(t, "exec ip netns exec hv ./eipoibd run --underlay ul --ovs-bridge obr --ovs-db unix:/tmp/ovs/db.sock --vlan-pkey 20=0x8014 --ctl-dir "+ctlDir+" --state-dir "+ctlDir)
	n0 := v.start(t, "exec ip netns exec n0 ./eipoibd host --underlay ul --pkey 0x8014")
	for _, p := range []struct {
		proc *vmProc
		what string
	}{{hv, "shim running"}, {n0, "host running"}} {
		for deadline := time.Now().Add(60 * time.Second); !strings.Contains(p.proc.output(), p.what); time.Sleep(50 * time.Millisecond) {
			if done, rc := p.proc.exited(); done || time.Now().After(deadline) {
				t.Fatalf("%q not seen (exited %v, %d):\n%s", p.what, done, rc, p.proc.output())
			}
		}
	}
	v.must(t, "ip -n n0 addr add 10.78.20.100/24 dev ib0")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := v.run(t, "ovs-vsctl --db=unix:/tmp/ovs/db.sock show; ip netns exec hv ovs-dpctl show; ip -n hv -d link; tail -30 /tmp/ovs/ovs-vswitchd.log", 20*time.Second)
			t.Logf("Open vSwitch in the VM:\n%s\neipoibd run:\n%s", out, hv.output())
		}
	})
	// The first ARP may be lost in the TCG guest, which now and then
	// drops a packet: a round of 3 answered, in at most 3 rounds.
	for i := 1; ; i++ {
		out, err := v.run(t, "ip netns exec g1 ping -c 3 -i 0.3 -w 20 10.78.20.100", 30*time.Second)
		if err == nil && strings.Contains(out, "3 packets transmitted, 3 received") {
			break
		}
		if i == 3 {
			t.Fatalf("g1 pings the native host: want 3 of 3 answered in one of 3 rounds (%v):\n%s", err, out)
		}
		t.Logf("ping round %d: %v\n%s", i, err, out)
	}
	// transfer sends vmBytes from client (namespace) to server
	// (namespace, at address dst) and checks both ends counted them.
	const vmBytes = 8 << 20
	transfer := func(server, dst, client string) {
		t.Helper()
		srv := v.start(t, "exec ip netns exec "+server+" iperf -s -y C -P 1")
		var out string
		var err error
		for range 50 { // until the server listens
			if out, err = v.run(t, "ip netns exec "+client+" iperf -y C -c "+dst+" -n "+strconv.Itoa(vmBytes), 90*time.Second); !strings.Contains(out, "connect failed") {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		rcvd, werr := srv.wait(30 * time.Second)
		if s, r := csvBytes(out), csvBytes(rcvd); err != nil || werr != nil || s != vmBytes || r != vmBytes {
			t.Errorf("TCP %s → %s: %d bytes sent, %d received, want %d both (%v, %v)\nclient: %s\nserver: %s", client, server, s, r, vmBytes, err, werr, out, rcvd)
		}
	}
	transfer("g1", "10.78.20.1", "n0")
	transfer("n0", "10.78.20.100", "g1")

	if want := `msg="Open vSwitch datapath" bridge=obr datapath_type="" userspace_tso=false write_super_frames=true`; !strings.Contains(hv.output(), want) {
		t.Errorf("eipoibd's log does not say %s:\n%s", want, hv.output())
	}
	var stats map[string]uint64
	if err := json.Unmarshal([]byte(v.must(t, "./eipoibd show stats --json --ctl-dir "+ctlDir)), &stats); err != nil {
		t.Fatal(err)
	}
	if stats["tap_gro"] != 1 || stats["tap_gro_frames_written"] < 1 {
		t.Errorf("kernel datapath: tap_gro %d, %d super-frames written; want 1 and some", stats["tap_gro"], stats["tap_gro_frames_written"])
	}
	if log := v.must(t, "cat /tmp/ovs/ovs-vswitchd.log"); strings.Contains(log, "Message too long") || strings.Contains(log, "Too big") || !strings.Contains(log, "ovs-system") {
		t.Errorf("ovs-vswitchd's log: a refused packet, or no kernel datapath (ovs-system):\n%s", abridge(log, 0, 30))
	}
}
