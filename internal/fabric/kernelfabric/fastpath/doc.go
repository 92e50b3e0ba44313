// Package fastpath holds the groundwork of an in-kernel fast path for the
// kernel backend: two tc BPF programs, written with cilium/ebpf's asm
// package (no clang), that carry a guest's ordinary unicast IP traffic
// between the hypervisor's TAP and the guest's IPoIB child interface, so
// that the common case never crosses user space. Everything else falls
// back, untouched, to eipoibd's user-space path.
//
// # TX: the TAP's egress to the child
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
// child's offloads go by the former. A TCP GSO skb must fit segment by
// segment; a UDP GSO skb must fit whole (struct __sk_buff does not say
// whether it is UDP segmentation, UFO or a UDP tunnel, whose segments
// carry inner headers gso_size does not count). Every other frame is left
// exactly as it was and returned TC_ACT_OK, so eipoibd reads it from the
// TAP and handles it as it does today. Each verdict and each fallback
// reason is counted in a per-CPU array (Reason).
//
// The kernel functions the TX program relies on (Linux 6.18):
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
//   - ipoib_start_xmit (drivers/infiniband/ulp/ipoib/ipoib_main.c) reads the
//     struct ipoib_pseudo_header (the 20-byte address, pushed by
//     push_pseudo_header in ipoib_hard_header) from skb->data, pulls it,
//     and switches on the struct ipoib_header's proto that follows; the
//     neighbour and path lookup (ipoib_neigh_get, neigh_add_path) is keyed
//     by those 20 bytes, and ipoib_send takes LSO and checksum offload from
//     the skb (skb_transport_offset, CHECKSUM_PARTIAL), which change_head
//     left intact. ipoib has no hw_enc_features, so an encapsulated GSO
//     skb is segmented in software first, and ipoib_send drops a segment
//     over the MTU.
//
// # RX: the child's ingress to the TAP
//
// The RX program (LoadRX) runs at tc ingress of an IPoIB child, where
// ipoib_ib_handle_rx_wc and ipoib_cm_handle_rx_wc leave
//
//	[20 zero bytes (skb_add_pseudo_hdr)][EtherType 2][reserved 2][L3]
//
// with mac_len 24 and skb->protocol from the IPoIB header. For unicast
// IPv4/IPv6 to the child's guest from a sender whose REMAC the senders
// map holds, it shrinks the link header to 14 bytes with
// bpf_skb_adjust_room, writes
//
//	[guest MAC 6][sender's REMAC 6][EtherType 2][L3]
//
// and redirects it to the TAP's ingress (BPF_F_INGRESS), as if eipoibd
// had written the frame to the TAP; rxInstructions says how each kernel
// function involved treats the skb. ARP, ND, DHCP, DHCPv6, IB multicast
// and IP group destinations, IPv6 extension headers, unknown children or
// senders, packets too big for the TAP or too short to shrink, and
// malformed packets return TC_ACT_OK untouched, each counted (RXReason).
//
// # How eipoibd runs it
//
// --fast-path auto or on (kernel backend only, off by default) runs
// Probe first. AttachWith loads both programs and attaches TX at the
// TAP's egress; PutChild attaches RX at each guest child's ingress. Both
// are attached with tcx links, or, on a kernel without tcx (before 6.6),
// with direct-action cls_bpf filters under a clsact qdisc, at a fixed
// priority and handle so that only ours is ever replaced or deleted
// (Hook says why the programs' verdicts mean the same under both).
//
// Under --persist the maps and the tcx links are pinned in a bpffs
// directory per TAP (Options.Pin): Release leaves them attached and
// pinned, and the next process's AttachWith takes them over, maps of
// the same layout with their entries and links still on their devices,
// swapping its freshly loaded programs in (tcx_link_update); what does
// not match this binary is replaced, and logged once. A clsact filter
// cannot be pinned: it stays on its device, and AttachWith replaces our
// filter's program in place. Close removes everything, pins included;
// RemovePins cleans up after a pinned run for a start that does not pin.
// kernelfabric's FastPath starts from the maps' Entries, so its first
// round deletes what is stale and puts what is missing.
//
// Package kernelfabric's FastPath fills and empties the maps from the rounds of
// the shim's control goroutine (internal/shim/fastpath.go says what it
// may carry and when it carries nothing), and the kernel port binds the
// VIF children's packet sockets to ETH_P_IP, ETH_P_IPV6, ETH_P_ARP and
// ETH_P_RARP rather than ETH_P_ALL, since __netif_receive_skb_core
// delivers to ptype_all sockets before tc ingress. Attached.Counts feeds
// the port's counters (eipoibd_fast_path_total).
//
// Each program, when it redirects, adds one with a BPF atomic add
// (countHits cites the kernel's semantics) to a hit count in both map
// values it used, with no extra lookup: TX in the guest's and the
// REMAC's, RX in the child's and the sender's. eipoibd does not see the
// frames it carries, so before its tables age a VIF or age or evict a
// neighbour, kernelfabric.FastPath reads those counts (GuestHits,
// REMACHits, SenderHits: one lookup per entry) and the shim keeps what
// was used since it last asked.
//
// # What it is not yet
//
// Test/hw kit legs with the fast path on and off exist, but only
// InfiniBand hosts run them. The clsact fallback has run here only
// forced, on a kernel that has tcx.
//
// # How it is tested
//
// BPF_PROG_TEST_RUN on crafted packets checks every verdict of both
// programs, the exact output bytes, the redirect target (recorded in
// LastRedirect, since TEST_RUN reports the verdict but not the target),
// the counters and the hit counts; FuzzTX and FuzzRX check the same
// contracts on arbitrary input. TEST_RUN cannot show everything: it
// sets no gso_type, so a UDP tunnel skb is a UDP skb with a gso_size
// there, and it builds an Ethernet skb, so RX packets carry their
// EtherType in the pseudo header's bytes 12-13 for it (the program
// reads neither).
//
// The attach, pinning and live tests run with each hook (clsact forced,
// as this kernel has tcx), pins on a private bpffs. Two live tests use
// real devices in a network namespace. TX: the
// program at egress of a TAP redirects to a TUN switched to
// ARPHRD_INFINIBAND with TUNSETLINK, an emulation of the child that shows
// what the kernel does with the skb up to the driver (a TSO super-frame
// arrives whole with gso_size kept and csum_start 44, or is segmented in
// software for a device without offloads, every segment keeping the
// 24-byte link header), and a VXLAN device's UDP tunnel GSO skb, whose
// segments would not fit the child, stays on the TAP. RX: the harness
// of the emulated wire (package emuib) at ingress of a child, written as
// the wire delivers, rebuilds ipoib's receive layout and the RX
// program, after it, redirects to a TAP carrying the guest's address
// (the kernel answers an ICMP echo to the REMAC; a TSO super-frame
// arrives whole with gso_size kept). Package emuib/testbed runs both end to end between two
// hypervisors over the emulated wire: guest ping and TCP both ways,
// byte-exact, with offloads on and off. What ipoib and the HCA do around
// these programs only hardware can confirm.
package fastpath
