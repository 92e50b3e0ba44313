package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/vswitch"
	"github.com/eipoib/eipoibd/mactrans"
)

// fakeShim records declarations and removals, and refuses a VLAN
// without a P_Key as the shim does.
type fakeShim struct {
	pkeys map[uint16]bool
	calls []string // "+MAC/VLAN origin" declared, "-MAC/VLAN origin" removed
}

func (f *fakeShim) DeclareVIF(mac ether.MAC, vlan uint16, origin mactrans.Origin) error {
	if !f.pkeys[vlan] {
		return fmt.Errorf("shim: VLAN %d has no P_Key", vlan)
	}
	f.calls = append(f.calls, fmt.Sprintf("+%s/%d %s", mac, vlan, origin))
	return nil
}

func (f *fakeShim) RemoveVIF(mac ether.MAC, vlan uint16, by mactrans.Origin) (bool, error) {
	f.calls = append(f.calls, fmt.Sprintf("-%s/%d %s", mac, vlan, by))
	return true, nil
}

// take returns the calls since the last take.
func (f *fakeShim) take() []string {
	c := f.calls
	f.calls = nil
	return c
}

// Ports of the fake bridge: eipoibd's TAP and two guest ports.
const (
	bgTAP    = 5
	bgPort1  = 6 // VLAN 1, PVID untagged (the bridge's default)
	bgPort10 = 7 // VLAN 10, PVID untagged
)

// filtering is a bridge with VLAN filtering whose TAP port has VLAN
// tapPVID PVID untagged and VLANs 10 and 20 tagged.
func filtering(tapPVID uint16) vswitch.VLANs {
	return vswitch.VLANs{Filtering: true, DefaultPVID: 1, TAP: bgTAP, Ports: map[int]vswitch.PortVLANs{
		bgTAP:    {PVID: tapPVID, VIDs: map[uint16]bool{tapPVID: true, 10: false, 20: false}},
		bgPort1:  {PVID: 1, VIDs: map[uint16]bool{1: true}},
		bgPort10: {PVID: 10, VIDs: map[uint16]bool{10: true}},
	}}
}

var (
	macA = ether.MAC{0x52, 0x54, 0, 0, 0, 0xa}
	macB = ether.MAC{0x52, 0x54, 0, 0, 0, 0xb}
	macC = ether.MAC{0x52, 0x54, 0, 0, 0, 0xc}
)

// bgHarness is a bridgeGuests over a fake shim (P_Keys for VLANs 0 and
// 10) and a fake FDB, logging into a buffer.
type bgHarness struct {
	*bridgeGuests
	sh    *fakeShim
	fdb   map[fdbKey]vswitch.Guest
	now   vswitch.VLANs // what reading the VLANs afresh finds
	reads int
	log   bytes.Buffer
}

