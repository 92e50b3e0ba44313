package fastpath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eipoib/eipoibd/internal/nstest"
	"github.com/eipoib/eipoibd/internal/testutil"
	"github.com/eipoib/eipoibd/ipoib"
)

// hooks are the ways of attaching the running kernel has: tcx and
// clsact where tcx attaches (6.6), clsact is then forced (Options.clsact,
// forceClsact) to test the fallback; clsact alone on an older kernel,
// which AttachWith must then choose by itself. EIPOIB_EXPECT_NO_TCX=1
// (the VM's Debian 6.1 kernel, TestFastPathVM) fails them where tcx
// attaches, so that a run meant for the fallback cannot test tcx
// instead; a kernel of 6.6 or later fails them where it does not (a tcx
// refused for another reason looks like no tcx to link.AttachTCX).
func hooks(t *testing.T) []Hook {
	t.Helper()
	tcx := haveTCX(t)
	if os.Getenv("EIPOIB_EXPECT_NO_TCX") == "1" && tcx {
		t.Fatal("EIPOIB_EXPECT_NO_TCX=1, yet tcx attaches on this kernel")
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", u.Release[:], err)
	}
	if !tcx && (major > 6 || major == 6 && minor >= 6) {
		t.Fatalf("kernel %d.%d has tcx (6.6), yet it does not attach", major, minor)
	}
	if tcx {
		return []Hook{TCX, Clsact}
	}
	return []Hook{Clsact}
}

// haveTCX reports whether tcx attaches on this kernel, as Probe finds
// out: at an interface index no device has, ENODEV once the attach type
// is known, ebpf.ErrNotSupported without tcx.
func haveTCX(t *testing.T) bool {
	t.Helper()
	nstest.RequireRoot(t)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "tcxprobe", Type: ebpf.SchedCLS, License: "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, tcActOK), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: p, Attach: ebpf.AttachTCXEgress})
	switch {
	case err == nil:
		l.Close()
		t.Fatal("tcx attached to a device that does not exist")
	case errors.Is(err, ebpf.ErrNotSupported):
		return false
	case !errors.Is(err, unix.ENODEV):
		t.Fatalf("tcx probe: %v", err)
	}
	return true
}

// forceClsact is Options.clsact for a test of hook h: forced where
// tcx attaches, left to AttachWith's own fallback where it does not.
func forceClsact(t *testing.T, h Hook) bool {
	return h == Clsact && haveTCX(t)
}

// attachHook attaches p at the device's ingress or egress with the hook,
// unpinned.
func attachHook(h Hook, ifindex int, ingress bool, p *ebpf.Program) (attachment, error) {
	if h == Clsact {
		return attachCls(ifindex, ingress, p, "eipoib_test")
	}
	at := ebpf.AttachTCXEgress
	if ingress {
		at = ebpf.AttachTCXIngress
	}
	return attachTCX(ifindex, at, p, "")
}

// attachedIDs are the IDs of the programs the hook runs at the device's
// ingress or egress, in the order they run: every tcx program, or every
// cls_bpf filter's.
func attachedIDs(t *testing.T, h Hook, ifindex int, ingress bool) []ebpf.ProgramID {
	t.Helper()
	var ids []ebpf.ProgramID
	if h == Clsact {
		l, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			t.Fatal(err)
		}
		fs, err := netlink.FilterList(l, clsFilter(ifindex, ingress, "").Parent)
		if err != nil {
			t.Fatalf("list the filters of ifindex %d: %v", ifindex, err)
		}
		for _, f := range fs {
			if b, ok := f.(*netlink.BpfFilter); ok {
				ids = append(ids, ebpf.ProgramID(b.Id))
			}
		}
		return ids
	}
	at := ebpf.AttachTCXEgress
	if ingress {
		at = ebpf.AttachTCXIngress
	}
	r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		t.Fatalf("query tcx of ifindex %d: %v", ifindex, err)
	}
	for _, p := range r.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

// progID is the program's ID.
func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("no program ID")
	}
	return id
}

// wantIDs fails unless the device runs exactly want.
func wantIDs(t *testing.T, h Hook, ifindex int, ingress bool, what string, want ...ebpf.ProgramID) {
	t.Helper()
	if got := attachedIDs(t, h, ifindex, ingress); !slices.Equal(got, want) {
		t.Fatalf("%s runs %v, want %v", what, got, want)
	}
}

