// Package kubernetes holds the Kubernetes deployment files: eipoibd's
// DaemonSet, as a kustomize base with an overlay per fabric backend, the
// Multus networks, a pod and KubeVirt VMs. Render builds an overlay as
// kubectl apply -k does. The package's test checks the files without a
// cluster: there is no Kubernetes on the project's machines, so they are
// rendered, parsed and cross-checked, not deployed.
package kubernetes

import (
	"path/filepath"
	"runtime"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Overlays are the kustomize overlays, one per fabric backend, by the
// name of their directory under overlays/.
var Overlays = []string{"sim", "kernel", "verbs"}

// Render builds the overlay (one of Overlays) with kustomize's API, as
// "kubectl apply -k deploy/kubernetes/overlays/<overlay>" would, and
// returns its objects as one multi-document YAML stream.
func Render(overlay string) ([]byte, error) {
	_, self, _, _ := runtime.Caller(0)
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(filepath.Dir(self), "overlays", overlay))
	if err != nil {
		return nil, err
	}
	return res.AsYaml()
}
