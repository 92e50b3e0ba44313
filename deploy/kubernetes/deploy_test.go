package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/containernetworking/cni/libcni"
	"sigs.k8s.io/yaml"
)

// object is the part of a Kubernetes object the test reads.
type object struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metadata          `json:"metadata"`
	Data       map[string]string `json:"data"`
	Spec       json.RawMessage   `json:"spec"`
}

type metadata struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Namespace   string            `json:"namespace"`
	Annotations map[string]string `json:"annotations"`
}

type podSpec struct {
	HostNetwork    bool        `json:"hostNetwork"`
	InitContainers []container `json:"initContainers"`
	Containers     []container `json:"containers"`
	Volumes        []struct {
		Name     string `json:"name"`
		HostPath *struct {
			Path string `json:"path"`
			Type string `json:"type"`
		} `json:"hostPath"`
	} `json:"volumes"`
}

type container struct {
	Name            string   `json:"name"`
	Image           string   `json:"image"`
	ImagePullPolicy string   `json:"imagePullPolicy"`
	Command         []string `json:"command"`
	Args            []string `json:"args"`
	RestartPolicy   string   `json:"restartPolicy"`
	SecurityContext struct {
		Privileged   *bool `json:"privileged"`
		Capabilities struct {
			Add  []string `json:"add"`
			Drop []string `json:"drop"`
		} `json:"capabilities"`
	} `json:"securityContext"`
	Resources struct {
		Requests map[string]json.RawMessage `json:"requests"`
		Limits   map[string]json.RawMessage `json:"limits"`
	} `json:"resources"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

// parse parses every document of a YAML stream, strictly (an unknown
// field of the test's types is no error: they read a part).
func parse(t *testing.T, what string, b []byte) []object {
	t.Helper()
	var out []object
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s, document %d: %v", what, i+1, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Fatalf("%s, document %d: apiVersion %q, kind %q, name %q: want all three", what, i+1, o.APIVersion, o.Kind, o.Metadata.Name)
		}
		out = append(out, o)
	}
	return out
}

// load parses the examples here (the networks, the pod, the VMs), by
// file name.
func load(t *testing.T) map[string][]object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files: %v", err)
	}
	out := map[string][]object{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = parse(t, f, b)
	}
	return out
}

// render renders an overlay (Render) and parses its objects.
func render(t *testing.T, overlay string) []object {
	t.Helper()
	b, err := Render(overlay)
	if err != nil {
		t.Fatalf("overlay %s: %v", overlay, err)
	}
	return parse(t, "overlay "+overlay, b)
}

// byKind returns the one object of the kind, failing unless there is
// exactly one.
func byKind(t *testing.T, objs []object, kind string) object {
	t.Helper()
	var found []object
	for _, o := range objs {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s, want 1 (%v)", len(found), kind, kinds(objs))
	}
	return found[0]
}

func kinds(objs []object) []string {
	var k []string
	for _, o := range objs {
		k = append(k, o.APIVersion+" "+o.Kind)
	}
	return k
}

// runFlags are the flags of "eipoibd run": docs/eipoibd.toml lists each
// as a key (cmd/eipoibd's TestReferenceConfig keeps it so), and config.
func runFlags(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if _, err := toml.DecodeFile("../../docs/eipoibd.toml", &m); err != nil {
		t.Fatal(err)
	}
	m["config"] = ""
	return m
}

// flagNames returns the flag names of args ("--name value" or
// "--name=value"), failing on a word that is neither a flag nor a value
// after one.
func flagNames(t *testing.T, args []string) []string {
	t.Helper()
	var names []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			t.Fatalf("%v: %q is not a flag", args, a)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		names = append(names, name)
		if !hasValue && name != "persist" && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
		}
	}
	return names
}

// backend is what an overlay must give the eipoibd container.
type backend struct {
	command    string   // the binary
	fabric     []string // the flags the overlay adds, in order
	caps       []string // capabilities added, sorted
	privileged bool
	infiniband bool // /dev/infiniband mounted and the RDMA resource requested
}

var backends = map[string]backend{
	"sim":    {command: "eipoibd", fabric: []string{"--fabric=sim", "--underlay=eth1"}, caps: []string{"NET_ADMIN"}},
	"kernel": {command: "eipoibd", fabric: []string{"--fabric=kernel", "--ib-dev=ib0"}, caps: []string{"NET_ADMIN", "NET_RAW"}, privileged: true},
	"verbs":  {command: "eipoibd-verbs", fabric: []string{"--fabric=verbs", "--ib-dev=mlx5_0"}, caps: []string{"IPC_LOCK", "NET_ADMIN"}, infiniband: true},
}

// baseImage returns the image base/kustomization.yaml names, the one
// place it is set: newName:newTag of its one images entry.
func baseImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("base/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Images []struct {
			Name, NewName, NewTag string
		} `json:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) != 1 || k.Images[0].Name != "eipoibd" || k.Images[0].NewName == "" || k.Images[0].NewTag == "" || k.Images[0].NewTag == "latest" {
		t.Fatalf("base/kustomization.yaml images %+v: want one entry for eipoibd with a name and a version tag", k.Images)
	}
	return k.Images[0].NewName + ":" + k.Images[0].NewTag
}

