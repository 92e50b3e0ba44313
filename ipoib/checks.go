package ipoib

// The checks every backend applies, written once: what a port refuses
// to send (CheckTx) and what it refuses to deliver (CheckRx). Each
// returns DropNone or the reason to count, and allocates nothing.

// CheckTx checks the metadata of a packet of n bytes (IPoIB header
// included) handed to Write. Its source QP must be one of qps with the
// P_Key it was allocated in. Its destination QPN must be the multicast
// QPN exactly when its GID is an MGID. A super-packet must be a TCP one
// the port takes (tso), with its TCP header inside the packet. A packet
// shorter than the IPoIB header passes: a backend that reads the header
// (for its ethertype) refuses one itself. CheckTx returns the source
// QP's entry, and DropBadMeta or DropBadGSO for a packet to refuse. Size
// against the MTU is the backend's check: the MTU may be the partition's
// or the child's.
func CheckTx(m *TxMeta, n int, qps *QPTable, tso bool) (QP, Drop) {
	return CheckTxOffloads(m, n, qps, Offloads{TSO: tso})
}

// CheckTxOffloads is CheckTx for a port that takes the super-packets o
// says: TCP ones with TSO, UDP ones with USO (the UDP header inside the
// packet).
func CheckTxOffloads(m *TxMeta, n int, qps *QPTable, o Offloads) (QP, Drop) {
	q, own := qps.Lookup(m.SrcQPN)
	l4min := 20 // a TCP header
	if m.GSO.Type.UDP() {
		l4min = 8
	}
	switch {
	case !own || q.PKey != m.PKey:
		return q, DropBadMeta
	case (m.Dst.QPN() == MulticastQPN) != m.Dst.GID().IsMulticast():
		return q, DropBadMeta
	case m.GSO.Type == GSONone:
		return q, DropNone
	case m.GSO.Type > GSOUDPv6 || !o.TSO || m.GSO.Type.UDP() && !o.USO ||
		m.GSO.L4 < HeaderLen || int(m.GSO.L4)+l4min > n || m.GSO.Size == 0:
		return q, DropBadGSO
	}
	return q, DropNone
}

// CheckRx checks a received packet's metadata against the port's QPs and
// groups. A multicast packet (m.DstQPN the multicast QPN, m.MGID its
// group) must be to a group the port is a full member of. A unicast one
// (m.MGID zero) must be to one of its QPs. Its P_Key must be able to
// talk to the group's or the QP's (IBA 10.9.3). The multicast QPN goes
// only to an MGID (IBA 9.8.1).
func CheckRx(m *RxMeta, qps *QPTable, groups *GroupTable) Drop {
	mcast := m.DstQPN == MulticastQPN
	if mcast != m.MGID.IsMulticast() {
		return DropBadDestQPN
	}
	if mcast {
		if !groups.Full(m.MGID) {
			return DropNotJoined
		}
		if !CanTalk(m.PKey, MGIDPKey(m.MGID)) {
			return DropPKey
		}
		return DropNone
	}
	pk, ok := qps.PKey(m.DstQPN)
	if !ok {
		return DropUnknownQPN
	}
	if !CanTalk(m.PKey, pk) {
		return DropPKey
	}
	return DropNone
}
