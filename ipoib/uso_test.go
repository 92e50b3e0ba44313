package ipoib

import "testing"

// TestCheckTxOffloads: a UDP super-packet passes only to a port with USO
// (and TSO: super-packets at all) and with its UDP header inside the
// packet; CheckTx, for the TCP-only backends, refuses it; an unknown
// kind is refused everywhere.
func TestCheckTxOffloads(t *testing.T) {
	qps := NewQPTable(0x100)
	if err := qps.Add(0x4242, 0x8001, "vif"); err != nil {
		t.Fatal(err)
	}
	udp := TxMeta{Dst: MakeHwAddr(0, 0x77, GID{0xfe, 0x80, 15: 1}), SrcQPN: 0x4242, PKey: 0x8001,
		GSO: GSO{Type: GSOUDPv6, L4: 44, Size: 64}}
	unknown := udp
	unknown.GSO.Type = GSOUDPv6 + 1
	all := Offloads{TSO: true, USO: true}
	for _, c := range []struct {
		name string
		m    TxMeta
		n    int
		o    Offloads
		want Drop
	}{
		{"UDP to a port with USO", udp, 44 + 8 + 64*3, all, DropNone},
		{"UDP to a TSO-only port", udp, 44 + 8 + 64*3, Offloads{TSO: true}, DropBadGSO},
		{"UDP header outside", udp, 50, all, DropBadGSO},
		{"unknown kind", unknown, 1000, all, DropBadGSO},
	} {
		if _, d := CheckTxOffloads(&c.m, c.n, qps, c.o); d != c.want {
			t.Errorf("%s: %s, want %s", c.name, d, c.want)
		}
	}
	if _, d := CheckTx(&udp, 1000, qps, true); d != DropBadGSO {
		t.Errorf("CheckTx (TSO only) took a UDP super-packet: %s", d)
	}
	if !GSOUDPv4.UDP() || !GSOUDPv6.V6() || GSOTCPv6.UDP() || GSOUDPv4.V6() || !GSOTCPv6.V6() {
		t.Error("GSOType.UDP or V6 misreports a kind")
	}
}
