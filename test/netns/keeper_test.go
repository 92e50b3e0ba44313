package netns

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/internal/sdnotify"
)

// keeperProc is an "eipoibd keeper" process with its log.
type keeperProc struct {
	socket, logPath string
	cmd             *exec.Cmd
	exited          chan struct{} // closed when the process has ended
}

// startKeeper runs a keeper on socket, logging to logPath, and waits
// until it serves. It is stopped (SIGTERM) when t ends, if it still
// runs, even when it never began serving.
func startKeeper(t *testing.T, socket, logPath string) *keeperProc {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	k := &keeperProc{socket: socket, logPath: logPath, exited: make(chan struct{})}
	k.cmd = exec.Command(daemonBin, "keeper", "--socket", socket)
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	if err := k.cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { k.signal(syscall.SIGTERM) })
	go func() { k.cmd.Wait(); logf.Close(); close(k.exited) }()
	k.waitLog(t, "keeper serving")
	return k
}

func (k *keeperProc) log() string {
	b, _ := os.ReadFile(k.logPath)
	return string(b)
}

// waitLog waits up to 20 s for the keeper's log to contain s.
func (k *keeperProc) waitLog(t *testing.T, s string) {
	t.Helper()
	k.waitLogN(t, s, 1)
}

// waitLogN waits up to 20 s for the keeper's log to contain s n times.
func (k *keeperProc) waitLogN(t *testing.T, s string, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); strings.Count(k.log(), s) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the keeper did not log %q %d times:\n%s", s, n, k.log())
		}
	}
}

// signal sends sig and, unless it is SIGUSR2, waits for the keeper to
// end; to a keeper that has ended, nothing.
func (k *keeperProc) signal(sig syscall.Signal) {
	select {
	case <-k.exited:
		return
	default:
	}
	k.cmd.Process.Signal(sig)
	if sig != syscall.SIGUSR2 {
		<-k.exited
	}
}

// handled waits until the keeper has handled every request sent to it
// so far: it handles them in order, so once it logs the removal of a
// name nothing is stored under, those sent before are done.
func (k *keeperProc) handled(t *testing.T) {
	t.Helper()
	if err := sdnotify.Send(k.socket, "FDSTOREREMOVE=1\nFDNAME=sentinel", nil); err != nil {
		t.Fatal(err)
	}
	k.waitLog(t, "msg=removed name=sentinel fds=0")
}

// monitor runs a command in h's namespace for the rest of the test and
// keeps what it prints.
func monitor(t *testing.T, h *hypervisor, args ...string) *listenWatch {
	t.Helper()
	w := &listenWatch{ready: make(chan struct{})}
	cmd := exec.Command("ip", in(h.ns, args...)[1:]...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return w
}

// subscribed waits until the "ip -o monitor link" and "bridge monitor
// fdb" of h print events; watching eib0 needs a subscription made before
// its flap. Events are made for them on a veth pair of h's own, on no
// bridge, again until each monitor has shown one. Then the pair is
// deleted.
func subscribed(t *testing.T, h *hypervisor, links, fdb *listenWatch) {
	t.Helper()
	sh(t, in(h.ns, "ip", "link", "add", "kprobe0", "type", "veth", "peer", "name", "kprobe1")...)
	defer sh(t, in(h.ns, "ip", "link", "del", "kprobe0")...)
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !strings.Contains(links.String(), "kprobe0") || !strings.Contains(fdb.String(), "dev kprobe0"); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the monitors showed no event of kprobe0 in 10 s:\n%s\n%s", links.String(), fdb.String())
		}
		// A new MTU is an RTM_NEWLINK; a permanent "self" entry of a
		// port of no bridge is an RTM_NEWNEIGH that eipoibd passes over.
		sh(t, in(h.ns, "ip", "link", "set", "kprobe0", "mtu", strconv.Itoa(1400+i))...)
		sh(t, in(h.ns, "bridge", "fdb", "add", fmt.Sprintf("02:00:5e:00:53:%02x", i%256), "dev", "kprobe0", "self", "permanent")...)
		time.Sleep(50 * time.Millisecond)
	}
}

