// Package iobuf allocates the data path's packet buffers outside the Go
// heap. A reader needs a batch of buffers, each as large as the largest
// frame it may be handed (64 KB super-frames with offloads). An ordinary
// frame writes a page or two of one. On the Go heap those buffers count
// in full toward the collector's goal (twice the live heap). So the
// garbage a burst of control-plane work leaves grows by their size,
// although their unwritten pages never take physical memory. Mapped
// anonymously instead, they cost only the pages written (RSS). The
// collector neither counts nor scans them, and its goal follows the
// tables alone.
package iobuf

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Bufs is n buffers of one size in one anonymous mapping.
type Bufs struct {
	mem  []byte
	Bufs [][]byte // the buffers, each with its capacity ending where it does
}

// New maps n buffers of size bytes each (mmap(2), MAP_ANONYMOUS: zeroed
// pages, backed by memory only once written).
func New(n, size int) (*Bufs, error) {
	if n <= 0 || size <= 0 {
		return nil, fmt.Errorf("iobuf: %d buffers of %d bytes", n, size)
	}
	mem, err := unix.Mmap(-1, 0, n*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("iobuf: map %d buffers of %d bytes: %w", n, size, err)
	}
	b := &Bufs{mem: mem, Bufs: make([][]byte, n)}
	for i := range b.Bufs {
		b.Bufs[i] = mem[i*size : (i+1)*size : (i+1)*size]
	}
	return b, nil
}

// Free unmaps the buffers; none of them may be used after it.
func (b *Bufs) Free() error {
	if b.mem == nil {
		return nil
	}
	err := unix.Munmap(b.mem)
	b.mem, b.Bufs = nil, nil
	return err
}
