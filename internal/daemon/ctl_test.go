package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/fabric/memfabric"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/state"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
)

// memShim is a shim on a TAP and a port in memory, VLAN 10 on P_Key
// 0x800a, with a clock that stands still. The VIF listing's idle_s is
// the time since its last frame. A real clock would make it depend on
// how long the machine took between AddVIF and the listing.
func memShim(t *testing.T) *shim.Shim {
	t.Helper()
	f, err := memfabric.New(4096)
	if err != nil {
		t.Fatal(err)
	}
	var gid ipoib.GID
	gid[0], gid[1], gid[15] = 0xfe, 0x80, 1
	port, err := f.NewPort(gid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { port.Close() })
	sh, err := shim.New(shim.Config{Device: tap.NewMem(16), Port: port, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Partitions: map[uint16]ipoib.PKey{10: 0x800a}, Clock: clock.NewFake(time.Unix(1_700_000_000, 0))})
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

// TestHandlerSavesDeclared: with --persist, vif-add and vif-del are
// answered once the state file says so. So a crash right after the
// answer (a kill -9 within the saver's second) neither loses a declared
// guest nor brings back a freed one. A freed guest brought back would
// keep its QP for good, as a declared VIF's origin never ages.
func TestHandlerSavesDeclared(t *testing.T) {
	sh := memShim(t)
	path := filepath.Join(t.TempDir(), "eib0.state")
	h := &ctlHandler{sh: sh, name: "eib0", fab: FabricSim, dev: "ul1",
		saver: &stateSaver{path: path, tap: "eib0", sh: sh, log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	saved := func() []string {
		st, err := state.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, g := range st.Guests {
			got = append(got, fmt.Sprintf("%v/%d", g.MAC, g.VLAN))
		}
		return got
	}
	for _, mac := range []string{"02:00:00:00:cc:01", "02:00:00:00:cc:02"} {
		if err := h.AddVIF(ctl.VIFRequest{MAC: mac, VLAN: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := saved(), []string{"02:00:00:00:cc:01/10", "02:00:00:00:cc:02/10"}; !slices.Equal(got, want) {
		t.Errorf("state after two vif-add: %v, want %v", got, want)
	}
	if err := h.DelVIF(ctl.VIFRequest{MAC: "02:00:00:00:cc:01", VLAN: 10}); err != nil {
		t.Fatal(err)
	}
	if got, want := saved(), []string{"02:00:00:00:cc:02/10"}; !slices.Equal(got, want) {
		t.Errorf("state after vif-del: %v, want %v", got, want)
	}
}

// TestHandlerSaveFailureRefused: a vif-add whose state cannot be written
// (the state file's path is a directory) is answered with that error,
// not success: the client must not believe the guest outlives a crash.
// The VIF itself stands, and a vif-del is refused likewise.
func TestHandlerSaveFailureRefused(t *testing.T) {
	sh := memShim(t)
	path := t.TempDir() // a directory: rename(2) onto it fails
	h := &ctlHandler{sh: sh, name: "eib0", fab: FabricSim, dev: "ul1",
		saver: &stateSaver{path: path, tap: "eib0", sh: sh, log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	const want = "done, but the state file (--persist) was not written, so a crash now would undo it: "
	err := h.AddVIF(ctl.VIFRequest{MAC: "02:00:00:00:cc:01", VLAN: 10})
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("vif-add with an unwritable state file: %v, want an error starting %q", err, want)
	}
	if vs := sh.VIFs(); len(vs) != 1 {
		t.Errorf("VIFs after the refused vif-add: %+v, want the one declared", vs)
	}
	if err := h.DelVIF(ctl.VIFRequest{MAC: "02:00:00:00:cc:01", VLAN: 10}); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("vif-del with an unwritable state file: %v, want an error starting %q", err, want)
	}
}

// TestHandlerReplies: the control handler's answers over a shim on the
// in-memory fabric, byte for byte as the wire carries them. It checks
// the field names and order, the formats (QPN as 0x and six digits,
// P_Keys as 0x and four), and empty listings as [] rather than null. It
// checks a declared VIF and its removal, and a bad MAC refused with the
// message the CLI prints. The groups' members and the neighbours' fields
// need traffic; test/netns TestCtl checks them against a running daemon.
func TestHandlerReplies(t *testing.T) {
	sh := memShim(t)
	h := &ctlHandler{sh: sh, name: "eib0", fab: FabricSim, dev: "ul1"}
	wire := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	link := "down"
	if sh.Port().Up {
		link = "up"
	}
	if got, want := wire(h.Port()), `{"name":"eib0","backend":"sim","device":"ul1","gid":"fe80::1","ib_mtu":4096,"ipoib_mtu":4092,"link":"`+link+
		`","partitions":[{"vlan":0,"pkey":"0xffff"},{"vlan":10,"pkey":"0x800a"}]}`; got != want {
		t.Errorf("port:\n%s\nwant\n%s", got, want)
	}
	for name, got := range map[string]string{"vifs": wire(h.VIFs()), "neigh": wire(h.Neighbours()), "groups": wire(h.Groups()), "flush": wire(h.FlushNeighbours())} {
		if want := map[string]string{"vifs": "[]", "neigh": "[]", "groups": "[]", "flush": `{"flushed":0}`}[name]; got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	if err := h.AddVIF(ctl.VIFRequest{MAC: "02:00:00:00:cc:01", VLAN: 10}); err != nil {
		t.Fatal(err)
	}
	vs := sh.VIFs()
	if len(vs) != 1 {
		t.Fatalf("shim VIFs after AddVIF: %+v", vs)
	}
	want := fmt.Sprintf(`[{"mac":"02:00:00:00:cc:01","vlan":10,"pkey":"0x800a","qpn":"%#06x","address":"%s","origin":"declared","idle_s":0,"tx_packets":0,"tx_bytes":0,"rx_packets":0,"rx_bytes":0}]`,
		vs[0].QPN, vs[0].Addr)
	if got := wire(h.VIFs()); got != want {
		t.Errorf("vifs:\n%s\nwant\n%s", got, want)
	}
	if err := h.DelVIF(ctl.VIFRequest{MAC: "02:00:00:00:cc:01", VLAN: 10}); err != nil || wire(h.VIFs()) != "[]" {
		t.Errorf("after DelVIF: %s, %v", wire(h.VIFs()), err)
	}
	if err := h.AddVIF(ctl.VIFRequest{MAC: "zz"}); err == nil || !strings.HasPrefix(err.Error(), `MAC "zz": `) {
		t.Errorf("AddVIF zz: %v", err)
	}
	if st := h.Stats(); st["vifs_created"] != 1 || st["vifs_removed"] != 1 {
		t.Errorf("stats: vifs_created %d, vifs_removed %d", st["vifs_created"], st["vifs_removed"])
	}
}