// foreignFilter puts someone else's cls_bpf filter (a program that
// passes every frame on, TC_ACT_UNSPEC) at the device's ingress or
// egress, before ours (priority 1), and returns its program's ID.
func foreignFilter(t *testing.T, ifindex int, ingress bool) ebpf.ProgramID {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "foreign", Type: ebpf.SchedCLS, License: "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	firstFilter(t, ifindex, ingress, p)
	return progID(t, p)
}

// firstFilter puts p as a cls_bpf filter at the device's ingress or
// egress, before ours (priority 1).
func firstFilter(t *testing.T, ifindex int, ingress bool, p *ebpf.Program) {
	t.Helper()
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscAdd(q); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	f := clsFilter(ifindex, ingress, "foreign")
	f.Priority, f.Handle, f.Fd = 1, 1, p.FD()
	if err := netlink.FilterAdd(&f); err != nil {
		t.Fatalf("add the foreign filter: %v", err)
	}
}

// devices makes, in a new namespace named after prefix and the hook, a
// TAP and a TUN that stands for a child, and runs fn in it with their
// ifindexes.
func devices(t *testing.T, prefix string, h Hook, fn func(tap, child int)) {
	ns := fmt.Sprintf("%s%s%d", prefix, h, os.Getpid())
	nstest.Add(t, ns)
	nstest.Do(t, ns, func() {
		openTun(t, prefix+"tap", unix.IFF_TAP)
		openTun(t, prefix+"ch", unix.IFF_TUN)
		tap, err := net.InterfaceByName(prefix + "tap")
		if err != nil {
			t.Fatal(err)
		}
		ch, err := net.InterfaceByName(prefix + "ch")
		if err != nil {
			t.Fatal(err)
		}
		fn(tap.Index, ch.Index)
	})
}

// TestAttach, with each hook: Attach puts TX at the TAP's egress,
// PutChild RX at a child's ingress (once, however often it is called),
// DeleteChild takes it off, a delete of what is not there succeeds, and
// Close detaches everything. Under clsact another filter that was on
// each device before stays there, running before ours, throughout.
func TestAttach(t *testing.T) {
	nstest.Require(t)
	for _, h := range hooks(t) {
		t.Run(h.String(), func(t *testing.T) {
			devices(t, "fpat", h, func(tap, ch int) {
				var tapOthers, chOthers []ebpf.ProgramID
				if h == Clsact {
					tapOthers = []ebpf.ProgramID{foreignFilter(t, tap, false)}
					chOthers = []ebpf.ProgramID{foreignFilter(t, ch, true)}
				}
				a, err := AttachWith(tap, Options{clsact: forceClsact(t, h)})
				if err != nil {
					t.Fatal(err)
				}
				if a.Hook() != h {
					t.Fatalf("attached with %s, want %s", a.Hook(), h)
				}
				txID, rxID := progID(t, a.TX.Program), progID(t, a.RX.Program)
				wantIDs(t, h, tap, false, "TAP egress", append(tapOthers, txID)...)
				g := RXGuest{MAC: guestMAC, TAP: uint32(tap), MTU: 1500}
				for range 2 {
					if err := a.PutChild(ch, g); err != nil {
						t.Fatal(err)
					}
				}
				wantIDs(t, h, ch, true, "child ingress", append(chOthers, rxID)...)
				var v rxGuest
				if err := a.RX.Guests.Lookup(uint32(ch), &v); err != nil || v.TAP != uint32(tap) {
					t.Fatalf("RX guest of the child: %+v, %v", v, err)
				}
				if err := a.DeleteChild(ch); err != nil {
					t.Fatal(err)
				}
				wantIDs(t, h, ch, true, "child ingress after DeleteChild", chOthers...)
				for _, err := range []error{a.DeleteChild(ch), a.DeleteGuest(guestMAC), a.DeleteREMAC(remac), a.DeleteSender(1, netip.MustParseAddr("10.0.0.1"))} {
					if err != nil {
						t.Errorf("delete of an absent entry: %v", err)
					}
				}
				if err := a.PutChild(ch, g); err != nil {
					t.Fatal(err)
				}
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				wantIDs(t, h, tap, false, "TAP egress after Close", tapOthers...)
				wantIDs(t, h, ch, true, "child ingress after Close", chOthers...)
			})
		})
	}
}

