package netns

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDHCP: an Ethernet guest gets its address from a DHCP server
// (dnsmasq) in a guest on another hypervisor, across the fabric. It does
// so with the default handling (BROADCAST flag) and with the RFC 4390
// translation, which the wire shows as hardware type 32 with a
// zero-length address. With the Mellanox client-identifier
// (rfc4390-mlnx), dnsmasq gives the guest the fixed address of a host
// entry keyed by that client-identifier, outside the dynamic range.
// OpenStack's networking-mlnx writes such entries.
func TestDHCP(t *testing.T) {
	for _, mode := range []string{"broadcast", "rfc4390", "rfc4390-mlnx"} {
		t.Run(mode, func(t *testing.T) {
			nstestRequire(t, "dnsmasq", "dhclient")
			flags := map[string][]string{"broadcast": {"--dhcp", "broadcast"}, "rfc4390": {"--dhcp", "rfc4390"},
				"rfc4390-mlnx": {"--dhcp", "rfc4390", "--dhcp-client-id", "mlnx"}}[mode]
			tp := newTopo(t, 2, false, flags...)
			h1, h2 := tp.hvs[0], tp.hvs[1]
			drops := watchDrops(t, h1, h2)
			defer drops.check(t)
			dhcpLease(t, mode, h1, h2.guests[0], h1.guests[1], "eth0")
		})
	}
}

// dhcpLease runs dnsmasq on dev in server's namespace and dhclient in
// client, a guest of hypervisor h whose eipoibd runs in --dhcp mode. It
// checks the lease both ends recorded and the DHCP packets on h's side
// of the fabric. Those are the guest's own (Ethernet, 6-byte address,
// BROADCAST flag) or, in rfc4390 mode, hardware type 32 with a
// zero-length address (and the BROADCAST flag). dnsmasq offers without
// pinging the address first (--no-ping): its check, an echo request to
// an address nobody holds, only delayed each offer by some 2 s.
func dhcpLease(t *testing.T, mode string, h *hypervisor, server, client *guest, dev string) {
	t.Helper()
	nstestRequire(t, "dnsmasq", "dhclient")
	dir := t.TempDir()
	args := []string{"dnsmasq", "--no-daemon", "--port=0", "--no-ping", "--interface=" + dev, "--bind-interfaces",
		"--dhcp-range=10.77.0.100,10.77.0.150,1h", "--dhcp-leasefile=" + filepath.Join(dir, "dnsmasq.leases")}
	if mode == "rfc4390-mlnx" {
		args = append(args, "--dhcp-host=id:"+mlnxClientID(client.mac(t))+","+mlnxFixedIP)
	}
	srv := exec.Command("ip", in(server.ns, args...)[1:]...)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	pcap, stopCapture := capture(t, h)
	sh(t, in(client.ns, "ip", "-4", "addr", "flush", "dev", "eth0")...)
	lease := filepath.Join(dir, "dhclient.leases")
	out := sh(t, in(client.ns, "timeout", "20", "dhclient", "-1", "-v", "-lf", lease, "-pf", filepath.Join(dir, "dhclient.pid"), "-sf", "/bin/true", "eth0")...)
	shErr("pkill", "-F", filepath.Join(dir, "dhclient.pid"))
	stopCapture()
	b, _ := os.ReadFile(lease)
	d, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.leases"))
	checkLease(t, mode, out, string(b), string(d), server.ip4, client.mac(t))
	hw := tshark(t, "-r", pcap, "-Y", "dhcp", "-T", "fields", "-E", "occurrence=f", "-e", "dhcp.hw.type", "-e", "dhcp.hw.len", "-e", "dhcp.flags.bc")
	want := "0x01\t6\t1" // Ethernet, BROADCAST flag
	if mode != "broadcast" {
		want = "0x20\t0\t1" // InfiniBand, no address (RFC 4390 §2.1)
	}
	if strings.TrimSpace(hw) == "" {
		t.Fatal("no DHCP captured on the fabric")
	}
	for _, l := range strings.Split(strings.TrimSpace(hw), "\n") {
		if l != want {
			t.Errorf("DHCP on the wire: hardware type, address length and broadcast flag %q, want %q", l, want)
		}
	}
}

// mlnxFixedIP is the address of the host entry keyed by the Mellanox
// client-identifier: outside dnsmasq's dynamic range, so only that entry
// can give it.
const mlnxFixedIP = "10.77.0.200"

// mlnxClientID is the client-identifier networking-mlnx keys a port with
// MAC m by: ff:00:00:00:00:00:02:00:00:02:c9:00, then m[0:3], 00:00,
// m[3:6] (written here from that driver's format, apart from arpndp's).
func mlnxClientID(m net.HardwareAddr) string {
	return "ff:00:00:00:00:00:02:00:00:02:c9:00:" + m[:3].String() + ":00:00:" + m[3:].String()
}

var (
	dhcpACK      = regexp.MustCompile(`(?m)^DHCPACK of (\S+) from (\S+)$`)
	fixedAddress = regexp.MustCompile(`(?m)^\s*fixed-address (\S+);$`)
)

// checkLease asserts that dhclient (its output and lease file) and
// dnsmasq (its lease file) agree on one address of the range
// 10.77.0.100–150 from server. It asserts that dnsmasq recorded the
// client by its MAC: as the hardware address (Ethernet, BROADCAST flag),
// or, after the RFC 4390 translation (hardware type 32, no address), as
// the client-identifier the shim added, type 1 + the MAC.
func checkLease(t *testing.T, mode, out, clientLease, serverLeases, server string, mac net.HardwareAddr) {
	t.Helper()
	ack := dhcpACK.FindStringSubmatch(out)
	fixed := fixedAddress.FindAllStringSubmatch(clientLease, -1)
	if ack == nil || len(fixed) != 1 {
		t.Fatalf("no DHCPACK or not one lease:\n%s\n%s", out, clientLease)
	}
	addr, err := netip.ParseAddr(ack[1])
	if err != nil || ack[2] != server {
		t.Fatalf("DHCPACK of %q from %s, want an address from %s", ack[1], ack[2], server)
	}
	if mode == "rfc4390-mlnx" {
		if addr.String() != mlnxFixedIP {
			t.Errorf("leased %s, want %s, the host entry keyed by the Mellanox client-identifier", addr, mlnxFixedIP)
		}
	} else if lo, hi := netip.MustParseAddr("10.77.0.100"), netip.MustParseAddr("10.77.0.150"); addr.Less(lo) || hi.Less(addr) {
		t.Errorf("leased %s, outside dnsmasq's range %s–%s", addr, lo, hi)
	}
	if fixed[0][1] != addr.String() {
		t.Errorf("dhclient acknowledged %s but its lease file holds %s", addr, fixed[0][1])
	}
	// dnsmasq: expiry, hardware address, IP address, hostname, client-id.
	lines := strings.Split(strings.TrimSpace(serverLeases), "\n")
	if len(lines) != 1 || len(strings.Fields(lines[0])) != 5 {
		t.Fatalf("dnsmasq's lease file, want one lease:\n%s", serverLeases)
	}
	f := strings.Fields(lines[0])
	hw, cid := mac.String(), "*"
	switch mode {
	case "rfc4390":
		hw, cid = "20-", "01:"+mac.String()
	case "rfc4390-mlnx":
		hw, cid = "20-", mlnxClientID(mac)
	}
	if f[1] != hw || f[2] != addr.String() || f[4] != cid {
		t.Errorf("dnsmasq leased %s to hardware address %s, client-id %s; want %s to %s, client-id %s",
			f[2], f[1], f[4], addr, hw, cid)
	}
}
