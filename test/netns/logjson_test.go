package netns

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/ipoib"
)

// jsonRecords parses a --log-format json log: one object a line, each
// value kept as its JSON text. A line that is not an object fails t.
func jsonRecords(t *testing.T, log string) []map[string]json.RawMessage {
	t.Helper()
	var recs []map[string]json.RawMessage
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		var r map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("log line is not a JSON object: %v\n%s", err, l)
		}
		recs = append(recs, r)
	}
	return recs
}

// checkRecord asserts that the first record with message msg (and, when
// key is not empty, key's value keyVal) has exactly the fields of want
// besides time, level and msg, each value as JSON text.
func checkRecord(t *testing.T, recs []map[string]json.RawMessage, msg, key, keyVal string, want map[string]string) {
	t.Helper()
	for _, r := range recs {
		if string(r["msg"]) != fmt.Sprintf("%q", msg) || key != "" && string(r[key]) != keyVal {
			continue
		}
		got := map[string]string{}
		for k, v := range r {
			if k != "time" && k != "level" && k != "msg" {
				got[k] = string(v)
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("%q: fields\n%v\nwant\n%v", msg, got, want)
		}
		return
	}
	t.Errorf("no %q record with %s=%s", msg, key, keyVal)
}

// TestJSONLog runs two hypervisors with --log-format json (the
// DaemonSet's) and a guest pinging across, and reads the JSON back.
// Every line is one object, and no value in it is an array or an object:
// MACs, GIDs and LIMACs are strings, not arrays of bytes. The start and
// the guest's arrival carry each field as the text log writes it. The
// GID is fe80::…, tap_start "created" and the P_Key "0xffff". The
// guest's MAC is in colon-hex, the QPN in hex, and the LIMAC 20
// colon-hex bytes.
func TestJSONLog(t *testing.T) {
	tp := newTopo(t, 2, false, "--log-format", "json")
	h1, h2 := tp.hvs[0], tp.hvs[1]
	g := h1.guests[0]
	ping(t, g, h2.guests[0].ip4)
	mac := g.mac(t).String()
	q := func(s string) string { return fmt.Sprintf("%q", s) }

	recs := jsonRecords(t, h1.log())
	for _, r := range recs {
		for _, k := range slices.Sorted(maps.Keys(r)) {
			if v := r[k]; v[0] == '[' || v[0] == '{' {
				t.Errorf("%s: %s=%s: not a string, number or boolean", r["msg"], k, v)
			}
		}
	}
	gid := h1.gid(t)
	checkRecord(t, recs, "started", "", "", map[string]string{
		"tap": q("eib0"), "tap_start": q("created"), "fabric": q("sim"), "device": q("ul1"),
		"gid": q(gid.String()), "ib_mtu": "4096", "ipoib_mtu": "4092",
	})
	var qpn uint32
	for _, r := range recs {
		if string(r["msg"]) == q("VIF created") && string(r["mac"]) == q(mac) {
			var s string
			json.Unmarshal(r["qpn"], &s)
			fmt.Sscanf(s, "0x%x", &qpn)
		}
	}
	if qpn == 0 {
		t.Fatalf("no hex QPN in the VIF created record of %s:\n%s", mac, h1.log())
	}
	checkRecord(t, recs, "VIF created", "mac", q(mac), map[string]string{
		"mac": q(mac), "vlan": "0", "pkey": q("0xffff"), "qpn": q(fmt.Sprintf("%#06x", qpn)),
		"limac": q(ipoib.MakeHwAddr(0, qpn, ipoib.GID(gid.As16())).String()), "origin": q("learned"),
	})
}