// TestOverlays renders each overlay with kustomize's API and checks its
// Namespace, ConfigMap and DaemonSet:
//   - the Namespace carries pod-security.kubernetes.io/enforce:
//     privileged;
//   - every container runs the image of base/kustomization.yaml (name
//     and version tag) with imagePullPolicy IfNotPresent, and ":latest"
//     is nowhere in the output;
//   - the eipoibd container runs the backend's binary with its fabric
//     flags, its capabilities (all dropped, then exactly the backend's
//     set) and privileged only for the kernel backend;
//   - /dev/infiniband is mounted (hostPath with no type, which never
//     holds the pod back) and the RDMA resource requested by the verbs
//     overlay only: nothing of either in sim and kernel;
//   - the DaemonSet's pods run on the host network;
//   - every flag of the command line and every key of the ConfigMap's
//     eipoibd.toml is one of "eipoibd run", with the type of
//     docs/eipoibd.toml's value;
//   - the keeper sidecar runs "eipoibd keeper" on the socket the
//     daemon's --fd-store names;
//   - /run/eipoibd and /dev/net/tun come from the host;
//   - the install-cni init container copies the plugin into the host's
//     /opt/cni/bin.
func TestOverlays(t *testing.T) {
	image := baseImage(t)
	ref := runFlags(t)
	if len(Overlays) != len(backends) {
		t.Fatalf("Overlays %v, the test knows %d backends", Overlays, len(backends))
	}
	for _, name := range Overlays {
		t.Run(name, func(t *testing.T) {
			want, ok := backends[name]
			if !ok {
				t.Fatalf("no backend %s", name)
			}
			raw, err := Render(name)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(raw, []byte(":latest")) {
				t.Errorf("the output names a :latest image")
			}
			objs := render(t, name)
			if got := slices.Sorted(slices.Values(kinds(objs))); !slices.Equal(got, []string{"apps/v1 DaemonSet", "v1 ConfigMap", "v1 Namespace"}) {
				t.Fatalf("objects %v, want a Namespace, a ConfigMap and a DaemonSet", got)
			}
			ns := byKind(t, objs, "Namespace")
			if ns.Metadata.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
				t.Errorf("Namespace %s labels %v: want pod-security.kubernetes.io/enforce=privileged", ns.Metadata.Name, ns.Metadata.Labels)
			}
			checkDaemonSet(t, byKind(t, objs, "ConfigMap"), byKind(t, objs, "DaemonSet"), ns.Metadata.Name, image, want, ref)
		})
	}
}

