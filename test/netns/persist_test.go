package netns

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/ctl"
	"github.com/eipoib/eipoibd/internal/state"
)

// fdStore plays systemd's notify socket with its file descriptor store
// (sd_notify(3): FDSTORE=1 with FDNAME=, FDSTOREREMOVE=1), as
// TestSystemdNotify plays the notify socket alone.
type fdStore struct {
	path  string
	c     *net.UnixConn
	mu    sync.Mutex
	files map[string][]*os.File
}

func newFDStore(t *testing.T) *fdStore {
	s := &fdStore{path: filepath.Join(t.TempDir(), "notify"), files: map[string][]*os.File{}}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	t.Cleanup(func() { c.Close(); s.release() })
	go s.serve()
	return s
}

func (s *fdStore) serve() {
	b, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*256))
	for {
		n, oobn, _, _, err := s.c.ReadMsgUnix(b, oob)
		if err != nil {
			return
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		kv := map[string]string{}
		for _, l := range strings.Split(string(b[:n]), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				kv[k] = v
			}
		}
		s.mu.Lock()
		name := kv["FDNAME"]
		if kv["FDSTOREREMOVE"] == "1" {
			for _, f := range s.files[name] {
				f.Close()
			}
			delete(s.files, name)
		}
		for _, fd := range fds {
			if kv["FDSTORE"] == "1" {
				s.files[name] = append(s.files[name], os.NewFile(uintptr(fd), name))
			} else {
				unix.Close(fd)
			}
		}
		s.mu.Unlock()
	}
}

// held returns the files stored under name.
func (s *fdStore) held(name string) []*os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.files[name])
}

