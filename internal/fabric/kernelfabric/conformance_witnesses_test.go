package kernelfabric_test

// The two witnesses of the conformance suite (conformance_test.go): the
// real kernel, on a veth pair in a fresh network namespace, and the fake
// (fakekernel), two IPoIB hosts on one fabric. A case gets the same
// witness description from both and asserts the same rule; what differs
// by link type (the address length, the hard header, whether the
// receiver learns the source address) is a field of the witness.

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	kf "github.com/eipoib/eipoibd/internal/fabric/kernelfabric"
	"github.com/eipoib/eipoibd/internal/fabric/kernelfabric/fakekernel"
	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// kernel is the Kernel a witness asks.
type kernel = kf.Kernel

// witness is one kernel the suite asks. Device a sends to device b; on
// the real kernel they are the two ends of a veth pair, on the fake the
// IPoIB parents of two hosts.
type witness struct {
	name   string
	ka, kb kernel // the kernels of a and b (one System for both on the real kernel)
	// in runs fn where the kernels' calls reach the kernel under test:
	// on an OS thread in the test's namespace for the real one.
	in           func(fn func())
	a, b         int    // ifindexes
	aName        string // a's name
	aAddr, bAddr []byte // link addresses, alen bytes
	alen         int    // dev->addr_len: 6 for Ethernet, 20 for IPoIB
	hatype       uint16 // dev->type
	// srcLen is the sll_halen a receiver sees: dev_parse_header gives
	// Ethernet's source MAC (eth_header_parse); IPoIB has no
	// header_ops->parse, so 0.
	srcLen int
	// hardLen is dev->hard_header_len, what csum_start counts from on a
	// SOCK_DGRAM send: ETH_HLEN, or IPOIB_HARD_LEN.
	hardLen int
	mtu     int
	bcast   []byte // the broadcast address
	mcast   []byte // a multicast address b can join
	down    int    // the ifindex of a link that is down
	tso     bool   // what ETHTOOL_GTSO says of a
	// segments: a super-packet reaches b cut to gso_size (IPoIB: the
	// HCA's LSO or software GSO) rather than whole (veth_xmit forwards
	// the GSO skb as it is).
	segments bool
	devMcast func(ifindex int) map[string]int // the device multicast list, as /proc/net/dev_mcast
	sysctl   func(path string) string         // read back /proc/sys/path
	gro      func(name string) bool           // generic-receive-offload on
	noarp    func(name string) bool           // IFF_NOARP set
	setPeer  func(up bool)                    // a's carrier off or on, from outside
	addLink  func(name string) error          // a new link, down, of a kind made here
	// subscribeSmall is a link subscription that holds the fewest
	// notifications unread the kernel allows.
	subscribeSmall func(done <-chan struct{}, onErr func(error)) (<-chan kf.Link, error)
}

// witnessKinds are the two witnesses; the real kernel's needs root, ip
// and ethtool (nstest.Require).
var witnessKinds = []struct {
	name string
	make func(t *testing.T) *witness
}{{"fake", fakeWitness}, {"kernel", realWitness}}

// each runs f against every witness, as subtests "fake" and "kernel".
func each(t *testing.T, f func(t *testing.T, w *witness)) {
	for _, wk := range witnessKinds {
		t.Run(wk.name, func(t *testing.T) { f(t, wk.make(t)) })
	}
}

func fakeWitness(t *testing.T) *witness {
	f := fakekernel.NewFabric()
	ka, kb := f.NewHost(testutil.GID("fe80::a"), "ib0", 2044), f.NewHost(testutil.GID("fe80::b"), "ib0", 2044)
	ka.TSOOn = true
	if err := ka.AddChild(kf.ChildSpec{Name: "ib0.down", Parent: 1, PKey: 0xffff}); err != nil {
		t.Fatal(err)
	}
	down, err := ka.LinkByName("ib0.down")
	if err != nil {
		t.Fatal(err)
	}
	la, _ := ka.LinkByName("ib0")
	lb, _ := kb.LinkByName("ib0")
	bc := kf.McastHwAddr(ipoib.BroadcastMGID(0xffff, ipoib.ScopeLinkLocal))
	mc := kf.McastHwAddr(ipoib.IPv4MGID(netip.MustParseAddr("239.1.2.3"), 0xffff, ipoib.ScopeLinkLocal))
	return &witness{
		name: "fake", ka: ka, kb: kb, in: func(fn func()) { fn() },
		a: la.Index, b: lb.Index, aName: "ib0", aAddr: la.HwAddr[:], bAddr: lb.HwAddr[:],
		alen: ipoib.HwAddrLen, hatype: kf.ARPHRDInfiniBand, srcLen: 0, hardLen: kf.IPoIBHardLen, mtu: 2044,
		bcast: bc[:], mcast: mc[:], down: down.Index, tso: true, segments: true,
		devMcast: kb.DevMcast,
		sysctl:   ka.Sysctl,
		gro:      func(name string) bool { st, _ := ka.Link(name); return st.GRO },
		noarp:    func(name string) bool { st, _ := ka.Link(name); return st.NoARP },
		setPeer:  ka.SetCarrier,
		addLink:  func(name string) error { return ka.AddChild(kf.ChildSpec{Name: name, Parent: la.Index, PKey: 0xffff}) },
		subscribeSmall: func(done <-chan struct{}, onErr func(error)) (<-chan kf.Link, error) {
			ka.LinkQueue = 1
			return ka.SubscribeLinks(done, onErr)
		},
	}
}

