// Package bpfasm holds instruction sequences that the fast path's tc
// programs (package fastpath) and the emulated IPoIB wire's (package
// emuib) share, written with cilium/ebpf's asm package.
package bpfasm

import "github.com/cilium/ebpf/asm"

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
