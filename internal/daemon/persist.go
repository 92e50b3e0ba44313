package daemon

// --persist: the TAP outlives the daemon (a persistent TAP whose queues
// systemd's file descriptor store keeps open, so its carrier never
// drops), and the guests' VIFs come back from a state file.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/eipoib/eipoibd/internal/sdnotify"
	"github.com/eipoib/eipoibd/internal/state"
	"github.com/eipoib/eipoibd/shim"
	"github.com/eipoib/eipoibd/tap"
)

// fdName is the name the TAP's queues have in systemd's file descriptor
// store.
func fdName(tapName string) string { return "tap-" + tapName }

// keptQueues returns the TAP queues systemd passed back from its file
// descriptor store ($LISTEN_FDS, named fdName); any other passed
// descriptor is closed, as nothing here listens on sockets. Without
// --persist (an earlier run had it) systemd is told to let go of its
// copies, so that the TAP goes when tap.Create closes these.
func keptQueues(c *Config, log *slog.Logger) []int {
	fds, err := sdnotify.ListenFDs()
	if err != nil {
		log.Warn("file descriptors passed by systemd ignored", "err", err)
		return nil
	}
	var queues []int
	for n, list := range fds {
		if n == fdName(c.Name) {
			queues = list
			continue
		}
		log.Warn("unexpected file descriptors from systemd closed", "name", n, "count", len(list))
		for _, fd := range list {
			os.NewFile(uintptr(fd), n).Close()
		}
	}
	if len(queues) > 0 && !c.Persist {
		log.Info("--persist is off: the TAP an earlier run kept is removed and made afresh (its link drops once)", "tap", c.Name)
		if _, err := sdnotify.Notify("FDSTOREREMOVE=1\nFDNAME=" + fdName(c.Name)); err != nil {
			log.Warn("systemd file descriptor store", "err", err)
		}
	}
	return queues
}

// storeQueues puts the TAP's queues into systemd's file descriptor store
// (with --persist) and says what a restart will do to the link.
func storeQueues(c *Config, dev *tap.TAP, log *slog.Logger) {
	if !c.Persist {
		return
	}
	ok, err := sdnotify.StoreFiles(fdName(c.Name), dev.Files())
	switch {
	case err != nil:
		log.Warn("TAP queues not kept by systemd: a restart drops the carrier", "err", err)
	case ok:
		log.Info("TAP queues sent to systemd's file descriptor store: a restart keeps the link up (the unit needs FileDescriptorStoreMax= of at least the queue count)", "tap", c.Name, "queues", len(dev.Files()))
	default:
		log.Info("no systemd file descriptor store: the TAP survives a restart, but its carrier drops while no eipoibd holds it", "tap", c.Name)
	}
}

// statePath is where --persist keeps the guests of TAP name.
func statePath(c *Config) string { return filepath.Join(c.StateDir, c.Name+".state") }

// vlanMap is the shim's VLAN to P_Key map as --vlan-pkey writes it,
// sorted by VLAN, untagged left out.
func vlanMap(sh *shim.Shim) string {
	parts := sh.Port().Partitions // a fresh map every call
	delete(parts, 0)
	return formatVLANPKeys(parts)
}

// restoreState reads the saved state and restores its guests' VIFs,
// whose addresses are then announced. A corrupt file is reported and set
// aside, never trusted.
func restoreState(c *Config, sh *shim.Shim, log *slog.Logger) {
	path := statePath(c)
	st, err := state.Load(path)
	var ce *state.CorruptError
	switch {
	case errors.Is(err, os.ErrNotExist):
		log.Info("no saved state", "path", path)
		return
	case errors.As(err, &ce):
		to, serr := state.SetAside(path)
		if serr != nil {
			log.Error("state file corrupt, and not set aside: fix or remove it", "err", err, "set_aside", serr)
			return
		}
		log.Warn("state file corrupt: set aside, not trusted", "err", err, "moved_to", to)
		return
	case err != nil:
		log.Warn("state file unreadable: guests are learned afresh", "err", err)
		return
	case st.TAP != c.Name:
		log.Warn("state file is another TAP's: ignored", "path", path, "tap", st.TAP)
		return
	}
	if cur := vlanMap(sh); st.VLANPKeys != cur {
		log.Info("VLAN map changed since the state was saved", "saved", st.VLANPKeys, "now", cur)
	}
	vifs, addrs, skipped := sh.RestoreGuests(st.Guests)
	for _, err := range skipped {
		log.Info("saved guest not restored", "reason", err)
	}
	log.Info("state restored", "path", path, "vifs", vifs, "addresses_announced", addrs, "skipped", len(skipped))
}

// stateSaver writes the state file whenever the guests change (checked
// every second), and once more when asked to stop, before the shim frees
// the VIFs. Once the shim has begun to free them (Run ended on its own)
// it saves nothing more: the file keeps the guests a restart restores.
type stateSaver struct {
	path, tap string
	sh        *shim.Shim
	log       *slog.Logger
	last      []byte
	lastErr   string
}

// run saves until ctx ends, then saves a last time and returns.
func (s *stateSaver) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.save()
			return
		case <-t.C:
			s.save()
		}
	}
}

// save writes the state if it changed; a failure is logged when it
// differs from the last one.
func (s *stateSaver) save() {
	guests, ok := s.sh.Guests()
	if !ok {
		return
	}
	b, err := state.Marshal(&state.State{TAP: s.tap, VLANPKeys: vlanMap(s.sh), Guests: guests})
	if err == nil && bytes.Equal(b, s.last) {
		return
	}
	if err == nil {
		err = state.Write(s.path, b)
	}
	if err != nil {
		if err.Error() != s.lastErr {
			s.log.Warn("state not saved", "err", err)
			s.lastErr = err.Error()
		}
		return
	}
	if s.lastErr != "" {
		s.log.Info("state saved again", "path", s.path)
	}
	s.last, s.lastErr = b, ""
}
