package fastpath

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Probe reports whether the running kernel can run the fast path, and
// if not, why, in one line naming what is missing. It changes nothing on
// any device:
//
//   - Both programs must load. The verifier refuses a helper the kernel
//     lacks (bpf_skb_change_head, bpf_skb_adjust_room, bpf_redirect,
//     bpf_skb_load_bytes, bpf_skb_store_bytes) or does not give tc
//     programs, and a __sk_buff field it does not know; loading needs
//     CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON, which lets the verifier
//     (kernel/bpf/verifier.c) take what it refuses an unprivileged
//     loader: 6.18's, the RX program's read of stack an IPv4 header
//     left unwritten (check_stack_read_fixed_off, allow_uninit_stack);
//     6.1's, the TX program's stores into a stack slot holding part of
//     a spilled scalar (check_stack_write_fixed_off, "attempt to
//     corrupt spilled pointer on stack"). And RLIMIT_MEMLOCK room
//     before Linux 5.11 (raiseMemlock). That sets the floor at Linux 5.8: tc programs
//     may call bpf_skb_change_head from 5.8 (tc_cls_act_func_proto,
//     net/core/filter.c, commit 6f3f65d80dac; before it tc programs could
//     not, lightweight-tunnel ones could from 4.10), and both programs
//     read __sk_buff.gso_size, from 5.7 (commit cf62089b0edd; an older
//     bpf_skb_is_valid_access refuses an offset past its struct). A kernel
//     older than 5.8 passes only if both were taken back into it (5.4.228
//     took the first).
//   - tcx (Linux 6.6) is tried: the TX program is attached to an
//     interface index no device has; tcx_link_attach (kernel/bpf/tcx.c)
//     answers ENODEV after accepting the attach type, and a kernel
//     without tcx refuses the attach type first, which link.AttachTCX
//     reports as ebpf.ErrNotSupported (its own probe, haveTCX, does the
//     same). Either passes: AttachWith then uses clsact filters, which
//     it cannot try without changing a device (a qdisc add), so a kernel
//     without cls_bpf or sch_ingress fails there, not here.
//
// The adjust_room flags the RX program passes (BPF_F_ADJ_ROOM_FIXED_GSO,
// BPF_F_ADJ_ROOM_NO_CSUM_RESET) are checked only when a packet runs
// (bpf_skb_adjust_room returns -EINVAL for flags outside its mask), not
// at load. On a kernel without them every RX packet falls back, counted
// as RXFallbackShrink. FIXED_GSO came in 5.2 and NO_CSUM_RESET in 5.8
// (and 5.7.5), so only a kernel that backported the load floor above
// unevenly can lack them. BPF_PROG_TEST_RUN is not needed at run time.
func Probe() error {
	raiseMemlock()
	tx, err := LoadTX()
	if err != nil {
		return fmt.Errorf("the TX program does not load (%s): %w", needs, err)
	}
	defer tx.Close()
	rx, err := LoadRX()
	if err != nil {
		return fmt.Errorf("the RX program does not load (%s): %w", needs, err)
	}
	rx.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: tx.Program, Attach: ebpf.AttachTCXEgress})
	switch {
	case err == nil:
		l.Close()
		return errors.New("tcx attached to a device that does not exist")
	case errors.Is(err, unix.ENODEV), errors.Is(err, ebpf.ErrNotSupported):
		return nil
	default:
		return fmt.Errorf("tcx attach: %w", err)
	}
}

// needs is what loading the programs takes, for the probe's errors.
const needs = "the fast path needs Linux 5.8 or later, CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN"

// raiseMemlock lifts RLIMIT_MEMLOCK as far as the process may: to
// infinity with CAP_SYS_RESOURCE (or a hard limit already infinite, as
// the systemd unit's LimitMEMLOCK gives), else the soft limit up to the
// hard one. It never lowers it. Before Linux 5.11 every map's memory
// counts against it (bpf_charge_memlock, from bpf_map_charge_init in
// kernel/bpf/syscall.c), and the maps here take a few MiB, far more than
// the default of 64 KiB those kernels give (8 MiB from 5.16). From 5.11
// the memory cgroup accounts for maps and the limit is not consulted, so
// raising it there changes nothing the fast path does; the daemon's
// children (ip, ovs-vsctl) inherit it. A limit it cannot raise is left as
// it is: the load then fails with EPERM, which the probe reports.
func raiseMemlock() {
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if unix.Setrlimit(unix.RLIMIT_MEMLOCK, &inf) == nil {
		return
	}
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r) == nil && r.Cur < r.Max {
		r.Cur = r.Max
		_ = unix.Setrlimit(unix.RLIMIT_MEMLOCK, &r)
	}
}
