// Command eipoib-cni is the CNI plugin "eipoib": it gives Kubernetes pods
// (and KubeVirt VMs with bridge binding) their place on an InfiniBand
// fabric through the local eipoibd. Chained after the reference bridge
// plugin (bridge enslaved to eipoibd's TAP's bridge, any IPAM), its ADD
// declares the pod interface's MAC (and the network's VLAN) to eipoibd
// over the control socket, so the pod's VIF exists before the pod
// speaks and --learn declared serves it, and passes the previous result
// on; DEL frees the VIF; CHECK fails when it is missing; GC frees the
// VIFs of attachments the runtime no longer has; STATUS fails while
// eipoibd is not ready. As bridge's
// IPAM wrapping the real one ({"type": "eipoib", "ipam": {...}}) it
// declares the MAC before the address is asked for, which DHCP needs
// under --learn declared. Install the binary as "eipoib" in the
// runtime's CNI directory (/opt/cni/bin). See docs/kubernetes.md.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

// versions are the spec versions the plugin speaks: every one with
// chaining (prevResult, 0.3.0 on) up to 1.1.0, whose GC and STATUS it
// implements.
var versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus}, versions,
		"CNI plugin eipoib: declares pods' MACs to eipoibd (docs/kubernetes.md)")
}
