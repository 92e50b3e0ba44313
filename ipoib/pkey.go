package ipoib

import (
	"fmt"
	"log/slog"
	"strconv"
)

// PKey is a 16-bit InfiniBand partition key: the top bit is the
// full-membership bit, the low 15 bits the partition number.
type PKey uint16

// Well-known P_Keys.
const (
	DefaultPKey PKey = 0xFFFF // the default partition, full member
	FullMember  PKey = 0x8000
)

// Full returns p with the full-membership bit set, as IPoIB uses it in MGIDs.
func (p PKey) Full() PKey { return p | FullMember }

// IsFull reports whether the full-membership bit is set.
func (p PKey) IsFull() bool { return p&FullMember != 0 }

// Base returns the 15-bit partition number.
func (p PKey) Base() uint16 { return uint16(p) &^ uint16(FullMember) }

// IsValid reports whether p names a partition: base 0 (0x0000, 0x8000) is
// the invalid P_Key of the IBA.
func (p PKey) IsValid() bool { return p.Base() != 0 }

// String formats p as 0x-prefixed four-digit hex.
func (p PKey) String() string { return fmt.Sprintf("0x%04x", uint16(p)) }

// LogValue logs p as its String, 0xffff, in every log format (a JSON
// log would otherwise show the decimal 65535).
func (p PKey) LogValue() slog.Value { return slog.StringValue(p.String()) }

// CanTalk reports whether endpoints with P_Keys a and b may exchange packets
// (IBA 10.9.3): both valid, the same partition number, and at least one a
// full member. Two limited members of one partition cannot talk.
func CanTalk(a, b PKey) bool {
	return a.IsValid() && a.Base() == b.Base() && (a.IsFull() || b.IsFull())
}

// ParsePKey parses a P_Key in hex (0x8001) or decimal and rejects invalid ones.
// Nothing else: strconv's base 0 would read 010 as octal 8, and accept
// 0b and 0o prefixes and underscores.
func ParsePKey(s string) (PKey, error) {
	base, digits := 10, s
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		base, digits = 16, s[2:]
	}
	v, err := strconv.ParseUint(digits, base, 16)
	if err != nil {
		return 0, fmt.Errorf("ipoib: bad P_Key %q: want 16-bit number like 0x8001", s)
	}
	p := PKey(v)
	if !p.IsValid() {
		return 0, fmt.Errorf("ipoib: P_Key %s is the invalid partition", p)
	}
	return p, nil
}
