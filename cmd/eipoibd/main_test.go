package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// Bad command lines exit with one line naming the problem (status 2);
// runtime failures such as a missing underlay are plain errors (status 1).
func TestBadCommandLines(t *testing.T) {
	tests := []struct {
		args  []string
		want  string
		usage bool
	}{
		{nil, "missing command", true},
		{[]string{"start"}, `unknown command "start"`, true},
		{[]string{"--underlay", "x"}, `missing command before "--underlay"`, true},
		{[]string{"run"}, "--underlay is required", true},
		{[]string{"run", "--underlay", "x", "--ib-mtu", "1500"}, "--ib-mtu 1500", true},
		{[]string{"run", "--underlay", "x", "--max-vifs", "0"}, "--max-vifs 0", true},
		{[]string{"run", "--underlay", "x", "--fabric", "verbs", "--ib-dev", "rxe0"}, `--underlay "x" is for --fabric sim, not --fabric verbs`, true},
		{[]string{"run", "--fabric", "kernel"}, "--fabric kernel needs --ib-dev", true},
		{[]string{"run", "--fabric", "kernel", "--ib-dev", "ib0", "--underlay", "x"}, `--underlay "x" is for --fabric sim, not --fabric kernel`, true},
		{[]string{"run", "--fabric", "verbs"}, "--fabric verbs needs --ib-dev (the verbs device, e.g. mlx5_0 or rxe0)", true},
		{[]string{"run", "--fabric", "verbs", "--ib-dev", "rxe0", "--fault", "loss=0.1"}, "--fault is for --fabric sim, not --fabric verbs", true},
		{[]string{"run", "--underlay", "x", "--verbs-recv-depth", "2048"}, "--verbs-recv-depth 2048 is for --fabric verbs, not --fabric sim", true},
		{[]string{"run", "--underlay", "x", "--fast-path", "on"}, "--fast-path on is for --fabric kernel, not --fabric sim", true},
		{[]string{"run", "--fabric", "kernel", "--ib-dev", "ib0", "--fast-path", "yes"}, `--fast-path "yes": want off, auto or on`, true},
		{[]string{"run", "--fabric", "kernel", "--ib-dev", "ib0", "--ib-mtu", "2048"}, "--ib-mtu 2048 is for --fabric sim, not --fabric kernel", true},
		{[]string{"run", "--underlay", "x", "--ib-dev", "ib0"}, `--ib-dev "ib0" is for --fabric kernel or verbs, not --fabric sim`, true},
		{[]string{"run", "--fabric", "ud"}, `--fabric "ud": want sim, kernel or verbs`, true},
		{[]string{"run", "--underlay", "x", "--dhcp", "nope"}, `--dhcp "nope"`, true},
		{[]string{"run", "--underlay", "x", "--dhcp", "rfc4390", "--dhcp-client-id", "duid"}, `--dhcp-client-id "duid": want mac or mlnx`, true},
		{[]string{"run", "--underlay", "x", "--dhcp-client-id", "mlnx"}, "--dhcp-client-id mlnx goes with --dhcp rfc4390", true},
		{[]string{"run", "--underlay", "x", "--fault", "loss=2"}, "loss=2", true},
		{[]string{"run", "--underlay", "x", "--fault", "jitter=0.1"}, "unknown fault", true},
		{[]string{"run", "--underlay", "x", "--log-level", "loud"}, "--log-level", true},
		{[]string{"run", "--underlay", "x", "--mac", "01:00:5e:00:00:01"}, "--mac", true},
		{[]string{"run", "--underlay", "x", "--bogus"}, "-bogus", true},
		{[]string{"run", "--underlay", "x", "--pprof"}, "--pprof serves on the --metrics address", true},
		{[]string{"run", "--underlay", "x", "--offload=maybe"}, "-offload", true},
		{[]string{"run", "--underlay", "x", "--queues", "-1"}, "--queues -1: want 0 (one per CPU) to 256", true},
		{[]string{"run", "--underlay", "x", "--log-format", "xml"}, `--log-format "xml": want text or json`, true},
		{[]string{"run", "--underlay", "x", "--learn", "some"}, `--learn "some": want auto or declared`, true},
		{[]string{"run", "--underlay", "x", "--learn", "declared"}, "--learn declared takes its guests from the --bridge FDB or the --ovs-bridge ports: give one", true},
		{[]string{"run", "--underlay", "x", "--tap-mtu", "576"}, "--tap-mtu 576: want 1280 to 65521", true},
		{[]string{"run", "--underlay", "x", "--tap-mtu", "70000"}, "--tap-mtu 70000", true},
		{[]string{"run", "--underlay", "x", "--queues", "257"}, "--queues 257", true},
		{[]string{"run", "--underlay", "x", "--tap-queue-len", "-1"}, "--tap-queue-len -1: want 0 (the TAP's own, 1000) to 524288", true},
		{[]string{"run", "--underlay", "x", "--tap-queue-len", "524289"}, "--tap-queue-len 524289", true},
		{[]string{"run", "--underlay", "x", "--busy-poll", "-1us"}, "--busy-poll -1µs: want 0 (off) to 10ms, e.g. 50us", true},
		{[]string{"run", "--underlay", "x", "--busy-poll", "1s"}, "--busy-poll 1s: want 0 (off) to 10ms", true},
		{[]string{"run", "--underlay", "x", "--busy-poll", "soon"}, "-busy-poll", true},
		{[]string{"run", "--underlay", "x", "--vlan-pkey", "10"}, `--vlan-pkey "10"`, true},
		{[]string{"run", "--underlay", "x", "--vlan-pkey", "5000=0x8001"}, `--vlan-pkey "5000=0x8001"`, true},
		{[]string{"run", "--underlay", "x", "--vlan-pkey", "10=0x8000"}, "invalid partition", true},
		{[]string{"run", "--underlay", "x", "--vlan-pkey", "10=0x800a,10=0x800b"}, "VLAN 10 given twice", true},
		{[]string{"run", "--underlay", "x", "--bridge", "br0", "--ovs-bridge", "ovsbr"}, "exclude each other", true},
		{[]string{"run", "--underlay", "x", "--mcast-robustness", "9"}, "robustness 9", true},
		{[]string{"run", "--underlay", "x", "extra"}, `unexpected argument "extra"`, true},
		{[]string{"run", "--underlay", "no-such-if0"}, `underlay interface "no-such-if0" not found`, false},
	}
	for _, tc := range tests {
		var stderr bytes.Buffer
		err := run(tc.args, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error spans lines: %q", tc.args, err)
		}
		var ue usageError
		if errors.As(err, &ue) != tc.usage {
			t.Errorf("%v: usage error %v, want %v", tc.args, !tc.usage, tc.usage)
		}
	}
	if m, err := parseVLANPKeys("10=0x800a,20=0x8014"); err != nil || len(m) != 2 || m[10] != 0x800a || m[20] != 0x8014 {
		t.Errorf("parseVLANPKeys = %v, %v", m, err)
	}
	var stderr bytes.Buffer
	if err := run([]string{"run", "-h"}, &stderr); err != errHelp || !strings.Contains(stderr.String(), "--underlay") && !strings.Contains(stderr.String(), "-underlay") {
		t.Errorf("-h: %v\n%s", err, stderr.String())
	}
}
