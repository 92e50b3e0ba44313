package udprate

// window is how far behind the highest sequence number of its flow a
// datagram may arrive and still be told apart as a duplicate or a late
// (reordered) one; an older one counts as stale.
const window = 1 << 20

// flowState is what a receiver knows of one flow.
type flowState struct {
	next      uint64   // the highest sequence number seen, plus 1
	seen      []uint64 // bit seq%window for the sequence numbers in [next-window, next)
	received  uint64   // distinct data datagrams
	dups      uint64
	reordered uint64 // arrived after a higher sequence number
	stale     uint64 // arrived more than window behind
	sent      uint64 // from the flow's end datagram
	ended     bool
}

func (f *flowState) bit(seq uint64) (word int, mask uint64) {
	i := seq % window
	return int(i / 64), 1 << (i % 64)
}

// clear forgets the slots of sequence numbers [from, to), which now stand
// for numbers window later.
func (f *flowState) clear(from, to uint64) {
	if to-from >= window {
		clear(f.seen)
		return
	}
	for s := from; s < to; {
		w, m := f.bit(s)
		if m == 1 && to-s >= 64 { // a whole word
			f.seen[w] = 0
			s += 64
			continue
		}
		f.seen[w] &^= m
		s++
	}
}

// add accounts for data datagram seq and reports whether it is one not
// seen before.
func (f *flowState) add(seq uint64) bool {
	if seq >= f.next {
		f.clear(f.next, seq+1)
		f.next = seq + 1
		w, m := f.bit(seq)
		f.seen[w] |= m
		f.received++
		return true
	}
	if f.next-seq > window {
		f.stale++
		return false
	}
	w, m := f.bit(seq)
	if f.seen[w]&m != 0 {
		f.dups++
		return false
	}
	f.seen[w] |= m
	f.received++
	f.reordered++
	return true
}

// Tracker accounts for the datagrams of up to MaxFlows flows. It is not
// safe for concurrent use.
type Tracker struct {
	flows    [MaxFlows]*flowState
	invalid  uint64
	received uint64 // over all flows
	bytes    uint64
	ends     int    // flows whose end datagram arrived
	want     uint16 // flows the sender runs, from the first valid datagram
}

// Add accounts for datagram b.
func (t *Tracker) Add(b []byte) {
	h, err := Parse(b)
	if err != nil {
		t.invalid++
		return
	}
	if t.want == 0 {
		t.want = h.Flows
	}
	f := t.flows[h.Flow]
	if f == nil {
		f = &flowState{seen: make([]uint64, window/64)}
		t.flows[h.Flow] = f
	}
	if h.Kind == End {
		if !f.ended {
			f.ended, f.sent = true, h.Seq
			t.ends++
		}
		return
	}
	if f.add(h.Seq) {
		t.received++
		t.bytes += uint64(len(b))
	}
}

// Received is how many distinct data datagrams arrived, over all flows.
func (t *Tracker) Received() uint64 { return t.received }

// Done reports whether every flow of the sender has ended.
func (t *Tracker) Done() bool { return t.want > 0 && t.ends >= int(t.want) }

// Stats are a receiver's counts, summed over the flows.
type Stats struct {
	// Sent is how many data datagrams the flows sent: the count of
	// their end datagrams, or for a flow whose end did not arrive the
	// highest sequence number seen plus 1.
	Sent uint64 `json:"sent"`
	// SentKnown is whether the end datagram of every flow seen arrived.
	SentKnown bool `json:"sent_known"`
	// Received counts distinct data datagrams, Bytes their UDP payload.
	Received uint64 `json:"received"`
	Bytes    uint64 `json:"bytes"`
	// Lost is Sent less Received.
	Lost uint64 `json:"lost"`
	// Duplicates arrived again; Reordered arrived after a higher
	// sequence number of their flow; Stale arrived so late (window
	// behind) that they could not be told apart and are not counted
	// as received; Invalid were not udprate datagrams.
	Duplicates uint64 `json:"duplicates"`
	Reordered  uint64 `json:"reordered"`
	Stale      uint64 `json:"stale"`
	Invalid    uint64 `json:"invalid"`
	// Flows is how many flows sent at least one datagram.
	Flows int `json:"flows"`
}

// Stats sums the counts of the flows.
func (t *Tracker) Stats() Stats {
	s := Stats{SentKnown: true, Bytes: t.bytes, Invalid: t.invalid}
	for _, f := range t.flows {
		if f == nil {
			continue
		}
		s.Flows++
		sent := f.next
		if f.ended {
			sent = max(f.sent, f.next)
		} else {
			s.SentKnown = false
		}
		s.Sent += sent
		s.Received += f.received
		s.Lost += sent - f.received
		s.Duplicates += f.dups
		s.Reordered += f.reordered
		s.Stale += f.stale
	}
	if t.want == 0 || s.Flows < int(t.want) {
		s.SentKnown = false
	}
	return s
}
