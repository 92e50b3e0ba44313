package kernelfabric

// The backend's IPoIB child request against the running kernel's own
// parser. It is sent exactly as AddChild sends it, and in a few
// deliberate variants cut from its bytes. The parent is an Ethernet
// device (a veth), in a network namespace of the test's own. Without
// InfiniBand no IPoIB parent exists, so ipoib_new_child_link's parent
// check is as far as a request can get. test/netns's TestIPoIBNetlinkVM
// runs this test inside the QEMU guest (Debian's 6.1 kernel), once
// before and once after it loads ib_ipoib. On a host without an IB stack
// it checks the answer to a link kind the kernel does not know.
//
// Expectations, from Linux 6.1 (Debian 6.1.192):
//   - net/core/rtnetlink.c __rtnl_newlink parses the message with
//     nlmsg_parse_deprecated (ifla_policy), and IFLA_LINKINFO with
//     ifla_info_policy. It looks the kind up (rtnl_link_ops_get). For a
//     kind nobody registered, it calls request_module("rtnl-link-%s")
//     once and answers EOPNOTSUPP with the extack "Unknown device type".
//     IFLA_INFO_DATA is parsed only once the kind is known, against
//     ops->policy (ipoib_policy: PKEY, MODE and UMCAST NLA_U16) and
//     ops->maxtype (IFLA_IPOIB_MAX = 3), with
//     nla_parse_nested_deprecated: NL_VALIDATE_LIBERAL.
//   - lib/nlattr.c __nla_validate_parse, liberal: a type beyond maxtype
//     is skipped, not refused (no NL_VALIDATE_MAXTYPE). In validate_nla,
//     an NLA_U16 of another length than 2 gets pr_warn_ratelimited
//     "attribute type %d has an invalid length.". It is refused only
//     under NL_VALIDATE_STRICT_ATTRS, which liberal parsing lacks. One
//     shorter than nla_attr_minlen[NLA_U16] = 2 is refused with ERANGE
//     and the extack "Attribute failed policy validation".
//   - drivers/infiniband/ulp/ipoib/ipoib_netlink.c ipoib_new_child_link
//     (called from rtnl_newlink_create once the device is allocated):
//     EINVAL without IFLA_LINK, ENODEV when IFLA_LINK names no device or
//     one whose type is not ARPHRD_INFINIBAND, no extack either way.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
)

// ipoibKindEnv, when set, is the state the caller put the kernel in:
// "absent" (no link kind "ipoib", and none loadable) or "present"
// (ib_ipoib loaded); the test fails if the kernel is in the other one.
// Unset, the test reads the state from /sys/module/ib_ipoib.
const ipoibKindEnv = "EIPOIB_IPOIB_KIND"

// kernelAnswer is what the kernel answered to a request: its errno and
// its extack message ("" for none).
type kernelAnswer struct {
	errno syscall.Errno
	msg   string
}

func (a kernelAnswer) String() string {
	s := fmt.Sprintf("errno %d (%v)", int(a.errno), a.errno)
	if a.msg != "" {
		s += fmt.Sprintf(", extack %q", a.msg)
	}
	return s
}

// answerOf decodes an error of nl.NetlinkRequest.Execute: the errno,
// followed by ": " and the extack message when the kernel gave one.
func answerOf(err error) (kernelAnswer, bool) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return kernelAnswer{}, false
	}
	msg, _ := strings.CutPrefix(err.Error(), errno.Error())
	return kernelAnswer{errno, strings.TrimPrefix(msg, ": ")}, true
}

// unknownKind is every request's answer when no module registers "ipoib"
// (__rtnl_newlink, after its request_module).
var unknownKind = kernelAnswer{unix.EOPNOTSUPP, "Unknown device type"}

// childRequestCase is one request and the answer ib_ipoib's parser gives
// it, the parent being an Ethernet device.
type childRequestCase struct {
	name string
	// edit cuts the variant from the body of the backend's request (the
	// bytes after the nlmsghdr); nil sends the request through AddChild.
	edit      func(t *testing.T, body []byte) []byte
	withIPoIB kernelAnswer
}

