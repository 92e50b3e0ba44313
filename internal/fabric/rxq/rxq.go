// Package rxq hands out the packets that a port's own goroutines (the
// in-memory fabric's senders, the kernel backend's per-child readers)
// queue on a channel in pooled buffers, a batch per Read.
package rxq

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/eipoib/eipoibd/ipoib"
)

// Packet is a queued packet: (*Buf)[Start:Start+N], from pool.
type Packet struct {
	Buf      *[]byte
	Start, N int
	Meta     ipoib.RxMeta
}

// Counters are the port's receive counters Read keeps.
type Counters struct {
	Packets, Bytes *atomic.Uint64
	// TooSmall counts a packet larger than the buffer it would go in
	// (dropped).
	TooSmall func()
}

// Read blocks for a packet on c (net.ErrClosed once done is closed) and
// returns it with those queued behind it, up to len(bufs), as
// ipoib.Port.Read does; buffers go back to pool.
func Read(c <-chan Packet, done <-chan struct{}, pool *sync.Pool, ctr Counters, bufs [][]byte, sizes []int, meta []ipoib.RxMeta, offset int) (int, error) {
	n := 0
	for n == 0 {
		var pk Packet
		select {
		case pk = <-c:
		case <-done:
			return 0, net.ErrClosed
		}
		for {
			if pk.N > len(bufs[n])-offset {
				ctr.TooSmall()
			} else {
				sizes[n] = copy(bufs[n][offset:], (*pk.Buf)[pk.Start:pk.Start+pk.N])
				meta[n] = pk.Meta
				ctr.Packets.Add(1)
				ctr.Bytes.Add(uint64(sizes[n]))
				n++
			}
			pool.Put(pk.Buf)
			if n == len(bufs) {
				return n, nil
			}
			var ok bool
			select {
			case pk, ok = <-c:
			default:
			}
			if !ok {
				break
			}
		}
	}
	return n, nil
}