var mapPins = []string{"eipoib_guests", "eipoib_remacs", "eipoib_rx_cnt", "eipoib_rx_guest", "eipoib_rx_last", "eipoib_senders", "eipoib_tx_cnt", "eipoib_tx_last"}

// TestAttachPinned, with each hook: a pinned fast path outlives Release,
// still running (the TX program left on the TAP redirects a guest's
// frame with the entries put before, BPF_PROG_TEST_RUN); a new
// AttachWith takes it over: the maps with their entries, the TAP's and
// the child's attachments running the new programs (one program each,
// not a second), and nothing logged as replaced; DeleteChild detaches
// the child it took over, and Close leaves the bpffs empty and nothing
// attached.
func TestAttachPinned(t *testing.T) {
	nstest.Require(t)
	sender := netip.MustParseAddr("10.0.0.1")
	for _, h := range hooks(t) {
		t.Run(h.String(), func(t *testing.T) {
			fs := nstest.BPFFS(t)
			fresh := nstest.Names(t, fs)
			dir := filepath.Join(fs, "fppntap")
			devices(t, "fppn", h, func(tap, ch int) {
				var logs bytes.Buffer
				o := Options{Pin: dir, clsact: forceClsact(t, h), Log: slog.New(slog.NewTextHandler(&logs, nil))}
				a, err := AttachWith(tap, o)
				if err != nil {
					t.Fatal(err)
				}
				g := RXGuest{MAC: guestMAC, TAP: uint32(tap), MTU: 1500}
				for _, err := range []error{a.PutGuest(guestMAC, Guest{Ifindex: uint32(ch), MTU: childMTU}), a.PutREMAC(remac, remoteIB), a.PutChild(ch, g), a.PutSender(uint32(ch), sender, remac)} {
					if err != nil {
						t.Fatal(err)
					}
				}
				tx1, rx1 := progID(t, a.TX.Program), progID(t, a.RX.Program)
				if err := a.Release(); err != nil {
					t.Fatal(err)
				}
				want := slices.Clone(mapPins)
				if h == TCX {
					want = append(want, fmt.Sprintf("rx_link_%d", ch), "tx_link")
				}
				if got := nstest.Names(t, dir); !slices.Equal(got, want) {
					t.Fatalf("pins after Release %v, want %v", got, want)
				}
				wantIDs(t, h, tap, false, "TAP egress after Release", tx1)
				wantIDs(t, h, ch, true, "child ingress after Release", rx1)
				p, err := ebpf.NewProgramFromID(tx1)
				if err != nil {
					t.Fatal(err)
				}
				l3 := ipv6(6, tcp(100))
				opts := &ebpf.RunOptions{Data: eth(remac, guestMAC, 0x86dd, l3), DataOut: make([]byte, 256)}
				ret, err := p.Run(opts)
				p.Close()
				if err != nil {
					t.Fatal(err)
				}
				if wantOut := ipoibFrame(0x86dd, l3); ret != tcActRedir || !bytes.Equal(opts.DataOut, wantOut) {
					t.Fatalf("the released TX program: verdict %d, %d bytes; want %d, %d bytes", ret, len(opts.DataOut), tcActRedir, len(wantOut))
				}

				a, err = AttachWith(tap, o)
				if err != nil {
					t.Fatal(err)
				}
				if logs.Len() != 0 {
					t.Errorf("logged on taking over its own pins: %s", logs.String())
				}
				e, err := a.Entries()
				if err != nil {
					t.Fatal(err)
				}
				wantE := Entries{
					Guests:   map[[6]byte]Guest{[6]byte(guestMAC): {Ifindex: uint32(ch), MTU: childMTU}},
					REMACs:   map[[6]byte]ipoib.HwAddr{[6]byte(remac): remoteIB},
					Children: map[int]RXGuest{ch: g},
					Senders:  map[Sender][6]byte{{Child: ch, IP: sender}: [6]byte(remac)},
				}
				if fmt.Sprint(e) != fmt.Sprint(wantE) {
					t.Fatalf("entries taken over\n%v\nwant\n%v", e, wantE)
				}
				tx2, rx2 := progID(t, a.TX.Program), progID(t, a.RX.Program)
				if tx2 == tx1 || rx2 == rx1 {
					t.Fatalf("program IDs %d, %d: not loaded afresh", tx2, rx2)
				}
				wantIDs(t, h, tap, false, "TAP egress taken over", tx2)
				wantIDs(t, h, ch, true, "child ingress taken over", rx2)
				if err := a.DeleteChild(ch); err != nil {
					t.Fatal(err)
				}
				wantIDs(t, h, ch, true, "child ingress after DeleteChild")
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				if got := nstest.Names(t, fs); !slices.Equal(got, fresh) {
					t.Fatalf("bpffs after Close holds %v, want %v as mounted", got, fresh)
				}
				wantIDs(t, h, tap, false, "TAP egress after Close")
			})
		})
	}
}

