package kernelfabric

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
)

// sysTree writes files (path → content) under a new directory.
func sysTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, v := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	sysAddr = "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:f1:f0:e1\n"
	sysGID  = "fe80:0000:0000:0000:0002:c903:00f1:f0e1\n"
)

// TestReadPKeyTable reads a P_Key table laid out as the kernel lays it
// out (ipoib_parent_init's device link and dev_port, show_port_pkey's
// "0x%04x"). Empty entries and mlx4's "none" are skipped. The port is
// dev_port + 1, or dev_id + 1 on kernels that set only dev_id. Of two
// HCAs under one device, the port is the one whose port GID 0 is the
// interface's.
func TestReadPKeyTable(t *testing.T) {
	pk := "ib0/device/infiniband/mlx4_0/ports/2/pkeys/"
	root := sysTree(t, map[string]string{
		"ib0/dev_port": "1\n", "ib0/dev_id": "0x1\n", "ib0/address": sysAddr,
		pk + "0": "0xffff\n", pk + "1": "0x8001\n", pk + "2": "0x0000\n", pk + "3": "none\n", pk + "4": "0x0005\n",
	})
	tab, err := readPKeyTable(root, "ib0")
	if err != nil {
		t.Fatal(err)
	}
	if tab.Device != "mlx4_0" || tab.Port != 2 || !slices.Equal(tab.PKeys, []ipoib.PKey{0xffff, 0x8001, 0x0005}) {
		t.Fatalf("%+v", tab)
	}
	// ib_find_pkey: the low 15 bits, limited membership accepted.
	if !tab.Has(0x0001) || !tab.Has(0x8005) || tab.Has(0x8002) {
		t.Fatal("Has")
	}

	old := sysTree(t, map[string]string{"ib0/dev_id": "0x1\n", "ib0/dev_port": "0\n", "ib0/address": sysAddr,
		"ib0/device/infiniband/mthca0/ports/2/pkeys/0": "0xffff\n"})
	if tab, err := readPKeyTable(old, "ib0"); err != nil || tab.Port != 2 {
		t.Fatalf("dev_id only: %+v %v", tab, err)
	}

	two := sysTree(t, map[string]string{"ib0/dev_port": "0\n", "ib0/address": sysAddr,
		"ib0/device/infiniband/mlx5_0/ports/1/gids/0":  "fe80:0000:0000:0000:0002:c903:00f1:0000\n",
		"ib0/device/infiniband/mlx5_0/ports/1/pkeys/0": "0xffff\n",
		"ib0/device/infiniband/mlx5_1/ports/1/gids/0":  sysGID,
		"ib0/device/infiniband/mlx5_1/ports/1/pkeys/0": "0x800a\n"})
	if tab, err := readPKeyTable(two, "ib0"); err != nil || tab.Device != "mlx5_1" || !slices.Equal(tab.PKeys, []ipoib.PKey{0x800a}) {
		t.Fatalf("two HCAs: %+v %v", tab, err)
	}

	bad := sysTree(t, map[string]string{"ib0/dev_port": "0\n", "ib0/address": sysAddr, "ib0/device/infiniband/x/ports/1/pkeys/0": "0xfffff\n"})
	if _, err := readPKeyTable(bad, "ib0"); err == nil || !strings.Contains(err.Error(), "no P_Key") {
		t.Fatalf("bad entry: %v", err)
	}
	noIB := sysTree(t, map[string]string{"eth0/dev_port": "0\n", "eth0/address": sysAddr})
	if _, err := readPKeyTable(noIB, "eth0"); err == nil || !strings.Contains(err.Error(), "no HCA") {
		t.Fatalf("no HCA: %v", err)
	}
}

// FuzzParsePKeyEntry: no entry text crashes the parser; an entry it takes
// prints back as show_port_pkey prints it and parses to the same P_Key.
func FuzzParsePKeyEntry(f *testing.F) {
	for _, s := range []string{"0xffff\n", "0x8001\n", "0x0000\n", "0x8000\n", "none\n", "fffff", "0x", "", "0x12345", "0xffff\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, ok, err := parsePKeyEntry(s)
		if err != nil {
			if ok || k != 0 {
				t.Fatalf("%q: error %v with %#x %v", s, err, k, ok)
			}
			return
		}
		if strings.TrimSpace(s) == "none" {
			return
		}
		k2, ok2, err := parsePKeyEntry(fmt.Sprintf("0x%04x\n", uint16(k)))
		if err != nil || k2 != k || ok2 != ok || ok != (k&0x7fff != 0) {
			t.Fatalf("%q → %#x %v, printed back → %#x %v %v", s, k, ok, k2, ok2, err)
		}
	})
}