func checkDaemonSet(t *testing.T, cm, dsObj object, namespace, image string, want backend, ref map[string]any) {
	t.Helper()
	conf := map[string]any{}
	if _, err := toml.Decode(cm.Data["eipoibd.toml"], &conf); err != nil || len(conf) == 0 {
		t.Fatalf("ConfigMap eipoibd.toml: %v (%d keys)", err, len(conf))
	}
	for k, v := range conf {
		if d, ok := ref[k]; !ok || reflect.TypeOf(d) != reflect.TypeOf(v) {
			t.Errorf("ConfigMap eipoibd.toml: key %s = %v (%T): eipoibd run has %v (%T)", k, v, v, d, d)
		}
	}
	if cm.Metadata.Namespace != namespace || dsObj.Metadata.Namespace != namespace {
		t.Errorf("ConfigMap in %q, DaemonSet in %q: want the Namespace %q", cm.Metadata.Namespace, dsObj.Metadata.Namespace, namespace)
	}
	var ds struct {
		Template struct {
			Spec podSpec `json:"spec"`
		} `json:"template"`
	}
	if err := json.Unmarshal(dsObj.Spec, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Template.Spec
	if !spec.HostNetwork {
		t.Error("the DaemonSet's pods are not on the host network")
	}
	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	byName := map[string]container{}
	for _, c := range all {
		byName[c.Name] = c
		if c.Image != image || c.ImagePullPolicy != "IfNotPresent" {
			t.Errorf("container %s: image %q, pull policy %q: want %q, IfNotPresent", c.Name, c.Image, c.ImagePullPolicy, image)
		}
	}
	if len(all) != 4 {
		t.Errorf("%d containers, want install-cni, make-bridge, keeper and eipoibd", len(all))
	}
	d, k := byName["eipoibd"], byName["keeper"]
	if !slices.Equal(d.Command, []string{want.command}) {
		t.Errorf("eipoibd container: command %v, want %s", d.Command, want.command)
	}
	if len(d.Args) == 0 || d.Args[0] != "run" {
		t.Fatalf("eipoibd container: args %v, want run ...", d.Args)
	}
	if len(d.Args) < len(want.fabric) || !slices.Equal(d.Args[len(d.Args)-len(want.fabric):], want.fabric) {
		t.Errorf("eipoibd container: args %v, want them to end in %v", d.Args, want.fabric)
	}
	flagValue := map[string]string{}
	for _, f := range flagNames(t, d.Args[1:]) {
		if _, ok := ref[f]; !ok {
			t.Errorf("eipoibd container: --%s is no flag of eipoibd run", f)
		}
	}
	for i, a := range d.Args {
		if strings.HasPrefix(a, "--") && i+1 < len(d.Args) {
			flagValue[strings.TrimPrefix(a, "--")] = d.Args[i+1]
		}
	}
	if !slices.Contains(d.Args, "--persist") || flagValue["config"] != "/etc/eipoibd/eipoibd.toml" {
		t.Errorf("eipoibd container: args %v, want --persist and --config /etc/eipoibd/eipoibd.toml", d.Args)
	}
	caps := d.SecurityContext.Capabilities
	privileged := d.SecurityContext.Privileged != nil && *d.SecurityContext.Privileged
	if add := slices.Sorted(slices.Values(caps.Add)); !slices.Equal(add, want.caps) || !slices.Equal(caps.Drop, []string{"ALL"}) || privileged != want.privileged {
		t.Errorf("eipoibd container: capabilities add %v drop %v, privileged %v: want add %v drop [ALL], privileged %v", caps.Add, caps.Drop, privileged, want.caps, want.privileged)
	}
	for _, c := range all {
		if c.Name != "eipoibd" && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			t.Errorf("container %s is privileged", c.Name)
		}
	}
	if len(k.Args) < 1 || k.Args[0] != "keeper" || k.RestartPolicy != "Always" {
		t.Fatalf("keeper: args %v, restartPolicy %q: want a sidecar running keeper", k.Args, k.RestartPolicy)
	}
	if sock := flagValue["fd-store"]; sock == "" || !slices.Equal(k.Args, []string{"keeper", "--socket", sock}) {
		t.Errorf("keeper args %v, eipoibd --fd-store %q: want the same socket", k.Args, sock)
	}
	hostPaths := map[string]string{}
	hostPathTypes := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
			hostPathTypes[v.HostPath.Path] = v.HostPath.Type
		}
	}
	mounts := func(c container) map[string]string {
		m := map[string]string{}
		for _, vm := range c.VolumeMounts {
			m[vm.MountPath] = hostPaths[vm.Name]
		}
		return m
	}
	for _, want := range []struct {
		c          container
		path, host string
	}{{d, "/run/eipoibd", "/run/eipoibd"}, {k, "/run/eipoibd", "/run/eipoibd"},
		{d, "/dev/net/tun", "/dev/net/tun"}, {byName["install-cni"], "/host/opt/cni/bin", "/opt/cni/bin"}} {
		if got := mounts(want.c)[want.path]; got != want.host {
			t.Errorf("container %s: %s is the host's %q, want %q", want.c.Name, want.path, got, want.host)
		}
	}
	// /dev/infiniband and the RDMA resource: the verbs backend's only.
	typ, ibVolume := hostPathTypes["/dev/infiniband"]
	ibMount := mounts(d)["/dev/infiniband"] == "/dev/infiniband"
	var rdma []string
	for _, c := range all {
		for _, res := range []map[string]json.RawMessage{c.Resources.Requests, c.Resources.Limits} {
			for r, n := range res {
				if strings.HasPrefix(r, "rdma/") {
					rdma = append(rdma, c.Name+" "+r+"="+string(n))
				}
			}
		}
	}
	if want.infiniband {
		if !ibVolume || !ibMount || typ != "" {
			t.Errorf("/dev/infiniband: volume %v (type %q), mounted in eipoibd %v: want a hostPath of no type, mounted", ibVolume, typ, ibMount)
		}
		if !slices.Equal(rdma, []string{"eipoibd rdma/hca_shared_devices_a=1"}) {
			t.Errorf("RDMA resources %v: want eipoibd's rdma/hca_shared_devices_a=1", rdma)
		}
	} else if ibVolume || ibMount || len(rdma) != 0 {
		t.Errorf("/dev/infiniband volume %v, mount %v, RDMA resources %v: want none on a backend without InfiniBand devices", ibVolume, ibMount, rdma)
	}
	if cmd := strings.Join(byName["install-cni"].Command, " "); !strings.Contains(cmd, "/host/opt/cni/bin/eipoib") {
		t.Errorf("install-cni: %q does not install /opt/cni/bin/eipoib", cmd)
	}
	if cmd := strings.Join(byName["make-bridge"].Command, " "); !strings.Contains(cmd, fmt.Sprintf("ip link add %s type bridge", conf["bridge"])) {
		t.Errorf("make-bridge: %q does not create the bridge %v of the ConfigMap", cmd, conf["bridge"])
	}
}