// flapsOf returns the lines of "ip -o monitor link" and "bridge monitor
// fdb" that show eib0 losing its carrier or going down, or an FDB entry
// on eib0 deleted.
func flapsOf(link, fdb string) []string {
	var bad []string
	for _, l := range strings.Split(link, "\n") {
		if strings.Contains(l, " eib0:") && (strings.Contains(l, "NO-CARRIER") || strings.Contains(l, "state DOWN")) {
			bad = append(bad, l)
		}
	}
	for _, l := range strings.Split(fdb, "\n") {
		if strings.HasPrefix(l, "Deleted") && strings.Contains(l, " dev eib0 ") {
			bad = append(bad, l)
		}
	}
	return bad
}

// TestKeeperRestart: eipoibd --persist --fd-store keeps its TAP queues
// in an "eipoibd keeper" process instead of systemd's store.
//
// While a guest pings one on the other hypervisor every 100 ms, the
// daemon is restarted (SIGTERM), then killed (SIGKILL) and started
// again. Each time:
//   - it takes the queues back from the keeper (tap_start=kept);
//   - eib0 keeps its ifindex, stays on br0 and never changes carrier
//     (carrier_changes, and "ip monitor link" shows it neither without
//     carrier nor down);
//   - no FDB entry on eib0 is deleted ("bridge monitor fdb");
//   - the guests' VIFs come back with their QPNs;
//   - the ping outage, pinging every 10 ms out of the hypervisor and
//     into it, is reported with the lost sequence numbers. It must stay
//     under 2 s each way, as TestPersistRestart's. What the fabric
//     delivers while no eipoibd reads the port is lost, so the outage
//     measures that window.
//
// Then the keeper is killed. The next start says the keeper is
// unreachable and reopens the TAP, whose carrier went down and up once;
// the monitors see it, so they do catch a flap. A new keeper started
// while the daemon runs gets the queues from it (the daemon watches the
// keeper's socket). Malformed requests to it are refused and counted by
// kind, logged once per kind, and it goes on serving: another restart
// keeps the carrier.
//
// Last, eib0 is deleted while eipoibd is down. The next start closes the
// detached queues the keeper hands back, makes the TAP afresh, and the
// keeper holds the new ones. Then --persist is turned off: the keeper is
// told to let go, and a new, ordinary TAP replaces the persistent one.
func TestKeeperRestart(t *testing.T) {
	tp := newTopo(t, 2, false)
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g11, g12, g21 := h1.guests[0], h1.guests[1], h2.guests[0]
	socket := filepath.Join(h1.logDir, "keeper.sock")
	kp := startKeeper(t, socket, filepath.Join(h1.logDir, "keeper-1.log"))
	h1.stop(t, true)
	const queues = 2
	h1.extra = append(slices.Clone(h1.extra), "--persist", "--queues", strconv.Itoa(queues), "--fd-store", socket)
	h1.start(t)
	if !strings.Contains(h1.log(), "TAP queues sent to the keeper") {
		t.Fatalf("queues not sent to the keeper:\n%s", h1.log())
	}
	kp.waitLog(t, fmt.Sprintf("msg=stored name=tap-eib0 fds=%d", queues))
	for _, g := range []*guest{g11, g12} {
		ping(t, g, g21.ip4)
	}
	qpns := map[string]uint32{}
	for _, g := range []*guest{g11, g12} {
		qpns[g.mac(t).String()] = h1.vifQPN(g.mac(t).String(), 0)
	}
	savedGuests(t, h1, map[string][]string{g11.mac(t).String(): {g11.ip4}, g12.mac(t).String(): {g12.ip4}})
	before := h1.link(t)
	if before.master != "br0" || !before.carrier {
		t.Fatalf("eib0 before the restarts: %+v", before)
	}
	links := monitor(t, h1, "ip", "-o", "monitor", "link")
	fdb := monitor(t, h1, "bridge", "monitor", "fdb")
	subscribed(t, h1, links, fdb)

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			const n, every = 500, 10 * time.Millisecond
			// Both ways, every 10 ms. A guest here pings out: its
			// requests sent while eipoibd is down wait in the kept TAP
			// queue, and a reply that reaches the fabric port in that
			// time is lost. The remote guest pings in: its requests that
			// reach the port while eipoibd is down are lost.
			pinged, pingedIn := make(chan pingResult, 1), make(chan pingResult, 1)
			go func() {
				r, _ := runPing(g11, g21.ip4, n, 20*time.Second, "-i", "0.01")
				pinged <- r
			}()
			go func() {
				r, _ := runPing(g21, g11.ip4, n, 20*time.Second, "-i", "0.01")
				pingedIn <- r
			}()
			time.Sleep(2 * time.Second)
			stopped := time.Now()
			h1.cmd.Process.Signal(sig)
			<-h1.done
			h1.cmd = nil
			h1.start(t)
			restart := time.Since(stopped)
			if !strings.Contains(h1.log(), "tap_start=kept") || !strings.Contains(h1.log(), "the keeper still holds the TAP's queues") {
				t.Errorf("the restarted daemon did not take the TAP's queues back from the keeper:\n%s", h1.log())
			}
			for _, way := range []struct {
				name string
				r    pingResult
			}{{"out", <-pinged}, {"in", <-pingedIn}} {
				r := way.r
				o := outage(r, n, every)
				var lost []int
				for seq := 1; seq <= n; seq++ {
					if !r.seqs[seq] {
						lost = append(lost, seq)
					}
				}
				t.Logf("%v: restarted in %v; ping %s every %v: %d of %d answered (lost %v), outage %v", sig, restart.Round(time.Millisecond), way.name, every, r.rx, n, lost, o)
				if o > 2*time.Second || !r.seqs[n] {
					t.Errorf("ping %s: outage %v (limit 2s), last request answered? %v\n%s", way.name, o, r.seqs[n], r.out)
				}
			}
			if after := h1.link(t); after != before {
				t.Errorf("eib0 changed across the restart: %+v, before %+v", after, before)
			}
			for mac, qpn := range qpns {
				if got := h1.vifQPN(mac, 0); got != qpn {
					t.Errorf("VIF of %s: QPN %#x after the restart, %#x before", mac, got, qpn)
				}
			}
			if bad := flapsOf(links.String(), fdb.String()); len(bad) > 0 {
				t.Errorf("eib0 flapped or lost FDB entries:\n%s", strings.Join(bad, "\n"))
			}
		})
	}

	t.Run("keeper killed", func(t *testing.T) {
		kp.signal(syscall.SIGKILL)
		h1.stop(t, false)
		h1.start(t)
		for _, want := range []string{"keeper unreachable", "tap_start=reopened", "TAP queues not kept by the keeper"} {
			if !strings.Contains(h1.log(), want) {
				t.Errorf("no %q after the keeper's death:\n%s", want, h1.log())
			}
		}
		l := h1.link(t)
		if l.index != before.index || l.master != "br0" || !l.carrier || l.changes != before.changes+2 {
			t.Errorf("eib0 after a restart without the keeper: %+v, before %+v; want the same TAP on br0, its carrier down and up once", l, before)
		}
		// The monitors see a flap when there is one: eib0 without
		// carrier, and the FDB entries learned on it flushed.
		deadline := time.Now().Add(20 * time.Second)
		for len(flapsOf(links.String(), "")) == 0 || len(flapsOf("", fdb.String())) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the monitors saw no carrier loss of eib0, or no FDB entry on it deleted:\n%s\n%s", links.String(), fdb.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		pingN(t, g11, g21.ip4, 3)
		before = l
	})

	// A new keeper, for the rest of the test: the running daemon sees its
	// socket and sends it the queues again.
	kp = startKeeper(t, socket, filepath.Join(h1.logDir, "keeper-2.log"))
	t.Run("malformed requests", func(t *testing.T) {
		kp.waitLog(t, fmt.Sprintf("msg=stored name=tap-eib0 fds=%d", queues))
		if !strings.Contains(h1.log(), "the keeper started anew: TAP queues sent to it again") {
			t.Errorf("the daemon did not say it sent its queues to the new keeper:\n%s", h1.log())
		}
		// Each kind twice: counted twice, logged once.
		kinds := map[string]string{"malformed_empty": "", "malformed_bad_name": "FDSTORE=1\nFDNAME=a:b", "malformed_no_name": "FDSTOREREMOVE=1",
			"get_bad_socket": "FDGET=1\nFDNAME=tap-eib0", "malformed_no_assignment": "no assignment"}
		for range 2 {
			for _, kind := range slices.Sorted(maps.Keys(kinds)) {
				if err := sdnotify.Send(socket, kinds[kind], nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		kp.handled(t)
		kp.signal(syscall.SIGUSR2)
		kp.waitLog(t, "keeper holds")
		counters := regexp.MustCompile(`counters="map\[([^]]*)\]"`).FindStringSubmatch(kp.log())
		for kind := range kinds {
			if w := kind + ":2"; counters == nil || !slices.Contains(strings.Fields(counters[1]), w) {
				t.Errorf("keeper counters %v, want %s among them:\n%s", counters, w, kp.log())
			}
			if c := strings.Count(kp.log(), "counter="+kind+" "); c != 1 {
				t.Errorf("%s logged %d times, want once:\n%s", kind, c, kp.log())
			}
		}
		h1.stop(t, false)
		h1.start(t)
		if !strings.Contains(h1.log(), "tap_start=kept") {
			t.Errorf("the keeper stopped serving after malformed requests:\n%s\n%s", h1.log(), kp.log())
		}
		if l := h1.link(t); l != before {
			t.Errorf("eib0 changed across the restart: %+v, before %+v", l, before)
		}
		pingN(t, g11, g21.ip4, 3)
	})

	// A TAP deleted while only the keeper holds its queues: nothing
	// tells the keeper (tun_detach_all wakes them, with EPOLLIN, before
	// it detaches them). So the next eipoibd gets detached queues back,
	// closes them, makes the TAP afresh and has the keeper hold its new
	// queues instead.
	t.Run("TAP deleted", func(t *testing.T) {
		h1.stop(t, false)
		sh(t, in(h1.ns, "ip", "link", "del", "eib0")...)
		h1.start(t)
		for _, want := range []string{fmt.Sprintf(`msg="kept queues of a deleted TAP closed: the TAP is made afresh" tap=eib0 closed=%d`, queues), "tap_start=created", "TAP queues sent to the keeper"} {
			if !strings.Contains(h1.log(), want) {
				t.Errorf("no %q after the TAP's deletion:\n%s", want, h1.log())
			}
		}
		kp.waitLog(t, fmt.Sprintf("msg=removed name=tap-eib0 fds=%d", queues))
		kp.signal(syscall.SIGUSR2)
		kp.waitLog(t, fmt.Sprintf("fds_by_name=map[tap-eib0:%d]", queues))
		pingN(t, g11, g21.ip4, 3)
	})

	// --persist turned off with --fd-store: the daemon takes the queues
	// the keeper holds, tells it to let go, and the persistent TAP goes
	// for an ordinary new one.
	t.Run("persist turned off", func(t *testing.T) {
		old := h1.link(t)
		h1.stop(t, false)
		h1.extra = slices.DeleteFunc(slices.Clone(h1.extra), func(a string) bool { return a == "--persist" })
		h1.start(t)
		if !strings.Contains(h1.log(), "tap_start=created") || !strings.Contains(h1.log(), "--persist is off") {
			t.Errorf("TAP not made afresh, or no word of it:\n%s", h1.log())
		}
		kp.waitLogN(t, fmt.Sprintf("msg=removed name=tap-eib0 fds=%d", queues), 2)
		kp.signal(syscall.SIGUSR2)
		kp.waitLog(t, "fds_by_name=map[]")
		if l := h1.link(t); l.index == old.index || l.master != "br0" || !l.carrier {
			t.Errorf("eib0 with --persist off: %+v, before %+v; want a new TAP on br0 with carrier", l, old)
		}
		pingN(t, g11, g21.ip4, 3)
		h1.stop(t, true) // and eib0 goes with it
	})
}
