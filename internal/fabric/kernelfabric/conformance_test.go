package kernelfabric_test

// The conformance suite: every case runs against the fake and against
// the real kernel (conformance_witnesses_test.go), and both must answer alike. The
// upstream function each rule comes from is named beside it;
// docs/kernel-backend.md lists the cases.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/gsotest"
)

// sll encodes a sockaddr_ll to send through ifindex with protocol proto
// and sll_halen halen; addr goes in sll_addr, which runs past the
// struct's 8 bytes when addr is longer. The name is 12 + max(len(addr),
// 8) bytes.
func sll(ifindex int, proto uint16, halen int, addr []byte) []byte {
	b := make([]byte, 12+max(len(addr), 8))
	binary.NativeEndian.PutUint16(b[0:2], unix.AF_PACKET)
	binary.BigEndian.PutUint16(b[2:4], proto)
	binary.NativeEndian.PutUint32(b[4:8], uint32(int32(ifindex)))
	b[11] = byte(halen)
	copy(b[12:], addr)
	return b
}

// openSock opens a packet socket on ifindex of k, where w's calls go,
// closed at cleanup.
func openSock(t *testing.T, w *witness, k kernel, ifindex int, o kf.PacketOptions) kf.Socket {
	t.Helper()
	var s kf.Socket
	var err error
	w.in(func() { s, err = k.OpenPacketWith(ifindex, o) })
	if err != nil {
		t.Fatalf("open packet socket on %d: %v", ifindex, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// send sends one datagram (hdr, then payload) with name[:namelen].
func send(s kf.Socket, name []byte, namelen int, hdr, payload []byte) error {
	n, err := s.Send([]kf.Msg{{Name: name, NameLen: namelen, Hdr: hdr, Buf: payload}})
	if err == nil && n != 1 {
		return errors.New("sendmmsg took nothing and said nothing")
	}
	return err
}

// mustSend sends payload of ethertype proto from s to addr through
// ifindex, with sll_halen the address's length.
func mustSend(t *testing.T, s kf.Socket, ifindex int, proto uint16, addr, payload []byte) {
	t.Helper()
	name := sll(ifindex, proto, len(addr), addr)
	if err := send(s, name, len(name), nil, payload); err != nil {
		t.Fatalf("send %d bytes of %#04x to %x: %v", len(payload), proto, addr, err)
	}
}

// received is one datagram as recvmmsg gave it.
type received struct {
	kf.Msg
	sa kf.SockaddrLL
}

// recvOne returns the next datagram on s, read into a buffer of bufLen
// bytes; nothing within 5 s (a lost or misrouted packet: nothing in this
// suite waits on a slow path) fails the test.
func recvOne(t *testing.T, s kf.Socket, bufLen int) received {
	t.Helper()
	return recvMsg(t, s, kf.Msg{Buf: make([]byte, bufLen)})
}

// recvMsg is recvOne into m's Hdr and Buf.
func recvMsg(t *testing.T, s kf.Socket, msg kf.Msg) received {
	t.Helper()
	msg.Name = make([]byte, kf.SockaddrLLIPoIBLen)
	m := []kf.Msg{msg}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := s.Recv(m)
		done <- result{n, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		s.Close()
		<-done
		t.Fatal("nothing received within 5 s")
	}
	if r.err != nil || r.n != 1 {
		t.Fatalf("recvmmsg: %d %v", r.n, r.err)
	}
	sa, err := kf.ParseSockaddrLL(m[0].Name, m[0].NameLen)
	if err != nil {
		t.Fatalf("received name %x (%d bytes): %v", m[0].Name, m[0].NameLen, err)
	}
	return received{m[0], sa}
}

// payload is n bytes that tell one send from another.
func payload(tag byte, n int) []byte {
	b := gsotest.Pattern(n)
	b[0] = tag
	return b
}

// checkRecv checks a datagram b received from a: its name (family,
// ethertype, ifindex, device type, packet type, sll_halen and the
// source address when the link gives one, name length
// sizeof(sockaddr_ll): packet_recvmsg pads shorter names) and its bytes.
func checkRecv(t *testing.T, w *witness, r received, proto uint16, pkttype uint8, want []byte) {
	t.Helper()
	sa := r.sa
	if sa.Family != unix.AF_PACKET || sa.Protocol != proto || int(sa.Ifindex) != w.b || sa.Hatype != w.hatype || sa.Pkttype != pkttype {
		t.Errorf("name %+v: want protocol %#04x, ifindex %d, hatype %d, pkttype %d", sa, proto, w.b, w.hatype, pkttype)
	}
	if r.NameLen != kf.SockaddrLLSize || int(sa.Halen) != w.srcLen || !bytes.Equal(sa.Addr, w.aAddr[:w.srcLen]) {
		t.Errorf("name length %d, sll_halen %d, address %x: want %d, %d, %x", r.NameLen, sa.Halen, sa.Addr, kf.SockaddrLLSize, w.srcLen, w.aAddr[:w.srcLen])
	}
	if r.Trunc || !bytes.Equal(r.Buf[:r.N], want) {
		t.Errorf("received %d bytes (trunc %v), want the %d sent", r.N, r.Trunc, len(want))
	}
}

// TestConformanceSendRecv: a datagram sent with a sockaddr_ll naming the
// ifindex, ethertype and destination reaches a socket bound to every
// protocol on the receiving device (with htons: af_packet.c packet_bind
// → packet_do_bind). Unicast arrives as PACKET_HOST, broadcast as
// PACKET_BROADCAST and a joined group as PACKET_MULTICAST. The payload
// is exact and the name as checkRecv says. A buffer shorter than the
// datagram gets its first bytes and MSG_TRUNC (packet_recvmsg).
func TestConformanceSendRecv(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		rx := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		var mreq [kf.MreqMaxSize]byte
		putMreq(&mreq, w.b, kf.PacketMRMulticast, w.alen, w.mcast)
		if err := rx.AddMembership(mreq[:]); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			what    string
			dst     []byte
			pkttype uint8
			proto   uint16
		}{
			{"unicast", w.bAddr, kf.PacketHost, 0x0800},
			{"unicast IPv6", w.bAddr, kf.PacketHost, 0x86dd},
			{"broadcast", w.bcast, kf.PacketBroadcast, 0x0806},
			{"multicast", w.mcast, kf.PacketMulticast, 0x0800},
		} {
			p := payload(byte(c.pkttype), 300)
			mustSend(t, tx, w.a, c.proto, c.dst, p)
			r := recvOne(t, rx, 2048)
			checkRecv(t, w, r, c.proto, c.pkttype, p)
		}
		p := payload(9, 100)
		mustSend(t, tx, w.a, 0x0800, w.bAddr, p)
		if r := recvOne(t, rx, 40); r.N != 40 || !r.Trunc || !bytes.Equal(r.Buf, p[:40]) {
			t.Errorf("short buffer: %d bytes, trunc %v", r.N, r.Trunc)
		}
	})
}