// TestNetworks: network.yaml holds NetworkAttachmentDefinitions whose
// config is a CNI network list (libcni parses it) of bridge then eipoib.
// They use the ConfigMap's bridge, TAP and control socket directory.
// libcni runs them at spec 1.1.0 (its "cniVersions"), older runtimes at
// 1.0.0 ("cniVersion"). Bridge's IPAM is empty (layer 2) or eipoib
// wrapping a real IPAM, host-local with an IPv4 and an IPv6 range.
func TestNetworks(t *testing.T) {
	all := load(t)
	var conf map[string]any
	if _, err := toml.Decode(byKind(t, render(t, "sim"), "ConfigMap").Data["eipoibd.toml"], &conf); err != nil {
		t.Fatal(err)
	}
	nads := all["network.yaml"]
	if len(nads) == 0 {
		t.Fatal("network.yaml holds no document")
	}
	for _, o := range nads {
		if o.APIVersion != "k8s.cni.cncf.io/v1" || o.Kind != "NetworkAttachmentDefinition" {
			t.Fatalf("network.yaml: %s %s, want NetworkAttachmentDefinitions", o.APIVersion, o.Kind)
		}
		var spec struct {
			Config string `json:"config"`
		}
		if err := json.Unmarshal(o.Spec, &spec); err != nil {
			t.Fatal(err)
		}
		list, err := libcni.NetworkConfFromBytes([]byte(spec.Config))
		if err != nil {
			t.Fatalf("%s: config: %v", o.Metadata.Name, err)
		}
		var types []string
		for _, p := range list.Plugins {
			types = append(types, p.Network.Type)
		}
		var versions struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal([]byte(spec.Config), &versions); err != nil {
			t.Fatalf("%s: config: %v", o.Metadata.Name, err)
		}
		if !slices.Equal(types, []string{"bridge", "eipoib"}) || list.CNIVersion != "1.1.0" || versions.CNIVersion != "1.0.0" || list.Name != o.Metadata.Name {
			t.Fatalf("%s: plugins %v, cniVersion %s (libcni's choice) and %s, name %s: want bridge then eipoib, 1.1.0 and 1.0.0, the object's name",
				o.Metadata.Name, types, list.CNIVersion, versions.CNIVersion, list.Name)
		}
		var br struct {
			Bridge string          `json:"bridge"`
			IPAM   json.RawMessage `json:"ipam"`
		}
		if err := json.Unmarshal(list.Plugins[0].Bytes, &br); err != nil {
			t.Fatalf("network.yaml %s: %v", o.Metadata.Name, err)
		}
		var own eipoibKeys
		if err := json.Unmarshal(list.Plugins[1].Bytes, &own); err != nil {
			t.Fatalf("%s: chained eipoib: %v", o.Metadata.Name, err)
		}
		if br.Bridge != conf["bridge"] {
			t.Errorf("%s: bridge %q, the ConfigMap's %v", o.Metadata.Name, br.Bridge, conf["bridge"])
		}
		own.check(t, o.Metadata.Name+" (chained eipoib)", conf)
		// The chained plugin's DEL, while eipoibd does not answer, looks
		// for its --persist state file.
		if own.StateDir != conf["state-dir"] {
			t.Errorf("%s (chained eipoib): stateDir %q, the ConfigMap's state-dir %v", o.Metadata.Name, own.StateDir, conf["state-dir"])
		}
		var wrap struct {
			eipoibKeys
			IPAM *struct {
				Type   string `json:"type"`
				Ranges [][]struct {
					Subnet netip.Prefix `json:"subnet"`
				} `json:"ranges"`
			} `json:"ipam"`
		}
		if err := json.Unmarshal(br.IPAM, &wrap); err != nil {
			t.Fatalf("%s: bridge's ipam: %v", o.Metadata.Name, err)
		}
		switch wrap.Type {
		case "":
		case "eipoib":
			wrap.check(t, o.Metadata.Name+" (eipoib as bridge's IPAM)", conf)
			if wrap.IPAM == nil || wrap.IPAM.Type == "" || wrap.IPAM.Type == "eipoib" {
				t.Fatalf("%s: eipoib as bridge's IPAM wraps %+v, want a real IPAM", o.Metadata.Name, wrap.IPAM)
			}
			if wrap.IPAM.Type == "host-local" {
				var families []string
				for _, set := range wrap.IPAM.Ranges {
					for _, r := range set {
						families = append(families, map[bool]string{true: "IPv4", false: "IPv6"}[r.Subnet.Addr().Is4()])
					}
				}
				if !slices.Equal(families, []string{"IPv4", "IPv6"}) {
					t.Errorf("%s: host-local's ranges are %v, want one IPv4 and one IPv6", o.Metadata.Name, families)
				}
			}
		default:
			t.Errorf("%s: bridge's IPAM %q: want none or eipoib wrapping it (the MAC declared before the address is asked for)", o.Metadata.Name, wrap.Type)
		}
	}
}

