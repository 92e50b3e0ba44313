package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/eipoib/eipoibd/internal/fabric/simfabric"
)

// vmGuest is a guest namespace inside the VM.
type vmGuest struct {
	vm           *vmHost
	ns, ip4, ip6 string
}

// sh runs a command line in the guest's namespace in the VM.
func (g *vmGuest) sh(t *testing.T, cmd string, timeout time.Duration) (string, error) {
	t.Helper()
	return g.vm.run(t, "ip netns exec "+g.ns+" "+cmd, timeout)
}

// TestVerbsRxe: a hypervisor inside a QEMU guest running Debian's kernel
// drives a real UD QP through libibverbs on soft-RoCE (eipoibd --fabric
// verbs --ib-dev rxe0). It talks, on one wire, to a hypervisor on the
// host using the simulated fabric. Between their guests:
//   - ping and ping -6 work both ways, and arping both ways;
//   - TCP works both ways, with the sender's and the receiver's byte
//     counts exactly the amount sent (iperf 2), and iperf3's throughput
//     is logged;
//   - IPv4 and IPv6 multicast with iperf 2 work both ways, every
//     datagram received;
//   - the VM's two guests send from distinct QPNs;
//   - every packet on the wire, from either side, decodes as an IPoIB UD
//     SEND-only (tshark) with a good ICRC (checked with the simulated
//     fabric's decoder).
//
// The host's port also has a partition (VLAN 10 = P_Key 0x800a) that rxe
// cannot join; the default one keeps working. When the VM's eth0 goes
// down, rxe's port goes down and eib0's carrier with it. Both come back
// with eth0, and the guests reach each other again. The single-vCPU TCG
// guest now and then drops a packet under load, so reachability checks
// retry; counts that must match still match exactly.
func TestVerbsRxe(t *testing.T) {
	nstestRequire(t, "arping", "iperf") // run here, in the host's guests and in the VM's
	// The host's port has a partition besides the default one: it keeps
	// talking to rxe, whose P_Key table holds 0xFFFF only.
	tp := newTopoOpts(t, topoOpts{n: 1, viaBridge: true, extra: []string{"--vlan-pkey", "10=0x800a"}})
	h := tp.hvs[0]
	ul := tp.pfx + "ul"
	vm := startVM(t, ul, "ubr")
	if out, err := exec.Command("go", "build", "-tags", "verbs", "-o", vm.file("eipoibd"), "github.com/eipoib/eipoibd/cmd/eipoibd").CombinedOutput(); err != nil {
		t.Fatalf("build eipoibd with -tags verbs: %v\n%s", err, out)
	}
	setup := `set -e
mkdir -p /run/netns
ip link add br0 type bridge
ip link set br0 up
for i in 1 2; do
  ip netns add gv$i
  ip link add eth$i type veth peer name vg$i
  ip link set eth$i netns gv$i
  ip link set vg$i master br0 up
  ip netns exec gv$i ip link set eth$i name eth0
  ip netns exec gv$i ip link set eth0 up
  ip netns exec gv$i ip link set lo up
done
`
	if out, err := vm.run(t, setup, 30*time.Second); err != nil {
		t.Fatalf("VM setup: %v\n%s", err, out)
	}
	vm.start(t, "exec /tmp/work/eipoibd run --fabric verbs --ib-dev rxe0 --bridge br0 --queues 1 --metrics 127.0.0.1:9474 >/tmp/work/eipoibd.log 2>&1")
	waitVMDaemon(t, vm)
	vmUp := time.Now()
	var vgs []*vmGuest
	for i := 1; i <= 2; i++ {
		g := &vmGuest{vm: vm, ns: fmt.Sprintf("gv%d", i), ip4: fmt.Sprintf("10.77.0.2%d", i), ip6: fmt.Sprintf("fd77::2%d", i)}
		if out, err := vm.run(t, fmt.Sprintf("ip netns exec %[1]s ip addr add %[2]s/24 dev eth0 && ip netns exec %[1]s ip addr add %[3]s/64 dev eth0 nodad && ip netns exec %[1]s ip route add 224.0.0.0/4 dev eth0", g.ns, g.ip4, g.ip6), 10*time.Second); err != nil {
			t.Fatalf("VM guest %s: %v\n%s", g.ns, err, out)
		}
		vgs = append(vgs, g)
	}
	// On the VM's TAP: the host's simulated port sends UDP GSO trains,
	// which the bridge carries whole and the TAP's transmit path cuts
	// into the datagrams the VM receives (and the capture sees).
	pcap, stopCapture := captureOn(t, ul, vmTap, "udp port 4791")

	// Reachability both ways, IPv4 and IPv6, from both VM guests.
	for i, vg := range vgs {
		hg := h.guests[i]
		for _, dst := range []string{hg.ip4, hg.ip6} {
			vmPing(t, vg, dst)
		}
		for _, dst := range []string{vg.ip4, vg.ip6} {
			hostPing(t, hg, dst)
		}
	}
	// arping: three requests, three replies, each way.
	retry(t, "arping host → VM", func() error {
		out, err := shErr(in(h.guests[0].ns, "arping", "-c", "3", "-w", "5", "-I", "eth0", vgs[0].ip4)...)
		return expectCount(out, err, `(\d+) packets received`, 3)
	})
	retry(t, "arping VM → host", func() error {
		out, err := vgs[0].sh(t, "arping -c 3 -w 5 -I eth0 "+h.guests[0].ip4, 20*time.Second)
		return expectCount(out, err, `(\d+) packets received`, 3)
	})

	// TCP, 8 MB each way: the sender's and the receiver's byte counts
	// equal the amount asked for; then iperf3's throughput.
	const n = 8 << 20
	tcpBytesVM(t, vgs[0], h.guests[0], n, false)
	tcpBytesVM(t, vgs[1], h.guests[1], n, true)
	iperf3Rate(t, vgs[0], h.guests[0])

	// Multicast, both ways, IPv4 and IPv6.
	// The snooping bridges' first query round: the daemons' start-up
	// queries ask for answers within 1 s (the host's daemon started
	// before the VM's, whose start the tests above are long past).
	time.Sleep(time.Until(vmUp.Add(2 * time.Second)))
	for _, group := range []string{"239.1.1.7", "ff15::77"} {
		retry(t, "multicast VM → host "+group, func() error {
			r := startReceiver(t, h.guests[0], group)
			defer r.stop()
			waitJoinedAny(t, h, group)
			sent := vmSend(t, vgs[0], group)
			return r.received(sent)
		})
		retry(t, "multicast host → VM "+group, func() error {
			log := vm.file("mc.log")
			os.Remove(log)
			v6 := ""
			if strings.Contains(group, ":") {
				v6 = " -V"
			}
			rp := vm.start(t, fmt.Sprintf("exec ip netns exec %s timeout 12 iperf -s -u -B %s -i 1%s >/tmp/work/mc.log 2>&1", vgs[0].ns, group, v6))
			defer rp.stop()
			vmWaitJoined(t, vm, group) // the VM guest's report and the join on the fabric
			sent := send(t, h.guests[0], group)
			r := &receiver{out: log}
			deadline := time.Now().Add(5 * time.Second)
			for r.received(sent) != nil && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			return r.received(sent)
		})
	}
	stopCapture()

	vmGID := vm.linkLocal(t, "eth0")
	hostGID := h.gid(t)
	checkWire(t, pcap, &guest{ip4: vgs[0].ip4}, &guest{ip4: vgs[1].ip4})
	perSide := checkICRC(t, pcap)
	if perSide[vmGID] == 0 || perSide[hostGID] == 0 {
		t.Errorf("packets on the wire by source GID %v; want some from the VM's rxe (%s) and from the host (%s)", perSide, vmGID, hostGID)
	}
	drops := vmMetrics(t, vm)
	for _, name := range []string{"bad_meta", "oversize", "tx_ring_full", "send_error", "recv_error", "no_grh", "bad_grh", "truncated", "unknown_qpn", "rx_buffer_small"} {
		if v := drops[`eipoibd_port_drops_total{reason="`+name+`"}`]; v != 0 {
			t.Errorf("the verbs port counted %v drops as %s", v, name)
		}
	}
	if drops["eipoibd_port_address_handles_made_total"] == 0 {
		t.Errorf("the verbs port made no address handles: %v", drops)
	}
	t.Logf("verbs port: tx %v packets, rx %v packets, %v address handles",
		drops["eipoibd_port_tx_packets_total"], drops["eipoibd_port_rx_packets_total"], drops["eipoibd_port_address_handles"])

	// Link loss: eth0 down takes rxe0's port down (an IB_EVENT_PORT_ERR),
	// and the TAP's carrier goes with it; eth0 up brings both back, and
	// the guests reach each other again.
	vmCarrier := func(want string) {
		t.Helper()
		out, err := vm.run(t, `for i in $(seq 50); do [ "$(cat /sys/class/net/eib0/carrier)" = `+want+` ] && exit 0; sleep 0.1; done; cat /sys/class/net/eib0/carrier; exit 1`, 20*time.Second)
		if err != nil {
			log, _ := os.ReadFile(vm.file("eipoibd.log"))
			t.Fatalf("eib0's carrier in the VM is not %s 5 s on: %v %s\nVM eipoibd log:\n%s", want, err, out, log)
		}
	}
	t0 := time.Now()
	vm.must(t, "ip link set eth0 down")
	vmCarrier("0")
	tDown := time.Since(t0)
	vm.must(t, "ip link set eth0 up")
	vmCarrier("1")
	tUp := time.Since(t0)
	if log, _ := os.ReadFile(vm.file("eipoibd.log")); !strings.Contains(string(log), `msg="verbs port down"`) || !strings.Contains(string(log), `msg="verbs port active"`) {
		t.Errorf("the VM's eipoibd logged no port down and active events:\n%s", log)
	}
	vmPing(t, vgs[0], h.guests[0].ip4)
	hostPing(t, h.guests[0], vgs[0].ip6)
	t.Logf("link loss: carrier off %.1f s after eth0 down, on %.1f s after, both pings answered %.1f s after",
		tDown.Seconds(), tUp.Seconds(), time.Since(t0).Seconds())
}