// TestConformanceBoundProtocol: a socket bound to one ethertype receives
// that ethertype only; one bound to ETH_P_ALL receives both
// (packet_do_bind hooks prot_hook.type; __netif_receive_skb_core matches
// ptype_base by type, ptype_all takes everything).
func TestConformanceBoundProtocol(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		v6 := openSock(t, w, w.kb, w.b, kf.PacketOptions{Protocol: 0x86dd})
		all := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		p4, p6 := payload(4, 64), payload(6, 64)
		mustSend(t, tx, w.a, 0x0800, w.bAddr, p4)
		mustSend(t, tx, w.a, 0x86dd, w.bAddr, p6)
		checkRecv(t, w, recvOne(t, v6, 2048), 0x86dd, kf.PacketHost, p6)
		checkRecv(t, w, recvOne(t, all, 2048), 0x0800, kf.PacketHost, p4)
		checkRecv(t, w, recvOne(t, all, 2048), 0x86dd, kf.PacketHost, p6)
	})
}

// TestConformanceHostOnly: a socket with the HostOnly filter (classic
// BPF on SKF_AD_PKTTYPE, run by packet_rcv before anything is queued)
// receives a unicast. It does not receive a broadcast or a joined
// group's multicast sent before it. A socket without it, on the same
// device, receives all three.
func TestConformanceHostOnly(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		host := openSock(t, w, w.kb, w.b, kf.PacketOptions{HostOnly: true})
		all := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		var mreq [kf.MreqMaxSize]byte
		putMreq(&mreq, w.b, kf.PacketMRMulticast, w.alen, w.mcast)
		if err := all.AddMembership(mreq[:]); err != nil {
			t.Fatal(err)
		}
		pb, pm, pu := payload(1, 100), payload(2, 100), payload(3, 100)
		mustSend(t, tx, w.a, 0x0800, w.bcast, pb)
		mustSend(t, tx, w.a, 0x0800, w.mcast, pm)
		mustSend(t, tx, w.a, 0x0800, w.bAddr, pu)
		checkRecv(t, w, recvOne(t, host, 2048), 0x0800, kf.PacketHost, pu)
		checkRecv(t, w, recvOne(t, all, 2048), 0x0800, kf.PacketBroadcast, pb)
		checkRecv(t, w, recvOne(t, all, 2048), 0x0800, kf.PacketMulticast, pm)
		checkRecv(t, w, recvOne(t, all, 2048), 0x0800, kf.PacketHost, pu)
	})
}