var childRequestCases = []childRequestCase{
	{name: "as AddChild sends it", // pdev->type != ARPHRD_INFINIBAND: policy and kind accepted it
		withIPoIB: kernelAnswer{unix.ENODEV, ""}},
	{name: "without IFLA_LINK", // !tb[IFLA_LINK]
		edit: func(t *testing.T, b []byte) []byte {
			return editAttr(t, b, []uint16{unix.IFLA_LINK}, func([]byte) []byte { return nil })
		},
		withIPoIB: kernelAnswer{unix.EINVAL, ""}},
	{name: "IFLA_IPOIB_PKEY of 1 byte", // shorter than NLA_U16's minimum
		edit: func(t *testing.T, b []byte) []byte {
			return editAttr(t, b, pkeyPath, func([]byte) []byte { return rtattr(iflaIPoIBPKey, []byte{0x01}) })
		},
		withIPoIB: kernelAnswer{unix.ERANGE, "Attribute failed policy validation"}},
	{name: "IFLA_IPOIB_PKEY of 4 bytes", // longer: warned about, not refused
		edit: func(t *testing.T, b []byte) []byte {
			return editAttr(t, b, pkeyPath, func([]byte) []byte { return rtattr(iflaIPoIBPKey, nl.Uint32Attr(0x8001)) })
		},
		withIPoIB: kernelAnswer{unix.ENODEV, ""}},
	{name: "an IFLA_IPOIB_* type beyond IFLA_IPOIB_MAX", // skipped
		edit: func(t *testing.T, b []byte) []byte {
			return editAttr(t, b, infoDataPath, func(old []byte) []byte {
				return appendChild(old, rtattr(iflaIPoIBUmcast+1, nl.Uint16Attr(1)))
			})
		},
		withIPoIB: kernelAnswer{unix.ENODEV, ""}},
}

// Attribute paths in the request, outermost first.
var (
	infoDataPath = []uint16{unix.IFLA_LINKINFO, nl.IFLA_INFO_DATA}
	pkeyPath     = []uint16{unix.IFLA_LINKINFO, nl.IFLA_INFO_DATA, iflaIPoIBPKey}
)

// rtattr encodes one attribute with the netlink library's encoder,
// padded to 4 bytes.
func rtattr(typ int, payload []byte) []byte { return nl.NewRtAttr(typ, payload).Serialize() }

// appendChild returns the nested attribute old (padded) with child
// appended and its length grown by it.
func appendChild(old, child []byte) []byte {
	b := append(append([]byte{}, old...), make([]byte, nlAlign(len(old))-len(old))...)
	b = append(b, child...)
	binary.NativeEndian.PutUint16(b, uint16(len(b)))
	return b
}