// waitVMDaemon waits for the VM's eipoibd to serve its metrics.
func waitVMDaemon(t *testing.T, vm *vmHost) {
	t.Helper()
	nstestRequire(t, "curl")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := vm.run(t, "curl -sf 127.0.0.1:9474/metrics >/dev/null && echo up", 10*time.Second)
		if err == nil && strings.Contains(out, "up") {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(vm.file("eipoibd.log"))
			t.Fatalf("eipoibd --fabric verbs in the VM did not come up:\n%s", log)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// retry runs fn up to three times until it succeeds and fails the test
// with its last error.
func retry(t *testing.T, what string, fn func() error) {
	t.Helper()
	var err error
	for range 3 {
		if err = fn(); err == nil {
			return
		}
		t.Logf("%s: %v (retrying)", what, err)
	}
	t.Errorf("%s: %v", what, err)
}

// expectCount checks that a command succeeded and its output's count
// (the first group of re) is want.
func expectCount(out string, err error, re string, want int) error {
	if err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	got, ok := firstInt(out, re)
	if !ok || got != want {
		return fmt.Errorf("count %d, want %d:\n%s", got, want, out)
	}
	return nil
}

// vmPing: three pings from a VM guest, all answered.
func vmPing(t *testing.T, g *vmGuest, dst string) {
	t.Helper()
	nstestRequire(t, "ping")
	retry(t, g.ns+" ping "+dst, func() error {
		out, err := g.sh(t, "ping -c 3 -i 0.3 -W 3 "+dst, 30*time.Second)
		return expectCount(out, err, `(\d+) received`, 3)
	})
}

// hostPing: three pings from a host guest, all answered.
func hostPing(t *testing.T, g *guest, dst string) {
	t.Helper()
	nstestRequire(t, "ping")
	retry(t, g.ns+" ping "+dst, func() error {
		out, err := shErr(in(g.ns, "ping", "-c", "3", "-i", "0.3", "-W", "3", dst)...)
		return expectCount(out, err, `(\d+) received`, 3)
	})
}

// tcpBytesVM moves n bytes over one iperf 2 TCP connection between a VM
// guest and a host guest, from the VM or with reverse to it, and checks
// that the sender wrote and the receiver read exactly n. (iperf 2, as
// tcpTransfer: an iperf3 server stops counting when the client's
// TEST_END overtakes data still in flight, which through the TCG guest
// is megabytes.)
func tcpBytesVM(t *testing.T, vg *vmGuest, hg *guest, n int64, reverse bool) {
	t.Helper()
	nstestRequire(t, "iperf")
	var sent, rcvd int64 = -1, -1
	if !reverse {
		srv := exec.Command("ip", in(hg.ns, "iperf", "-s", "-y", "C", "-P", "1")[1:]...)
		var srvOut strings.Builder
		srv.Stdout = &srvOut
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Wait() }()
		defer func() { srv.Process.Kill(); <-done }()
		var out string
		for range 20 { // until the server listens
			out, _ = vg.sh(t, fmt.Sprintf("iperf -y C -c %s -n %d", hg.ip4, n), 90*time.Second)
			if sent = csvBytes(out); sent >= 0 {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		select {
		case <-done:
			done <- nil
		case <-time.After(15 * time.Second):
			t.Fatalf("iperf server in %s did not finish: %s", hg.ns, srvOut.String())
		}
		rcvd = csvBytes(srvOut.String())
	} else {
		p := vg.vm.start(t, "exec ip netns exec "+vg.ns+" iperf -s -y C -P 1")
		var out string
		for range 20 {
			out, _ = shErr(in(hg.ns, "iperf", "-y", "C", "-c", vg.ip4, "-n", strconv.FormatInt(n, 10))...)
			if sent = csvBytes(out); sent >= 0 {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		srvOut, err := p.wait(30 * time.Second)
		if err != nil {
			t.Fatalf("iperf server in the VM: %v\n%s", err, srvOut)
		}
		rcvd = csvBytes(srvOut)
	}
	if sent != n || rcvd != n {
		t.Errorf("TCP (to the VM: %v): %d bytes sent, %d received, want %d both", reverse, sent, rcvd, n)
	}
}

// iperf3Rate logs the TCP throughput through the TCG guest, each way.
func iperf3Rate(t *testing.T, vg *vmGuest, hg *guest) {
	t.Helper()
	nstestRequire(t, "iperf3")
	srv := exec.Command("ip", in(hg.ns, "iperf3", "-s")[1:]...)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	for _, rev := range []string{"", " -R"} {
		var out string
		var err error
		for range 20 {
			if out, err = vg.sh(t, "iperf3 -J -t 3 -c "+hg.ip4+rev, 60*time.Second); err == nil {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		var r struct {
			End struct {
				Received struct {
					Bits float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err != nil || json.Unmarshal([]byte(out), &r) != nil {
			t.Errorf("iperf3%s from the VM: %v\n%s", rev, err, out)
			continue
		}
		t.Logf("iperf3 TCP VM guest → host guest%s: %.1f Mbit/s", rev, r.End.Received.Bits/1e6)
	}
}

// vmSend runs an iperf 2 multicast sender in a VM guest for 2 s at
// 1 Mbit/s and returns the data datagrams sent (see send).
func vmSend(t *testing.T, g *vmGuest, group string) int {
	t.Helper()
	nstestRequire(t, "iperf")
	args := "iperf -c " + group + " -u -T 2 -t 2 -b 1M"
	if strings.Contains(group, ":") {
		args += " -V"
	}
	out, err := g.sh(t, args, 30*time.Second)
	n, ok := firstInt(out, sentCount.String())
	if err != nil || !ok {
		t.Fatalf("%s: %v: no count of datagrams sent:\n%s", args, err, out)
	}
	return n - 1
}

// received checks that the receiver's last stream holds all sent
// datagrams, none lost.
func (r *receiver) received(sent int) error {
	ss := r.streams()
	if len(ss) == 0 {
		return errors.New("no stream received")
	}
	if s := ss[len(ss)-1]; s.lost != 0 || s.total != sent {
		return fmt.Errorf("%d lost of %d, want all %d sent received", s.lost, s.total, sent)
	}
	return nil
}

// waitJoinedAny waits until hypervisor h is a full member of group's
// MGID (the receiver's report crossed the shim).
func waitJoinedAny(t *testing.T, h *hypervisor, group string) {
	t.Helper()
	waitJoined(t, h, groupMGID(group), true, 20*time.Second)
}

// vmWaitJoined waits up to 5 s for the VM's daemon to be a full member
// of group's MGID: a guest's report crossed its shim and the join on the
// fabric completed (the shim lists an MGID once joined). It polls in the
// VM, where each command costs much under TCG.
func vmWaitJoined(t *testing.T, vm *vmHost, group string) {
	t.Helper()
	want := fmt.Sprintf(`"mgid":%q,"send_only":false`, groupMGID(group).String())
	script := fmt.Sprintf(`for i in $(seq 50); do /tmp/work/eipoibd show groups --json | grep -qF '%s' && exit 0; sleep 0.1; done; /tmp/work/eipoibd show groups --json; exit 1`, want)
	if out, err := vm.run(t, script, 20*time.Second); err != nil {
		t.Fatalf("the VM's eipoibd did not join %s (%s) within 5 s: %v\n%s", group, want, err, out)
	}
}

// vmMetrics reads the VM daemon's Prometheus metrics.
func vmMetrics(t *testing.T, vm *vmHost) map[string]float64 {
	t.Helper()
	nstestRequire(t, "curl")
	out, err := vm.run(t, "curl -sf 127.0.0.1:9474/metrics", 10*time.Second)
	if err != nil {
		t.Fatalf("VM metrics: %v\n%s", err, out)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && !strings.HasPrefix(l, "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m
}

// checkICRC decodes every RoCE v2 packet of the capture with the
// simulated fabric's codec, which verifies the ICRC (IBA Annex A17), and
// returns how many each source GID sent.
func checkICRC(t *testing.T, pcap string) map[netip.Addr]int {
	t.Helper()
	f, err := os.Open(pcap)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var c simfabric.Codec
	var p simfabric.Packet
	perSrc := map[netip.Addr]int{}
	for i := 1; ; i++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pkt := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		ip, ok1 := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		udp, ok2 := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if !ok1 || !ok2 {
			t.Errorf("packet %d is not IPv6/UDP", i)
			continue
		}
		src, dst := [16]byte(ip.SrcIP.To16()), [16]byte(ip.DstIP.To16())
		if err := c.Decode(udp.Payload, &src, &dst, uint16(udp.SrcPort), uint16(udp.DstPort), &p); err != nil {
			t.Errorf("packet %d from %s: %v", i, ip.SrcIP, err)
			continue
		}
		perSrc[netip.AddrFrom16(src)]++
	}
	return perSrc
}

// firstInt returns the integer in the first group of re's first match in
// out.
func firstInt(out, re string) (int, bool) {
	m := regexp.MustCompile(re).FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}
