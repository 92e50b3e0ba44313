// Package bpfasm holds instruction sequences that the fast path's tc
// programs (package fastpath) and the emulated IPoIB wire's (package
// emuib) share, written with cilium/ebpf's asm package.
package bpfasm

import (
	"encoding/binary"

	"github.com/cilium/ebpf/asm"
)

// CountAndExit is a program's common tail, labelled count: it stores the
// counter index R9 in the 4-byte stack slot at slot (an offset from R10),
// adds one, atomically, to that uint64 element of the array map that
// instruction index counters loads, and returns R8 (labelled exit). An
// index the map does not hold counts nothing.
func CountAndExit(counters int, slot int16) asm.Instructions {
	return asm.Instructions{
		asm.StoreMem(asm.RFP, slot, asm.R9, asm.Word).WithSymbol("count"),
		asm.LoadMapPtr(asm.R1, counters),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(slot)),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "exit"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R0, asm.R8).WithSymbol("exit"),
		asm.Return(),
	}
}

// TestRunTakes reports whether BPF_PROG_TEST_RUN takes frame as a tc
// program's packet, for the fuzz targets of both packages to skip what
// it refuses: bpf_prog_test_run_skb (net/bpf/test_run.c) refuses a frame
// shorter than Ethernet or than the IPv4 or IPv6 header its bytes 12-13
// announce, and bpf_test_init one longer than a page's room (3000 bytes
// stays within it).
func TestRunTakes(frame []byte) bool {
	const ethLen = 14
	if len(frame) < ethLen || len(frame) > 3000 {
		return false
	}
	typ := binary.BigEndian.Uint16(frame[12:])
	return !(typ == 0x0800 && len(frame) < ethLen+20 || typ == 0x86dd && len(frame) < ethLen+40)
}