// realWitness makes a namespace with the veth pair va (02:00:00:00:00:0a)
// – vb (…:0b), both up with IPv6 off (so that nothing but the test's own
// packets crosses), and a veth "dn" left down (veth: the kernel here has
// no dummy module).
func realWitness(t *testing.T) *witness {
	nstest.Require(t, "ethtool")
	var r [3]byte
	rand.Read(r[:])
	ns := "kconf-" + hex.EncodeToString(r[:])
	nstest.Add(t, ns)
	in := func(args ...string) string { return nstest.Must(t, nstest.In(ns, args...)...) }
	nstest.Do(t, ns, func() {
		for _, p := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+p+"/disable_ipv6", []byte("1"), 0); err != nil {
				t.Fatal(err)
			}
		}
	})
	in("ip", "link", "add", "va", "address", "02:00:00:00:00:0a", "type", "veth", "peer", "name", "vb", "address", "02:00:00:00:00:0b")
	in("ip", "link", "set", "va", "up")
	in("ip", "link", "set", "vb", "up")
	in("ip", "link", "add", "dn", "type", "veth", "peer", "name", "dnp") // no dummy module on every kernel
	w := &witness{
		name: "kernel", ka: kf.System{}, kb: kf.System{},
		in:    func(fn func()) { nstest.Do(t, ns, fn) },
		aName: "va", aAddr: []byte{2, 0, 0, 0, 0, 0xa}, bAddr: []byte{2, 0, 0, 0, 0, 0xb},
		alen: 6, hatype: unix.ARPHRD_ETHER, srcLen: 6, hardLen: 14, mtu: 1500,
		bcast: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mcast: []byte{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03},
		tso: true, segments: false,
	}
	w.in(func() {
		for name, idx := range map[string]*int{"va": &w.a, "vb": &w.b, "dn": &w.down} {
			l, err := w.ka.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			*idx = l.Index
		}
	})
	w.devMcast = func(ifindex int) map[string]int {
		out := make(map[string]int)
		w.in(func() {
			f, err := os.Open("/proc/thread-self/net/dev_mcast")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for sc := bufio.NewScanner(f); sc.Scan(); {
				var idx, users, global int
				var dev, addr string
				if n, _ := fmt.Sscan(sc.Text(), &idx, &dev, &users, &global, &addr); n == 5 && idx == ifindex {
					out[addr] = users
				}
			}
		})
		return out
	}
	w.sysctl = func(path string) string {
		var b []byte
		w.in(func() {
			var err error
			if b, err = os.ReadFile("/proc/sys/" + path); err != nil {
				t.Fatal(err)
			}
		})
		return strings.TrimSpace(string(b))
	}
	w.gro = func(name string) bool {
		return strings.Contains(in("ethtool", "-k", name), "generic-receive-offload: on")
	}
	w.noarp = func(name string) bool {
		return strings.Contains(in("ip", "link", "show", name), "NOARP")
	}
	w.setPeer = func(up bool) {
		state := "down"
		if up {
			state = "up"
		}
		in("ip", "link", "set", "vb", state)
	}
	w.subscribeSmall = func(done <-chan struct{}, onErr func(error)) (ch <-chan kf.Link, err error) {
		w.in(func() { ch, err = kf.SubscribeLinksBuf(done, onErr, 1) })
		return ch, err
	}
	peers := 0
	w.addLink = func(name string) error {
		// A veth has carrier when its peer is up: the peer is. The
		// peer's name is short, whatever name's length.
		peers++
		peer := fmt.Sprintf("kp%d", peers)
		if out, err := nstest.Run(nstest.In(ns, "ip", "link", "add", name, "type", "veth", "peer", "name", peer)...); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		_, err := nstest.Run(nstest.In(ns, "ip", "link", "set", peer, "up")...)
		return err
	}
	return w
}
