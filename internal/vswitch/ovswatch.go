package vswitch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/eipoib/eipoibd/ether"
)

// Open vSwitch guests: libvirt (and OpenStack's os-vif) record a guest's
// MAC in the Interface table, external_ids:attached-mac, when it adds the
// guest's port; an access port's VLAN is the Port table's tag. The
// daemon lists them with ovs-vsctl and follows changes through
// ovsdb-client monitor, whose every update triggers a fresh listing
// (guests come and go rarely; a listing is three ovs-vsctl calls).

// Guests returns the guests on bridge br's ports other than except: each
// port whose interface has external_ids:attached-mac, with the port's
// tag as VLAN (0 for a trunk or untagged port).
func (o OVS) Guests(br, except string) ([]Guest, error) {
	ports, err := o.vsctl("list-ports", br)
	if err != nil {
		return nil, err
	}
	tags, err := o.column("Port", "tag")
	if err != nil {
		return nil, err
	}
	ids, err := o.column("Interface", "external_ids")
	if err != nil {
		return nil, err
	}
	var out []Guest
	for _, p := range strings.Fields(ports) {
		if p == except {
			continue
		}
		m, err := ovsMap(ids[p])
		if err != nil || m["attached-mac"] == "" {
			continue
		}
		mac, err := ether.ParseMAC(m["attached-mac"])
		if err != nil || mac.IsMulticast() || mac.IsZero() {
			continue
		}
		vlan, _ := ovsInt(tags[p])
		if vlan < 0 || vlan > 4094 {
			vlan = 0
		}
		out = append(out, Guest{MAC: mac, VLAN: uint16(vlan), Static: true})
	}
	return out, nil
}

// column lists column col of every row of table, by row name.
func (o OVS) column(table, col string) (map[string]json.RawMessage, error) {
	out, err := o.vsctl("--format=json", "--columns=name,"+col, "list", table)
	if err != nil {
		return nil, err
	}
	rows, err := parseOVSTable([]byte(out))
	if err != nil {
		return nil, fmt.Errorf("vswitch: ovs-vsctl list %s: %w", table, err)
	}
	byName := make(map[string]json.RawMessage, len(rows))
	for _, r := range rows {
		var name string
		if json.Unmarshal(r["name"], &name) == nil {
			byName[name] = r[col]
		}
	}
	return byName, nil
}

// ovsTable is ovs-vsctl's and ovsdb-client's --format=json output.
type ovsTable struct {
	Data     [][]json.RawMessage `json:"data"`
	Headings []string            `json:"headings"`
}

// parseOVSTable parses one --format=json table into rows keyed by
// heading.
func parseOVSTable(b []byte) ([]map[string]json.RawMessage, error) {
	var t ovsTable
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, err
	}
	rows := make([]map[string]json.RawMessage, 0, len(t.Data))
	for _, d := range t.Data {
		if len(d) != len(t.Headings) {
			return nil, fmt.Errorf("a row of %d values under %d headings", len(d), len(t.Headings))
		}
		r := make(map[string]json.RawMessage, len(d))
		for i, h := range t.Headings {
			r[h] = d[i]
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// ovsMap decodes an OVSDB map, ["map", [[k, v], ...]], of strings.
func ovsMap(raw json.RawMessage) (map[string]string, error) {
	var v []json.RawMessage
	if err := json.Unmarshal(raw, &v); err != nil || len(v) != 2 {
		return nil, errors.New("not an OVSDB map")
	}
	var kind string
	var pairs [][2]string
	if json.Unmarshal(v[0], &kind) != nil || kind != "map" || json.Unmarshal(v[1], &pairs) != nil {
		return nil, errors.New("not an OVSDB map of strings")
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		m[p[0]] = p[1]
	}
	return m, nil
}

// ovsInt decodes an optional OVSDB integer: a number, or an empty set.
func ovsInt(raw json.RawMessage) (int, bool) {
	var n int
	if json.Unmarshal(raw, &n) == nil {
		return n, true
	}
	return 0, false
}

// remote is the OVSDB remote ovsdb-client is given: o.DB, else where
// ovs-vsctl looks by default.
func (o OVS) remote() string {
	if o.DB != "" {
		return o.DB
	}
	dir := os.Getenv("OVS_RUNDIR")
	if dir == "" {
		dir = "/run/openvswitch"
	}
	return "unix:" + dir + "/db.sock"
}

// Watch calls fn for each guest bridge br gains (added) or loses on ports
// other than except, starting with those it has, until ctx ends. Guests
// in have are taken as known already (the caller holds them, e.g.
// restored from a state file): the first listing reports those whose
// port is gone as lost, and no others. It follows the Interface and Port
// tables with ovsdb-client monitor; when a monitor exits it is restarted
// after a second, and trouble is told to warn (which may be nil).
func (o OVS) Watch(ctx context.Context, br, except string, have []Guest, fn func(g Guest, added bool), warn func(err error)) error {
	known := make(guestSet, len(have))
	for _, g := range have {
		known[g] = true
	}
	return o.follow(ctx, [][]string{{"Interface", "name,external_ids"}, {"Port", "name,tag,interfaces"}}, func() {
		gs, err := o.Guests(br, except)
		if err != nil {
			if warn != nil {
				warn(err)
			}
			return
		}
		known = known.update(gs, fn)
	}, warn)
}

// follow calls resync now and after every update of the tables (each
// {table, columns}, monitored with ovsdb-client) until ctx ends.
func (o OVS) follow(ctx context.Context, tables [][]string, resync func(), warn func(err error)) error {
	if _, err := exec.LookPath("ovsdb-client"); err != nil {
		return fmt.Errorf("vswitch: watching Open vSwitch needs ovsdb-client (Debian: openvswitch-common): %w", err)
	}
	changed := make(chan struct{}, 1)
	for _, spec := range tables {
		go o.monitor(ctx, spec, changed, warn)
	}
	resync()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			// Let a transaction's updates of every table arrive.
			time.Sleep(50 * time.Millisecond)
			select {
			case <-changed:
			default:
			}
			resync()
		}
	}
}

// guestSet is the set of a switch's guests as last listed.
type guestSet map[Guest]bool

// update calls fn for each guest of listing gs not in s (added) and each
// of s not in gs (lost), and returns gs as a guestSet.
func (s guestSet) update(gs []Guest, fn func(g Guest, added bool)) guestSet {
	now := make(guestSet, len(gs))
	for _, g := range gs {
		now[g] = true
		if !s[g] {
			fn(g, true)
		}
	}
	for g := range s {
		if !now[g] {
			fn(g, false)
		}
	}
	return now
}

// monitor runs ovsdb-client monitor on one table until ctx ends, telling
// changed of every update after the initial rows.
func (o OVS) monitor(ctx context.Context, spec []string, changed chan<- struct{}, warn func(err error)) {
	for ctx.Err() == nil {
		cmd := exec.CommandContext(ctx, "ovsdb-client", "--format=json", "monitor", o.remote(), "Open_vSwitch", spec[0], spec[1])
		out, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err == nil {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"initial"`) {
					continue
				}
				select {
				case changed <- struct{}{}:
				default:
				}
			}
			err = cmd.Wait()
		}
		if ctx.Err() != nil {
			return
		}
		if warn != nil {
			warn(fmt.Errorf("vswitch: ovsdb-client monitor %s ended: %v; restarting", spec[0], err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		select { // list afresh: updates may have been missed
		case changed <- struct{}{}:
		default:
		}
	}
}
