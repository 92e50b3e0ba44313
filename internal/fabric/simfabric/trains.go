package simfabric

// UDP GSO trains: runs of equal-length packets to one peer leave as one
// super-datagram with a UDP_SEGMENT control message, cut back into the
// same datagrams by the kernel at the device.

import (
	"unsafe"

	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// span is the messages [from, to) of a chunk that one message sends.
type span struct{ from, to int }

// singles returns the spans of n messages sent one by one.
func (p *Port) singles(n int) []span {
	s := p.tspan[:0]
	for i := 0; i < n; i++ {
		s = append(s, span{i, i + 1})
	}
	return s
}

// trains replaces each run of messages to one address with equal lengths
// (the last may be shorter) by one message. That message gathers them
// end to end (an iovec per packet) with a UDP_SEGMENT control message.
// The kernel sends the train as one super-datagram and cuts it into the
// same datagrams at the device (UDP GSO): one traversal of the stack
// instead of one per packet.
func (p *Port) trains(msgs []ipv6.Message) ([]ipv6.Message, []span) {
	out, spans := p.tmsgs[:0], p.tspan[:0]
	nt := 0 // trains built
	for i := 0; i < len(msgs); {
		seg := len(msgs[i].Buffers[0])
		j, total := i+1, seg
		for j < len(msgs) && j-i < maxTrain && msgs[j].Addr == msgs[i].Addr &&
			len(msgs[j].Buffers[0]) <= seg && len(msgs[j-1].Buffers[0]) == seg && total+len(msgs[j].Buffers[0]) <= maxTrainBytes {
			total += len(msgs[j].Buffers[0])
			j++
		}
		if j-i == 1 {
			out = append(out, msgs[i])
		} else {
			if nt == len(p.trainOOB) {
				p.trainOOB = append(p.trainOOB, make([]byte, unix.CmsgSpace(2)))
				p.trainIOV = append(p.trainIOV, make([][]byte, 0, maxTrain))
			}
			iov := p.trainIOV[nt][:0]
			for _, m := range msgs[i:j] {
				iov = append(iov, m.Buffers[0]) // the kernel gathers them: no copy
			}
			p.trainIOV[nt] = iov
			oob := p.trainOOB[nt]
			h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
			h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			h.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(seg)
			out = append(out, ipv6.Message{Buffers: iov, OOB: oob, Addr: msgs[i].Addr})
			nt++
		}
		spans = append(spans, span{i, j})
		i = j
	}
	return out, spans
}
