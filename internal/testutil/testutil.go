// Package testutil holds the small helpers that the tests of many of
// eipoibd's packages share: waiting for a state, writing a GID and
// writing bytes in hex.
//
// It imports the standard library and ipoib only, so the tests of any
// package that ipoib does not import can use it (an in-package test of
// ether, internal/csum, internal/header or internal/gso would make an
// import cycle).
package testutil

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/eipoib/eipoibd/ipoib"
)

// Settle bounds a wait for a state, or a message, that a test expects:
// generous, since it only runs out when the state never comes, and a
// loaded machine may take seconds to schedule the goroutine that makes
// it.
const Settle = 20 * time.Second

// poll is how long WaitFor sleeps between two calls of its condition.
const poll = 5 * time.Millisecond

// WaitFor calls cond until it returns true, and fails t, naming what it
// waited for, if that has not happened within Settle.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(Settle); !cond(); time.Sleep(poll) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", Settle, what)
		}
	}
}

// GID is the GID written as the IPv6 address s ("fe80::a"); it panics
// if s is not one.
func GID(s string) ipoib.GID { return ipoib.GID(netip.MustParseAddr(s).As16()) }

// Unhex decodes hex in which spaces, tabs, newlines and "|" may separate
// the digits (to lay out a packet's fields), failing t if s is not hex.
func Unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
