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
//     bpf_skb_load_bytes, bpf_skb_store_bytes), and needs CAP_BPF and
//     CAP_NET_ADMIN.
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
// as RXFallbackShrink; both are years older than tcx, so only a kernel
// that uses the clsact fallback can lack them. BPF_PROG_TEST_RUN is not
// needed at run time.
func Probe() error {
	tx, err := LoadTX()
	if err != nil {
		return fmt.Errorf("the TX program does not load: %w", err)
	}
	defer tx.Close()
	rx, err := LoadRX()
	if err != nil {
		return fmt.Errorf("the RX program does not load: %w", err)
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
