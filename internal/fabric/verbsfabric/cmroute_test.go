package verbsfabric

import (
	"errors"
	"syscall"
	"testing"

	"github.com/eipoib/eipoibd/internal/testutil"
)

// TestCMRoutes: the routing of join ids' events (ibvSA's reader). A join
// gets its id's first event whatever it is. A MULTICAST_ERROR of a
// membership goes to the Port, also one that comes while its join is
// still asking the MTU (after MULTICAST_JOIN, before the id is current).
// Errors of ids that never joined, were replaced or were left go
// nowhere.
func TestCMRoutes(t *testing.T) {
	r := newCMRoutes()
	g := testutil.GID("ff12:401b:ffff::506:708")
	key := saKey{g, false}
	reset := cmEvent{kind: cmError, status: -int(syscall.ENETRESET)}
	mustNone := func(what string) {
		t.Helper()
		if e, ok := r.next(); ok {
			t.Fatalf("%s: the Port got %+v", what, e)
		}
	}

	// An error in the join's window, between its event and establish.
	uid, j := r.add(key)
	joinEv := cmEvent{kind: cmJoined, typ: 12, dlid: 0xc001, sl: 3, qkey: 0x0b1b}
	r.route(uid, joinEv)
	if ev := <-j.ev; ev != joinEv {
		t.Fatalf("join got %+v, want %+v", ev, joinEv)
	}
	r.route(uid, reset)
	if old := r.establish(uid, nil); old != nil {
		t.Fatalf("replaced %+v", old)
	}
	if e, ok := r.next(); !ok || e.mgid != g || e.sendOnly || !errors.Is(e.err, syscall.ENETRESET) {
		t.Fatalf("the error during the join: %+v, %v", e, ok)
	}
	mustNone("one error")

	// A refused join: its first event is the join's, a second is no
	// membership's.
	uid2, j2 := r.add(saKey{g, true})
	r.route(uid2, reset)
	if ev := <-j2.ev; ev.kind != cmError {
		t.Fatalf("refused join got %+v", ev)
	}
	r.route(uid2, reset)
	r.route(uid2, cmEvent{kind: cmOther})
	mustNone("a refused join's later events")
	r.drop(uid2)

	// A rejoin replaces the id: the old one's errors go nowhere, the new
	// one's to the Port.
	uid3, j3 := r.add(key)
	r.route(uid3, cmEvent{kind: cmJoined})
	<-j3.ev
	if old := r.establish(uid3, nil); old != j {
		t.Fatalf("replaced %p, want the first join %p", old, j)
	}
	r.route(uid, reset)
	mustNone("the replaced id's error")
	r.route(uid3, reset)
	if _, ok := r.next(); !ok {
		t.Fatal("the current id's error was lost")
	}

	// Left: nothing more.
	if left := r.remove(key); left != j3 {
		t.Fatalf("removed %p, want %p", left, j3)
	}
	r.route(uid3, reset)
	mustNone("a left id's error")
	if all := r.takeAll(); len(all) != 0 {
		t.Fatalf("memberships after the leave: %d", len(all))
	}
}