// waitHeld waits until n files are stored under name.
func (s *fdStore) waitHeld(t *testing.T, name string, n int) []*os.File {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		f := s.held(name)
		if len(f) == n {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store holds %d descriptors named %s, want %d", len(f), name, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// release closes everything stored, as "systemctl stop" does.
func (s *fdStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, fs := range s.files {
		for _, f := range fs {
			f.Close()
		}
		delete(s.files, name)
	}
}

// link is what the test watches of eib0: its ifindex, master, carrier
// and carrier changes.
type link struct {
	index, changes int
	master         string
	carrier        bool
}

func (h *hypervisor) link(t *testing.T) link {
	t.Helper()
	var l link
	out := sh(t, in(h.ns, "ip", "-j", "link", "show", "eib0")...)
	var ls []struct {
		Index  int    `json:"ifindex"`
		Master string `json:"master"`
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil || len(ls) != 1 {
		t.Fatalf("ip -j link show eib0: %v\n%s", err, out)
	}
	l.index, l.master = ls[0].Index, ls[0].Master
	c := strings.Fields(sh(t, in(h.ns, "cat", "/sys/class/net/eib0/carrier_changes", "/sys/class/net/eib0/carrier")...))
	if len(c) != 2 {
		t.Fatalf("carrier_changes and carrier: %q", c)
	}
	var err error
	if l.changes, err = strconv.Atoi(c[0]); err != nil {
		t.Fatalf("carrier_changes and carrier: %q %v", c, err)
	}
	l.carrier = c[1] == "1"
	return l
}

// savedGuests waits until h's state file lists each MAC with exactly the
// addresses given, and returns the file's guests.
func savedGuests(t *testing.T, h *hypervisor, want map[string][]string) []state.Guest {
	t.Helper()
	path := filepath.Join(h.ctlDir(), "eib0.state")
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := state.Load(path)
		ok := err == nil
		if ok {
			for mac, ips := range want {
				found := false
				for _, g := range st.Guests {
					if g.MAC.String() == mac {
						var got []string
						for _, a := range g.IPs {
							got = append(got, a.String())
						}
						slices.Sort(got)
						found = slices.Equal(got, ips)
					}
				}
				ok = ok && found
			}
		}
		if ok {
			return st.Guests
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file %s: %+v (%v), want guests with addresses %v", path, st, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPersistRestart: eipoibd --persist, its TAP queues in a file
// descriptor store (the test plays systemd's), is restarted (SIGTERM).
// Then it crashes (SIGKILL) and is started again. Each time, a guest
// pings one on the other hypervisor every 100 ms and runs iperf3 to it.
//   - eib0 never changes: same ifindex, still on br0, no carrier change
//     and up throughout.
//   - The guests' VIFs come back from the state file with the same QPNs.
//   - Their saved addresses (IPv4 and IPv6 of both guests) are announced
//     three times each.
//   - iperf3 completes with traffic after the restart, and an exact
//     transfer follows.
//   - The ping outage is reported, and must stay under 2 s.
//
// A guest declared by a static FDB entry that went while eipoibd was
// down loses its VIF at the restart; one whose entry stayed keeps it,
// and its QPN. A corrupt state file is then set aside and reported, not
// trusted. Without the store (as after "systemctl stop") the TAP still
// survives, same ifindex and still on br0, though its carrier dropped
// while no process held it. With --persist turned off, the kept queues
// handed back make way for a new TAP, and the store lets go of them.
func TestPersistRestart(t *testing.T) {
	nstestRequire(t, "iperf3")
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21 := h1.guests[0], h1.guests[1], h2.guests[0]
	store := newFDStore(t)
	h1.stop(t, true)
	const queues = 2
	h1.extra = append(slices.Clone(h1.extra), "--persist", "--queues", strconv.Itoa(queues))
	h1.env = []string{"NOTIFY_SOCKET=" + store.path}
	h1.start(t)
	store.waitHeld(t, "tap-eib0", queues)
	for _, g := range []*guest{g11, g12} {
		ping(t, g, g21.ip4)
		ping(t, g, g21.ip6)
	}
	want := map[string][]string{}
	for _, g := range []*guest{g11, g12} {
		want[g.mac(t).String()] = []string{g.ip4, g.ip6}
		slices.Sort(want[g.mac(t).String()])
	}
	saved := savedGuests(t, h1, want)
	qpns := map[string]uint32{}
	for _, g := range []*guest{g11, g12} {
		qpns[g.mac(t).String()] = h1.vifQPN(g.mac(t).String(), 0)
	}
	before := h1.link(t)
	if before.master != "br0" || !before.carrier {
		t.Fatalf("eib0 before the restarts: %+v", before)
	}

	srv := exec.Command("ip", in(g21.ns, "iperf3", "-s")[1:]...)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			const n, every = 60, 100 * time.Millisecond
			type res struct {
				r   pingResult
				err error
			}
			pinged := make(chan res, 1)
			go func() {
				r, err := runPing(g11, g21.ip4, n, 20*time.Second, "-i", "0.1")
				pinged <- res{r, err}
			}()
			type iperfOut struct {
				out string
				err error
			}
			perf := make(chan iperfOut, 1)
			go func() {
				out, err := retryConnect(g12, []string{"iperf3", "-J", "-t", "6", "-c", g21.ip4}, "Connection refused")
				perf <- iperfOut{out, err}
			}()
			time.Sleep(2 * time.Second)
			stopped := time.Now()
			h1.cmd.Process.Signal(sig)
			<-h1.done
			h1.cmd = nil
			h1.files, h1.fdNames = store.held("tap-eib0"), []string{"tap-eib0", "tap-eib0"}
			h1.start(t)
			restart := time.Since(stopped)
			h1.files = nil
			if !strings.Contains(h1.log(), "tap_start=kept") {
				t.Errorf("the restarted daemon did not keep the TAP:\n%s", h1.log())
			}
			p := <-pinged
			o := outage(p.r, n, every)
			t.Logf("%v: restarted in %v; ping every %v: %d of %d answered, outage %v", sig, restart.Round(time.Millisecond), every, p.r.rx, n, o)
			if o > 2*time.Second || !p.r.seqs[n] {
				t.Errorf("ping outage %v (limit 2s), last request answered? %v\n%s", o, p.r.seqs[n], p.r.out)
			}
			r := <-perf
			var out iperf3Run
			if err := json.Unmarshal([]byte(r.out), &out); err != nil || r.err != nil || out.Error != "" || len(out.Intervals) < 6 {
				t.Fatalf("iperf3 across the restart: %v %v %s\n%s", r.err, err, out.Error, r.out)
			}
			for _, iv := range out.Intervals[4:] {
				if iv.Sum.Bytes == 0 {
					t.Errorf("iperf3 carried nothing in the second from %.0f s: traffic did not resume\n%s", iv.Sum.Start, r.out)
				}
			}
			after := h1.link(t)
			if after != before {
				t.Errorf("eib0 changed across the restart: %+v, before %+v", after, before)
			}
			for mac, qpn := range qpns {
				if got := h1.vifQPN(mac, 0); got != qpn {
					t.Errorf("VIF of %s: QPN %#x after the restart, %#x before", mac, got, qpn)
				}
			}
			// Every saved address is announced three times.
			addrs := 0
			for _, g := range saved {
				addrs += len(g.IPs)
			}
			if !strings.Contains(h1.log(), fmt.Sprintf("addresses_announced=%d", addrs)) {
				t.Errorf("the restart did not restore %d addresses:\n%s", addrs, h1.log())
			}
			waitMetric(t, h1, "tx_announced", float64(3*addrs))
			tcpBytes(t, g21, g11, 10<<20)
			store.waitHeld(t, "tap-eib0", queues)
		})
	}

	// Two guests are declared by static entries (libvirt's). One entry
	// is deleted while eipoibd is down: its guest's port went. The
	// restart frees that guest's VIF at once, as the bridge's removal;
	// it would not age, being declared. It keeps the other's, with its
	// QPN.
	t.Run("static entry gone while down", func(t *testing.T) {
		const kept, gone = "52:54:00:77:00:01", "52:54:00:77:00:02"
		fdb := func(op, mac, dev string) {
			sh(t, in(h1.ns, "bridge", "fdb", op, mac, "dev", dev, "master", "static")...)
		}
		fdb("add", kept, "vg1")
		fdb("add", gone, "vg2")
		qpn := waitVIFs(t, h1, "bridge", kept, gone)[kept].QPN
		savedGuests(t, h1, map[string][]string{kept: nil, gone: nil})
		h1.stop(t, false)
		sh(t, in(h1.ns, "bridge", "fdb", "del", gone, "dev", "vg2", "master")...)
		h1.files, h1.fdNames = store.held("tap-eib0"), []string{"tap-eib0", "tap-eib0"}
		h1.start(t)
		h1.files = nil
		vs := h1.vifs(t)
		if v, ok := vs[gone]; ok {
			t.Errorf("the VIF of %s, whose entry went while eipoibd was down, is still there after the start: %+v\n%s", gone, v, h1.log())
		}
		if !strings.Contains(h1.log(), `msg="VIF removed" mac=`+gone+" vlan=0") || !strings.Contains(h1.log(), "by=bridge") {
			t.Errorf("no line of %s's VIF removed by the bridge:\n%s", gone, h1.log())
		}
		if v := vs[kept]; v.QPN != qpn || v.Origin != "bridge" {
			t.Errorf("the VIF of %s, whose entry stayed: %+v, want QPN %s, origin bridge", kept, v, qpn)
		}
		sh(t, in(h1.ns, "bridge", "fdb", "del", kept, "dev", "vg1", "master")...)
	})

	t.Run("corrupt state", func(t *testing.T) {
		path := filepath.Join(h1.ctlDir(), "eib0.state")
		h1.stop(t, false)
		if err := os.WriteFile(path, []byte(`{"version": 1, "tap": "eib0", "guests": [{"mac": "zz"}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		h1.files, h1.fdNames = store.held("tap-eib0"), []string{"tap-eib0", "tap-eib0"}
		h1.start(t)
		h1.files = nil
		if !strings.Contains(h1.log(), `level=WARN msg="state file corrupt: set aside, not trusted"`) || !strings.Contains(h1.log(), "moved_to="+path+".corrupt") {
			t.Errorf("corrupt state file not reported:\n%s", h1.log())
		}
		if b, err := os.ReadFile(path + ".corrupt"); err != nil || !strings.Contains(string(b), `"zz"`) {
			t.Errorf("corrupt state not set aside: %v %q", err, b)
		}
		ping(t, g11, g21.ip4)
	})

	t.Run("without the store", func(t *testing.T) {
		h1.stop(t, false)
		store.release()
		h1.env = nil
		h1.start(t)
		if !strings.Contains(h1.log(), "tap_start=reopened") || !strings.Contains(h1.log(), "no systemd file descriptor store") {
			t.Errorf("TAP not reopened, or no word on the missing store:\n%s", h1.log())
		}
		l := h1.link(t)
		if l.index != before.index || l.master != "br0" || !l.carrier || l.changes != before.changes+2 {
			t.Errorf("eib0 after a restart without the store: %+v, before %+v; want the same TAP on br0, its carrier down and up once", l, before)
		}
		ping(t, g11, g21.ip4)
	})

	// Turning --persist off under systemd: the kept queues come back,
	// the daemon has the store let go of them, and the old TAP goes
	// for a new, ordinary one, removed again on stop.
	t.Run("persist turned off", func(t *testing.T) {
		h1.stop(t, false)
		h1.env = []string{"NOTIFY_SOCKET=" + store.path}
		h1.start(t)
		store.waitHeld(t, "tap-eib0", queues)
		h1.stop(t, false)
		h1.extra = slices.DeleteFunc(slices.Clone(h1.extra), func(a string) bool { return a == "--persist" })
		h1.files, h1.fdNames = store.held("tap-eib0"), []string{"tap-eib0", "tap-eib0"}
		h1.start(t)
		h1.files = nil
		if !strings.Contains(h1.log(), "tap_start=created") || !strings.Contains(h1.log(), "--persist is off") {
			t.Errorf("TAP not made afresh, or no word of it:\n%s", h1.log())
		}
		store.waitHeld(t, "tap-eib0", 0)
		if l := h1.link(t); l.index == before.index || l.master != "br0" || !l.carrier {
			t.Errorf("eib0 with --persist off: %+v, before %+v; want a new TAP on br0 with carrier", l, before)
		}
		ping(t, g11, g21.ip4)
		h1.stop(t, true) // and eib0 goes with it
	})
}

// waitVIFs waits up to 10 s until h has a VIF of origin for each of
// macs, and returns h's VIFs.
func waitVIFs(t *testing.T, h *hypervisor, origin string, macs ...string) map[string]ctl.VIF {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		vs := h.vifs(t)
		if !slices.ContainsFunc(macs, func(m string) bool { return vs[m].Origin != origin }) {
			return vs
		}
		if time.Now().After(deadline) {
			t.Fatalf("VIFs %+v, want %v of origin %s\n%s", vs, macs, origin, h.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPersistOVS: with --persist on an Open vSwitch bridge, a restart
// keeps the TAP's OVS port (the same Port row, not deleted and added
// again) and the TAP's carrier, and a guest behind it still reaches the
// other hypervisor. Of two guests declared by attached-macs, the one
// whose port was deleted while eipoibd was down loses its VIF once the
// watch has listed the ports; the other keeps its VIF and QPN.
func TestPersistOVS(t *testing.T) {
	tp := newTopoOpts(t, topoOpts{n: 2, ovs: []bool{true, false}})
	h1, h2 := tp.hvs[0], tp.hvs[1]
	store := newFDStore(t)
	h1.stop(t, true)
	h1.extra = append(slices.Clone(h1.extra), "--persist", "--queues", "2")
	h1.env = []string{"NOTIFY_SOCKET=" + store.path}
	h1.start(t)
	store.waitHeld(t, "tap-eib0", 2)
	ping(t, h1.guests[0], h2.guests[0].ip4)
	db := h1.switchArgs[slices.Index(h1.switchArgs, "--ovs-db")+1]
	port := func() string {
		return strings.TrimSpace(sh(t, "ovs-vsctl", "--timeout=10", "--db="+db, "get", "Port", "eib0", "_uuid"))
	}
	vsctl := func(args ...string) { sh(t, append([]string{"ovs-vsctl", "--timeout=10", "--db=" + db}, args...)...) }
	// Guests libvirt declares in OVSDB, on vg1 and vg2.
	const kept, gone = "52:54:00:78:00:01", "52:54:00:78:00:02"
	vsctl("set", "Interface", "vg1", "external_ids:attached-mac="+kept)
	vsctl("set", "Interface", "vg2", "external_ids:attached-mac="+gone)
	qpn := waitVIFs(t, h1, "ovs", kept, gone)[kept].QPN
	savedGuests(t, h1, map[string][]string{kept: nil, gone: nil})
	beforePort, before := port(), h1.link(t)
	h1.stop(t, false)
	vsctl("del-port", "obr", "vg2") // while eipoibd is down
	h1.files, h1.fdNames = store.held("tap-eib0"), []string{"tap-eib0", "tap-eib0"}
	h1.start(t)
	h1.files = nil
	if after := port(); after != beforePort {
		t.Errorf("OVS port of eib0 replaced across the restart: %s, before %s", after, beforePort)
	}
	// The watch's first listing frees the VIF whose port went.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h1.log(), `msg="VIF removed" mac=`+gone+" vlan=0") {
		if time.Now().After(deadline) {
			t.Fatalf("the VIF of %s, whose port went while eipoibd was down, not removed after the start:\n%s", gone, h1.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	vs := h1.vifs(t)
	if v, ok := vs[gone]; ok {
		t.Errorf("the VIF of %s is still listed: %+v", gone, v)
	}
	if v := vs[kept]; v.QPN != qpn || v.Origin != "ovs" {
		t.Errorf("the VIF of %s, whose port stayed: %+v, want QPN %s, origin ovs", kept, v, qpn)
	}
	if after := h1.link(t); after.changes != before.changes || !after.carrier || after.index != before.index {
		t.Errorf("eib0 across the restart: %+v, before %+v", after, before)
	}
	pingN(t, h1.guests[0], h2.guests[0].ip4, 3)
}

// iperf3Run is what the tests read of iperf3 -J: its error and the bytes
// of each interval.
type iperf3Run struct {
	Error     string `json:"error"`
	Intervals []struct {
		Sum struct {
			Start float64 `json:"start"`
			Bytes int64   `json:"bytes"`
		} `json:"sum"`
	} `json:"intervals"`
}
