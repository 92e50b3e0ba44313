package vswitch

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// OVS attaches ports to an Open vSwitch bridge through ovs-vsctl. The
// OVSDB client libraries for Go (libovsdb) need the whole schema model
// and a long-lived connection, for what is here two transactions, at
// start and at stop. ovs-vsctl is the interface OVS itself documents and
// keeps stable. It honours OVS_RUNDIR, so a private OVS instance (as the
// tests start) is reached the same way.
type OVS struct {
	// DB is the OVSDB remote (ovs-vsctl --db), e.g. unix:/run/openvswitch/db.sock;
	// empty means ovs-vsctl's default ($OVS_RUNDIR/db.sock).
	DB string
	// Timeout bounds each ovs-vsctl call; 0 means 10 s.
	Timeout time.Duration
}

func (o OVS) vsctl(args ...string) (string, error) {
	t := o.Timeout
	if t == 0 {
		t = 10 * time.Second
	}
	full := []string{fmt.Sprintf("--timeout=%d", int(t.Seconds()))}
	if o.DB != "" {
		full = append(full, "--db="+o.DB)
	}
	ctx, cancel := context.WithTimeout(context.Background(), t+2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ovs-vsctl", append(full, args...)...).CombinedOutput()
	msg := strings.TrimSpace(string(out))
	if err != nil {
		if msg == "" {
			msg = err.Error()
		}
		return msg, fmt.Errorf("vswitch: ovs-vsctl %s: %s", strings.Join(args, " "), msg)
	}
	return msg, nil
}

// Attach adds port to bridge br as a trunk (no tag, every VLAN),
// replacing a stale port of that name left by an earlier run. With keep,
// a port of that name is left as it is: it is a persistent TAP's, kept
// across a restart, and replacing it would flap it.
func (o OVS) Attach(port, br string, keep bool) error {
	if _, err := exec.LookPath("ovs-vsctl"); err != nil {
		return fmt.Errorf("vswitch: --ovs-bridge needs ovs-vsctl (Debian: openvswitch-switch): %w", err)
	}
	if _, err := o.vsctl("br-exists", br); err != nil {
		return fmt.Errorf("vswitch: Open vSwitch bridge %q not found (or OVSDB unreachable): %w", br, err)
	}
	if keep {
		_, err := o.vsctl("--may-exist", "add-port", br, port)
		return err
	}
	_, err := o.vsctl("--if-exists", "del-port", br, port, "--", "add-port", br, port)
	return err
}

// Detach removes port from bridge br.
func (o OVS) Detach(port, br string) error {
	_, err := o.vsctl("--if-exists", "del-port", br, port)
	return err
}
