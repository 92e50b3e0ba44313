package vswitch

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// dumpTries bounds how often a netlink dump is made when a change of
// the table interrupts it.
const dumpTries = 5

// dump calls list, a netlink dump, again while it is interrupted. The
// kernel flags a dump during which its table changed NLM_F_DUMP_INTR
// (include/net/netlink.h nl_dump_check_consistent, as rtnl_dump_ifinfo,
// rtnl_fdb_dump and neigh_dump_table use it). vishvananda/netlink
// returns that as ErrDumpInterrupted beside results that may lack the
// change. After dumpTries interrupted dumps it gives up with the error.
func dump[T any](what string, list func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpTries {
		if v, err = list(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return v, fmt.Errorf("vswitch: %s: %w", what, err)
	}
	return v, nil
}