// TestAttachPinnedReplaced: pins of another layout (a guests map with
// 8-byte values, as before the hit counts, and where tcx attaches a TAP
// link running another program; clsact filters are not pinned) are
// replaced, the map made afresh (its entry gone) and the TAP running the
// TX program, and one line says so, naming what was replaced.
func TestAttachPinnedReplaced(t *testing.T) {
	nstest.Require(t)
	hook := hooks(t)[0]
	dir := filepath.Join(nstest.BPFFS(t), "fprptap")
	devices(t, "fprp", hook, func(tap, _ int) {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "eipoib_guests", Type: ebpf.Hash, KeySize: 6, ValueSize: 8, MaxEntries: MaxGuests, Pinning: ebpf.PinByName}, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Put([6]byte(guestMAC), [8]byte{1}); err != nil {
			t.Fatal(err)
		}
		old.Close()
		want := "replaced=eipoib_guests"
		if hook == TCX {
			p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "foreign", Type: ebpf.SchedCLS, License: "Apache-2.0",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
			if err != nil {
				t.Fatal(err)
			}
			l, err := attachTCX(tap, ebpf.AttachTCXEgress, p, filepath.Join(dir, txLinkPin))
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
			l.release()
			want += ",eipoib_tx"
		}

		var logs bytes.Buffer
		a, err := AttachWith(tap, Options{Pin: dir, Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if lines := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(lines) != 1 || !slices.Contains(strings.Fields(lines[0]), want) {
			t.Fatalf("log %q, want one line with %s", logs.String(), want)
		}
		if info, err := a.TX.Guests.Info(); err != nil || info.ValueSize != 16 {
			t.Fatalf("guests map: %+v, %v; want 16-byte values", info, err)
		}
		e, err := a.Entries()
		if err != nil || len(e.Guests) != 0 {
			t.Fatalf("guests %v, %v; want none", e.Guests, err)
		}
		wantIDs(t, hook, tap, false, "TAP egress", progID(t, a.TX.Program))
	})
}

// TestRemovePins: after a pinned run's Release, RemovePins leaves the
// bpffs empty and neither the TAP nor the child with our program, with
// each hook: a child's tcx link goes with its pin, a child's filter is
// found through the pinned RX map (a --persist restart keeps the
// children). With the pins removed by hand first, RemovePins still
// removes the TAP's filter, which clsact leaves on the device.
func TestRemovePins(t *testing.T) {
	nstest.Require(t)
	for _, h := range hooks(t) {
		for _, byHand := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pins-removed-by-hand=%v", h, byHand), func(t *testing.T) {
				fs := nstest.BPFFS(t)
				fresh := nstest.Names(t, fs)
				dir := filepath.Join(fs, "fprmtap")
				devices(t, "fprm", h, func(tap, ch int) {
					a, err := AttachWith(tap, Options{Pin: dir, clsact: forceClsact(t, h)})
					if err != nil {
						t.Fatal(err)
					}
					if err := a.PutChild(ch, RXGuest{MAC: guestMAC, TAP: uint32(tap), MTU: 1500}); err != nil {
						t.Fatal(err)
					}
					rx := progID(t, a.RX.Program)
					if err := a.Release(); err != nil {
						t.Fatal(err)
					}
					if byHand {
						if err := os.RemoveAll(dir); err != nil {
							t.Fatal(err)
						}
						// A tcx link goes with its pin, later: the unlink's
						// put (bpf_free_inode, an RCU callback) defers its
						// release to a work item (bpf_link_put in
						// kernel/bpf/syscall.c), then tcx_link_release.
						testutil.WaitFor(t, "the TAP's tcx link gone with its pin", func() bool { return h != TCX || len(attachedIDs(t, h, tap, false)) == 0 })
					}
					if err := RemovePins(dir, tap); err != nil {
						t.Fatal(err)
					}
					if got := nstest.Names(t, fs); !slices.Equal(got, fresh) {
						t.Fatalf("bpffs after RemovePins holds %v, want %v as mounted", got, fresh)
					}
					wantIDs(t, h, tap, false, "TAP egress after RemovePins")
					if byHand && h == Clsact {
						// Nothing names the child any more: its filter
						// goes with the child.
						wantIDs(t, h, ch, true, "child ingress after RemovePins", rx)
					} else {
						wantIDs(t, h, ch, true, "child ingress after RemovePins")
					}
					if err := RemovePins(dir, tap); err != nil {
						t.Fatalf("RemovePins of nothing: %v", err)
					}
				})
			})
		}
	}
}

