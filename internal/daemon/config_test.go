package daemon

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/faultport"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fastpath"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestValidate: a valid Config passes, and each bad setting is refused
// with one line naming it as its flag, including those the command line
// cannot produce (a Config built in Go).
func TestValidate(t *testing.T) {
	good := testConfig("ul1")
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Underlay = "" }, "--underlay is required"},
		{func(c *Config) { c.Fabric = "ud" }, `--fabric "ud": want sim, kernel or verbs`},
		{onKernel, ""},
		{func(c *Config) { onVerbs(c); c.Faults = faultport.Faults{Loss: 0.1} }, "--fault is for --fabric sim, not --fabric verbs"},
		{func(c *Config) { onVerbs(c); c.Underlay = "ul1" }, `--underlay "ul1" is for --fabric sim, not --fabric verbs`},
		{func(c *Config) { onVerbs(c); c.IBDev = "mlx5_0:2" }, ""},
		{func(c *Config) { onVerbs(c); c.IBDev = "mlx5_0:0" }, `--ib-dev "mlx5_0:0": port "0": want a number from 1 to 255`},
		// A backend's setting given to another backend is refused, unless
		// it is the default (which the reference config file writes out).
		{func(c *Config) { c.VerbsRecvDepth = 2048 }, "--verbs-recv-depth 2048 is for --fabric verbs, not --fabric sim"},
		{func(c *Config) { onKernel(c); c.VerbsRecvDepth = 64 }, "--verbs-recv-depth 64 is for --fabric verbs, not --fabric kernel"},
		{func(c *Config) { c.VerbsRecvDepth = DefaultVerbsRecvDepth }, ""},
		{func(c *Config) { c.IBDev = "ib0" }, `--ib-dev "ib0" is for --fabric kernel or verbs, not --fabric sim`},
		{func(c *Config) { onKernel(c); c.IBMTU = 2048 }, "--ib-mtu 2048 is for --fabric sim, not --fabric kernel"},
		{func(c *Config) { onVerbs(c); c.IBMTU = 2048 }, "--ib-mtu 2048 is for --fabric sim, not --fabric verbs"},
		{func(c *Config) { onKernel(c); c.RxWorkers = 1 }, ""},
		{func(c *Config) { onKernel(c); c.FastPath = fastpath.On }, ""},
		{func(c *Config) { c.FastPath = fastpath.Auto }, "--fast-path auto is for --fabric kernel, not --fabric sim"},
		{func(c *Config) { onVerbs(c); c.FastPath = fastpath.On }, "--fast-path on is for --fabric kernel, not --fabric verbs"},
		{func(c *Config) { onKernel(c); c.FastPath = 3 }, "--fast-path Mode(3): want off, auto or on"},
		{func(c *Config) { c.IBMTU = 1500 }, "--ib-mtu 1500: want 2048 or 4096"},
		{func(c *Config) { onVerbs(c); c.VerbsRecvDepth = 63 }, "--verbs-recv-depth 63: want 64 to 16384 (0: 1024)"},
		{func(c *Config) { onVerbs(c); c.VerbsRecvDepth = 16385 }, "--verbs-recv-depth 16385: want 64 to 16384 (0: 1024)"},
		{func(c *Config) { onVerbs(c); c.VerbsRecvDepth = 16384 }, ""},
		{func(c *Config) { c.Queues = MaxQueues + 1 }, "--queues 257: want 0 (one per CPU) to 256"},
		{func(c *Config) { c.RxWorkers = -1 }, "--rx-workers -1: want 0 (one per TAP queue) to 32"},
		{func(c *Config) { c.RxWorkers = MaxRxWorkers + 1 }, "--rx-workers 33: want 0 (one per TAP queue) to 32"},
		{func(c *Config) { onKernel(c); c.RxWorkers = 2 }, "--rx-workers 2 is for --fabric sim, not --fabric kernel"},
		{func(c *Config) { c.Learn = 7 }, "--learn LearnMode(7): want auto or declared"},
		{func(c *Config) { c.DHCP = 2 }, "--dhcp DHCPMode(2): want broadcast or rfc4390"},
		{func(c *Config) { c.DHCPClientID = 7 }, "--dhcp-client-id 7: want mac or mlnx"},
		{func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{0: 0x800a} }, "--vlan-pkey 0=0x800a: want VLAN=P_Key with VLAN 1..4094"},
		{func(c *Config) { c.Partitions = map[uint16]ipoib.PKey{10: 0x8000} }, "--vlan-pkey 10=0x8000"},
		{func(c *Config) { c.MAC[0] = 1 }, "--mac 01:00:00:00:00:00: want a unicast MAC"},
		{func(c *Config) { c.Faults.Dup = 2 }, "dup=2"},
		{func(c *Config) { c.Multicast.Robustness = 9 }, "--mcast-*: robustness 9"},
		{func(c *Config) { c.Persist, c.StateDir = true, "" }, "--persist keeps its state in --state-dir: give one"},
	} {
		cfg := testConfig("ul1")
		c.set(&cfg)
		err := cfg.Validate()
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", cfg, err)
			}
			continue
		}
		if _, ok := err.(ConfigError); !ok || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %v, want a ConfigError with %q", err, c.want)
		}
	}
}

// onKernel and onVerbs turn testConfig's simulated fabric into the
// kernel or verbs backend, with the defaults of the simulated fabric's
// settings.
func onKernel(c *Config) {
	c.Fabric, c.IBDev, c.Underlay, c.IBMTU = FabricKernel, "ib0", "", DefaultIBMTU
}
func onVerbs(c *Config) {
	c.Fabric, c.IBDev, c.Underlay, c.IBMTU = FabricVerbs, "rxe0", "", DefaultIBMTU
}

// TestReloadDiff: a reload sees exactly the settings that changed, and
// which of them apply live; VLAN maps compare as maps.
func TestReloadDiff(t *testing.T) {
	a, b := testConfig("u"), testConfig("u")
	b.Settings = maps.Clone(a.Settings)
	b.Settings["vif-idle"], b.Settings["log-level"], b.Settings["max-vifs"] = "10s", "debug", "10"
	if got := strings.Join(changedKeys(&a, &b), " "); got != "log-level max-vifs vif-idle" {
		t.Fatalf("changed %q", got)
	}
	if got := strings.Join(slices.Sorted(maps.Keys(liveKeys)), " "); got != "log-level max-neighbours max-vifs mcast-last-member-interval mcast-query-interval mcast-response-interval mcast-robustness vif-idle vlan-pkey" {
		t.Fatalf("live keys %q", got)
	}
	c, d := testConfig("u"), testConfig("u")
	c.Partitions, d.Partitions = map[uint16]ipoib.PKey{10: 0x800a, 20: 0x8014}, map[uint16]ipoib.PKey{20: 0x8014, 10: 0x800a}
	c.Settings, d.Settings = maps.Clone(c.Settings), maps.Clone(d.Settings)
	c.Settings["vlan-pkey"], d.Settings["vlan-pkey"] = "10=0x800a,20=0x8014", "20=0x8014,10=0x800a"
	if ks := changedKeys(&c, &d); len(ks) != 0 {
		t.Fatalf("reordered VLAN map seen as a change: %v", ks)
	}
	if got := formatVLANPKeys(d.Partitions); got != "10=0x800a,20=0x8014" {
		t.Errorf("formatVLANPKeys = %q", got)
	}
}