// TestNothingBeforeBind (real kernel only): a socket OpenPacketWith
// returns bound to a device holds nothing from other devices. A packet
// socket created with a protocol is hooked to every device at once
// (af_packet.c packet_create registers prot_hook when proto is not 0).
// So what arrives anywhere between socket() and bind() would be queued
// on it and read as the bound child's. Created with protocol 0, it is
// hooked only by the bind (packet_bind → packet_do_bind). While a floods
// b, 50 sockets are opened on a device that is down; bound, they receive
// nothing. /proc/net/packet must then show none holding data (Rmem,
// sk_rmem_alloc).
func TestNothingBeforeBind(t *testing.T) {
	w := realWitness(t)
	tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
	stop := make(chan struct{})
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		name := sll(w.a, 0x0800, w.alen, w.bAddr)
		msgs := make([]kf.Msg, 64)
		for i := range msgs {
			msgs[i] = kf.Msg{Name: name, NameLen: len(name), Buf: payload(byte(i), 64)}
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			tx.Send(msgs)
		}
	}()
	w.in(func() {
		for range 50 {
			s, err := w.ka.OpenPacketWith(w.down, kf.PacketOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { s.Close() })
		}
	})
	close(stop)
	<-flooding
	var b []byte
	w.in(func() {
		var err error
		if b, err = os.ReadFile("/proc/thread-self/net/packet"); err != nil {
			t.Fatal(err)
		}
	})
	n, holding := 0, 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		var sk, inode string
		var ref, typ, proto, iface, running, rmem, user int
		if c, _ := fmt.Sscanf(line, "%s %d %d %x %d %d %d %d %s", &sk, &ref, &typ, &proto, &iface, &running, &rmem, &user, &inode); c != 9 || iface != w.down {
			continue
		}
		n++
		if rmem > 0 {
			holding++
		}
	}
	if n != 50 || holding != 0 {
		t.Fatalf("%d sockets on the down device, %d holding data received before their bind", n, holding)
	}
}

// TestConformanceIgnoreOutgoing: a socket bound to every protocol on the
// sending device gets a PACKET_OUTGOING copy of another socket's send
// (net/core/dev.c dev_queue_xmit_nit; skb_loop_sk spares only the
// sender). It does not with PACKET_IGNORE_OUTGOING, which OpenPacketWith
// sets unless SeeOutgoing (af_packet.c packet_setsockopt;
// dev_queue_xmit_nit skips ptype->ignore_outgoing). Then the next thing
// it gets is what b sends back.
func TestConformanceIgnoreOutgoing(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		sees := openSock(t, w, w.ka, w.a, kf.PacketOptions{SeeOutgoing: true})
		ignores := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		t.Cleanup(func() { ignores.Close() })
		back := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		out, reply := payload(1, 80), payload(2, 80)
		mustSend(t, tx, w.a, 0x0800, w.bAddr, out)
		mustSend(t, back, w.b, 0x0800, w.aAddr, reply)
		r := recvOne(t, sees, 2048)
		if r.sa.Pkttype != kf.PacketOutgoing || r.sa.Protocol != 0x0800 || int(r.sa.Ifindex) != w.a || !bytes.Equal(r.Buf[:r.N], out) {
			t.Errorf("without PACKET_IGNORE_OUTGOING: %+v, %d bytes; want the send as PACKET_OUTGOING", r.sa, r.N)
		}
		if r := recvOne(t, ignores, 2048); r.sa.Pkttype != kf.PacketHost || !bytes.Equal(r.Buf[:r.N], reply) {
			t.Errorf("with PACKET_IGNORE_OUTGOING: first datagram %+v, %d bytes; want b's reply", r.sa, r.N)
		}
	})
}

// TestIgnoreOutgoingFallback: a kernel that refuses PACKET_IGNORE_OUTGOING
// (ENOPROTOOPT, before 4.20) still gets its socket, counted; any other
// refusal fails the open; SeeOutgoing does not ask for it.
func TestIgnoreOutgoingFallback(t *testing.T) {
	var asked []int
	refuse := func(err error) func(fd, level, opt, value int) error {
		return func(_, level, opt, _ int) error {
			asked = append(asked, opt)
			if level == unix.SOL_PACKET && opt == unix.PACKET_IGNORE_OUTGOING {
				return err
			}
			return nil
		}
	}
	before := kf.OutgoingNotIgnored()
	if err := kf.SetOptions(-1, kf.PacketOptions{Vnet: true}, refuse(unix.ENOPROTOOPT)); err != nil {
		t.Fatal(err)
	}
	if got := kf.OutgoingNotIgnored() - before; got != 1 || !slices.Equal(asked, []int{unix.PACKET_VNET_HDR, unix.PACKET_IGNORE_OUTGOING}) {
		t.Fatalf("counted %d, asked %v", got, asked)
	}
	if err := kf.SetOptions(-1, kf.PacketOptions{}, refuse(unix.EPERM)); !errors.Is(err, unix.EPERM) {
		t.Fatalf("EPERM: got %v", err)
	}
	asked = nil
	if err := kf.SetOptions(-1, kf.PacketOptions{SeeOutgoing: true}, refuse(unix.EPERM)); err != nil || len(asked) != 0 {
		t.Fatalf("SeeOutgoing: %v, asked %v", err, asked)
	}
	if kf.OutgoingNotIgnored()-before != 1 {
		t.Fatal("a refusal other than ENOPROTOOPT was counted")
	}
}

