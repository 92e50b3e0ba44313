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
//     programs, and a __sk_buff field it does not know; it needs CAP_BPF
//     and CAP_NET_ADMIN. That sets the floor at Linux 5.8: tc programs
//     may call bpf_skb_change_head from 5.8 (tc_cls_act_func_proto,
//     net/core/filter.c, commit 6f3f65d80dac; before, only LWT programs
//     could), and both programs read __sk_buff.gso_size, from 5.7
//     (bpf_convert_ctx_access, commit cf62089b0edd). A distribution
//     kernel that took those back (5.4.228 took the first) may pass.
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
	tx, err := LoadTX()
	if err != nil {
		return fmt.Errorf("the TX program does not load (the fast path needs Linux 5.8 or later): %w", err)
	}
	defer tx.Close()
	rx, err := LoadRX()
	if err != nil {
		return fmt.Errorf("the RX program does not load (the fast path needs Linux 5.8 or later): %w", err)
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
