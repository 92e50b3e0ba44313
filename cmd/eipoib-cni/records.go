package main

// Records hold, on disk, what each attachment's ADD declared, so that
// DEL and GC free it from the record rather than from the configuration.
// A DEL whose configuration no longer parses still frees it. Such a
// configuration may have a typo in the chained plugin's keys, found only
// after bridge's IPAM, the wrapping eipoib, had declared the VIF. And GC
// frees the VIFs of attachments the runtime no longer has.
//
// There is one file an attachment, DataDir/NETWORK/CONTAINERID:IFNAME,
// the spec's attachment key. Neither a container ID nor an interface
// name holds ':' or '/' (libcni's utils.ValidateContainerID and
// ValidateInterfaceName, which skel applies before the plugin runs).
// Each is written whole to a temporary file and renamed over the old
// one.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// DefaultDataDir is where a configuration without "dataDir" records
// what ADD declared (the reference plugins keep theirs under
// /var/lib/cni too).
const DefaultDataDir = "/var/lib/cni/eipoib"

// decl is one VIF an ADD declared: the daemon it went to (its TAP, the
// directory of its control socket and of its state file) and the MAC
// and VLAN.
type decl struct {
	TAP       string `json:"tap"`
	SocketDir string `json:"socketDir"`
	StateDir  string `json:"stateDir"`
	MAC       string `json:"mac"`
	VLAN      int    `json:"vlan"`
}

// declOf is the declaration of mac on c's daemon and VLAN.
func declOf(c *Conf, mac net.HardwareAddr) decl {
	return decl{TAP: c.TAP, SocketDir: c.SocketDir, StateDir: c.StateDir, MAC: mac.String(), VLAN: c.VLAN}
}

// conf is the configuration that names d's daemon and VLAN, for the
// functions that talk to it (client, delGone, refused).
func (d decl) conf() *Conf {
	return &Conf{TAP: d.TAP, SocketDir: d.SocketDir, StateDir: d.StateDir, VLAN: d.VLAN}
}

// record is one attachment's file.
type record struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Declared    []decl `json:"declared"`
}

// records are one network's records: the directory DataDir/NETWORK.
type records struct{ dir string }

// recordsOf are the records of the network c configures.
func recordsOf(c *Conf) records { return records{filepath.Join(c.DataDir, c.Net.Name)} }

// recordsIn finds the records of the network configuration stdin without
// parsing the rest of it, for a DEL or GC whose configuration no longer
// parses. It reads the network's name and its "dataDir", at the top or
// in an "eipoib" IPAM section; the default stands where that is missing
// or not an absolute directory. ok is false when stdin has no network
// name.
func recordsIn(stdin []byte) (r records, ok bool) {
	var n struct {
		Name    string          `json:"name"`
		DataDir json.RawMessage `json:"dataDir"`
		IPAM    struct {
			Type    string          `json:"type"`
			DataDir json.RawMessage `json:"dataDir"`
		} `json:"ipam"`
	}
	json.Unmarshal(stdin, &n) // what parses is used
	raw := n.DataDir
	if n.IPAM.Type == PluginType {
		raw = n.IPAM.DataDir
	}
	dir := DefaultDataDir
	var d string
	if given(raw) && json.Unmarshal(raw, &d) == nil && filepath.IsAbs(d) {
		dir = d
	}
	if n.Name == "" || strings.ContainsAny(n.Name, "/") || n.Name == "." || n.Name == ".." {
		return records{}, false
	}
	return records{filepath.Join(dir, n.Name)}, true
}

// path is the file of the attachment (containerID, ifName).
func (rs records) path(containerID, ifName string) string {
	return filepath.Join(rs.dir, containerID+":"+ifName)
}

