package emuib

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Fabric is the emulated wire as several processes share it: the wire,
// the harness and the multicast program and their maps, pinned in a
// bpffs directory, so that each eipoibd of the emulation (each an
// emulated Kernel in a process of its own) puts its children's ends
// and group members where the others' frames look them up.
type Fabric struct {
	*Programs
	*Multicast
}

// The names of the pinned objects in a Fabric's directory.
var pinNames = [...]string{"wire", "harness", "ends", "counters", "mcast", "groups", "mcounters"}

// objects are f's programs and maps, in pinNames' order.
func (f *Fabric) objects() []pinner {
	return []pinner{f.Wire, f.Harness, f.Ends, f.Programs.Counters, f.Prog, f.Groups, f.Multicast.Counters}
}

type pinner interface{ Pin(string) error }

// NewFabric loads the programs and pins them in dir, a bpffs mount;
// Close releases this process's references (the pins stay until dir is
// unmounted or the files removed).
func NewFabric(dir string) (f *Fabric, err error) {
	f = &Fabric{}
	if f.Programs, err = Load(); err != nil {
		return nil, err
	}
	if f.Multicast, err = LoadMulticast(); err != nil {
		f.Programs.Close()
		return nil, err
	}
	for i, o := range f.objects() {
		if err := o.Pin(filepath.Join(dir, pinNames[i])); err != nil {
			f.Close()
			return nil, fmt.Errorf("emuib: pin %s in %s: %w", pinNames[i], dir, err)
		}
	}
	return f, nil
}

// OpenFabric opens the Fabric NewFabric pinned in dir.
func OpenFabric(dir string) (*Fabric, error) {
	f := &Fabric{Programs: &Programs{}, Multicast: &Multicast{}}
	progs := []**ebpf.Program{&f.Wire, &f.Harness, nil, nil, &f.Prog, nil, nil}
	maps := []**ebpf.Map{nil, nil, &f.Ends, &f.Programs.Counters, nil, &f.Groups, &f.Multicast.Counters}
	for i, name := range pinNames {
		path := filepath.Join(dir, name)
		var err error
		if progs[i] != nil {
			*progs[i], err = ebpf.LoadPinnedProgram(path, nil)
		} else {
			*maps[i], err = ebpf.LoadPinnedMap(path, nil)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("emuib: open the pinned fabric: %w", err)
		}
	}
	return f, nil
}

// Close releases the programs and maps.
func (f *Fabric) Close() error {
	return errors.Join(f.Programs.Close(), f.Multicast.Close())
}
