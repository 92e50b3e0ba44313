package verbsfabric

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/eipoib/eipoibd/internal/fabric/eventtest"
	"github.com/eipoib/eipoibd/ipoib"
)

// TestEventsRoCE: an ACTIVE port first reports its link up; PORT_ERR and
// PORT_ACTIVE report down and up in order, a GID change or another
// event nothing; Close closes the channel.
func TestEventsRoCE(t *testing.T) {
	p, d := openPort(t, newHub(), gid1)
	ch := p.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	for _, ev := range []portEvent{eventPortDown, eventGIDChange, eventOther, eventPortActive, eventPortDown} {
		d.raise(ev)
	}
	eventtest.Expect(t, ch, eventtest.Link(false), eventtest.Link(true), eventtest.Link(false))
	p.Close()
	eventtest.Closed(t, ch)
}

// TestEventsIB: on InfiniBand a partition's MTU is reported from its
// broadcast group's join (2048 on 4096-byte ports). It is reported again
// when the SM restarted with another MTU and the port rejoined
// (CLIENT_REREGISTER). A reader that does not read never blocks the
// async event loop. The link changes it missed come coalesced, the last
// one the port's state.
func TestEventsIB(t *testing.T) {
	sm := newSM()
	sm.mtu = 2048
	n := newIBNet(t, sm, []ipoib.PKey{0xffff}, 0xffff)
	ch := n.p1.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	if _, err := n.p1.AllocQP(0xffff, 0); err != nil {
		t.Fatal(err)
	}
	eventtest.Expect(t, ch, eventtest.MTU(0xffff, 2048))
	// eventOther after each: the loop has taken it, so it is done with
	// the change before (events are handled one at a time).
	setUp := func(up bool) {
		ev := eventPortDown
		if up {
			ev = eventPortActive
		}
		n.d1.raise(ev)
		n.d1.raise(eventOther)
	}
	mark := eventtest.SlowReader(t, ch, setUp, func() {
		sm.restart(ipoib.QKey, 4096)
		n.d1.raise(eventClientReregister)
	})
	if mark != eventtest.MTU(0xffff, 4096) {
		t.Fatalf("mark %+v", mark)
	}
}

// TestEventsOtherPort: a port opened as fake0:2 uses port 2. The device
// context reports every port's events (ibv_get_async_event gives each
// its element.port_num). Those of port 1, a PORT_ERR included, are
// counted and change nothing: the link stays up until port 2's own
// PORT_ERR.
func TestEventsOtherPort(t *testing.T) {
	h := newHub()
	p, err := New(Config{Device: "fake0:2", Logger: slog.New(slog.DiscardHandler), open: h.opener(gid1)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := h.devs[gid1]
	if d.a.port != 2 {
		t.Fatalf("opened port %d, want 2", d.a.port)
	}
	ch := p.Events()
	eventtest.Expect(t, ch, eventtest.Link(true))
	d.events <- asyncEvent{ev: eventPortDown, port: 1}
	d.events <- asyncEvent{ev: eventClientReregister, port: 1}
	// The loop takes events one at a time: once it has taken this one,
	// it is done with those before.
	d.raise(eventOther)
	if p.IsDown() || p.Counters().Stats["async_events_other_port"] != 2 {
		t.Fatalf("after port 1's PORT_ERR: down %v, async_events_other_port %d (want up, 2)", p.IsDown(), p.Counters().Stats["async_events_other_port"])
	}
	d.raise(eventPortDown)
	eventtest.Expect(t, ch, eventtest.Link(false))
	if !p.IsDown() {
		t.Fatal("port 2's PORT_ERR left the port up")
	}
}

// TestParseDevice: --ib-dev's verbs device, NAME or NAME:PORT.
func TestParseDevice(t *testing.T) {
	for _, c := range []struct {
		in   string
		name string
		port int
		err  string
	}{
		{"mlx5_0", "mlx5_0", 1, ""},
		{"mlx5_0:2", "mlx5_0", 2, ""},
		{"rxe0:1", "rxe0", 1, ""},
		{"mlx5_0:255", "mlx5_0", 255, ""},
		{"mlx5_0:0", "", 0, `port "0": want a number from 1 to 255`},
		{"mlx5_0:256", "", 0, `port "256": want a number from 1 to 255`},
		{"mlx5_0:", "", 0, `port "": want a number from 1 to 255`},
		{"mlx5_0:+2", "", 0, `port "+2": want a number from 1 to 255`},
		{"mlx5_0:1:2", "", 0, `port "1:2": want a number from 1 to 255`},
		{":2", "", 0, "no device name before the port"},
	} {
		name, port, err := ParseDevice(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q: %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || name != c.name || port != c.port {
			t.Errorf("%q: %q %d %v, want %q %d", c.in, name, port, err, c.name, c.port)
		}
	}
}

// FuzzParseDevice: any text gives a name and a port from 1 to
// MaxPortNum, or a one-line error; a result put back together parses
// to itself.
func FuzzParseDevice(f *testing.F) {
	for _, s := range []string{"mlx5_0", "mlx5_0:2", ":1", "a:0", "a:b:c", "a:+1", "a:０", "a:99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, port, err := ParseDevice(s)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("%q: a multi-line error", s)
			}
			return
		}
		if name == "" || port < 1 || port > MaxPortNum {
			t.Fatalf("%q: name %q port %d", s, name, port)
		}
		if n2, p2, err := ParseDevice(name + ":" + strconv.Itoa(port)); err != nil || n2 != name || p2 != port {
			t.Fatalf("%q: %q:%d parses to %q %d %v", s, name, port, n2, p2, err)
		}
	})
}