// TestConformanceSendErrors: packet_snd's checks of the name, the device
// and the length, in its order, and that an accepted odd name is sent
// where dev->addr_len bytes of sll_addr say, whatever sll_halen says.
func TestConformanceSendErrors(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{})
		rx := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		full := sll(w.a, 0x0800, w.alen, w.bAddr)
		// A 20-byte name holds a whole Ethernet address but not an
		// IPoIB one: SOCK_DGRAM wants dev->addr_len + 12 bytes.
		var short error
		if w.alen+12 > kf.SockaddrLLSize {
			short = unix.EINVAL
		}
		padded := append(slices.Clone(w.bAddr), 0xee, 0xee, 0xee, 0xee)
		for _, c := range []struct {
			what    string
			name    []byte
			namelen int
			size    int
			want    error // nil: sent, and b receives it
		}{
			{"name shorter than sockaddr_ll", full, kf.SockaddrLLSize - 1, 64, unix.EINVAL},
			{"sll_halen past the name", sll(w.a, 0x0800, 9, w.bAddr), kf.SockaddrLLSize, 64, unix.EINVAL},
			{"name of sizeof(sockaddr_ll)", sll(w.a, 0x0800, min(w.alen, 8), w.bAddr), kf.SockaddrLLSize, 64, short},
			{"unknown ifindex", sll(9999, 0x0800, w.alen, w.bAddr), len(full), 64, unix.ENXIO},
			{"unknown ifindex, short name", sll(9999, 0x0800, 0, w.bAddr), kf.SockaddrLLSize, 64, unix.ENXIO},
			{"device down", sll(w.down, 0x0800, w.alen, w.bAddr), len(full), 64, unix.ENETDOWN},
			{"longer than the MTU", full, len(full), w.mtu + 1, unix.EMSGSIZE},
			{"the MTU", full, len(full), w.mtu, nil},
			{"sll_halen longer than dev->addr_len", sll(w.a, 0x0800, w.alen+4, padded), 12 + w.alen + 4, 64, nil},
			{"sll_halen 0", sll(w.a, 0x0800, 0, w.bAddr), len(full), 64, nil},
		} {
			p := payload(byte(len(c.what)), c.size)
			err := send(tx, c.name, c.namelen, nil, p)
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("%s: got %v, want %v", c.what, err, c.want)
				continue
			}
			if c.want == nil {
				checkRecv(t, w, recvOne(t, rx, 4096), 0x0800, kf.PacketHost, p)
			}
		}
	})
}

// putMreq encodes a struct packet_mreq_max.
func putMreq(b *[kf.MreqMaxSize]byte, ifindex int, typ uint16, alen int, addr []byte) {
	*b = [kf.MreqMaxSize]byte{}
	binary.NativeEndian.PutUint32(b[0:4], uint32(int32(ifindex)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], uint16(alen))
	copy(b[8:], addr)
}

// TestConformanceMembership: PACKET_ADD_MEMBERSHIP / _DROP_MEMBERSHIP
// (af_packet.c packet_setsockopt, packet_mc_add, packet_mc_drop,
// packet_dev_mc, packet_flush_mclist). The device's multicast list gets
// the address once per socket however often it joins. It loses it with
// the socket's last drop or its close. A drop of what was never joined
// is no error. A wrong mr_alen, a short option and an unknown device are
// refused with the kernel's errno.
func TestConformanceMembership(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		s1 := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		s2 := openSock(t, w, w.kb, w.b, kf.PacketOptions{})
		key := hex.EncodeToString(w.mcast)
		users := func() int { return w.devMcast(w.b)[key] }
		var m [kf.MreqMaxSize]byte
		putMreq(&m, w.b, kf.PacketMRMulticast, w.alen, w.mcast)
		step := func(what string, err error, wantUsers int) {
			t.Helper()
			if err != nil || users() != wantUsers {
				t.Fatalf("%s: %v, %d users of %s; want %d (list %v)", what, err, users(), key, wantUsers, w.devMcast(w.b))
			}
		}
		step("before", nil, 0)
		step("join", s1.AddMembership(m[:]), 1)
		step("join again", s1.AddMembership(m[:]), 1)
		step("second socket joins", s2.AddMembership(m[:]), 2)
		step("drop once of two", s1.DropMembership(m[:]), 2)
		step("last drop", s1.DropMembership(m[:]), 1)
		step("drop never joined", s1.DropMembership(m[:]), 1)
		step("close", s2.Close(), 0)
		for _, c := range []struct {
			what string
			req  []byte
			want error
		}{
			{"mr_alen longer than the address", mreq(w.b, w.alen+1, w.mcast), unix.EINVAL},
			{"mr_alen shorter than the address", mreq(w.b, w.alen-1, w.mcast), unix.EINVAL},
			{"option shorter than packet_mreq", m[:kf.MreqSize-1], unix.EINVAL},
			{"unknown device", mreq(9999, w.alen, w.mcast), unix.ENODEV},
		} {
			if err := s1.AddMembership(c.req); !errors.Is(err, c.want) {
				t.Errorf("%s: got %v, want %v", c.what, err, c.want)
			}
		}
		step("after refusals", nil, 0)
	})
}