func nlAlign(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// editAttr returns body (an ifinfomsg and its attributes) with the
// attribute at path replaced by what repl returns for it (nil removes
// it), the lengths of the attributes around it adjusted. It fails the
// test if the attribute is not there.
func editAttr(t *testing.T, body []byte, path []uint16, repl func(attr []byte) []byte) []byte {
	t.Helper()
	out, _, ok := editIn(body, unix.SizeofIfInfomsg, len(body), path, repl)
	if !ok {
		t.Fatalf("the request has no attribute at %v", path)
	}
	return out
}

// editIn edits the attributes of b[start:end], returning the new bytes
// and the change in length.
func editIn(b []byte, start, end int, path []uint16, repl func([]byte) []byte) ([]byte, int, bool) {
	for off := start; off+unix.SizeofRtAttr <= end; {
		l := int(binary.NativeEndian.Uint16(b[off:]))
		if l < unix.SizeofRtAttr || off+l > end {
			return nil, 0, false
		}
		next := min(off+nlAlign(l), end)
		if binary.NativeEndian.Uint16(b[off+2:]) != path[0] {
			off = next
			continue
		}
		if len(path) == 1 {
			r := repl(b[off : off+l])
			r = append(r, make([]byte, nlAlign(len(r))-len(r))...)
			out := append(append(append([]byte{}, b[:off]...), r...), b[next:]...)
			return out, len(r) - (next - off), true
		}
		out, delta, ok := editIn(b, off+unix.SizeofRtAttr, off+l, path[1:], repl)
		if ok {
			binary.NativeEndian.PutUint16(out[off:], uint16(l+delta))
		}
		return out, delta, ok
	}
	return nil, 0, false
}

// TestChildRequestKernelAnswers sends the backend's IPoIB child request
// for a child of a veth to the running kernel with extended acks on. It
// sends it as AddChild sends it and in the variants of
// childRequestCases, and checks every answer. With ib_ipoib loaded, each
// case's answer is its own: the policy and the kind accepted the
// backend's attributes, and ipoib_new_child_link refused the parent.
// Without it, all get EOPNOTSUPP "Unknown device type". No request
// leaves an interface behind.
func TestChildRequestKernelAnswers(t *testing.T) {
	nstest.Require(t)
	want := os.Getenv(ipoibKindEnv)
	switch want {
	case "", "absent", "present":
	default:
		t.Fatalf("%s=%q: want absent or present", ipoibKindEnv, want)
	}
	ns := fmt.Sprintf("kfchildreq%d", os.Getpid())
	nstest.Add(t, ns)
	reporting := nl.EnableErrorMessageReporting
	nl.EnableErrorMessageReporting = true // NETLINK_EXT_ACK: the kernel's message in the error
	t.Cleanup(func() { nl.EnableErrorMessageReporting = reporting })

	answers := make([]kernelAnswer, len(childRequestCases))
	nstest.Do(t, ns, func() {
		parent := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ibp"}, PeerName: "ibpp"}
		if err := netlink.LinkAdd(parent); err != nil {
			t.Fatalf("add the parent, a veth: %v", err)
		}
		spec := ChildSpec{Name: "ibp.e0", Parent: parent.Index, PKey: 0x8001}
		for i, c := range childRequestCases {
			var err error
			if c.edit == nil {
				err = System{}.AddChild(spec)
			} else {
				req := newChildRequest(spec)
				body := c.edit(t, req.Serialize()[unix.SizeofNlMsghdr:])
				req.Data, req.RawData = nil, body
				_, err = req.Execute(unix.NETLINK_ROUTE, 0)
			}
			a, ok := answerOf(err)
			if !ok {
				t.Fatalf("%s: the kernel answered %v, want an errno", c.name, err)
			}
			answers[i] = a
			t.Logf("%s: %v", c.name, a)
			if _, err := netlink.LinkByName(spec.Name); !errors.As(err, &netlink.LinkNotFoundError{}) {
				t.Errorf("%s: after the request, %s: %v, want no such link", c.name, spec.Name, err)
			}
		}
	})

	// The state is read after the requests: the first one may have
	// loaded ib_ipoib (request_module("rtnl-link-ipoib")).
	_, err := os.Stat("/sys/module/ib_ipoib")
	loaded := err == nil
	t.Logf("ib_ipoib loaded: %v", loaded)
	if want != "" && loaded != (want == "present") {
		t.Fatalf("%s=%s, but /sys/module/ib_ipoib exists: %v", ipoibKindEnv, want, loaded)
	}
	for i, c := range childRequestCases {
		exp := unknownKind
		if loaded {
			exp = c.withIPoIB
		}
		if answers[i] != exp {
			t.Errorf("%s: the kernel answered %v, want %v", c.name, answers[i], exp)
		}
	}
}

// TestChildRequestVariantBytes: each variant of childRequestCases is the
// backend's request for ib0.e3 (TestNewChildRequestBytes) changed where
// its name says and nowhere else, the lengths around the change adjusted.
func TestChildRequestVariantBytes(t *testing.T) {
	req := newChildRequest(ChildSpec{Name: "ib0.e3", Parent: 2, PKey: 0x8001})
	body := req.Serialize()[unix.SizeofNlMsghdr:]
	link := []byte{8, 0, 5, 0, 2, 0, 0, 0}
	pkey := []byte{6, 0, 1, 0, 0x01, 0x80, 0, 0}
	umcast := []byte{6, 0, 3, 0, 0, 0, 0, 0}
	linkInfo := []byte{44, 0, 18, 0}
	infoData := []byte{28, 0, 2, 0}
	swap := func(b []byte, pairs ...[]byte) []byte {
		for i := 0; i < len(pairs); i += 2 {
			if bytes.Count(b, pairs[i]) != 1 {
				t.Fatalf("% x occurs %d times in the request", pairs[i], bytes.Count(b, pairs[i]))
			}
			b = bytes.Replace(b, pairs[i], pairs[i+1], 1)
		}
		return b
	}
	want := map[string][]byte{
		"without IFLA_LINK":          swap(body, link, nil),
		"IFLA_IPOIB_PKEY of 1 byte":  swap(body, pkey, []byte{5, 0, 1, 0, 0x01, 0, 0, 0}),
		"IFLA_IPOIB_PKEY of 4 bytes": swap(body, pkey, []byte{8, 0, 1, 0, 0x01, 0x80, 0, 0}),
		"an IFLA_IPOIB_* type beyond IFLA_IPOIB_MAX": swap(body, linkInfo, []byte{52, 0, 18, 0},
			infoData, []byte{36, 0, 2, 0}, umcast, append(umcast, 6, 0, 4, 0, 1, 0, 0, 0)),
	}
	for _, c := range childRequestCases {
		if c.edit == nil {
			continue // the request itself: TestNewChildRequestBytes
		}
		w, ok := want[c.name]
		if !ok {
			t.Errorf("%s: no bytes worked out for this variant", c.name)
			continue
		}
		if got := c.edit(t, bytes.Clone(body)); !bytes.Equal(got, w) {
			t.Errorf("%s:\ngot  % x\nwant % x", c.name, got, w)
		}
	}
}