// TestAttachNotBPFFS: a pin directory that is not on a bpffs is refused
// in one line naming it, before anything is loaded.
func TestAttachNotBPFFS(t *testing.T) {
	nstest.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "eipoibd", "tap0")
	_, err := AttachWith(1, Options{Pin: dir})
	if err == nil || !strings.Contains(err.Error(), dir+" is not on a bpffs") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("AttachWith on a plain directory: %v", err)
	}
}

// TestAttachWithFailsClean: an AttachWith that fails after taking over
// pins (here: its TAP is gone) leaves nothing pinned and nothing on the
// earlier TAP, so no program over stale maps outlives the fast path
// eipoibd then runs without. With tcx the start names another ifindex
// while the earlier TAP stays, and the TAP's pinned link must go; a
// clsact filter is on its device, not pinned, so there the TAP really
// goes (its filter with it) and the start names it.
func TestAttachWithFailsClean(t *testing.T) {
	nstest.Require(t)
	hook := hooks(t)[0]
	fs := nstest.BPFFS(t)
	fresh := nstest.Names(t, fs)
	dir := filepath.Join(fs, "fpfctap")
	devices(t, "fpfc", hook, func(tap, ch int) {
		a, err := AttachWith(tap, Options{Pin: dir})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.PutGuest(guestMAC, Guest{Ifindex: uint32(ch), MTU: childMTU}); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(); err != nil {
			t.Fatal(err)
		}
		target := 1 << 30
		if hook == Clsact {
			if err := netlink.LinkDel(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Index: tap}}); err != nil {
				t.Fatalf("delete the TAP: %v", err)
			}
			target = tap
		}
		if _, err := AttachWith(target, Options{Pin: dir}); err == nil {
			t.Fatal("AttachWith to an ifindex no device has: no error")
		}
		if got := nstest.Names(t, fs); !slices.Equal(got, fresh) {
			t.Errorf("bpffs after a failed AttachWith holds %v, want %v as mounted", got, fresh)
		}
		if hook == TCX {
			wantIDs(t, TCX, tap, false, "TAP egress after a failed AttachWith")
		}
	})
}

// TestMountBPFFS: a directory already on a bpffs, existing or not, gets
// no mount; one under /sys/fs/bpf (bpffsRoot here) that does not exist
// gets the bpffs mounted at /sys/fs/bpf, not at itself; one elsewhere is
// made and gets its own.
func TestMountBPFFS(t *testing.T) {
	nstest.RequireRoot(t)
	root := t.TempDir()
	defer func(r string) { bpffsRoot = r }(bpffsRoot)
	bpffsRoot = root
	under := filepath.Join(root, "eipoibd")
	if err := MountBPFFS(under); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	if !isBPFFS(root) {
		t.Fatalf("%s (the bpffs root) is not a bpffs after MountBPFFS(%s)", root, under)
	}
	if _, err := os.Stat(under); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MountBPFFS made %s (%v); making it is pinDir's", under, err)
	}
	mounts := func() int {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), " - bpf ")
	}
	n := mounts()
	if err := MountBPFFS(filepath.Join(under, "tap0")); err != nil || mounts() != n {
		t.Errorf("MountBPFFS under a bpffs: %v, bpf mounts %d, want %d", err, mounts(), n)
	}
	elsewhere := filepath.Join(t.TempDir(), "a", "b")
	if err := MountBPFFS(elsewhere); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(elsewhere, unix.MNT_DETACH)
	if !isBPFFS(elsewhere) || isBPFFS(filepath.Dir(elsewhere)) {
		t.Errorf("MountBPFFS(%s): bpffs there %v, above %v; want it at the directory only", elsewhere, isBPFFS(elsewhere), isBPFFS(filepath.Dir(elsewhere)))
	}
}
