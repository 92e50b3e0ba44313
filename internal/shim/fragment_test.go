package shim

import (
	"bytes"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/ip4defrag"
	"github.com/gopacket/gopacket/layers"

	"github.com/eipoib/eipoibd/internal/csum"
	"github.com/eipoib/eipoibd/internal/header"
)

// TestFragmentOptions: an oversized IPv4 packet with options is
// fragmented so that the first fragment carries every option and the
// others only those with the copied flag (RFC 791 §3.2). Each fragment's
// header checksum verifies, and the fragments reassemble byte for byte.
func TestFragmentOptions(t *testing.T) {
	a, b := pair(t, nil)
	_, remacB1 := arpExchange(t, a, b)
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, Id: 77, SrcIP: ipA1.AsSlice(), DstIP: ipB1.AsSlice(),
		Options: []layers.IPv4Option{
			{OptionType: 7, OptionLength: 11, OptionData: []byte{4, 0, 0, 0, 0, 0, 0, 0, 0}}, // record route: first fragment only
			{OptionType: 0x94, OptionLength: 4, OptionData: []byte{0, 0}},                    // router alert: copied
		}}
	udp := &layers.UDP{SrcPort: 5000, DstPort: 6000}
	udp.SetNetworkLayerForChecksum(ip)
	data := make([]byte, 5000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	frame := serialize(t, eth(macA1, remacB1, layers.EthernetTypeIPv4), ip, udp, gopacket.Payload(data))
	orig, _ := header.ParseIPv4(frame[14:])
	a.dev.Inject(frame)
	defrag := ip4defrag.NewIPv4Defragmenter()
	var whole *layers.IPv4
	for i := 0; whole == nil; i++ {
		if i == 4 {
			t.Fatal("no reassembly after 4 fragments")
		}
		p := b.recv(t)
		raw := header.IPv4(p.Layer(layers.LayerTypeIPv4).LayerContents())
		wantOpts := []byte{0x94, 4, 0, 0}
		if i == 0 {
			wantOpts = orig.Options()
		}
		if !bytes.Equal(raw.Options(), wantOpts) {
			t.Fatalf("fragment %d options %x, want %x", i, raw.Options(), wantOpts)
		}
		if csum.Fold(csum.Sum(0, raw[:raw.HeaderLen()])) != 0 {
			t.Fatalf("fragment %d header checksum does not verify", i)
		}
		frag := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if int(frag.Length) > a.s.IPMTU() {
			t.Fatalf("fragment %d of %d bytes", i, frag.Length)
		}
		var err error
		if whole, err = defrag.DefragIPv4(frag); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(whole.Payload, orig.Payload()) {
		t.Fatalf("reassembled payload differs (%d bytes, want %d)", len(whole.Payload), len(orig.Payload()))
	}
}