func mreq(ifindex, alen int, addr []byte) []byte {
	var b [kf.MreqMaxSize]byte
	putMreq(&b, ifindex, kf.PacketMRMulticast, alen, addr)
	return b[:]
}

// TestConformanceVnetGSO: a TCPv4 super-packet is sent with a
// virtio_net_hdr (GSO TCPv4, NEEDS_CSUM, csum_start counted from the
// link's hard header: af_packet.c packet_snd → virtio_net_hdr_to_skb).
// On a veth it reaches the peer's PACKET_VNET_HDR socket whole
// (veth_xmit forwards the GSO skb; packet_rcv_vnet describes it). On
// IPoIB it arrives cut to gso_size (the HCA's LSO or software GSO). A
// packet with a zero header arrives as it was sent, the header in Buf's
// first bytes or in a Hdr iovec of its own. Bad headers are refused with
// EINVAL (packet_snd_vnet_parse, virtio_net_hdr_to_skb).
func TestConformanceVnetGSO(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		tx := openSock(t, w, w.ka, w.a, kf.PacketOptions{Vnet: true})
		rx := openSock(t, w, w.kb, w.b, kf.PacketOptions{Vnet: true})
		data := gsotest.Pattern(3000)
		super, l4 := gsotest.Super(t, nil, false, data)
		tcpLen := int(super[l4+12]>>4) * 4
		good := kf.VnetHdr{Flags: kf.VnetNeedsCsum, GSOType: kf.VnetGSOTCPv4, HdrLen: uint16(w.hardLen + l4 + tcpLen),
			GSOSize: 1000, CsumStart: uint16(w.hardLen + l4), CsumOffset: 16}
		name := sll(w.a, 0x0800, w.alen, w.bAddr)
		hdr := func(h kf.VnetHdr) []byte {
			var b [kf.VnetHdrLen]byte
			h.Put(&b)
			return b[:]
		}
		if err := send(tx, name, len(name), hdr(good), super); err != nil {
			t.Fatalf("super-packet: %v", err)
		}
		if w.segments {
			var segs [][]byte
			for got := 0; got < len(data); {
				r := recvOne(t, rx, 4096)
				h, _ := kf.ParseVnetHdr(r.Buf[:r.N])
				if h.GSOType != kf.VnetGSONone || r.N-kf.VnetHdrLen-l4-tcpLen > int(good.GSOSize) {
					t.Fatalf("segment %d: %+v, %d bytes", len(segs), h, r.N)
				}
				segs = append(segs, slices.Clone(r.Buf[kf.VnetHdrLen:r.N]))
				got += r.N - kf.VnetHdrLen - l4 - tcpLen
			}
			if got := gsotest.Reassemble(t, segs, 0, false, w.mtu); !bytes.Equal(got, data) {
				t.Fatal("segments do not carry the super-packet's payload")
			}
		} else {
			r := recvOne(t, rx, 4096)
			h, _ := kf.ParseVnetHdr(r.Buf[:r.N])
			want := kf.VnetHdr{Flags: kf.VnetNeedsCsum, GSOType: kf.VnetGSOTCPv4, HdrLen: h.HdrLen, GSOSize: good.GSOSize, CsumStart: good.CsumStart, CsumOffset: 16}
			if h != want || !bytes.Equal(r.Buf[kf.VnetHdrLen:r.N], super) {
				t.Fatalf("whole super-packet: header %+v, want %+v; %d bytes, want %d", h, want, r.N-kf.VnetHdrLen, len(super))
			}
		}
		plain := payload(7, 200)
		if err := send(tx, name, len(name), hdr(kf.VnetHdr{}), plain); err != nil {
			t.Fatalf("plain packet: %v", err)
		}
		if r := recvOne(t, rx, 4096); r.Buf[1] != kf.VnetGSONone || !bytes.Equal(r.Buf[kf.VnetHdrLen:r.N], plain) || r.sa.Pkttype != kf.PacketHost {
			t.Fatalf("plain packet: header %x, %d bytes", r.Buf[:kf.VnetHdrLen], r.N)
		}
		if err := send(tx, name, len(name), hdr(kf.VnetHdr{}), plain); err != nil {
			t.Fatalf("plain packet: %v", err)
		}
		if r := recvMsg(t, rx, kf.Msg{Hdr: make([]byte, kf.VnetHdrLen), Buf: make([]byte, 4096)}); r.Hdr[1] != kf.VnetGSONone || r.N != kf.VnetHdrLen+len(plain) || !bytes.Equal(r.Buf[:len(plain)], plain) {
			t.Fatalf("plain packet, header apart: header %x, %d bytes", r.Hdr, r.N)
		}
		bad := func(f func(h *kf.VnetHdr)) []byte {
			h := good
			f(&h)
			return hdr(h)
		}
		for _, c := range []struct {
			what string
			hdr  []byte
			buf  []byte
		}{
			{"shorter than the header", hdr(good)[:5], nil},
			{"unknown gso_type", bad(func(h *kf.VnetHdr) { h.GSOType = 2 }), super},
			{"gso_size 0", bad(func(h *kf.VnetHdr) { h.GSOSize = 0 }), super},
			{"hdr_len past the packet", bad(func(h *kf.VnetHdr) { h.Flags, h.HdrLen = 0, uint16(w.hardLen+len(super)+1) }), super},
			{"checksum field past the packet", bad(func(h *kf.VnetHdr) { h.CsumStart = uint16(w.hardLen + len(super)) }), super},
			{"csum_offset not TCP's", bad(func(h *kf.VnetHdr) { h.CsumOffset = 10 }), super},
			{"csum_start inside the IP header", bad(func(h *kf.VnetHdr) { h.CsumStart = 10 }), super},
		} {
			if err := send(tx, name, len(name), c.hdr, c.buf); !errors.Is(err, unix.EINVAL) {
				t.Errorf("%s: got %v, want EINVAL", c.what, err)
			}
		}
	})
}

