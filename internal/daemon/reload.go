package daemon

// Reloading (SIGHUP): the settings read afresh, what can change in a
// running daemon applied and logged, the rest logged as needing a
// restart.

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/ipoib"
)

// liveKeys are the settings a reload (SIGHUP) applies to the running
// daemon; any other change needs a restart.
var liveKeys = map[string]bool{
	"log-level": true, "vif-idle": true, "max-vifs": true, "max-neighbours": true, "vlan-pkey": true,
	"mcast-query-interval": true, "mcast-response-interval": true, "mcast-last-member-interval": true, "mcast-robustness": true,
}

// changedKeys lists the settings whose values differ, by key (VLAN maps
// compared as maps).
func changedKeys(a, b *Config) []string {
	var ks []string
	for k, v := range b.Settings {
		if a.Settings[k] == v || k == "vlan-pkey" && maps.Equal(a.Partitions, b.Partitions) {
			continue
		}
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// formatVLANPKeys writes a VLAN map as --vlan-pkey takes it.
func formatVLANPKeys(m map[uint16]ipoib.PKey) string {
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d=%s", v, m[v]))
	}
	return strings.Join(parts, ",")
}

// addPartitions applies the VLAN map want over the running one: new VLANs
// are added to the shim; a VLAN removed or remapped needs a restart. It
// returns the map now running.
func addPartitions(sh *shim.Shim, log *slog.Logger, running, want map[uint16]ipoib.PKey) map[uint16]ipoib.PKey {
	now := maps.Clone(running)
	if now == nil {
		now = map[uint16]ipoib.PKey{}
	}
	for v, pk := range running {
		if w, ok := want[v]; !ok || w != pk {
			log.Warn("config change needs a restart", "key", "vlan-pkey", "vlan", v, "running", pk, "new", formatVLANPKeys(want))
		}
	}
	for _, v := range slices.Sorted(maps.Keys(want)) {
		if _, ok := running[v]; ok {
			continue
		}
		if err := sh.AddPartition(v, want[v]); err != nil {
			log.Error("config reload: partition not added", "vlan", v, "pkey", want[v], "err", err)
			continue
		}
		now[v] = want[v]
	}
	return now
}

// reloader holds the settings running, which reloads change.
type reloader struct {
	cur Config
	sh  *shim.Shim
	log *slog.Logger
}

// reload reads the settings afresh (cur.Reload) and applies what can
// change live, logging each change and each change that needs a
// restart. Settings that do not read change nothing.
func (r *reloader) reload() {
	cur, log := &r.cur, r.log
	if cur.Reload == nil {
		log.Info("config reloaded: no changes")
		return
	}
	o, err := cur.Reload()
	if err == nil {
		err = o.Validate()
	}
	if err != nil {
		log.Error("config reload failed; running on unchanged", "err", err)
		return
	}
	if cur.Settings == nil {
		cur.Settings = map[string]string{}
	}
	changed := changedKeys(cur, &o)
	for _, k := range changed {
		if !liveKeys[k] {
			log.Warn("config change needs a restart", "key", k, "running", cur.Settings[k], "new", o.Settings[k])
			continue
		}
		old := cur.Settings[k]
		switch k {
		case "log-level":
			if cur.Level != nil && o.Level != nil {
				cur.Level.Set(o.Level.Level())
			}
		case "vif-idle":
			r.sh.SetVIFIdle(o.VIFIdle)
		case "mcast-query-interval", "mcast-response-interval", "mcast-last-member-interval", "mcast-robustness":
			// Validate checked them together; applied whole, once per key
			if err := r.sh.SetMulticastTimers(o.Multicast); err != nil {
				log.Error("config reload: multicast timers not changed", "key", k, "err", err)
				continue
			}
		case "max-vifs", "max-neighbours":
			cur.MaxVIFs, cur.MaxNeighbours = o.MaxVIFs, o.MaxNeighbours
			r.sh.SetLimits(cur.MaxVIFs, cur.MaxNeighbours)
		case "vlan-pkey":
			now := addPartitions(r.sh, log, cur.Partitions, o.Partitions)
			if maps.Equal(now, cur.Partitions) {
				continue
			}
			cur.Partitions = now
			o.Settings[k] = formatVLANPKeys(now)
		}
		log.Info("config reloaded", "key", k, "old", old, "new", o.Settings[k])
		cur.Settings[k] = o.Settings[k]
	}
	if len(changed) == 0 {
		log.Info("config reloaded: no changes")
	}
}
