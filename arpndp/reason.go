// Package arpndp rewrites the link-layer addresses that ARP, RARP, IPv6
// neighbour discovery and DHCPv4 carry inside their payloads, between
// Ethernet (6-byte MACs) and IPoIB (20-byte addresses, RFC 4391/4390). All
// functions work in place on zero-copy views: a packet that grows needs the
// spare capacity, and nothing is allocated. Bad input is rejected with a
// Reason, an error value that Counters counts.
package arpndp

import (
	"sync/atomic"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/ipoib"
)

// Translator maps addresses between the two link layers for one partition.
// mactrans.View implements it.
type Translator interface {
	EthToIB(mac ether.MAC) (ipoib.HwAddr, bool)
	IBToEth(hw ipoib.HwAddr) (ether.MAC, bool)
}

// Reason is why a packet was rejected. It is an error; returning it does not
// allocate.
type Reason uint8

// Rejection reasons.
const (
	ErrTruncated   Reason = iota + 1 // shorter than its headers say
	ErrBadLength                     // a length field disagrees with the packet
	ErrBadHwType                     // ARP hardware type not 1 or 32, or not matching the direction
	ErrBadHwLen                      // ARP hardware length not 6 or 20, or not matching the type
	ErrBadProto                      // ARP protocol not IPv4/4 bytes
	ErrBadOp                         // ARP opcode not 1–4
	ErrNotNDP                        // not an NDP message this package rewrites
	ErrOptLenZero                    // an NDP or DHCP option of length 0
	ErrOptOverrun                    // an option runs past the packet
	ErrBadOptLen                     // a link-layer option of the wrong size
	ErrTooManyOpts                   // more link-layer options than an NDP message may carry
	ErrUnknownAddr                   // a MAC or IPoIB address the tables do not know
	ErrNoRoom                        // the buffer lacks the capacity to grow
	ErrNotDHCP                       // not a DHCPv4 message over UDP/IPv4
	ErrBadCookie                     // missing DHCP magic cookie
	ErrNoEnd                         // DHCP options without an END option
	ErrBadChecksum                   // the packet arrived with a wrong checksum; rewriting would hide that
	numReasons
)

var reasonNames = [numReasons]string{
	ErrTruncated:   "truncated",
	ErrBadLength:   "bad_length",
	ErrBadHwType:   "bad_hw_type",
	ErrBadHwLen:    "bad_hw_len",
	ErrBadProto:    "bad_proto",
	ErrBadOp:       "bad_op",
	ErrNotNDP:      "not_ndp",
	ErrOptLenZero:  "opt_len_zero",
	ErrOptOverrun:  "opt_overrun",
	ErrBadOptLen:   "bad_opt_len",
	ErrTooManyOpts: "too_many_opts",
	ErrUnknownAddr: "unknown_addr",
	ErrNoRoom:      "no_room",
	ErrNotDHCP:     "not_dhcp",
	ErrBadCookie:   "bad_cookie",
	ErrNoEnd:       "no_end",
	ErrBadChecksum: "bad_checksum",
}

// String returns the counter name of r, e.g. "opt_len_zero".
func (r Reason) String() string {
	if r == 0 || r >= numReasons {
		return "unknown"
	}
	return reasonNames[r]
}

// Error implements error.
func (r Reason) Error() string { return "arpndp: " + r.String() }

// Counters counts rejections by reason. The zero value is ready; it is safe
// for concurrent use.
type Counters struct {
	c [numReasons]atomic.Uint64
}

// Count records err if it is a Reason and reports whether it was.
func (c *Counters) Count(err error) bool {
	r, ok := err.(Reason)
	if !ok || r == 0 || r >= numReasons {
		return false
	}
	c.c[r].Add(1)
	return true
}

// Get returns the count for r.
func (c *Counters) Get(r Reason) uint64 {
	if r >= numReasons {
		return 0
	}
	return c.c[r].Load()
}

// Snapshot returns the non-zero counts by name.
func (c *Counters) Snapshot() map[string]uint64 {
	m := make(map[string]uint64)
	for r := Reason(1); r < numReasons; r++ {
		if v := c.c[r].Load(); v != 0 {
			m[r.String()] = v
		}
	}
	return m
}

// Each calls f with every reason and its count, zero or not, in order.
func (c *Counters) Each(f func(r Reason, n uint64)) {
	for r := Reason(1); r < numReasons; r++ {
		f(r, c.c[r].Load())
	}
}
