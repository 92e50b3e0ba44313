package keeper

import (
	"errors"
	"strings"
	"testing"
)

// TestParse: the requests sd_notify(3) and Take send are read as such,
// other keys are counted and ignored, and every defect is refused with
// its kind.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Message
		kind string
	}{
		{in: "FDSTORE=1\nFDNAME=tap-eib0", want: Message{Store: true, Name: "tap-eib0"}},
		{in: "FDSTORE=1\nFDNAME=tap-eib0\nFDPOLL=0\n", want: Message{Store: true, Name: "tap-eib0", NoPoll: true}},
		{in: "FDSTORE=1", want: Message{Store: true, Name: DefaultName}},
		{in: "FDSTOREREMOVE=1\nFDNAME=tap-eib0", want: Message{Remove: true, Name: "tap-eib0"}},
		// systemd: removal wins over a store in the same message.
		{in: "FDSTOREREMOVE=1\nFDSTORE=1\nFDNAME=a", want: Message{Remove: true, Store: true, Name: "a"}},
		{in: "FDGET=1\nFDNAME=tap-eib0", want: Message{Get: true, Name: "tap-eib0"}},
		{in: "READY=1\nSTATUS=up\nFDSTORE=1\nFDNAME=x", want: Message{Store: true, Name: "x", Other: 2}},
		{in: "\n\nFDSTORE=1\n\nFDNAME=x\n", want: Message{Store: true, Name: "x"}},
		{in: "", kind: KindEmpty},
		{in: "\n\n", kind: KindEmpty},
		{in: "FDSTORE=1\x00\nFDNAME=x", kind: KindNUL},
		{in: "FDSTORE\nFDNAME=x", kind: KindNoAssignment},
		{in: "FDSTORE=1\nFDNAME=x\nFDNAME=y", kind: KindRepeated},
		{in: "FDSTORE=yes\nFDNAME=x", kind: KindBadValue},
		{in: "FDSTORE=1\nFDPOLL=no", kind: KindBadValue},
		{in: "FDGET=2\nFDNAME=x", kind: KindBadValue},
		{in: "FDSTORE=1\nFDNAME=a:b", kind: KindBadName},
		{in: "FDSTORE=1\nFDNAME=", kind: KindBadName},
		{in: "FDSTORE=1\nFDNAME=a b", kind: KindBadName},
		{in: "FDSTORE=1\nFDNAME=" + strings.Repeat("n", 256), kind: KindBadName},
		{in: "FDSTOREREMOVE=1", kind: KindNoName},
		{in: "FDGET=1", kind: KindNoName},
		{in: "FDGET=1\nFDSTORE=1\nFDNAME=x", kind: KindConflict},
		{in: "READY=1", kind: KindNoRequest},
		{in: "FDNAME=x\nFDPOLL=0", kind: KindNoRequest},
	} {
		m, err := Parse([]byte(c.in))
		var me *MalformedError
		switch {
		case c.kind == "" && err != nil:
			t.Errorf("Parse(%q): %v", c.in, err)
		case c.kind == "" && m != c.want:
			t.Errorf("Parse(%q) = %+v, want %+v", c.in, m, c.want)
		case c.kind != "" && !errors.As(err, &me):
			t.Errorf("Parse(%q) = %+v, %v; want a %s error", c.in, m, err, c.kind)
		case c.kind != "" && me.Kind != c.kind:
			t.Errorf("Parse(%q): %v; want kind %s", c.in, err, c.kind)
		}
	}
}

// FuzzParse: no input crashes Parse; what it takes is a request with a
// valid name, and what it refuses has a kind.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"FDSTORE=1\nFDNAME=tap-eib0", "FDSTOREREMOVE=1\nFDNAME=tap-eib0", "FDGET=1\nFDNAME=tap-eib0",
		"FDSTORE=1\nFDPOLL=0\n", "READY=1\nSTATUS=x", "FDNAME=a:b\nFDSTORE=1", "=\n=", "FDSTORE=1\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			var me *MalformedError
			if !errors.As(err, &me) || me.Kind == "" {
				t.Fatalf("Parse(%q): error %v without a kind", b, err)
			}
			return
		}
		if !m.Store && !m.Remove && !m.Get {
			t.Fatalf("Parse(%q) = %+v: no request taken", b, m)
		}
		if m.Name == "" || strings.ContainsAny(m.Name, ":\n\x00 ") || len(m.Name) > 255 {
			t.Fatalf("Parse(%q) = %+v: bad name taken", b, m)
		}
	})
}

// FuzzParseAnswer: no answer crashes Take's parser; what it takes names
// the asked-for name and a count of at least 0, and the keeper's own
// answers parse.
func FuzzParseAnswer(f *testing.F) {
	for _, s := range []string{"FDNAME=tap-eib0\nFDCOUNT=2", "FDNAME=tap-eib0\nFDCOUNT=0", "FDNAME=tap-eib0\nFDCOUNT=-1",
		"FDNAME=other\nFDCOUNT=1", "FDNAME=tap-eib0", "", "FDNAME=tap-eib0\nFDCOUNT=99999999999999999999"} {
		f.Add([]byte(s))
	}
	if n, err := parseAnswer([]byte("FDNAME=tap-eib0\nFDCOUNT=3"), "tap-eib0"); err != nil || n != 3 {
		f.Fatalf("the keeper's answer: %d, %v", n, err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseAnswer(b, "tap-eib0")
		if err == nil && (n < 0 || !strings.HasPrefix(string(b), "FDNAME=tap-eib0\nFDCOUNT=")) {
			t.Fatalf("parseAnswer(%q) = %d", b, n)
		}
	})
}
