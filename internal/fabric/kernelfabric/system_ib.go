package kernelfabric

// System's InfiniBand-specific reads: the P_Key table of the port an IPoIB
// parent interface sits on, from sysfs.
//
// Where it is: ipoib_main.c ipoib_parent_init does
// SET_NETDEV_DEV(priv->dev, priv->ca->dev.parent) and sets
// dev->dev_port = dev->dev_id = port - 1, so /sys/class/net/PARENT/device is
// the HCA's bus device, which holds the HCA as infiniband/HCA, and the port
// is dev_port + 1 (dev_id on kernels older than dev_port). Its table is
// infiniband/HCA/ports/N/pkeys/0..len-1, one "0x%04x" entry each
// (drivers/infiniband/core/sysfs.c show_port_pkey; mlx4's SR-IOV guests
// print "none" for an unmapped entry). When the bus device holds more than
// one HCA, the one whose port's GID 0 is the parent's address GID is the
// parent's: ipoib_parent_init takes the interface's GID from
// rdma_query_gid(ca, port, 0).

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/eipoib/eipoibd/ipoib"
)

// sysClassNet is where System reads network interfaces' sysfs entries.
const sysClassNet = "/sys/class/net"

// PKeyTable is the P_Key table of one HCA port.
type PKeyTable struct {
	Device string // the HCA, e.g. mlx5_0
	Port   int    // its port number, from 1
	// Path is the sysfs directory of the table, for messages.
	Path  string
	PKeys []ipoib.PKey // the non-empty entries (0x0000 and 0x8000 are empty)
}

// Has reports whether the table holds pkey with either membership, as
// ib_find_pkey matches (the low 15 bits; a full-membership entry is
// preferred, a limited one accepted).
func (t PKeyTable) Has(pkey ipoib.PKey) bool {
	for _, k := range t.PKeys {
		if k.Base() == pkey.Base() {
			return true
		}
	}
	return false
}

// PKeys reads the P_Key table of the port under IPoIB interface parent.
func (System) PKeys(parent string) (PKeyTable, error) {
	return readPKeyTable(sysClassNet, parent)
}

// readPKeyTable is PKeys with the sysfs class directory given (tests
// build a tree).
func readPKeyTable(classNet, parent string) (PKeyTable, error) {
	dir := filepath.Join(classNet, parent)
	port, err := sysPort(dir)
	if err != nil {
		return PKeyTable{}, err
	}
	addr, err := os.ReadFile(filepath.Join(dir, "address"))
	if err != nil {
		return PKeyTable{}, err
	}
	hw, err := ipoib.ParseHwAddr(strings.TrimSpace(string(addr)))
	if err != nil {
		return PKeyTable{}, fmt.Errorf("%s/address: %w", dir, err)
	}
	hcas, err := filepath.Glob(filepath.Join(dir, "device", "infiniband", "*"))
	if err != nil || len(hcas) == 0 {
		return PKeyTable{}, fmt.Errorf("%s/device/infiniband: no HCA (not an InfiniBand port's interface?)", dir)
	}
	hca := hcas[0]
	if len(hcas) > 1 {
		hca = ""
		for _, h := range hcas {
			if gid, err := readGID(filepath.Join(h, "ports", strconv.Itoa(port), "gids", "0")); err == nil && gid == hw.GID() {
				hca = h
				break
			}
		}
		if hca == "" {
			return PKeyTable{}, fmt.Errorf("%s/device/infiniband: none of %d HCAs has GID %s at port %d index 0", dir, len(hcas), hw.GID(), port)
		}
	}
	t := PKeyTable{Device: filepath.Base(hca), Port: port, Path: filepath.Join(hca, "ports", strconv.Itoa(port), "pkeys")}
	entries, err := os.ReadDir(t.Path)
	if err != nil {
		return PKeyTable{}, err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(t.Path, e.Name()))
		if err != nil {
			return PKeyTable{}, err
		}
		k, ok, err := parsePKeyEntry(string(b))
		if err != nil {
			return PKeyTable{}, fmt.Errorf("%s/%s: %w", t.Path, e.Name(), err)
		}
		if ok {
			t.PKeys = append(t.PKeys, k)
		}
	}
	return t, nil
}

// parsePKeyEntry parses one sysfs P_Key table entry ("0x%04x\n", or
// "none" for an unmapped one); ok is false for an empty entry (0x0000 or
// 0x8000: no partition).
func parsePKeyEntry(text string) (k ipoib.PKey, ok bool, err error) {
	s := strings.TrimSpace(text)
	if s == "none" {
		return 0, false, nil
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 16)
	if err != nil || !strings.HasPrefix(s, "0x") {
		return 0, false, fmt.Errorf("%q is no P_Key", s)
	}
	k = ipoib.PKey(v)
	return k, k.IsValid(), nil
}

// sysPort returns the HCA port number of the interface at sysfs dir:
// dev_port + 1, or dev_id + 1 where dev_port is 0 and dev_id is not (older
// kernels set only dev_id).
func sysPort(dir string) (int, error) {
	read := func(name string, base int) (int, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), base, 16)
		if err != nil {
			return 0, fmt.Errorf("%s/%s: %w", dir, name, err)
		}
		return int(v), nil
	}
	port, perr := read("dev_port", 10) // fmt_dec
	id, ierr := read("dev_id", 16)     // fmt_hex
	switch {
	case perr != nil && ierr != nil:
		return 0, errors.Join(perr, ierr)
	case perr == nil && (port != 0 || ierr != nil):
		return port + 1, nil
	}
	return id + 1, nil
}

// readGID reads a sysfs GID entry ("%pI6": eight groups of four digits).
func readGID(path string) (ipoib.GID, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ipoib.GID{}, err
	}
	a, err := netip.ParseAddr(strings.TrimSpace(string(b)))
	if err != nil || !a.Is6() {
		return ipoib.GID{}, fmt.Errorf("%s: %q is no GID", path, b)
	}
	return ipoib.GID(a.As16()), nil
}
