package netns

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"sigs.k8s.io/yaml"

	"github.com/eipoib/eipoibd/deploy/kubernetes"
)

// podman runs podman with the project's containers configuration
// (scripts/containers.conf: runc, no default ulimits) and returns its
// combined output. It runs in network namespace ns (unless empty), the
// "host" network of the containers it starts. It enters it by nsenter,
// which leaves podman in the host's mount namespace, where its mounts
// must be.
func podman(t *testing.T, ns string, args ...string) (string, error) {
	t.Helper()
	nstestRequire(t, "podman", "nsenter")
	conf, err := filepath.Abs("../../scripts/containers.conf")
	if err != nil {
		return "", err
	}
	argv := append([]string{"podman"}, args...)
	if ns != "" {
		argv = append([]string{"nsenter", "--net=/var/run/netns/" + ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	timer := time.AfterFunc(5*time.Minute, func() { cmd.Process.Kill() })
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// simDaemonSet renders the sim overlay (kustomize's API, as kubectl
// apply -k does) and returns its DaemonSet's pod template and its
// ConfigMap, as generic objects.
func simDaemonSet(t *testing.T) (tmpl, configMap map[string]any) {
	t.Helper()
	out, err := kubernetes.Render("sim")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatal(err)
		}
		switch o["kind"] {
		case "DaemonSet":
			tmpl = o["spec"].(map[string]any)["template"].(map[string]any)
		case "ConfigMap":
			configMap = o
		}
	}
	if tmpl == nil || configMap == nil {
		t.Fatalf("the sim overlay has no DaemonSet or no ConfigMap:\n%s", out)
	}
	return tmpl, configMap
}

// nodePod is the DaemonSet's pod on one node, as podman kube play (4.3,
// Debian's) can run it: a Pod named name with the template's spec,
// except that
//   - its containers run image;
//   - the init containers with restartPolicy Always (sidecars, the
//     keeper) are containers, listed first. podman runs every init
//     container to its end before the containers start, so a sidecar
//     would block the pod.
//   - there are no probes: podman turns them into healthchecks, which
//     need systemd's timers.
//   - its restartPolicy is OnFailure, not a DaemonSet's Always. podman
//     4.3 gives every container the pod's policy, init containers too
//     (playKubePod's ctrRestartPolicy; containers/podman#15631, fixed
//     in 4.6 by #18481), so under Always an init container that ends
//     well is restarted at once, again and again. kube play waits for
//     each init container to end (Pod.startInitContainers, then
//     Container.WaitForExit), and sees it end only if its conmon is
//     found dead between restarts, which arms a 20 s timer: the play
//     took 20 s per init container, or never ended (here: killed after
//     5 minutes, install-cni restarted about 490 times). Under OnFailure an init
//     container that succeeds ends once, as kubelet runs it, and the
//     keeper and eipoibd are still restarted if they fail.
//   - the init containers are of podman's type "always" (run at each
//     start of the pod, kept), not "once" (removed once they end).
//     podman 4.3 races that removal with their exit: "failed to remove
//     once init container ... as it is running",
//     containers/podman#18477.
//   - the node's directories (the hostPath volumes /run/eipoibd and
//     /opt/cni/bin) are the test node's, dirs by path;
//   - its ConfigMap volume is of the node's own ConfigMap, configMap
//     (see nodeConfigMap).
//
// Everything else (commands, arguments, capabilities, the ConfigMap's
// data and the TUN device's volume) is the manifest's.
func nodePod(t *testing.T, tmpl map[string]any, name, image, configMap string, dirs map[string]string) []byte {
	t.Helper()
	b, err := json.Marshal(tmpl["spec"])
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	json.Unmarshal(b, &spec)
	strip := func(c map[string]any) map[string]any {
		c["image"] = image
		delete(c, "restartPolicy")
		delete(c, "startupProbe")
		delete(c, "livenessProbe")
		delete(c, "readinessProbe")
		return c
	}
	var inits, ctrs []any
	for _, c := range spec["initContainers"].([]any) {
		c := c.(map[string]any)
		if c["restartPolicy"] == "Always" {
			ctrs = append(ctrs, strip(c))
		} else {
			inits = append(inits, strip(c))
		}
	}
	for _, c := range spec["containers"].([]any) {
		ctrs = append(ctrs, strip(c.(map[string]any)))
	}
	spec["initContainers"], spec["containers"] = inits, ctrs
	if p, ok := spec["restartPolicy"]; ok && p != "Always" {
		t.Fatalf("the DaemonSet's pod has restartPolicy %v: a DaemonSet's must be Always", p)
	}
	spec["restartPolicy"] = "OnFailure"
	if spec["hostNetwork"] != true {
		t.Fatalf("the DaemonSet's pod is not on the host's network")
	}
	seen := map[string]bool{}
	cms := 0
	for _, v := range spec["volumes"].([]any) {
		if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok {
			cm["name"] = configMap
			cms++
		}
		hp, ok := v.(map[string]any)["hostPath"].(map[string]any)
		if !ok {
			continue
		}
		if d, ok := dirs[hp["path"].(string)]; ok {
			hp["path"] = d
			seen[d] = true
		}
	}
	for p, d := range dirs {
		if !seen[d] {
			t.Fatalf("the DaemonSet has no hostPath volume %s", p)
		}
	}
	if cms != 1 {
		t.Fatalf("the DaemonSet has %d ConfigMap volumes, want 1", cms)
	}
	out, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": tmpl["metadata"].(map[string]any)["labels"],
			"annotations": map[string]any{"io.podman.annotations.init.container.type": "always"}}, "spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// nodeConfigMap is the ConfigMap cm named name, for one node's pod
// alone. podman kube play (4.3) makes a ConfigMap volume a named volume
// called after the ConfigMap, which every pod that plays it on the
// machine shares, and at each play rewrites its files in place, with
// os.Create (which truncates) then Write (playKubePod,
// pkg/domain/infra/abi/play.go). With one ConfigMap for both nodes,
// the second node's play emptied the file under the first node's
// eipoibd while it read it at its start: it read 0 bytes, and (before
// eipoibd refused an empty --config) ran with the defaults. Two pods
// of one ConfigMap on a real cluster never share a file so: kubelet
// gives each pod its own volume and swaps its files in atomically.
func nodeConfigMap(t *testing.T, cm map[string]any, name string) []byte {
	t.Helper()
	meta := map[string]any{}
	for k, v := range cm["metadata"].(map[string]any) {
		meta[k] = v
	}
	meta["name"] = name
	out, err := yaml.Marshal(map[string]any{"apiVersion": cm["apiVersion"], "kind": cm["kind"], "metadata": meta, "data": cm["data"]})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// configMapSettings are the settings of the ConfigMap's eipoibd.toml,
// the --config file of the eipoibd container.
func configMapSettings(t *testing.T, cm map[string]any) map[string]any {
	t.Helper()
	text, ok := cm["data"].(map[string]any)["eipoibd.toml"].(string)
	if !ok {
		t.Fatalf("the ConfigMap has no key eipoibd.toml: %v", cm["data"])
	}
	var m map[string]any
	if _, err := toml.Decode(text, &m); err != nil {
		t.Fatalf("the ConfigMap's eipoibd.toml: %v", err)
	}
	return m
}

// configMismatch says how node h's eipoibd (container ctr) does not
// run with the ConfigMap's settings set, by what shows them outside
// the daemon: bridge (the TAP's master), log-format (its "started"
// line, a JSON object), metrics (an exposition on 127.0.0.1 of its
// port); nil when it does. The control socket (name and ctl-dir) is
// the one the test found. learn shows nothing until a guest's frame
// comes, and eipoibd refuses learn = "declared" without a bridge.
func configMismatch(t *testing.T, h *hypervisor, ctr string, set map[string]any) error {
	t.Helper()
	var why []string
	if l := h.link(t); l.master != set["bridge"] {
		why = append(why, fmt.Sprintf("bridge = %q, but eib0's master is %q", set["bridge"], l.master))
	}
	logs, err := podman(t, h.ns, "logs", ctr)
	started := false
	for _, l := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "started" {
			started = true
		}
	}
	if set["log-format"] == "json" && !started {
		why = append(why, fmt.Sprintf("log-format = \"json\", but its log has no JSON line \"started\" (podman logs: %v):\n%s", err, logs))
	}
	if _, err := h.readMetrics(t); err != nil {
		why = append(why, fmt.Sprintf("metrics = %q, but %v", set["metrics"], err))
	}
	if len(why) > 0 {
		return errors.New(strings.Join(why, "; "))
	}
	return nil
}

// TestImagePod builds the image (make image: scripts/mkimage.sh) and
// runs the DaemonSet's pod of the sim overlay, with podman kube play
// and the manifest's capabilities, on two nodes (network namespaces
// joined by their underlay eth1) with the simulated fabric:
//   - the init container installs the CNI plugin into the node's CNI
//     directory, the one the image holds, of the image's version;
//   - the keeper and eipoibd start: the keeper's socket and the control
//     socket appear in the node's /run/eipoibd, and eipoibd runs with
//     the ConfigMap's settings (each node plays its own copy of the
//     ConfigMap: see nodeConfigMap);
//   - a pod made through that CNI plugin (libcni, the bridge and
//     host-local plugins of Debian's containernetworking-plugins) on
//     each node reaches the other: ping and ping -6 both ways, 1 MB of
//     TCP to the byte;
//   - restarting the eipoibd container (podman restart) leaves the TAP
//     as it was under the keeper: the same interface, carrier on, no
//     carrier change. The pods still reach each other.
func TestImagePod(t *testing.T) {
	require(t, "podman", "runc", "catatonit", "nsenter", "debootstrap", "iperf", "ping", cniDir+"/bridge", cniDir+"/host-local")
	version := script(t, time.Minute, nil, "version.sh")
	// An image of this version that make image built before stays;
	// the one this test builds goes (its base, cached, stays).
	if _, err := podman(t, "", "image", "exists", "localhost/eipoibd:"+version); err != nil {
		t.Cleanup(func() { podman(t, "", "rmi", "localhost/eipoibd:"+version) })
	}
	image := script(t, 30*time.Minute, []string{"VERSION=" + version}, "mkimage.sh")
	if image != "localhost/eipoibd:"+version {
		t.Fatalf("mkimage.sh made %q, want localhost/eipoibd:%s", image, version)
	}
	tmpl, cm := simDaemonSet(t)
	settings := configMapSettings(t, cm)
	if settings["metrics"] != ":9474" {
		t.Fatalf("the ConfigMap's metrics = %q: the test reads 127.0.0.1:9474", settings["metrics"])
	}

	pfx := fmt.Sprintf("e%d%d", os.Getpid()%1000, nsSeq.Add(1))
	logDir := t.TempDir()
	var nodes []*hypervisor
	var cniDirs []string
	for _, n := range []string{"n1", "n2"} {
		h := &hypervisor{name: n, ns: pfx + n, underlay: "eth1", logDir: logDir}
		sh(t, "ip", "netns", "add", h.ns)
		t.Cleanup(func() { shErr("ip", "netns", "delete", h.ns) })
		sh(t, in(h.ns, "ip", "link", "set", "lo", "up")...)
		nodes = append(nodes, h)
	}
	// The simulated fabric's underlay, named as the overlay says.
	sh(t, "ip", "link", "add", "eth1", "netns", nodes[0].ns, "type", "veth", "peer", "name", "eth1", "netns", nodes[1].ns)
	for _, h := range nodes {
		underlayUp(t, h.ns, h.underlay)
		cni := filepath.Join(logDir, h.name+"-cni")
		for _, d := range []string{h.ctlDir(), cni} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cniDirs = append(cniDirs, cni)
		name := pfx + h.name
		podFile, cmFile := filepath.Join(logDir, name+".yaml"), filepath.Join(logDir, name+"-configmap.yaml")
		os.WriteFile(podFile, nodePod(t, tmpl, name, image, name, map[string]string{"/run/eipoibd": h.ctlDir(), "/opt/cni/bin": cni}), 0o644)
		os.WriteFile(cmFile, nodeConfigMap(t, cm, name), 0o644)
		t.Cleanup(func() {
			if t.Failed() {
				for _, c := range []string{"install-cni", "make-bridge", "keeper", "eipoibd"} {
					out, _ := podman(t, h.ns, "logs", "--tail", "30", name+"-"+c)
					t.Logf("%s %s:\n%s", name, c, out)
				}
			}
			podman(t, h.ns, "pod", "rm", "-f", "-t", "2", name)
			podman(t, h.ns, "volume", "rm", "-f", name) // the ConfigMap's
		})
		if out, err := podman(t, h.ns, "kube", "play", "--configmap", cmFile, podFile); err != nil {
			t.Fatalf("podman kube play %s on %s: %v\n%s", podFile, h.name, err, out)
		}
	}

	for i, h := range nodes {
		var out []byte
		waitFor(t, time.Minute, fmt.Sprintf("%s: the CNI plugin installed, the keeper's and the control socket", h.name), func() bool {
			_, e1 := os.Stat(filepath.Join(h.ctlDir(), "keeper.sock"))
			_, e2 := os.Stat(filepath.Join(h.ctlDir(), "eib0.sock"))
			var e3 error
			out, e3 = exec.Command(filepath.Join(cniDirs[i], "eipoib"), "--version").Output()
			return e1 == nil && e2 == nil && e3 == nil
		})
		if got, want := string(out), "eipoib "+version+"\n"; got != want {
			t.Fatalf("%s: the installed plugin says %q, want %q", h.name, got, want)
		}
		waitUntil(t, time.Minute, h.name+": eipoibd running with the ConfigMap's settings", func() error {
			return configMismatch(t, h, pfx+h.name+"-eipoibd", settings)
		})
	}

	// The init containers ran once and ended well (see nodePod's
	// restartPolicy). The containers that keep running run with the
	// manifest's capabilities, and no more: drop ALL, add what it lists.
	for _, h := range nodes {
		for _, c := range append(tmpl["spec"].(map[string]any)["initContainers"].([]any), tmpl["spec"].(map[string]any)["containers"].([]any)...) {
			c := c.(map[string]any)
			ctr := pfx + h.name + "-" + c["name"].(string)
			if c["restartPolicy"] != "Always" && c["name"] != "eipoibd" {
				out, err := podman(t, h.ns, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}", ctr)
				if got := strings.TrimSpace(out); err != nil || got != "exited 0 0" {
					t.Fatalf("init container %s: status, exit code, restarts = %q (%v), want \"exited 0 0\"", ctr, got, err)
				}
				continue
			}
			checkCaps(t, h.ns, ctr, c)
		}
	}

	r1, r2 := newCNIRuntime(t, nodes[0], cniDirs[0]), newCNIRuntime(t, nodes[1], cniDirs[1])
	r1.bridge, r2.bridge = "br-ib", "br-ib"
	l1, l2 := r1.list(t, "ib1", r1.wrap(r1.hostLocal(50, 59))), r2.list(t, "ib2", r2.wrap(r2.hostLocal(60, 69)))
	p1, p2 := r1.add(t, l1, pfx+"p1"), r2.add(t, l2, pfx+"p2")
	reach := func(t *testing.T) {
		ping(t, p1.g, p2.g.ip4)
		ping(t, p1.g, p2.g.ip6)
		ping(t, p2.g, p1.g.ip4)
		ping(t, p2.g, p1.g.ip6)
		tcpBytes(t, p2.g, p1.g, 1000000)
	}
	t.Run("reach", reach)

	t.Run("restart", func(t *testing.T) {
		h := nodes[0]
		ctr := pfx + h.name + "-eipoibd"
		pid := func() string {
			out, err := podman(t, h.ns, "inspect", "--format", "{{.State.Pid}}", ctr)
			if err != nil {
				t.Fatalf("podman inspect %s: %v\n%s", ctr, err, out)
			}
			return strings.TrimSpace(out)
		}
		before, pid0 := h.link(t), pid()
		if !before.carrier {
			t.Fatalf("eib0 has no carrier before the restart: %+v", before)
		}
		if out, err := podman(t, h.ns, "restart", "-t", "10", ctr); err != nil {
			t.Fatalf("podman restart %s: %v\n%s", ctr, err, out)
		}
		if pid1 := pid(); pid1 == pid0 || pid1 == "0" {
			t.Fatalf("the eipoibd container's process is %s, was %s: not restarted", pid1, pid0)
		}
		waitFor(t, time.Minute, "the restarted eipoibd answering on its control socket", func() bool {
			_, err := exec.Command(daemonBin, "show", "port", "--ctl-dir", h.ctlDir()).Output()
			return err == nil
		})
		waitUntil(t, time.Minute, "the restarted eipoibd running with the ConfigMap's settings", func() error {
			return configMismatch(t, h, ctr, settings)
		})
		if after := h.link(t); after != before {
			t.Fatalf("eib0 across the restart: %+v, was %+v (want the same interface, carrier and carrier changes)", after, before)
		}
		reach(t)
	})
}

// capBits are the capabilities the manifests add, by their number
// (linux/capability.h).
var capBits = map[string]uint{"NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14}

// checkCaps fails unless container ctr's process has exactly the
// effective capabilities that the manifest's container c adds, after
// dropping ALL.
func checkCaps(t *testing.T, ns, ctr string, c map[string]any) {
	t.Helper()
	caps, _ := c["securityContext"].(map[string]any)["capabilities"].(map[string]any)
	if drop, _ := caps["drop"].([]any); len(drop) != 1 || drop[0] != "ALL" {
		t.Fatalf("%s: the manifest drops %v, want ALL", ctr, caps["drop"])
	}
	var want uint64
	add, _ := caps["add"].([]any)
	for _, a := range add {
		bit, ok := capBits[a.(string)]
		if !ok {
			t.Fatalf("%s: capability %v: not in capBits", ctr, a)
		}
		want |= 1 << bit
	}
	out, err := podman(t, ns, "inspect", "--format", "{{.State.Pid}}", ctr)
	if err != nil {
		t.Fatalf("podman inspect %s: %v\n%s", ctr, err, out)
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(out) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var got uint64
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			got, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	if err != nil || got != want {
		t.Errorf("%s runs with capabilities %#x (%v), want %#x (%v)", ctr, got, err, want, add)
	}
}

// waitFor polls cond every 250 ms until it holds, and fails the test
// naming what it waited for when it still does not after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	waitUntil(t, within, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// errNotYet is waitFor's condition not holding yet.
var errNotYet = errors.New("not yet")

// waitUntil polls check every 250 ms until it returns nil, and fails
// the test naming what it waited for, and check's last error, when it
// still has not after within.
func waitUntil(t *testing.T, within time.Duration, what string, check func() error) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(250 * time.Millisecond) {
		err := check()
		switch {
		case err == nil:
			return
		case !time.Now().After(deadline):
		case err == errNotYet:
			t.Fatalf("no %s after %v", what, within)
		default:
			t.Fatalf("no %s after %v: %v", what, within, err)
		}
	}
}