// eipoibKeys are the eipoib plugin's own keys.
type eipoibKeys struct {
	Type      string `json:"type"`
	TAP       string `json:"tap"`
	SocketDir string `json:"socketDir"`
	StateDir  string `json:"stateDir"`
	VLAN      int    `json:"vlan"`
}

// check fails the test unless the keys name the ConfigMap's daemon.
func (k eipoibKeys) check(t *testing.T, what string, conf map[string]any) {
	t.Helper()
	if k.Type != "eipoib" || k.TAP != conf["name"] || k.SocketDir != conf["ctl-dir"] || k.VLAN != 0 {
		t.Errorf("%s: %+v, want type eipoib, tap %v, socketDir %v, vlan 0", what, k, conf["name"], conf["ctl-dir"])
	}
}

// TestWorkloads: the pod's Multus annotation and the KubeVirt VM's
// multus network name networks of network.yaml, and the VM's interface
// on it uses bridge binding.
func TestWorkloads(t *testing.T) {
	all := load(t)
	nads := map[string]bool{}
	for _, o := range all["network.yaml"] {
		nads[o.Metadata.Namespace+"/"+o.Metadata.Name] = true
	}
	pod := all["pod.yaml"]
	if len(pod) != 1 || pod[0].Kind != "Pod" || !nads[pod[0].Metadata.Namespace+"/"+pod[0].Metadata.Annotations["k8s.v1.cni.cncf.io/networks"]] {
		t.Errorf("pod.yaml: %v, want a Pod whose k8s.v1.cni.cncf.io/networks names one of %v", pod, nads)
	}
	vm := all["kubevirt-vm.yaml"]
	if len(vm) != 1 || vm[0].APIVersion != "kubevirt.io/v1" || vm[0].Kind != "VirtualMachine" {
		t.Fatalf("kubevirt-vm.yaml: %v, want one kubevirt.io/v1 VirtualMachine", kinds(vm))
	}
	var spec vmSpec
	if err := json.Unmarshal(vm[0].Spec, &spec); err != nil {
		t.Fatal(err)
	}
	bridged := 0
	for _, n := range spec.Template.Spec.Networks {
		if n.Multus == nil {
			continue
		}
		if !nads[n.Multus.NetworkName] {
			t.Errorf("VM network %s: multus network %q is none of %v", n.Name, n.Multus.NetworkName, nads)
		}
		for _, i := range spec.Template.Spec.Domain.Devices.Interfaces {
			if i.Name == n.Name && i.Bridge != nil {
				bridged++
			}
		}
	}
	if bridged != 1 {
		t.Errorf("VM: %d interfaces with bridge binding on a network of network.yaml, want 1", bridged)
	}
}