// waitLink polls LinkByName until cond holds of the link (bounded: a
// state change netlink reports at once on both witnesses).
func waitLink(t *testing.T, w *witness, name string, cond func(kf.Link) bool) kf.Link {
	t.Helper()
	var l kf.Link
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.in(func() { l, err = w.ka.LinkByName(name) })
		if err == nil && cond(l) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %+v, %v", name, l, err)
		}
	}
}

// TestConformanceLinks: a link is made and deleted: a veth on the real
// kernel, which has no ipoib kind here, and an IPoIB child on the fake.
// It is seen by LinkByName and Links (rtnl_getlink, rtnl_dump_ifinfo).
// It comes up with SetUp with its carrier on (IFF_LOWER_UP:
// dev_get_flags), gets IFF_NOARP with SetNoARP (dev_change_flags), and
// goes with DelLink (rtnl_dellink). A missing link is ENODEV to
// LinkByName, SetUp and DelLink (rtnl_getlink, do_setlink, rtnl_dellink
// via __dev_get_by_index).
func TestConformanceLinks(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		if err := w.addLink("kc0"); err != nil {
			t.Fatal(err)
		}
		l := waitLink(t, w, "kc0", func(l kf.Link) bool { return true })
		if l.Name != "kc0" || l.Up || l.Carrier || l.Index <= 0 {
			t.Fatalf("new link: %+v", l)
		}
		var links []kf.Link
		var errs [6]error
		w.in(func() {
			links, errs[0] = w.ka.Links()
			errs[1] = w.ka.SetUp(l.Index)
			errs[2] = w.ka.SetNoARP(l.Index)
		})
		if errs[0] != nil || !slices.ContainsFunc(links, func(x kf.Link) bool { return x == l }) {
			t.Fatalf("Links: %v, %+v lacks %+v", errs[0], links, l)
		}
		if errs[1] != nil || errs[2] != nil {
			t.Fatalf("SetUp: %v, SetNoARP: %v", errs[1], errs[2])
		}
		waitLink(t, w, "kc0", func(l kf.Link) bool { return l.Up && l.Carrier })
		if !w.noarp("kc0") {
			t.Error("IFF_NOARP not set")
		}
		w.in(func() {
			errs[0] = w.ka.DelLink(l.Index)
			_, errs[1] = w.ka.LinkByName("kc0")
			errs[2] = w.ka.DelLink(l.Index)
			errs[3] = w.ka.SetUp(l.Index)
			errs[4] = w.ka.SetNoARP(l.Index)
		})
		if errs[0] != nil {
			t.Fatalf("DelLink: %v", errs[0])
		}
		for i, what := range []string{"LinkByName", "DelLink", "SetUp", "SetNoARP"} {
			if !errors.Is(errs[i+1], unix.ENODEV) {
				t.Errorf("%s of a deleted link: got %v, want ENODEV", what, errs[i+1])
			}
		}
	})
}

