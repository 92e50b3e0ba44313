// Package kubernetes holds the Kubernetes deployment files (eipoibd's
// DaemonSet, the Multus networks, a pod and a KubeVirt VM) and the test
// that checks them without a cluster: there is no Kubernetes on the
// project's machines, so they are parsed and cross-checked, not
// deployed.
package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
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
		} `json:"hostPath"`
	} `json:"volumes"`
}

type container struct {
	Name            string   `json:"name"`
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
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

// load parses every document of every YAML file here, strictly (an
// unknown field of the test's types is no error: they read a part).
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
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			var o object
			if err := yaml.Unmarshal(doc, &o); err != nil {
				t.Fatalf("%s, document %d: %v", f, i+1, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s, document %d: apiVersion %q, kind %q, name %q: want all three", f, i+1, o.APIVersion, o.Kind, o.Metadata.Name)
			}
			out[f] = append(out[f], o)
		}
	}
	return out
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

// TestDaemonSet: eipoibd.yaml holds a Namespace, a ConfigMap and a
// DaemonSet; the DaemonSet runs on the host network with the eipoibd
// container given exactly NET_ADMIN and IPC_LOCK (all else dropped, not
// privileged), every flag of its command line and every key of the
// ConfigMap's eipoibd.toml is one of "eipoibd run" (with the type of
// docs/eipoibd.toml's value), the keeper sidecar runs "eipoibd keeper"
// on the socket the daemon's --fd-store names, /run/eipoibd and
// /dev/infiniband come from the host, and the install-cni init
// container copies the plugin into the host's /opt/cni/bin.
func TestDaemonSet(t *testing.T) {
	objs := load(t)["eipoibd.yaml"]
	if got, want := kinds(objs), []string{"v1 Namespace", "v1 ConfigMap", "apps/v1 DaemonSet"}; !slices.Equal(got, want) {
		t.Fatalf("eipoibd.yaml holds %v, want %v", got, want)
	}
	ref := runFlags(t)
	conf := map[string]any{}
	if _, err := toml.Decode(objs[1].Data["eipoibd.toml"], &conf); err != nil || len(conf) == 0 {
		t.Fatalf("ConfigMap eipoibd.toml: %v (%d keys)", err, len(conf))
	}
	for k, v := range conf {
		if d, ok := ref[k]; !ok || reflect.TypeOf(d) != reflect.TypeOf(v) {
			t.Errorf("ConfigMap eipoibd.toml: key %s = %v (%T): eipoibd run has %v (%T)", k, v, v, d, d)
		}
	}
	var ds struct {
		Template struct {
			Spec podSpec `json:"spec"`
		} `json:"template"`
	}
	if err := json.Unmarshal(objs[2].Spec, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Template.Spec
	if !spec.HostNetwork {
		t.Error("the DaemonSet's pods are not on the host network")
	}
	byName := map[string]container{}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		byName[c.Name] = c
	}
	d, k := byName["eipoibd"], byName["keeper"]
	if len(d.Args) == 0 || d.Args[0] != "run" {
		t.Fatalf("eipoibd container: args %v, want run ...", d.Args)
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
	if add := slices.Sorted(slices.Values(caps.Add)); !slices.Equal(add, []string{"IPC_LOCK", "NET_ADMIN"}) || !slices.Equal(caps.Drop, []string{"ALL"}) ||
		(d.SecurityContext.Privileged != nil && *d.SecurityContext.Privileged) {
		t.Errorf("eipoibd container: capabilities add %v drop %v, privileged %v: want NET_ADMIN and IPC_LOCK only", caps.Add, caps.Drop, d.SecurityContext.Privileged)
	}
	if len(k.Args) < 1 || k.Args[0] != "keeper" || k.RestartPolicy != "Always" {
		t.Fatalf("keeper: args %v, restartPolicy %q: want a sidecar running keeper", k.Args, k.RestartPolicy)
	}
	if sock := flagValue["fd-store"]; sock == "" || !slices.Equal(k.Args, []string{"keeper", "--socket", sock}) {
		t.Errorf("keeper args %v, eipoibd --fd-store %q: want the same socket", k.Args, sock)
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
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
	}{{d, "/run/eipoibd", "/run/eipoibd"}, {k, "/run/eipoibd", "/run/eipoibd"}, {d, "/dev/infiniband", "/dev/infiniband"},
		{d, "/dev/net/tun", "/dev/net/tun"}, {byName["install-cni"], "/host/opt/cni/bin", "/opt/cni/bin"}} {
		if got := mounts(want.c)[want.path]; got != want.host {
			t.Errorf("container %s: %s is the host's %q, want %q", want.c.Name, want.path, got, want.host)
		}
	}
	if cmd := strings.Join(byName["install-cni"].Command, " "); !strings.Contains(cmd, "/host/opt/cni/bin/eipoib") {
		t.Errorf("install-cni: %q does not install /opt/cni/bin/eipoib", cmd)
	}
	if cmd := strings.Join(byName["make-bridge"].Command, " "); !strings.Contains(cmd, fmt.Sprintf("ip link add %s type bridge", conf["bridge"])) {
		t.Errorf("make-bridge: %q does not create the bridge %v of the ConfigMap", cmd, conf["bridge"])
	}
}

// TestNetworks: network.yaml holds NetworkAttachmentDefinitions whose
// config is a CNI network list (libcni parses it) of bridge then eipoib,
// on the ConfigMap's bridge, TAP and control socket directory, run at
// spec 1.1.0 by libcni (its "cniVersions") and at 1.0.0 by older
// runtimes ("cniVersion"); bridge's IPAM is empty (layer 2) or eipoib
// wrapping a real IPAM, host-local with an IPv4 and an IPv6 range.
func TestNetworks(t *testing.T) {
	all := load(t)
	var conf map[string]any
	if _, err := toml.Decode(all["eipoibd.yaml"][1].Data["eipoibd.toml"], &conf); err != nil {
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
		json.Unmarshal([]byte(spec.Config), &versions)
		if !slices.Equal(types, []string{"bridge", "eipoib"}) || list.CNIVersion != "1.1.0" || versions.CNIVersion != "1.0.0" || list.Name != o.Metadata.Name {
			t.Fatalf("%s: plugins %v, cniVersion %s (libcni's choice) and %s, name %s: want bridge then eipoib, 1.1.0 and 1.0.0, the object's name",
				o.Metadata.Name, types, list.CNIVersion, versions.CNIVersion, list.Name)
		}
		var br struct {
			Bridge string          `json:"bridge"`
			IPAM   json.RawMessage `json:"ipam"`
		}
		json.Unmarshal(list.Plugins[0].Bytes, &br)
		var own eipoibKeys
		json.Unmarshal(list.Plugins[1].Bytes, &own)
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
	var spec struct {
		Template struct {
			Spec struct {
				Domain struct {
					Devices struct {
						Interfaces []struct {
							Name   string    `json:"name"`
							Bridge *struct{} `json:"bridge"`
						} `json:"interfaces"`
					} `json:"devices"`
				} `json:"domain"`
				Networks []struct {
					Name   string `json:"name"`
					Multus *struct {
						NetworkName string `json:"networkName"`
					} `json:"multus"`
				} `json:"networks"`
			} `json:"spec"`
		} `json:"template"`
	}
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
