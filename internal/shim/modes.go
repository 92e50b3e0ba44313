package shim

import "fmt"

// LearnMode says which guest MACs get a VIF.
type LearnMode uint8

// The learning modes.
const (
	// LearnAuto gives a VIF to any source MAC (promiscuous emulation).
	LearnAuto LearnMode = iota
	// LearnDeclared gives VIFs only to MACs declared with DeclareVIF;
	// frames from others are dropped and counted, so a guest spoofing
	// or flooding MACs cannot take QPs.
	LearnDeclared
)

// DHCPMode says how guests' DHCP is carried.
type DHCPMode uint8

// The DHCP modes.
const (
	// DHCPBroadcast sets the BROADCAST flag on guests' DHCP requests so
	// that servers broadcast their replies.
	DHCPBroadcast DHCPMode = iota
	// DHCPRFC4390 also rewrites requests to the IPoIB form of RFC 4390
	// (htype 32, hlen 0, client-identifier) and restores the replies, for
	// servers that insist on it.
	DHCPRFC4390
)

var (
	learnNames = []string{LearnAuto: "auto", LearnDeclared: "declared"}
	dhcpNames  = []string{DHCPBroadcast: "broadcast", DHCPRFC4390: "rfc4390"}
)

// String is the mode's name, as ParseLearnMode reads it.
func (m LearnMode) String() string { return modeName(learnNames, m, "LearnMode") }

// String is the mode's name, as ParseDHCPMode reads it.
func (m DHCPMode) String() string { return modeName(dhcpNames, m, "DHCPMode") }

// ParseLearnMode reads "auto" or "declared".
func ParseLearnMode(s string) (LearnMode, bool) { return parseMode[LearnMode](learnNames, s) }

// ParseDHCPMode reads "broadcast" or "rfc4390".
func ParseDHCPMode(s string) (DHCPMode, bool) { return parseMode[DHCPMode](dhcpNames, s) }

// Valid reports whether m is one of the modes.
func (m LearnMode) Valid() bool { return int(m) < len(learnNames) }

// Valid reports whether m is one of the modes.
func (m DHCPMode) Valid() bool { return int(m) < len(dhcpNames) }

func modeName[M ~uint8](names []string, m M, typ string) string {
	if int(m) < len(names) {
		return names[m]
	}
	return fmt.Sprintf("%s(%d)", typ, m)
}

func parseMode[M ~uint8](names []string, s string) (M, bool) {
	for i, n := range names {
		if n == s {
			return M(i), true
		}
	}
	return 0, false
}