// load returns the attachment's record; one that is not there is empty.
func (rs records) load(containerID, ifName string) (record, error) {
	r := record{ContainerID: containerID, IfName: ifName}
	b, err := os.ReadFile(rs.path(containerID, ifName))
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	// The file's name, not what it holds, says whose record it is.
	r.ContainerID, r.IfName = containerID, ifName
	if err != nil {
		return r, types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: record of %s %s: %v", containerID, ifName, err), "")
	}
	return r, nil
}

// save writes r, or removes its file when it declares nothing.
func (rs records) save(r record) error {
	path := rs.path(r.ContainerID, r.IfName)
	if len(r.Declared) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: record: %v", err), "")
		}
		return nil
	}
	b, _ := json.Marshal(r)
	err := os.MkdirAll(rs.dir, 0o700)
	if err == nil {
		tmp := path + ".tmp"
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: record of %s %s: %v", r.ContainerID, r.IfName, err), "")
	}
	return nil
}

// add records d for the attachment, before it is declared: a VIF is
// never declared unrecorded.
func (rs records) add(containerID, ifName string, d decl) error {
	r, err := rs.load(containerID, ifName)
	if err != nil {
		return err
	}
	if slices.Contains(r.Declared, d) {
		return nil
	}
	r.Declared = append(r.Declared, d)
	return rs.save(r)
}

// drop removes d from the attachment's record (a declaration the daemon
// refused, or freed at once).
func (rs records) drop(containerID, ifName string, d decl) error {
	r, err := rs.load(containerID, ifName)
	if err != nil {
		return err
	}
	r.Declared = slices.DeleteFunc(r.Declared, func(x decl) bool { return x == d })
	return rs.save(r)
}

// free frees every VIF the attachment's record holds, keeping in it
// those that could not be freed (their daemon does not answer but may
// come back, or refused), and returns the first such error. found
// reports whether there was a record.
func (rs records) free(containerID, ifName string) (found bool, err error) {
	r, err := rs.load(containerID, ifName)
	if err != nil || len(r.Declared) == 0 {
		return false, err
	}
	var left []decl
	var first error
	for _, d := range r.Declared {
		if err := free(d); err != nil {
			left = append(left, d)
			if first == nil {
				first = err
			}
		}
	}
	r.Declared = left
	if err := rs.save(r); err != nil && first == nil {
		first = err
	}
	return true, first
}

// all returns every record of the network.
func (rs records) all() ([]record, error) {
	ents, err := os.ReadDir(rs.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: records: %v", err), "")
	}
	var out []record
	for _, e := range ents {
		cid, ifName, ok := strings.Cut(e.Name(), ":")
		if !ok || strings.HasSuffix(ifName, ".tmp") {
			continue
		}
		r, err := rs.load(cid, ifName)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// gc frees the VIFs of every attachment of the network that is not in
// valid, and returns the errors of those it could not free (each kept
// in its record for the next DEL or GC), joined.
func (rs records) gc(valid []types.GCAttachment) error {
	all, err := rs.all()
	if err != nil {
		return err
	}
	var errs []string
	for _, r := range all {
		if slices.Contains(valid, types.GCAttachment{ContainerID: r.ContainerID, IfName: r.IfName}) {
			continue
		}
		if _, err := rs.free(r.ContainerID, r.IfName); err != nil {
			errs = append(errs, fmt.Sprintf("%s %s: %v", r.ContainerID, r.IfName, err))
		}
	}
	if len(errs) > 0 {
		return types.NewError(types.ErrTryAgainLater, "eipoib: GC: "+strings.Join(errs, "; "), "")
	}
	return nil
}

// free frees d's VIF (vif-del on its daemon). A VIF that is not there
// is freed; so is one whose daemon is gone with its VIFs (delGone).
func free(d decl) error {
	c := d.conf()
	err := client(c).DelVIF(ctl.VIFRequest{MAC: d.MAC, VLAN: d.VLAN})
	if err == nil {
		return nil
	}
	mac, _ := net.ParseMAC(d.MAC)
	if gone := daemonGone(c, err); gone != nil {
		return delGone(c, mac, gone)
	}
	return refused(c, "vif-del", mac, err)
}
