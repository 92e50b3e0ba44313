package verbsfabric

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNoDevice: a verbs device that is not there is named with the RDMA
// devices the (fake) /sys/class/infiniband lists, or with the fact that
// there is none; one that is listed but that libibverbs could not find
// points at ib_uverbs.
func TestNoDevice(t *testing.T) {
	sys := t.TempDir()
	for _, d := range []string{"rxe0", "mlx5_1"} {
		if err := os.Mkdir(filepath.Join(sys, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ name, dir, want string }{
		{"mlx5_0", sys, `verbsfabric: there is no RDMA device "mlx5_0"; the RDMA devices here: mlx5_1, rxe0`},
		{"rxe0", sys, `verbsfabric: RDMA device "rxe0" exists, but libibverbs finds no verbs device of it: is ib_uverbs loaded?`},
		{"mlx5_0", filepath.Join(sys, "absent"), `verbsfabric: there is no RDMA device "mlx5_0": this host has none (` + filepath.Join(sys, "absent") +
			` is empty or absent: no RDMA driver such as mlx5_ib is loaded, nor an rxe link made with rdma link add)`},
	} {
		if err := noDevice(tc.name, tc.dir); err == nil || err.Error() != tc.want {
			t.Errorf("noDevice(%q, %s) = %v, want %s", tc.name, tc.dir, err, tc.want)
		}
	}
}
