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
// one; GC removes the temporary files of writers killed in between.
//
// Several attachments can declare one VIF. The daemon keys its VIFs by
// MAC and VLAN, and the same pair can come from a pod re-created with
// its MAC (its old DEL still to come), two interfaces, or two networks
// on one eipoibd. The daemon keeps one declaration, not a count, so the
// records are the count. DEL and GC free a VIF only when no other record
// under the same dataDir declares it; otherwise they only forget it
// from their own record. Records and the daemon's VIFs change together
// under a lock on dataDir (lock): no ADD declares a VIF between a DEL's
// look at the other records and its vif-del.

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
	"syscall"
	"time"

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

// sameVIF reports whether d and o declare the same VIF: the same daemon
// (its control socket) and the same MAC and VLAN, the daemon's key. The
// state directory, which only DEL's answer when the daemon is gone
// uses, does not tell VIFs apart.
func (d decl) sameVIF(o decl) bool {
	return ctl.Path(d.SocketDir, d.TAP) == ctl.Path(o.SocketDir, o.TAP) && strings.EqualFold(d.MAC, o.MAC) && d.VLAN == o.VLAN
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

// recordsIn finds the records of the network configuration stdin
// without parsing the rest of it (a DEL or GC whose configuration no
// longer parses): its name and its "dataDir" (at the top, or in an
// "eipoib" IPAM section), the default where that is missing or not an
// absolute directory. ok is false when stdin has no network name.
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

// attachment is the attachment whose record is the file name (path's
// inverse); ok is false for a file that is no record (a temporary one).
func attachment(name string) (containerID, ifName string, ok bool) {
	containerID, ifName, ok = strings.Cut(name, ":")
	return containerID, ifName, ok && !strings.HasSuffix(ifName, tmpSuffix)
}

// lock takes the lock of the records of every network under rs's
// dataDir, and returns its release: an exclusive flock(2), held until
// the descriptor is closed (a process that dies releases it with its
// descriptors). The reference host-local IPAM flocks a file "lock" in
// its directory (plugins/ipam/host-local/backend/disk, NewFileLock);
// this lock is of the directory itself, whose entries are networks'
// names, any of which may be "lock". A dataDir that is not there and cannot be made holds no
// record, nor can an ADD make one there: there is nothing to lock.
func (rs records) lock() (unlock func(), err error) {
	root := filepath.Dir(rs.dir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		if _, serr := os.Stat(root); missing(serr) {
			return func() {}, nil
		}
		return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: records: %v", err), "")
	}
	f, err := os.Open(root)
	if err == nil {
		for {
			if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX); !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: lock of the records in %s: %v", root, err), "")
	}
	return func() { f.Close() }, nil
}

// shared reports whether a record other than the attachment's own, of
// any network under rs's dataDir, declares d's VIF. A record that cannot
// be read is its own attachment's DEL's or GC's error to report, not
// this one's, and is passed over.
func (rs records) shared(containerID, ifName string, d decl) bool {
	root := filepath.Dir(rs.dir)
	nets, _ := os.ReadDir(root)
	for _, n := range nets {
		if !n.IsDir() {
			continue
		}
		other := records{filepath.Join(root, n.Name())}
		ents, _ := os.ReadDir(other.dir)
		for _, e := range ents {
			cid, ifn, ok := attachment(e.Name())
			if !ok || other.dir == rs.dir && cid == containerID && ifn == ifName {
				continue
			}
			if r, err := other.load(cid, ifn); err == nil && slices.ContainsFunc(r.Declared, d.sameVIF) {
				return true
			}
		}
	}
	return false
}

// missing reports whether err says a file is not there: not found, or
// a component of its path is a file (ENOTDIR).
func missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// load returns the attachment's record; one that is not there is empty.
func (rs records) load(containerID, ifName string) (record, error) {
	r := record{ContainerID: containerID, IfName: ifName}
	b, err := os.ReadFile(rs.path(containerID, ifName))
	if missing(err) {
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
		if err := os.Remove(path); err != nil && !missing(err) {
			return types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: record: %v", err), "")
		}
		return nil
	}
	b, _ := json.Marshal(r)
	if err := writeFile(rs.dir, path, b); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: record of %s %s: %v", r.ContainerID, r.IfName, err), "")
	}
	return nil
}

// tmpSuffix ends the name of a record being written (attachment skips
// it).
const tmpSuffix = ".tmp"

// tmpStale is the age past which gc removes a temporary file: that of a
// writer killed between its write and its rename.
const tmpStale = time.Minute

// writeFile writes b to path whole: into a new temporary file in dir,
// renamed over path. The temporary file is removed when the write or
// the rename fails.
func writeFile(dir, path string, b []byte) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*"+tmpSuffix)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// sweepTemps removes the network's temporary files older than tmpStale,
// under the lock: those of writers that died before their rename.
func (rs records) sweepTemps(now time.Time) error {
	unlock, err := rs.lock()
	if err != nil {
		return err
	}
	defer unlock()
	ents, err := os.ReadDir(rs.dir)
	if err != nil {
		if missing(err) {
			return nil
		}
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("eipoib: records: %v", err), "")
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), tmpSuffix) {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && now.Sub(fi.ModTime()) > tmpStale {
			os.Remove(filepath.Join(rs.dir, e.Name()))
		}
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

// free frees every VIF the attachment's record holds that no other
// record declares, keeping in it those that could not be freed (their
// daemon does not answer but may come back, or refused), and returns
// the first such error; a VIF another record declares stays, and is
// only forgotten here. found reports whether there was a record.
func (rs records) free(containerID, ifName string) (found bool, err error) {
	unlock, err := rs.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	r, err := rs.load(containerID, ifName)
	if err != nil || len(r.Declared) == 0 {
		return false, err
	}
	var left []decl
	var first error
	for _, d := range r.Declared {
		if err := rs.freeUnshared(containerID, ifName, d); err != nil {
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

// release frees d's VIF unless another record declares it, then drops
// d from the attachment's record (d need not be in it: a DEL of an
// attachment its ADD did not record frees the VIF of the MAC it finds).
// A VIF that could not be freed stays recorded.
func (rs records) release(containerID, ifName string, d decl) error {
	unlock, err := rs.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := rs.freeUnshared(containerID, ifName, d); err != nil {
		return err
	}
	return rs.drop(containerID, ifName, d)
}

// freeUnshared frees d's VIF (free) unless a record other than the
// attachment's declares it. The caller holds the lock.
func (rs records) freeUnshared(containerID, ifName string, d decl) error {
	if rs.shared(containerID, ifName, d) {
		return nil
	}
	return free(d)
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
		cid, ifName, ok := attachment(e.Name())
		if !ok {
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
// in its record for the next DEL or GC), joined. It first removes the
// stale temporary files (sweepTemps).
func (rs records) gc(valid []types.GCAttachment) error {
	if err := rs.sweepTemps(time.Now()); err != nil {
		return err
	}
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