func newBGHarness(v vswitch.VLANs) *bgHarness {
	h := &bgHarness{sh: &fakeShim{pkeys: map[uint16]bool{0: true, 10: true}}, fdb: map[fdbKey]vswitch.Guest{}, now: v}
	log := slog.New(slog.NewTextHandler(&h.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.bridgeGuests = newBridgeGuests(h.sh, log, v, func() ([]vswitch.Guest, error) {
		return slices.Collect(func(yield func(vswitch.Guest) bool) {
			for _, g := range h.fdb {
				if !yield(g) {
					return
				}
			}
		}), nil
	}, func() (vswitch.VLANs, error) { h.reads++; return h.now, nil })
	return h
}

// add and del change the fake FDB and tell bridgeGuests, as the watch
// does.
func (h *bgHarness) add(mac ether.MAC, vid uint16, port int, static bool) {
	g := vswitch.Guest{MAC: mac, VLAN: vid, Port: port, Static: static}
	h.fdb[fdbKey{mac, vid}] = g
	h.entry(g, true)
}

func (h *bgHarness) del(mac ether.MAC, vid uint16) {
	g := h.fdb[fdbKey{mac, vid}]
	delete(h.fdb, fdbKey{mac, vid})
	h.entry(g, false)
}

func (h *bgHarness) expect(t *testing.T, step string, want ...string) {
	t.Helper()
	if got := h.sh.take(); !slices.Equal(got, want) {
		t.Errorf("%s: shim calls %q, want %q", step, got, want)
	}
}

// TestBridgeGuestsPVID: on a filtering bridge, a libvirt guest has two
// static entries: one without a VLAN, and the copy br_fdb_add makes on
// the default PVID 1. They are one guest of the untagged partition,
// declared once on VLAN 0 with no warning. It is kept while either entry
// remains and freed once when the last goes. The same entry notified
// again declares nothing more. A guest on a port whose PVID is tagged
// VLAN 10 on the TAP is declared on VLAN 10, once for its two entries.
func TestBridgeGuestsPVID(t *testing.T) {
	h := newBGHarness(filtering(1))
	h.add(macA, 0, bgPort1, true)
	h.expect(t, "entry without a VLAN", "+"+macA.String()+"/0 bridge")
	h.add(macA, 1, bgPort1, true)
	h.add(macA, 1, bgPort1, true)
	h.expect(t, "the PVID entry, twice")
	h.del(macA, 0)
	h.expect(t, "entry without a VLAN gone, the PVID entry left")
	h.del(macA, 1)
	h.expect(t, "the last entry gone", "-"+macA.String()+"/0 bridge")

	h.add(macB, 1, bgPort1, true) // bridge fdb add … vlan 1
	h.expect(t, "a PVID entry alone", "+"+macB.String()+"/0 bridge")

	h.add(macC, 0, bgPort10, true)
	h.add(macC, 10, bgPort10, true)
	h.expect(t, "a VLAN 10 guest's two entries", "+"+macC.String()+"/10 bridge")
	h.del(macC, 10)
	h.del(macC, 0)
	h.expect(t, "a VLAN 10 guest gone", "-"+macC.String()+"/10 bridge")

	if strings.Contains(h.log.String(), "level=WARN") {
		t.Errorf("warnings logged:\n%s", h.log.String())
	}
	if n := strings.Count(h.log.String(), `msg="guest declared"`); n != 2+1 {
		t.Errorf(`%d "guest declared" lines, want 3:\n%s`, n, h.log.String())
	}
}

// TestBridgeGuestsRefused: a static entry on a VLAN the TAP carries
// tagged but --vlan-pkey does not map (20) is warned about once, however
// often it is mapped again, and never "freed". An entry on a VLAN the
// TAP does not carry (30) declares nothing and says why at info level.
func TestBridgeGuestsRefused(t *testing.T) {
	h := newBGHarness(filtering(1))
	h.add(macA, 20, bgPort1, true)
	h.add(macB, 0, bgPort1, true) // maps again: macA/20 retried
	h.expect(t, "VLAN 20 refused, then another guest", "+"+macB.String()+"/0 bridge")
	h.del(macA, 20)
	h.expect(t, "the refused entry gone")
	if n := strings.Count(h.log.String(), "VLAN 20 has no P_Key"); n != 1 {
		t.Errorf("%d warnings about VLAN 20, want 1:\n%s", n, h.log.String())
	}
	h.add(macC, 30, bgPort1, true)
	h.expect(t, "a VLAN the TAP lacks")
	if !strings.Contains(h.log.String(), `level=INFO msg="bridge entry declares no guest" mac=`+macC.String()+` bridge_vlan=30`) ||
		!strings.Contains(h.log.String(), "eipoibd's TAP port is not a member") {
		t.Errorf("no info line about the VLAN 30 entry:\n%s", h.log.String())
	}
}

// TestBridgeGuestsLearned: a learned entry declares nothing; its going
// frees its guest's VIF on the VLAN it maps to (the untagged partition
// for the PVID) as OriginLearned (which frees only a learned VIF),
// unless a static entry holds that guest. A static entry's going frees
// as OriginBridge (the other tests).
func TestBridgeGuestsLearned(t *testing.T) {
	h := newBGHarness(filtering(1))
	h.add(macA, 1, bgPort1, false)
	h.expect(t, "a learned entry")
	h.del(macA, 1)
	h.expect(t, "a learned entry gone", "-"+macA.String()+"/0 learned")

	h.add(macB, 0, bgPort1, true)
	h.expect(t, "a static entry", "+"+macB.String()+"/0 bridge")
	h.entry(vswitch.Guest{MAC: macB, VLAN: 1, Port: bgPort1}, false) // a learned PVID entry of the same MAC
	h.expect(t, "a learned entry of a declared guest gone")
}

// TestBridgeGuestsVLANChanges: VLAN filtering turned off and on, and the
// TAP's PVID changed, are followed: the FDB is listed afresh, guests
// whose entries now map elsewhere are freed and declared again, and a
// change that maps nothing differently frees nothing. Each change of
// the bridge's or the TAP's VLANs is logged at info level, one of a
// guest's port at debug level.
func TestBridgeGuestsVLANChanges(t *testing.T) {
	h := newBGHarness(filtering(1))
	h.add(macA, 0, bgPort1, true)
	h.add(macA, 1, bgPort1, true)
	h.add(macC, 10, bgPort10, true)
	h.expect(t, "two guests", "+"+macA.String()+"/0 bridge", "+"+macC.String()+"/10 bridge")

	off := filtering(1)
	off.Filtering = false
	h.setVLANs(off)
	h.expect(t, "filtering off", "-"+macC.String()+"/10 bridge")
	if !strings.Contains(h.log.String(), `level=DEBUG msg="bridge entry declares no guest" mac=`+macA.String()+" bridge_vlan=1") {
		t.Errorf("the per-VLAN copy is not logged at debug level as unused:\n%s", h.log.String())
	}

	h.setVLANs(filtering(1))
	h.expect(t, "filtering on again", "+"+macC.String()+"/10 bridge")

	// The TAP's PVID becomes 2 (bridge vlan add vid 2 dev TAP pvid
	// untagged; VLAN 1 off it): VLAN 1 no longer reaches eipoibd.
	h.setVLANs(filtering(2))
	h.expect(t, "the TAP's PVID changed", "-"+macA.String()+"/0 bridge")
	// The guest's port follows (bridge vlan add vid 2 dev PORT pvid
	// untagged): the entry without a VLAN is on PVID 2 again.
	v := filtering(2)
	v.Ports[bgPort1] = vswitch.PortVLANs{PVID: 2, VIDs: map[uint16]bool{1: true, 2: true}}
	h.setVLANs(v)
	h.expect(t, "the guest's PVID changed", "+"+macA.String()+"/0 bridge")

	// An entry the watch missed is found by the listing.
	h.fdb[fdbKey{macB, 10}] = vswitch.Guest{MAC: macB, VLAN: 10, Port: bgPort10, Static: true}
	delete(h.fdb, fdbKey{macC, 10})
	h.relist()
	h.expect(t, "listed afresh", "+"+macB.String()+"/10 bridge", "-"+macC.String()+"/10 bridge")
	// Each change of the bridge or the TAP's VLANs said at info level,
	// the guest's port's alone at debug level.
	if i, d := strings.Count(h.log.String(), `level=INFO msg="bridge VLANs"`), strings.Count(h.log.String(), `level=DEBUG msg="bridge VLANs"`); i != 3 || d != 1 {
		t.Errorf(`"bridge VLANs" logged %d times at info and %d at debug level, want 3 and 1:\n%s`, i, d, h.log.String())
	}
	if !strings.Contains(h.log.String(), `msg="bridge VLANs" vlan_filtering=true default_pvid=1 tap_pvid=2 tap_untagged=true tap_tagged="[10 20]"`) {
		t.Errorf("the TAP's VLANs are not logged as they are:\n%s", h.log.String())
	}
	if strings.Contains(h.log.String(), "level=WARN") {
		t.Errorf("warnings logged:\n%s", h.log.String())
	}
}

// TestBridgeGuestsNewPort: a static entry on a port the VLANs do not
// know yet makes bridgeGuests read them at once. (The entry was added
// just after the port joined, before the watch read the VLANs again.)
// The entry without a VLAN maps to the new port's PVID, with no line
// saying it declares no guest. An entry on a known port reads nothing.
func TestBridgeGuestsNewPort(t *testing.T) {
	const newPort = 9
	h := newBGHarness(filtering(1))
	h.now = filtering(1)
	h.now.Ports[newPort] = vswitch.PortVLANs{PVID: 10, VIDs: map[uint16]bool{10: true}}
	h.add(macA, 0, newPort, true)
	h.expect(t, "an entry without a VLAN on a new VLAN 10 port", "+"+macA.String()+"/10 bridge")
	if h.reads != 1 || strings.Contains(h.log.String(), "declares no guest") {
		t.Errorf("%d reads of the VLANs, want 1; log:\n%s", h.reads, h.log.String())
	}
	h.add(macB, 0, bgPort1, true)
	h.expect(t, "an entry on a known port", "+"+macB.String()+"/0 bridge")
	if h.reads != 1 {
		t.Errorf("%d reads of the VLANs after an entry on a known port, want still 1", h.reads)
	}
}

// TestBridgeGuestsRestored: a state file restored two guests as declared
// from the bridge. The one whose static entry went while eipoibd was
// down is freed at start (as OriginBridge). The one whose entry is still
// there is neither freed nor declared again: its VIF, and QPN, stay.
// Then its entry going frees it. Had the listing failed, nothing is
// freed until a listing succeeds.
func TestBridgeGuestsRestored(t *testing.T) {
	h := newBGHarness(filtering(1))
	h.fdb[fdbKey{macA, 0}] = vswitch.Guest{MAC: macA, Port: bgPort1, Static: true}
	h.restore([]mactrans.VIFKey{{MAC: macA}, {MAC: macB}})
	h.expect(t, "restored, macB's entry gone", "-"+macB.String()+"/0 bridge")
	h.del(macA, 0)
	h.expect(t, "macA's entry gone after the start", "-"+macA.String()+"/0 bridge")

	h = newBGHarness(filtering(1))
	fail := true
	list := h.list
	h.list = func() ([]vswitch.Guest, error) {
		if fail {
			return nil, errors.New("no FDB")
		}
		return list()
	}
	h.restore([]mactrans.VIFKey{{MAC: macB}})
	h.expect(t, "restored, the FDB unreadable")
	fail = false
	h.relist()
	h.expect(t, "the FDB listed", "-"+macB.String()+"/0 bridge")
}

// TestBridgeGuestsUnservedOnce: a static entry that declares no guest
// is logged once, however often the FDB is listed again (each guest
// port's change relists), and again once it declared a guest and then
// no longer does.
func TestBridgeGuestsUnservedOnce(t *testing.T) {
	h := newBGHarness(filtering(1))
	h.add(macC, 30, bgPort1, true) // VLAN 30: the TAP is no member
	h.relist()
	h.relist()
	line := `msg="bridge entry declares no guest" mac=` + macC.String() + " bridge_vlan=30"
	if n := strings.Count(h.log.String(), line); n != 1 {
		t.Fatalf("%d lines about the VLAN 30 entry after two relists, want 1:\n%s", n, h.log.String())
	}
	h.expect(t, "an entry on a VLAN the TAP does not carry")
	h.sh.pkeys[30] = true
	v := filtering(1)
	v.Ports[bgTAP].VIDs[30] = false // the TAP carries VLAN 30 tagged, which has a P_Key: served
	h.setVLANs(v)
	h.expect(t, "VLAN 30 carried by the TAP", "+"+macC.String()+"/30 bridge")
	h.relist()
	if n := strings.Count(h.log.String(), line); n != 1 {
		t.Fatalf("%d lines about the VLAN 30 entry while it declared its guest, want still 1:\n%s", n, h.log.String())
	}
	h.setVLANs(filtering(1))
	h.expect(t, "VLAN 30 no longer carried", "-"+macC.String()+"/30 bridge")
	h.relist()
	if n := strings.Count(h.log.String(), line); n != 2 {
		t.Errorf("%d lines about the VLAN 30 entry after it was served and is no more, want 2:\n%s", n, h.log.String())
	}
}
