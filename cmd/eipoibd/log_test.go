package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/tap"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// TestLogFormatsAgree logs one value of each type the daemon logs that
// is not a string or a number underneath: MAC, GID, LIMAC, P_Key, the
// TAP's start, a VIF's origin, a port event's kind. It logs them with
// the text and the JSON logger of --log-format. Each comes out as the
// same string in both, the one the text log always showed.
func TestLogFormatsAgree(t *testing.T) {
	gid := ipoib.GID{0xfe, 0x80, 15: 1}
	want := map[string]string{
		"mac":    "02:00:00:00:00:01",
		"gid":    "fe80::1",
		"limac":  "00:00:12:34:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01",
		"pkey":   "0x800a",
		"start":  "kept",
		"origin": "bridge",
		"kind":   "partition_mtu",
	}
	args := []any{"mac", ether.MAC{2, 0, 0, 0, 0, 1}, "gid", gid, "limac", ipoib.MakeHwAddr(0, 0x1234, gid), "pkey", ipoib.PKey(0x800a),
		"start", tap.Kept, "origin", mactrans.OriginBridge, "kind", ipoib.EventPartitionMTU}

	var text, js bytes.Buffer
	newLogger("text", &text, nil).Info("m", args...)
	newLogger("json", &js, nil).Info("m", args...)
	var rec map[string]any
	if err := json.Unmarshal(js.Bytes(), &rec); err != nil {
		t.Fatalf("json log %q: %v", js.String(), err)
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(text.String()) {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	for k, w := range want {
		if fields[k] != w {
			t.Errorf("text %s=%s, want %s", k, fields[k], w)
		}
		if s, ok := rec[k].(string); !ok || s != w {
			t.Errorf("json %q: %#v, want %q", k, rec[k], w)
		}
	}
}