// TestConformanceSysctls: the host-off settings of a child
// (hostOffSysctls) are each accepted on a device and read back; a key
// the device lacks, and a device that does not exist, are ENOENT
// (proc_sys_lookup: no such entry under /proc/sys/net/*/conf).
func TestConformanceSysctls(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		for _, kv := range kf.HostOffSysctls(w.aName, true) {
			var err error
			w.in(func() { err = w.ka.WriteSysctl(kv[0], kv[1]) })
			if err != nil {
				t.Fatalf("%s=%s: %v", kv[0], kv[1], err)
			}
			if got := w.sysctl(kv[0]); got != kv[1] {
				t.Errorf("%s reads back %q, want %q", kv[0], got, kv[1])
			}
		}
		for _, path := range []string{"net/ipv4/conf/" + w.aName + "/no_such_key", "net/ipv4/conf/nosuchdev/forwarding", "net/ipv6/conf/nosuchdev/disable_ipv6"} {
			var err error
			w.in(func() { err = w.ka.WriteSysctl(path, "1") })
			if !errors.Is(err, unix.ENOENT) {
				t.Errorf("%s: got %v, want ENOENT", path, err)
			}
		}
	})
}

// TestConformanceEthtool: ETHTOOL_GTSO says what the device has
// (ethtool_get_one_feature), ETHTOOL_SGRO 0 turns GRO off as `ethtool -k`
// reads it back (ethtool_set_one_feature); a missing device is ENODEV
// (dev_ethtool). Every device answers both commands: they go through
// the generic feature flags, not the driver's ethtool_ops, so there is no
// "device without the ioctl" to ask.
func TestConformanceEthtool(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		var tso bool
		var errs [4]error
		w.in(func() {
			tso, errs[0] = w.ka.TSO(w.aName)
			errs[1] = w.ka.DisableGRO(w.aName)
			_, errs[2] = w.ka.TSO("nosuchdev")
			errs[3] = w.ka.DisableGRO("nosuchdev")
		})
		if errs[0] != nil || tso != w.tso {
			t.Errorf("TSO: %v %v, want %v", tso, errs[0], w.tso)
		}
		if errs[1] != nil || w.gro(w.aName) {
			t.Errorf("DisableGRO: %v, GRO still on: %v", errs[1], w.gro(w.aName))
		}
		for i, what := range []string{"TSO", "DisableGRO"} {
			if !errors.Is(errs[i+2], unix.ENODEV) {
				t.Errorf("%s of a missing device: got %v, want ENODEV", what, errs[i+2])
			}
		}
	})
}

// TestConformanceCarrier: SubscribeLinks reports a's carrier going off
// and coming back (a veth whose peer goes down is LOWERLAYERDOWN without
// IFF_LOWER_UP: the Carrier field is IFF_LOWER_UP, netif_carrier_ok; the
// fake's parent carrier), and LinkByName agrees. The updates are read
// as they come, as a subscriber must: a queue left unread overruns.
func TestConformanceCarrier(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		done := make(chan struct{})
		defer close(done)
		var ch <-chan kf.Link
		var err error
		w.in(func() { ch, err = w.ka.SubscribeLinks(done, nil) })
		if err != nil {
			t.Fatal(err)
		}
		seen := make(chan bool, 2)
		go func() {
			want := false
			for l := range ch {
				if l.Index == w.a && l.Carrier == want {
					seen <- want
					want = !want
				}
			}
		}()
		for _, up := range []bool{false, true} {
			w.setPeer(up)
			select {
			case <-seen:
			case <-time.After(5 * time.Second):
				t.Fatalf("no update with carrier %v on %s", up, w.aName)
			}
			waitLink(t, w, w.aName, func(l kf.Link) bool { return l.Carrier == up && l.Up })
		}
	})
}

// TestConformanceCarrierEvents: the port's link events (Port.Events)
// report a's carrier: on first, then off as the carrier goes and on as
// it comes back, in order. The backend's own link following (follow,
// followLink) makes them from the notifications SubscribeLinks gives.
// This holds on the real kernel (a veth whose peer goes down) as on the
// fake (the parent's carrier). The Port itself cannot be opened on the
// real kernel here. It wants an IPoIB parent, and this kernel has no
// IPoIB device (rxe is RoCE, which ib_ipoib does not serve).
func TestConformanceCarrierEvents(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		done := make(chan struct{})
		var ch <-chan kf.Link
		var l kf.Link
		var errs [2]error
		w.in(func() {
			l, errs[0] = w.ka.LinkByName(w.aName)
			ch, errs[1] = w.ka.SubscribeLinks(done, nil)
		})
		if errs[0] != nil || errs[1] != nil {
			close(done)
			t.Fatal(errs)
		}
		events, stop := kf.FollowParent(w.ka, l, ch, done)
		defer stop()
		eventtest.Expect(t, events, eventtest.Link(true))
		for _, up := range []bool{false, true, false, true} {
			w.setPeer(up)
			eventtest.Expect(t, events, eventtest.Link(up))
		}
	})
}

