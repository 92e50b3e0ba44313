package simfabric

// A Port counts its drops with the drop reasons every backend shares
// (ipoib.Drop, ipoib.DropCounters): what is simfabric's own here is how
// a wire decode error maps to one of them.

import "github.com/eipoib/eipoibd/ipoib"

// decodeDrops are the drop reasons of the DecodeError values.
var decodeDrops = [numDecodeErrors]ipoib.Drop{
	ErrTruncated: ipoib.DropTruncated,
	ErrOpcode:    ipoib.DropBadOpcode,
	ErrVersion:   ipoib.DropBadTVer,
	ErrICRC:      ipoib.DropBadICRC,
	ErrPad:       ipoib.DropBadPad,
}

// Drop is the reason a port counts the datagram under, ipoib.DropNone
// for an unknown error.
func (e DecodeError) Drop() ipoib.Drop {
	if e >= numDecodeErrors {
		return ipoib.DropNone
	}
	return decodeDrops[e]
}
