package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/vswitch"
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
// must have logged neither. With userspace-tso-enable set before
// ovs-vswitchd added any port, as the operator may turn it on, the TAP
// writes super-frames again (tap_gro 1, and some were written) and the
// bytes still cross exactly.
//
// Set late, on a running switch with its guests' ports, before eipoibd
// starts: ovs-vswitchd takes it at once (it logs it), but only ports it
// adds from then on get TSO, the TAP's among them; the others keep
// sockets without a vnet header. So eipoibd, though OVSDB has the key
// when it starts, writes no super-frame (tap_gro 0) and says which port
// lacks it. (OVS 3.1 then reads and writes those older ports as if they
// had the header, so nothing crosses them until ovs-vswitchd restarts,
// whatever eipoibd does: no traffic is tried then.) Once ovs-vswitchd
// restarts, every port has TSO, eipoibd finds it within its recheck
// and writes super-frames, and the bytes cross exactly as above.
//
// No drop counter rises. The log says what the daemon found, and it
// follows userspace-tso-enable as it changes in OVSDB.
func TestOVSGuestTCP(t *testing.T) {
	for _, c := range []struct {
		offload bool
		tso     string // userspace-tso-enable: "false", "true" (before any port) or "late"
	}{{true, "false"}, {false, "false"}, {true, "true"}, {true, "late"}} {
		t.Run("offload="+strconv.FormatBool(c.offload)+",userspace-tso="+c.tso, func(t *testing.T) {
			tp := newTopoOpts(t, topoOpts{
				n: 2, ovs: []bool{true, true}, tags: [][]int{{20}, {20}}, ovsTSO: c.tso == "true", ovsTSOLate: c.tso == "late",
				extra: []string{"--vlan-pkey", "20=0x8014", "--offload=" + strconv.FormatBool(c.offload)},
			})
			h1, h2 := tp.hvs[0], tp.hvs[1]
			g1, g2 := h1.guests[0], h2.guests[0]
			if c.tso == "late" {
				lateTSO(t, tp)
			}
			setGuestMTU(t, tp, 4092)
			ping(t, g1, g2.ip4)
			drops := watchDrops(t, h1, h2)
			tcpBytes(t, g2, g1, guestTCPBytes)
			tcpBytes(t, g1, g2, guestTCPBytes)
			drops.check(t)
			superFrames := c.offload && c.tso != "false"
			for _, h := range tp.hvs {
				m := h.metrics(t)
				over, ok := m["tap_frames_over_mtu_written"]
				if !ok {
					t.Fatalf("%s: no tap_frames_over_mtu_written counter", h.name)
				}
				if !superFrames && (over != 0 || m["tap_gro_frames_written"] != 0 || m["tap_gro"] != 0) {
					t.Errorf("%s: userspace datapath whose ports have no TSO, but %v frames over the TAP's MTU and %v super-frames were written to it (tap_gro %v); want none",
						h.name, over, m["tap_gro_frames_written"], m["tap_gro"])
				}
				if superFrames && (m["tap_gro"] != 1 || m["tap_gro_frames_written"] < 1) {
					t.Errorf("%s: userspace TSO on, but tap_gro %v and %v super-frames written; want 1 and some", h.name, m["tap_gro"], m["tap_gro_frames_written"])
				}
				log := h.ovsLog(t)
				for _, bad := range []string{"Message too long", "Dropped packet: Too big", "No TSO support"} {
					if strings.Contains(log, bad) {
						t.Errorf("%s: ovs-vswitchd logged %q:\n%s", h.name, bad, abridge(log, 0, 20))
					}
				}
				want := fmt.Sprintf("datapath_type=netdev userspace_tso=%v write_super_frames=%v", c.tso != "false", superFrames)
				if c.offload && !strings.Contains(h.log(), want) {
					t.Errorf("%s: the log does not say %q:\n%s", h.name, want, h.log())
				}
			}
			if c.offload && c.tso == "false" {
				// The daemon follows OVSDB, but userspace-tso-enable set
				// on a running bridge gives its ports no vnet header
				// (ovs-vswitchd gives it to ports it adds afterwards), so
				// merging stays off, and the log says what it saw.
				db := "--db=" + h1.ovsDB()
				for i, on := range []bool{true, false} {
					sh(t, "ovs-vsctl", "--timeout=10", db, "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable="+strconv.FormatBool(on))
					seen := fmt.Sprintf("datapath_type=netdev userspace_tso=%v write_super_frames=false", on)
					for deadline := time.Now().Add(20 * time.Second); strings.Count(h1.log(), seen) < i+1; time.Sleep(50 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("userspace-tso-enable=%v in OVSDB, but the log never said %q:\n%s", on, seen, h1.log())
						}
					}
					if g := h1.metrics(t)["tap_gro"]; g != 0 {
						t.Errorf("userspace-tso-enable=%v set on a running bridge: tap_gro %v, want 0", on, g)
					}
				}
			}
			if c.offload && c.tso == "true" {
				// OVS started with userspace-tso-enable keeps it whatever
				// OVSDB says later, so merging may go off and come back.
				db := "--db=" + h1.ovsDB()
				for _, on := range []bool{false, true} {
					sh(t, "ovs-vsctl", "--timeout=10", db, "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable="+strconv.FormatBool(on))
					want := map[bool]float64{true: 1, false: 0}[on]
					for deadline := time.Now().Add(20 * time.Second); h1.metrics(t)["tap_gro"] != want; time.Sleep(50 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("userspace-tso-enable=%v in OVSDB, but tap_gro stayed %v", on, h1.metrics(t)["tap_gro"])
						}
					}
				}
			}
		})
	}
}

// lateTSO checks each hypervisor of tp, whose Open vSwitch took
// userspace-tso-enable only once it ran its ports (ovsTSOLate): eipoibd
// writes no super-frame and says why; then it restarts ovs-vswitchd and
// waits until eipoibd writes them.
func lateTSO(t *testing.T, tp *topo) {
	t.Helper()
	const noTSO = `datapath_type=netdev userspace_tso=true write_super_frames=false why_not="ovs-vswitchd reads port vg1 without a vnet header"`
	for _, h := range tp.hvs {
		if !strings.Contains(h.log(), noTSO) {
			t.Fatalf("%s: userspace-tso-enable set on the running switch, but the log does not say %q:\n%s", h.name, noTSO, h.log())
		}
		if g := h.metrics(t)["tap_gro"]; g != 0 {
			t.Fatalf("%s: userspace-tso-enable set on the running switch: tap_gro %v, want 0", h.name, g)
		}
	}
	for _, h := range tp.hvs {
		restartVswitchd(t, h.ns, filepath.Dir(strings.TrimPrefix(h.ovsDB(), "unix:")))
	}
	for _, h := range tp.hvs {
		for deadline := time.Now().Add(vswitch.PortsRecheck + time.Minute); h.metrics(t)["tap_gro"] != 1; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: ovs-vswitchd restarted with userspace-tso-enable, but tap_gro stayed %v:\n%s", h.name, h.metrics(t)["tap_gro"], h.log())
			}
		}
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
