// Package state keeps what a restarted eipoibd needs to find its guests
// again (with --persist). That is the TAP, the VLAN to P_Key map, and
// each guest's VIF with its origin, QPN and the addresses it claimed,
// which are announced on the fabric after the restart. The file is
// written atomically (a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves the old state or the new one. A file
// that does not parse or does not hold together is reported and set
// aside, never trusted.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// Version is the file format's version; a file of another is not read.
const Version = 1

// Limits of a file: its size and the guests in it.
const (
	MaxSize   = 16 << 20
	MaxGuests = 1 << 20
)

// State is the saved state of one daemon.
type State struct {
	// TAP is the TAP's name.
	TAP string
	// VLANPKeys is the VLAN to P_Key map, as --vlan-pkey takes it.
	VLANPKeys string
	// Guests are the VIFs there were.
	Guests []Guest
}

// Guest is one VIF: a guest MAC on a VLAN.
type Guest struct {
	MAC    ether.MAC
	VLAN   uint16
	Origin mactrans.Origin
	// QPN is the VIF's QP, wished for again after the restart.
	QPN uint32
	// IPs are the addresses the guest claimed (ARP, NDP), at most
	// mactrans.MaxGuestIPs.
	IPs []netip.Addr
}

// file is the JSON form.
type file struct {
	Version   int         `json:"version"`
	TAP       string      `json:"tap"`
	VLANPKeys string      `json:"vlan_pkey"`
	Guests    []fileGuest `json:"guests"`
}

type fileGuest struct {
	MAC    string       `json:"mac"`
	VLAN   uint16       `json:"vlan"`
	Origin string       `json:"origin"`
	QPN    uint32       `json:"qpn"`
	IPs    []netip.Addr `json:"ips,omitempty"`
}

// Marshal encodes s.
func Marshal(s *State) ([]byte, error) {
	f := file{Version: Version, TAP: s.TAP, VLANPKeys: s.VLANPKeys, Guests: make([]fileGuest, len(s.Guests))}
	for i, g := range s.Guests {
		f.Guests[i] = fileGuest{MAC: g.MAC.String(), VLAN: g.VLAN, Origin: g.Origin.String(), QPN: g.QPN, IPs: g.IPs}
	}
	b, err := json.MarshalIndent(&f, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	return append(b, '\n'), nil
}

// Parse decodes and checks a state file: unknown fields, another
// version, a bad MAC, VLAN, origin, QPN or address, a guest twice or a
// file over the limits are errors.
func Parse(b []byte) (*State, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("state: %d bytes, over the %d limit", len(b), MaxSize)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var f file
	if err := d.Decode(&f); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("state: data after the JSON object")
	}
	switch {
	case f.Version != Version:
		return nil, fmt.Errorf("state: version %d, want %d", f.Version, Version)
	case f.TAP == "" || len(f.TAP) > 15:
		return nil, fmt.Errorf("state: bad TAP name %q", f.TAP)
	case len(f.Guests) > MaxGuests:
		return nil, fmt.Errorf("state: %d guests, over the %d limit", len(f.Guests), MaxGuests)
	}
	s := &State{TAP: f.TAP, VLANPKeys: f.VLANPKeys, Guests: make([]Guest, len(f.Guests))}
	seen := make(map[mactrans.VIFKey]bool, len(f.Guests))
	for i, fg := range f.Guests {
		g, err := fg.check()
		if err != nil {
			return nil, fmt.Errorf("state: guest %d: %w", i, err)
		}
		k := mactrans.VIFKey{MAC: g.MAC, VLAN: g.VLAN}
		if seen[k] {
			return nil, fmt.Errorf("state: guest %d: %s on VLAN %d twice", i, g.MAC, g.VLAN)
		}
		seen[k] = true
		s.Guests[i] = g
	}
	return s, nil
}

func (fg fileGuest) check() (Guest, error) {
	mac, err := ether.ParseMAC(fg.MAC)
	if err != nil || mac.IsMulticast() || mac.IsZero() {
		return Guest{}, fmt.Errorf("MAC %q: want a unicast MAC", fg.MAC)
	}
	origin, ok := mactrans.ParseOrigin(fg.Origin)
	switch {
	case fg.VLAN > 4094:
		return Guest{}, fmt.Errorf("VLAN %d: want 0 to 4094", fg.VLAN)
	case !ok:
		return Guest{}, fmt.Errorf("origin %q: want learned, declared, bridge or ovs", fg.Origin)
	case fg.QPN < 2 || fg.QPN >= ipoib.MulticastQPN:
		return Guest{}, fmt.Errorf("QPN %#x: want 0x2 to 0xfffffe", fg.QPN)
	case len(fg.IPs) > mactrans.MaxGuestIPs:
		return Guest{}, fmt.Errorf("%d addresses, over the %d a guest keeps", len(fg.IPs), mactrans.MaxGuestIPs)
	}
	for _, a := range fg.IPs {
		if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() {
			return Guest{}, fmt.Errorf("address %q: want a unicast address a guest claims", a)
		}
	}
	ips := fg.IPs
	if len(ips) == 0 {
		ips = nil // "ips":[] and no "ips" are the same guest; Marshal writes the latter
	}
	return Guest{MAC: mac, VLAN: fg.VLAN, Origin: origin, QPN: fg.QPN, IPs: ips}, nil
}

// Save writes s to path atomically (see Write).
func Save(path string, s *State) error {
	b, err := Marshal(s)
	if err != nil {
		return err
	}
	return Write(path, b)
}

// Write writes a marshalled state to path atomically: into a temporary
// file in the same directory (mode 0600), synced, renamed over path, and
// the directory synced. Its errors name path and the step, never the
// temporary file's random name, so that a failure that persists reads
// the same each time.
func Write(path string, b []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return writeError(path, "create", err)
	}
	step := "write"
	_, err = tmp.Write(b)
	if err == nil {
		step, err = "sync", tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		step, err = "close", cerr
	}
	if err == nil {
		step, err = "rename", os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return writeError(path, step, err)
	}
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		d.Close()
	}
	if err != nil {
		return writeError(path, "sync directory", err)
	}
	return nil
}

// writeError is Write's error for step: the cause without the file name
// os put in front of it.
func writeError(path, step string, err error) error {
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	return fmt.Errorf("state: save %s: %s: %w", path, step, err)
}

// CorruptError is a state file that cannot be trusted.
type CorruptError struct {
	Path string
	Err  error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%s: %s", e.Path, strings.TrimPrefix(e.Err.Error(), "state: "))
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Load reads the state file at path: an error wrapping os.ErrNotExist
// when there is none, a *CorruptError when it cannot be trusted (see
// SetAside).
func Load(path string) (*State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, &CorruptError{Path: path, Err: err}
	}
	return s, nil
}

// SetAside renames a corrupt state file out of the way, to path with
// ".corrupt" appended (replacing an older one), and returns the new
// name.
func SetAside(path string) (string, error) {
	to := path + ".corrupt"
	if err := os.Rename(path, to); err != nil {
		return "", fmt.Errorf("state: set aside %s: %w", path, err)
	}
	return to, nil
}
