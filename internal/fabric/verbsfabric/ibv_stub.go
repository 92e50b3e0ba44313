//go:build !verbs

package verbsfabric

import "errors"

// openDevice without the verbs build tag: there is no libibverbs.
func openDevice(string, int, layout) (device, error) {
	return nil, errors.New("verbsfabric: this eipoibd was built without verbs support (build with -tags verbs, which needs libibverbs-dev)")
}