// vmSpec is the part of a KubeVirt VirtualMachine's spec the tests read.
type vmSpec struct {
	Template struct {
		Metadata metadata `json:"metadata"`
		Spec     struct {
			EvictionStrategy string `json:"evictionStrategy"`
			Domain           struct {
				Devices struct {
					Interfaces []struct {
						Name       string    `json:"name"`
						Bridge     *struct{} `json:"bridge"`
						Masquerade *struct{} `json:"masquerade"`
						MACAddress string    `json:"macAddress"`
					} `json:"interfaces"`
				} `json:"devices"`
			} `json:"domain"`
			Networks []struct {
				Name   string    `json:"name"`
				Pod    *struct{} `json:"pod"`
				Multus *struct {
					NetworkName string `json:"networkName"`
				} `json:"multus"`
			} `json:"networks"`
		} `json:"spec"`
	} `json:"template"`
}

// TestMigration: kubevirt-migration.yaml holds a VirtualMachine that
// KubeVirt lets migrate and eipoibd keeps serving where it lands, and a
// VirtualMachineInstanceMigration of it. The VM's eviction is by live
// migration. Its pod network is bound by masquerade, or by bridge with
// the annotation kubevirt.io/allow-pod-bridge-network-live-migration on
// its template (KubeVirt's VerifyVMIMigratable). Each interface on a
// network of network.yaml is bound by bridge with a fixed macAddress,
// and that network's bridge plugin takes the MAC (the "mac" capability).
// So the target node's pod declares the guest's own MAC.
func TestMigration(t *testing.T) {
	all := load(t)
	nadMAC := map[string]bool{}
	for _, o := range all["network.yaml"] {
		var spec struct {
			Config string `json:"config"`
		}
		if err := json.Unmarshal(o.Spec, &spec); err != nil {
			t.Fatalf("network.yaml %s: %v", o.Metadata.Name, err)
		}
		list, err := libcni.NetworkConfFromBytes([]byte(spec.Config))
		if err != nil {
			t.Fatal(err)
		}
		var br struct {
			Capabilities map[string]bool `json:"capabilities"`
		}
		if err := json.Unmarshal(list.Plugins[0].Bytes, &br); err != nil {
			t.Fatalf("network.yaml %s: %v", o.Metadata.Name, err)
		}
		nadMAC[o.Metadata.Namespace+"/"+o.Metadata.Name] = br.Capabilities["mac"]
	}
	objs := all["kubevirt-migration.yaml"]
	if got := kinds(objs); !slices.Equal(got, []string{"kubevirt.io/v1 VirtualMachine", "kubevirt.io/v1 VirtualMachineInstanceMigration"}) {
		t.Fatalf("kubevirt-migration.yaml holds %v, want a VirtualMachine and its migration", got)
	}
	var vm vmSpec
	if err := json.Unmarshal(objs[0].Spec, &vm); err != nil {
		t.Fatal(err)
	}
	var mig struct {
		VMIName string `json:"vmiName"`
	}
	if err := json.Unmarshal(objs[1].Spec, &mig); err != nil {
		t.Fatal(err)
	}
	if mig.VMIName != objs[0].Metadata.Name || objs[1].Metadata.Namespace != objs[0].Metadata.Namespace {
		t.Errorf("the migration moves %s/%s, want the VM %s/%s", objs[1].Metadata.Namespace, mig.VMIName, objs[0].Metadata.Namespace, objs[0].Metadata.Name)
	}
	spec := vm.Template.Spec
	if spec.EvictionStrategy != "LiveMigrate" {
		t.Errorf("evictionStrategy %q, want LiveMigrate", spec.EvictionStrategy)
	}
	_, annotated := vm.Template.Metadata.Annotations["kubevirt.io/allow-pod-bridge-network-live-migration"]
	onFabric := 0
	for _, n := range spec.Networks {
		for _, i := range spec.Domain.Devices.Interfaces {
			if i.Name != n.Name {
				continue
			}
			switch {
			case n.Pod != nil:
				if i.Masquerade == nil && (i.Bridge == nil || !annotated) {
					t.Errorf("pod network %s: neither masquerade nor bridge with the annotation: KubeVirt does not migrate it", n.Name)
				}
			case n.Multus != nil:
				mac, err := net.ParseMAC(i.MACAddress)
				if i.Bridge == nil || err != nil || mac[0]&3 != 2 {
					t.Errorf("interface %s: bridge %v, macAddress %q: want bridge binding and a locally administered unicast MAC", n.Name, i.Bridge != nil, i.MACAddress)
				}
				if takes, ok := nadMAC[n.Multus.NetworkName]; !ok || !takes {
					t.Errorf("interface %s: network %q is none of network.yaml's or its bridge plugin has no mac capability (%v)", n.Name, n.Multus.NetworkName, nadMAC)
				}
				onFabric++
			}
		}
	}
	if onFabric != 1 {
		t.Errorf("%d interfaces on the fabric's networks, want 1", onFabric)
	}
}