// TestConformanceLinkOverrun: a link subscription left unread while a's
// carrier keeps changing is overrun (net/netlink/af_netlink.c
// netlink_overrun: sk_err = ENOBUFS, what does not fit is dropped).
// onErr is told ENOBUFS, and the channel is closed once what was queued
// is read. vishvananda/netlink's linkSubscribeAt ends the subscription
// on that receive error, which is why the backend subscribes again.
func TestConformanceLinkOverrun(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		done := make(chan struct{})
		defer close(done)
		errs := make(chan error, 16)
		ch, err := w.subscribeSmall(done, func(err error) {
			select {
			case errs <- err:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		// Over 64 notifications: the library's reader holds 64
		// updates, the socket's minimal buffer about one more.
		for i := range 50 {
			w.setPeer(i%2 == 1)
		}
		timeout := time.After(5 * time.Second)
		for open := true; open; {
			select {
			case _, open = <-ch:
			case <-timeout:
				t.Fatal("the subscription did not end")
			}
		}
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), unix.ENOBUFS.Error()) {
				t.Fatalf("told %v, want ENOBUFS", err)
			}
		default:
			t.Fatal("the subscription ended and onErr was told nothing")
		}
	})
}

// TestConformanceLinkGone: a socket whose device is deleted gets
// ENETDOWN from its next receive (af_packet.c packet_notifier:
// NETDEV_UNREGISTER sets sk_err), and a send naming the gone ifindex is
// ENXIO (packet_snd).
func TestConformanceLinkGone(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		if err := w.addLink("kc1"); err != nil {
			t.Fatal(err)
		}
		l := waitLink(t, w, "kc1", func(kf.Link) bool { return true })
		var err error
		w.in(func() { err = w.ka.SetUp(l.Index) })
		if err != nil {
			t.Fatal(err)
		}
		s := openSock(t, w, w.ka, l.Index, kf.PacketOptions{})
		w.in(func() { err = w.ka.DelLink(l.Index) })
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			n   int
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, err := s.Recv([]kf.Msg{{Name: make([]byte, kf.SockaddrLLIPoIBLen), Buf: make([]byte, 64)}})
			done <- result{n, err}
		}()
		select {
		case r := <-done:
			if !errors.Is(r.err, unix.ENETDOWN) {
				t.Errorf("receive after the device went: %d %v, want ENETDOWN", r.n, r.err)
			}
		case <-time.After(5 * time.Second):
			s.Close()
			t.Fatal("receive after the device went: still blocked after 5 s")
		}
		name := sll(l.Index, 0x0800, w.alen, w.bAddr)
		if err := send(s, name, len(name), nil, payload(1, 64)); !errors.Is(err, unix.ENXIO) {
			t.Errorf("send through the gone device: %v, want ENXIO", err)
		}
	})
}

// longParent is a parent name of IFNAMSIZ - 1 bytes, the longest the
// kernel takes.
const longParent = "ibp129s0f0np0xy"

// TestConformanceChildNames: the names the backend gives the children of
// a 15-byte parent are each taken by the kernel for a new link and read
// back. That covers its group children's and its VIF children's, the
// largest index's included. The 16-byte name PARENT.mffff is refused
// with EINVAL (net/core/dev.c dev_valid_name: longer than IFNAMSIZ - 1).
// The real kernel's answer comes from ip(8), which checks the same
// length first. The real kernel's links are veths, the fake's IPoIB
// children (fakekernel checks dev_valid_name).
func TestConformanceChildNames(t *testing.T) {
	each(t, func(t *testing.T, w *witness) {
		stem := kf.ChildStem(longParent)
		if !strings.HasPrefix(stem, "ib") || len(stem) != 8 {
			t.Fatalf("stem of %s: %q, want ib and 6 hex digits", longParent, stem)
		}
		names := []string{kf.GroupChildName(stem, 0xffff), kf.GroupChildName(stem, 0x8001)}
		for _, n := range []int{1, 2, kf.MaxChildIndex} {
			name, err := kf.ChildName(stem, n)
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		for _, name := range names {
			if err := w.addLink(name); err != nil {
				t.Fatalf("link %q (%d bytes): %v", name, len(name), err)
			}
			if l := waitLink(t, w, name, func(kf.Link) bool { return true }); l.Name != name || !kf.IsChildName(stem, l.Name) {
				t.Errorf("link %q read back as %q", name, l.Name)
			}
		}
		if err := w.addLink(longParent + ".mffff"); err == nil {
			t.Errorf("%s.mffff (16 bytes) accepted", longParent)
		} else if w.name == "fake" && !errors.Is(err, unix.EINVAL) {
			t.Errorf("%s.mffff: %v, want EINVAL", longParent, err)
		}
	})
}
