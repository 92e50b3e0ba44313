package arpndp

import (
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
)

func BenchmarkARPRewrite(b *testing.B) {
	tr := newTr()
	orig := testutil.Unhex(b, arpEthReply)
	buf := make([]byte, ARPIBLen)
	b.ReportAllocs()
	b.SetBytes(int64(len(orig)))
	for i := 0; i < b.N; i++ {
		n := copy(buf, orig)
		ib, err := ARPToIB(buf[:n], tr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ARPToEth(ib, tr); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNDPRewrite(b *testing.B) {
	tr := newTr()
	orig := ndpPacket(TypeNeighborAdvertisement, ndpBodies()[TypeNeighborAdvertisement], ethOpt(OptTLLA, guestMAC))
	buf := make([]byte, len(orig)+16)
	b.ReportAllocs()
	b.SetBytes(int64(len(orig)))
	for i := 0; i < b.N; i++ {
		n := copy(buf, orig)
		ib, err := NDPToIB(buf[:n], tr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := NDPToEth(ib, tr); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDHCPToIB(b *testing.B) {
	orig := dhcpRequest(b, false)
	buf := make([]byte, len(orig)+16)
	b.ReportAllocs()
	b.SetBytes(int64(len(orig)))
	for i := 0; i < b.N; i++ {
		n := copy(buf, orig)
		if _, err := DHCPToIB(buf[:n], ClientIDMAC); err != nil {
			b.Fatal(err)
		}
	}
}
