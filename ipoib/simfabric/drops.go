package simfabric

// The drop reasons of a Port, in one place: a refused packet is counted
// under one of these indexes and exported under its name (the port's
// Counters().Drops).

// Drop reasons counted by a Port. The first ones are the DecodeError
// values, so a decode failure indexes the same array.
const (
	DropQKey = int(numDecodeErrors) + iota
	DropPKey
	DropUnknownQPN
	DropNotJoined
	DropOversize
	DropNoRoom
	DropBadMeta
	DropPortDown
	DropNoPktinfo
	DropSendError
	DropBadSource
	DropBadDestQPN
	DropBadGSO
	numDrops
)

// DropNames are the counter names of the drop reasons, by index.
var DropNames = func() [numDrops]string {
	var n [numDrops]string
	for e := DecodeError(1); e < numDecodeErrors; e++ {
		n[e] = e.String()
	}
	n[DropQKey] = "qkey_mismatch"
	n[DropPKey] = "pkey_mismatch"
	n[DropUnknownQPN] = "unknown_qpn"
	n[DropNotJoined] = "not_joined"
	n[DropOversize] = "oversize"
	n[DropNoRoom] = "no_room"
	n[DropBadMeta] = "bad_meta"
	n[DropPortDown] = "port_down"
	n[DropNoPktinfo] = "no_pktinfo"
	n[DropSendError] = "send_error"
	n[DropBadSource] = "bad_source"
	n[DropBadDestQPN] = "bad_dest_qpn"
	n[DropBadGSO] = "bad_gso"
	return n
}()

// decodeNames are the counter names of the DecodeError values.
var decodeNames = [numDecodeErrors]string{
	ErrTruncated: "truncated",
	ErrOpcode:    "bad_opcode",
	ErrVersion:   "bad_tver",
	ErrICRC:      "bad_icrc",
	ErrPad:       "bad_pad",
}

// dropRxQueueOverflow names the kernel's receive-queue drops
// (SO_RXQ_OVFL), which the kernel counts, not the port.
const dropRxQueueOverflow = "rx_queue_overflow"

func (p *Port) drop(reason int) { p.drops[reason].Add(1) }

// dropCounts returns the drops counted so far by name, reasons with none
// left out.
func (p *Port) dropCounts() map[string]uint64 {
	m := make(map[string]uint64)
	for i := range p.drops {
		if v := p.drops[i].Load(); v != 0 {
			m[DropNames[i]] = v
		}
	}
	if v := p.rxOverflow.Load(); v != 0 {
		m[dropRxQueueOverflow] = v
	}
	return m
}
