package ipoib

import "testing"

// pkeyOracle reads s as the flag documentation says: 0x (or 0X) and hex
// digits, or decimal digits; ok is false for anything else or more than
// 16 bits.
func pkeyOracle(s string) (v uint32, ok bool) {
	base, digits := uint32(10), s
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		base, digits = 16, s[2:]
	}
	if digits == "" {
		return 0, false
	}
	for _, c := range []byte(digits) {
		var d uint32
		switch {
		case c >= '0' && c <= '9':
			d = uint32(c - '0')
		case base == 16 && c >= 'a' && c <= 'f':
			d = uint32(c-'a') + 10
		case base == 16 && c >= 'A' && c <= 'F':
			d = uint32(c-'A') + 10
		default:
			return 0, false
		}
		if v = v*base + d; v > 0xffff {
			return 0, false
		}
	}
	return v, true
}

// FuzzParsePKey: ParsePKey accepts exactly the valid P_Keys written in
// hex or decimal, and what it accepts survives String and back.
func FuzzParsePKey(f *testing.F) {
	for _, s := range []string{"0x800a", "0XFFFF", "65535", "0x8000", "0", "0x10000", "ten", "0x", "32769", "-1", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePKey(s)
		v, ok := pkeyOracle(s)
		want := ok && PKey(v).IsValid()
		if (err == nil) != want {
			t.Fatalf("ParsePKey(%q) = %s, %v; want accepted %v (%#x)", s, p, err, want, v)
		}
		if err != nil {
			if p != 0 {
				t.Fatalf("ParsePKey(%q) returned %s with error %v", s, p, err)
			}
			return
		}
		if uint32(p) != v {
			t.Fatalf("ParsePKey(%q) = %s, want %#04x", s, p, v)
		}
		if q, err := ParsePKey(p.String()); err != nil || q != p {
			t.Fatalf("ParsePKey(%q) = %s, %v; the String of %#04x", p.String(), q, err, uint16(p))
		}
	})
}
