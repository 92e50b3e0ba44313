//go:build verbs

package verbsfabric

import "testing"

// TestOpenMissingDevice: opening a verbs device that does not exist
// through libibverbs gives noDevice's error, whether libibverbs found
// other devices (ENODEV) or none at all (ENOSYS, as on a host without
// an RDMA stack).
func TestOpenMissingDevice(t *testing.T) {
	const name = "eipoib-no-such-dev"
	_, err := openDevice(name, 1, layout{})
	if want := noDevice(name, sysRDMA).Error(); err == nil || err.Error() != want {
		t.Errorf("openDevice(%q) = %v, want %s", name, err, want)
	}
}
