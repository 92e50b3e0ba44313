package netns

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// waitLog waits up to 20 s for h's log to contain s.
func waitLog(t *testing.T, h *hypervisor, s string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h.log(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q in the log:\n%s", h.name, s, h.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSIGHUP: a daemon started with --config re-reads the file on SIGHUP
// and applies what can change live:
//   - the log level;
//   - the VIF idle time (idle VIFs then age out after the new time);
//   - the VIF limit;
//   - the IGMP/MLD query interval (general queries, every 125 s before,
//     come within the new 5 s);
//   - a VLAN map addition (the partition shows in "show port" at once).
//
// It names each change that needs a restart (the IB MTU here), and keeps
// running unchanged when the new file is bad.
func TestSIGHUP(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "eipoibd.toml")
	if err := os.WriteFile(cfg, []byte("vif-idle = \"5m\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tp := newTopo(t, 2, false, "--config", cfg)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g21 := h1.guests[0], h2.guests[0]
	ping(t, g11, g21.ip4)

	if err := os.WriteFile(cfg, []byte("vif-idle = \"2s\"\nlog-level = \"debug\"\nmax-vifs = 10\nib-mtu = 2048\nvlan-pkey = \"10=0x800a\"\nmcast-query-interval = \"5s\"\nmcast-response-interval = \"1s\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h1.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, h1, `msg="config reloaded" key=log-level old=info new=debug`)
	waitLog(t, h1, `msg="config reloaded" key=vif-idle old=5m0s new=2s`)
	waitLog(t, h1, `msg="config reloaded" key=max-vifs old=1024 new=10`)
	waitLog(t, h1, `msg="partition added" vlan=10 pkey=0x800a`)
	waitLog(t, h1, `msg="config reloaded" key=vlan-pkey old="" new="10=0x800a"`)
	waitLog(t, h1, `msg="config change needs a restart" key=ib-mtu running=4096 new=2048`)
	waitLog(t, h1, `msg="config reloaded" key=mcast-query-interval old=2m5s new=5s`)
	waitLog(t, h1, `msg="config reloaded" key=mcast-response-interval old=10s new=1s`)
	// General queries: an IGMP and an MLD one into each of the two
	// partitions, within 20 s of the reload: the new interval is 5 s, the
	// old one 125 s, and a busy machine may be seconds late.
	// The guests' reports to them come 4 s apart at least, so the VIFs
	// still go idle for the 2 s below.
	q0 := h1.metrics(t)["tx_queries"]
	deadline := time.Now().Add(20 * time.Second)
	for h1.metrics(t)["tx_queries"] < q0+4 {
		if time.Now().After(deadline) {
			t.Fatalf("tx_queries %v → %v in the 20 s after the query interval became 5 s", q0, h1.metrics(t)["tx_queries"])
		}
		time.Sleep(100 * time.Millisecond)
	}
	port, err := ctl.Client{Path: ctl.Path(h1.ctlDir(), "eib0")}.ShowPort()
	if err != nil {
		t.Fatal(err)
	}
	if len(port.Partitions) != 2 || port.Partitions[1].VLAN != 10 || port.Partitions[1].PKey != "0x800a" {
		t.Fatalf("partitions after the reload: %+v", port.Partitions)
	}
	// The new idle time applies: the guests, silent now, lose their VIFs
	// (within 20 s: the new idle time is 2 s, the old one 5 minutes).
	deadline = time.Now().Add(20 * time.Second)
	for h1.metrics(t)["vifs_aged"] < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("vifs_aged %v 20 s after vif-idle became 2s", h1.metrics(t)["vifs_aged"])
		}
		time.Sleep(200 * time.Millisecond)
	}

	if err := os.WriteFile(cfg, []byte("vif-idle = \"soon\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reloaded := strings.Count(h1.log(), `msg="config reloaded"`)
	h1.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, h1, `msg="config reload failed; running on unchanged"`)
	if n := strings.Count(h1.log(), `msg="config reloaded"`); n != reloaded {
		t.Errorf("the bad file changed %d settings, want none:\n%s", n-reloaded, h1.log())
	}
	ping(t, g11, g21.ip4) // running, and the guest gets a VIF again
}
