package udprate

import "testing"

// feed adds data datagrams of flow (of flows) with these sequence
// numbers to tr.
func feed(tr *Tracker, flow, flows uint16, seqs ...uint64) {
	for _, s := range seqs {
		tr.Add(datagram(64, Header{Kind: Data, Flow: flow, Flows: flows, Seq: s}))
	}
}

// A flow with gaps, a late datagram and a duplicate, closed by its end
// datagram; a second flow with a duplicate and no end; one foreign
// datagram.
func TestTrackerCountsGapsDuplicatesReordering(t *testing.T) {
	var tr Tracker
	feed(&tr, 0, 2, 0, 1, 2, 5, 6, 3, 3, 9)
	tr.Add(datagram(64, Header{Kind: End, Flow: 0, Flows: 2, Seq: 12}))
	feed(&tr, 1, 2, 0, 1, 1)
	tr.Add([]byte("not ours"))
	want := Stats{
		Sent:       12 + 2,       // flow 0's end says 12; flow 1 shows 0 and 1
		Received:   7 + 2,        // {0 1 2 3 5 6 9} and {0 1}
		Bytes:      (7 + 2) * 64, // the distinct ones
		Lost:       5,            // 4 7 8 10 11 of flow 0
		Duplicates: 2,            // 3 of flow 0, 1 of flow 1
		Reordered:  1,            // 3 after 6
		Invalid:    1,
		Flows:      2,
	}
	if got := tr.Stats(); got != want {
		t.Fatalf("Stats\n got %+v\nwant %+v", got, want)
	}
	if tr.Done() {
		t.Fatal("Done before flow 1 ended")
	}
	tr.Add(datagram(64, Header{Kind: End, Flow: 1, Flows: 2, Seq: 2}))
	tr.Add(datagram(64, Header{Kind: End, Flow: 1, Flows: 2, Seq: 2})) // sent again: counted once
	if got := tr.Stats(); !tr.Done() || !got.SentKnown || got.Sent != 14 || got.Lost != 5 {
		t.Fatalf("after both ends: Done %v, Stats %+v; want done, sent 14 known, 5 lost", tr.Done(), got)
	}
}

// A datagram more than window behind its flow's highest is stale (it
// cannot be told from a duplicate); one exactly window behind is still
// told apart, after a gap that cleared its slot.
func TestTrackerWindowEdge(t *testing.T) {
	var tr Tracker
	feed(&tr, 0, 1, 0, window+5, 0, 6, window+5)
	want := Stats{
		Sent:       window + 6,
		Received:   3, // 0, window+5, 6
		Bytes:      3 * 64,
		Lost:       window + 3,
		Duplicates: 1, // window+5 again
		Reordered:  1, // 6
		Stale:      1, // 0 again, window+6 behind
		Flows:      1,
	}
	if got := tr.Stats(); got != want {
		t.Fatalf("Stats\n got %+v\nwant %+v", got, want)
	}
}
