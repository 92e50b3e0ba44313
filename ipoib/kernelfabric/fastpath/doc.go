// Package fastpath holds the groundwork of an in-kernel fast path for
// the kernel backend. It is a tc BPF program on a hypervisor's TAP that
// sends a guest's ordinary unicast IP traffic straight to the guest's
// IPoIB child interface, so that the common case never crosses user
// space.
//
// # What it is
//
// The TX program (LoadTX) runs at tc egress of the TAP, where the frames a
// guest sends leave the host stack towards eipoibd. For an untagged
// IPv4/IPv6 unicast frame from a known guest MAC to a known REMAC that fits
// the guest child's MTU, it rewrites
//
//	[dst MAC 6][src MAC 6][EtherType 2][L3]
//
// into the layout an IPoIB device expects from its own hard_header,
//
//	[20-byte destination IPoIB address][EtherType 2][reserved 2][L3]
//
// and redirects it to the child's egress. It also requires skb->protocol
// to match the EtherType, since GSO (skb_mac_gso_segment) and the
// child's offloads go by the former. Every other frame is left exactly
// as it was and returned TC_ACT_OK, so eipoibd reads it from the TAP and
// handles it as it does today. Each verdict and each fallback reason is
// counted in a per-CPU array (Reason).
//
// The kernel functions the program relies on (Linux 6.18):
//
//   - bpf_skb_change_head (net/core/filter.c, __bpf_skb_change_head) pushes
//     10 zeroed bytes in front of the Ethernet header and resets the MAC
//     header to the new start, keeping skb->protocol, the network header,
//     csum_start and gso_size: "we currently only allow to expand on mac
//     header ... not needing to linearize or reset GSO". bpf_skb_adjust_room
//     is not used: it moves the network header and, for GSO skbs, changes
//     gso_size, which would corrupt a TSO super-frame.
//   - bpf_redirect / __bpf_redirect (net/core/filter.c): dev_is_mac_header_xmit
//     is true for ARPHRD_INFINIBAND, so __bpf_redirect_common keeps the
//     24-byte link header (it only checks mac_header < network_header) and
//     __bpf_tx_skb queues the skb on the child unchanged.
//   - ipoib_start_xmit (drivers/infiniband/ulp/ipoib/ipoib_main.c) reads
//     the struct ipoib_pseudo_header from skb->data and pulls it: the
//     20-byte address, pushed by push_pseudo_header in ipoib_hard_header.
//     It switches on the proto of the struct ipoib_header that follows.
//     The neighbour and path lookup (ipoib_neigh_get, neigh_add_path) is
//     keyed by those 20 bytes. ipoib_send takes LSO and checksum offload
//     from the skb (skb_transport_offset, CHECKSUM_PARTIAL), which
//     change_head left intact.
//
// # What it is not yet
//
// Nothing in eipoibd loads this package. Still to come:
//   - attaching (tcx, clsact on kernels before 6.6) and pinning for
//     --persist;
//   - the RX program on the children's tc ingress;
//   - the control plane that fills and empties the maps as VIFs and
//     neighbours come and go, and keeps the fast path off where the
//     user-space path does more than re-frame (MSS clamping, the shim's
//     per-source checks);
//   - the --fast-path flag and its kernel probe;
//   - Prometheus export of the counters;
//   - make bench rows and test/hw kit legs.
//
// # How it is tested
//
// BPF_PROG_TEST_RUN on crafted frames checks every verdict, the exact
// output bytes, the redirect target (recorded in LastRedirect) and the
// counters. A fuzz target checks the same contract on arbitrary frames.
//
// A live test attaches the program at tcx egress of a real TAP in a
// network namespace. It reads what the program redirects from a TUN
// switched to ARPHRD_INFINIBAND with TUNSETLINK. That emulates the child
// and shows what the kernel does with the skb up to the driver. A TSO
// super-frame arrives whole with gso_size kept and csum_start 44, or is
// segmented in software for a device without offloads, every segment
// keeping the 24-byte link header. What ipoib_start_xmit and the HCA
// then do with it only hardware can confirm.
package fastpath
