package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDHCP: an Ethernet guest gets its address from a DHCP server (dnsmasq)
// in a guest on another hypervisor, across the fabric, with the default
// handling (BROADCAST flag) and with the RFC 4390 translation, which the
// wire shows as hardware type 32 with a zero-length address.
func TestDHCP(t *testing.T) {
	for _, mode := range []string{"broadcast", "rfc4390"} {
		t.Run(mode, func(t *testing.T) {
			nstestRequire(t, "dnsmasq", "dhclient")
			tp := newTopo(t, 2, false, "--dhcp", mode)
			h1, h2 := tp.hvs[0], tp.hvs[1]
			server, client := h2.guests[0], h1.guests[1]
			dir := t.TempDir()
			srv := exec.Command("ip", in(server.ns, "dnsmasq", "--no-daemon", "--port=0", "--interface=eth0", "--bind-interfaces",
				"--dhcp-range=10.77.0.100,10.77.0.150,1h", "--dhcp-leasefile="+filepath.Join(dir, "dnsmasq.leases"))[1:]...)
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
			pcap, stopCapture := capture(t, h1)
			sh(t, in(client.ns, "ip", "-4", "addr", "flush", "dev", "eth0")...)
			lease := filepath.Join(dir, "dhclient.leases")
			out := sh(t, in(client.ns, "timeout", "20", "dhclient", "-1", "-v", "-lf", lease, "-pf", filepath.Join(dir, "dhclient.pid"), "-sf", "/bin/true", "eth0")...)
			shErr("pkill", "-F", filepath.Join(dir, "dhclient.pid"))
			stopCapture()
			b, _ := os.ReadFile(lease)
			if !strings.Contains(out, "DHCPACK of 10.77.0.1") || !strings.Contains(string(b), "fixed-address 10.77.0.1") {
				t.Fatalf("no lease from 10.77.0.100-150:\n%s\n%s", out, b)
			}
			hw := stdout(t, "tshark", "-r", pcap, "-Y", "dhcp", "-T", "fields", "-E", "occurrence=f", "-e", "dhcp.hw.type", "-e", "dhcp.flags.bc")
			want := "0x01\t1" // Ethernet, BROADCAST flag
			if mode == "rfc4390" {
				want = "0x20\t1" // InfiniBand (RFC 4390 §2.1)
			}
			if strings.TrimSpace(hw) == "" {
				t.Fatal("no DHCP captured on the fabric")
			}
			for _, l := range strings.Split(strings.TrimSpace(hw), "\n") {
				if l != want {
					t.Errorf("DHCP on the wire: hardware type and broadcast flag %q, want %q", l, want)
				}
			}
		})
	}
}
