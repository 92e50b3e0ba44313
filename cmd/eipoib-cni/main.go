// Command eipoib-cni is the CNI plugin "eipoib". It gives Kubernetes
// pods (and KubeVirt VMs with bridge binding) their place on an
// InfiniBand fabric through the local eipoibd.
//
// Chained after the reference bridge plugin (bridge enslaved to
// eipoibd's TAP's bridge, any IPAM), its ADD declares the pod
// interface's MAC and the network's VLAN to eipoibd over the control
// socket. So the pod's VIF exists before the pod speaks and --learn
// declared serves it. ADD passes the previous result on. DEL frees the
// VIF; CHECK fails when it is missing; GC frees the VIFs of attachments
// the runtime no longer has; STATUS fails while eipoibd is not ready.
//
// As bridge's IPAM wrapping the real one ({"type": "eipoib", "ipam":
// {...}}) it declares the MAC before the address is asked for, which
// DHCP needs under --learn declared.
//
// Install the binary as "eipoib" in the runtime's CNI directory
// (/opt/cni/bin; Debian's runtimes also look in /usr/lib/cni, where the
// package installs it). See docs/kubernetes.md. "eipoib --version"
// prints its version, as its "about" line does when run without
// CNI_COMMAND.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

// versions are the spec versions the plugin speaks: every one with
// chaining (prevResult, 0.3.0 on) up to 1.1.0, whose GC and STATUS it
// implements.
var versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// buildVersion is the release, set by the Makefile from
// scripts/version.sh: -ldflags "-X main.buildVersion=...", as eipoibd's.
var buildVersion string

// pluginVersion is buildVersion, else what the Go toolchain recorded:
// the module's version and the VCS revision ("(devel)" and the commit
// for a plain go build in a checkout).
func pluginVersion(v string, info *debug.BuildInfo, ok bool) string {
	if v != "" || !ok {
		return v
	}
	v = info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
	}
	return v
}

func main() {
	info, ok := debug.ReadBuildInfo()
	v := pluginVersion(buildVersion, info, ok)
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println("eipoib", v)
		return
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus}, versions,
		"CNI plugin eipoib "+v+": declares pods' MACs to eipoibd (docs/kubernetes.md)")
}
