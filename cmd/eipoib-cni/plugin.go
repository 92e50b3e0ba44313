package main

// ADD, DEL, CHECK, GC and STATUS: find the pod's interface and its MAC,
// and declare it to eipoibd (vif-add), free it (vif-del) or check that
// it is there (show vifs), over the control socket; free the VIFs of
// the attachments the runtime no longer has; say whether eipoibd is
// ready (show port).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/eipoib/eipoibd/internal/ctl"
)

// ErrDaemonRefused is the CNI error code (plugin-specific codes start at
// 100) of a request eipoibd answered with a refusal; the message is the
// daemon's.
const ErrDaemonRefused uint = 100

// ErrVIFMissing is the CNI error code of a CHECK that found the pod's
// VIF missing or not as declared.
const ErrVIFMissing uint = 101

// delegateTimeout bounds the wrapped IPAM plugin's run (a DHCP lease
// takes seconds; the dhcp plugin gives up by itself well before).
const delegateTimeout = 2 * time.Minute

// cmdAdd declares the pod's MAC to eipoibd, then (chained) passes the
// prevResult on, with the pod interface's MTU, or (ipamWrap) runs the
// real IPAM and returns its result. Everything is checked before
// anything is declared: the configuration, the pod's interface and (ipamWrap)
// the real IPAM's binary; and the declaration is recorded before it is
// made (records), so that DEL and GC free it whatever the configuration
// says by then.
func cmdAdd(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.mode == ipamWrap {
		link, err := podLink(args.Netns, args.IfName)
		if err != nil {
			return err
		}
		if _, err := invoke.FindInPath(c.ipamType, filepath.SplitList(args.Path)); err != nil {
			return badConf("ipam type %q: %v", c.ipamType, err)
		}
		d := declOf(c, link.HardwareAddr)
		if err := declare(c, args, d); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), delegateTimeout)
		defer cancel()
		r, err := invoke.DelegateAdd(ctx, c.ipamType, c.delegate, nil)
		if err != nil {
			// The runtime calls DEL after a failed ADD; free the VIF
			// now all the same (unless another attachment declares it
			// too), so that none waits for it.
			recordsOf(c).release(args.ContainerID, args.IfName, d)
			return err
		}
		return types.PrintResult(r, c.Net.CNIVersion)
	}
	if c.Net.PrevResult == nil {
		return badConf(`no prevResult: list "eipoib" after "bridge" in the plugins of a conflist`)
	}
	res, err := current.NewResultFromResult(c.Net.PrevResult)
	if err != nil {
		return badConf("prevResult: %v", err)
	}
	iface, err := podInterface(res, args)
	if err != nil {
		return err
	}
	mac, err := ifaceMAC(iface, args)
	if err != nil {
		return err
	}
	link, err := podLink(args.Netns, args.IfName)
	if err != nil {
		return err
	}
	if err := declare(c, args, declOf(c, mac)); err != nil {
		return err
	}
	// Spec 1.1.0's interface "mtu": bridge does not report it.
	iface.Mtu = link.MTU
	return types.PrintResult(res, c.Net.CNIVersion)
}

// cmdDel frees what the attachment's ADD declared, from its record,
// whether the configuration still parses or not. A VIF that another
// attachment's record declares too stays (records). A DEL whose
// configuration no longer parses frees what the record holds and
// succeeds, so that the rest of the chain's DEL (bridge's veth, its
// IPAM's address) runs too.
//
// Per the spec, DEL must succeed when there is nothing left to free
// (SPEC.md, section 2, "DEL: Remove container from network, or un-apply
// modifications"). So none of these is an error: no record; no
// prevResult and no interface (the MAC is unknown); no VIF; no daemon
// that could still hold one (delGone). In ipamWrap mode the real IPAM's
// DEL runs too. Without a record (an ADD by an older plugin), the
// chained plugin frees the VIF of the MAC in the prevResult or, with no
// prevResult, of the pod's interface.
func cmdDel(args *skel.CmdArgs) error {
	var found bool
	var freeErr error
	if rs, ok := recordsIn(args.StdinData); ok {
		found, freeErr = rs.free(args.ContainerID, args.IfName)
	}
	c, err := ParseConf(args.StdinData)
	if err != nil {
		fmt.Fprintf(os.Stderr, "eipoib: DEL of %s %s with a configuration that does not parse (%v): freed what its ADD recorded, if anything\n", args.ContainerID, args.IfName, err)
		return freeErr
	}
	if c.mode == ipamWrap {
		if err := delegate(c, invoke.DelegateDel); err != nil {
			return err
		}
		return freeErr
	}
	if found {
		return freeErr
	}
	var mac net.HardwareAddr
	if c.Net.PrevResult != nil {
		if res, err := current.NewResultFromResult(c.Net.PrevResult); err == nil {
			if iface, err := podInterface(res, args); err == nil {
				mac, _ = ifaceMAC(iface, args)
			}
		}
	} else if link, err := podLink(args.Netns, args.IfName); err == nil {
		mac = link.HardwareAddr
	}
	if mac == nil {
		return nil
	}
	return recordsOf(c).release(args.ContainerID, args.IfName, declOf(c, mac))
}

// delGone is DEL's answer when nothing answers on c's control socket
// (gone says why). A daemon with --persist restores the VIFs of its
// state file when it starts again (internal/daemon restoreState), and a
// declared VIF never ages (mactrans.Origin.Frees): a DEL that succeeded
// while eipoibd restarts would leave the pod's VIF, a QP, for good. So
// while the daemon's control socket (it crashed, or is starting) or its
// state file (it stopped with --persist) is there, DEL fails with "try
// again later", which the runtime retries, and the message says which
// files to remove if that eipoibd is gone for good. With neither, the
// daemon's VIFs went with it: DEL succeeds. A state file whose own
// daemon answers (on the control socket beside it, in a stateDir other
// than socketDir) is a live daemon's, not one that will restore the
// pod's VIF: it is neither waited for nor named for removal.
func delGone(c *Conf, mac net.HardwareAddr, gone *types.Error) error {
	var left []string
	for _, path := range []string{c.Socket(), c.StateFile()} {
		if _, err := os.Lstat(path); !missing(err) {
			left = append(left, path)
		}
	}
	if len(left) > 0 && left[len(left)-1] == c.StateFile() && c.StateDir != c.SocketDir && answers(ctl.Path(c.StateDir, c.TAP)) {
		left = left[:len(left)-1]
	}
	if len(left) == 0 {
		return nil
	}
	return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s The VIF of the pod's MAC %s on VLAN %d is not freed yet: eipoibd restores its VIFs when it starts and keeps a declared one until it is deleted. If eipoibd for %s is gone for good, remove %s: the next DEL then succeeds",
		gone.Msg, mac, c.VLAN, c.TAP, strings.Join(left, " and ")), "")
}

// answers reports whether a daemon answers on the control socket at
// path (with a reply, even a refusal).
func answers(path string) bool {
	_, err := ctl.Client{Path: path}.ShowPort()
	var de *ctl.NoDaemonError
	return !errors.As(err, &de)
}

// cmdGC frees the VIFs of the network's attachments that are not among
// the runtime's valid ones ("cni.dev/valid-attachments"), from their
// records, whether the configuration still parses or not. A VIF another
// record declares too stays (records). In ipamWrap mode the real IPAM's
// GC runs too, as the spec asks of a plugin that delegates.
func cmdGC(args *skel.CmdArgs) error {
	var n types.NetConf
	if err := json.Unmarshal(args.StdinData, &n); err != nil {
		return badConf("network configuration is not JSON: %v", err)
	}
	var gcErr error
	if rs, ok := recordsIn(args.StdinData); ok {
		gcErr = rs.gc(n.ValidAttachments)
	}
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.mode == ipamWrap {
		if err := delegate(c, invoke.DelegateGC); err != nil {
			return err
		}
	}
	return gcErr
}

// ErrNotAvailable is spec 1.1.0's STATUS error: the plugin cannot
// serve ADD.
const ErrNotAvailable uint = 50

// cmdStatus fails (code 50) unless c's eipoibd is ready to declare VIFs:
// its control socket answers and its fabric port is up. In ipamWrap mode
// the real IPAM's STATUS runs too.
func cmdStatus(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	p, err := client(c).ShowPort()
	if err != nil {
		if gone := daemonGone(c, err); gone != nil {
			return types.NewError(ErrNotAvailable, gone.Msg, "")
		}
		return types.NewError(ErrNotAvailable, fmt.Sprintf("eipoibd %s refused show port: %v", c.TAP, err), "")
	}
	if p.Link != "up" {
		return types.NewError(ErrNotAvailable, fmt.Sprintf("eipoibd %s is not ready: its fabric port (%s %s) is %s", c.TAP, p.Backend, p.Device, p.Link), "")
	}
	if c.mode == ipamWrap {
		return delegate(c, invoke.DelegateStatus)
	}
	return nil
}

// cmdCheck fails unless eipoibd holds a VIF for the MAC of the pod's
// interface in the prevResult (the MAC ADD declared) on the configured
// VLAN. The interface's MAC now is not compared: KubeVirt's bridge
// binding hands the pod interface's MAC to the VM and gives the
// interface another, and the VM's MAC is the one that must have a VIF.
// In ipamWrap mode only the real IPAM's CHECK runs; the chained eipoib
// checks the VIF.
func cmdCheck(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.mode == ipamWrap {
		return delegate(c, invoke.DelegateCheck)
	}
	mac, err := prevMAC(c, args, "CHECK without a prevResult: the runtime must pass the result of ADD")
	if err != nil {
		return err
	}
	return checkVIF(c, mac)
}

// delegate runs op, the real IPAM's DEL or CHECK (invoke.DelegateDel,
// invoke.DelegateCheck), with c's delegate configuration, bounded by
// delegateTimeout.
func delegate(c *Conf, op func(context.Context, string, []byte, invoke.Exec) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), delegateTimeout)
	defer cancel()
	return op(ctx, c.ipamType, c.delegate, nil)
}

// checkVIF fails unless eipoibd holds a VIF for mac on c's VLAN.
func checkVIF(c *Conf, mac net.HardwareAddr) error {
	vifs, err := client(c).ShowVIFs()
	if err != nil {
		if gone := daemonGone(c, err); gone != nil {
			return gone
		}
		return refused(c, "show vifs", mac, err)
	}
	var other []string
	for _, v := range vifs {
		if !strings.EqualFold(v.MAC, mac.String()) {
			continue
		}
		if int(v.VLAN) == c.VLAN {
			return nil
		}
		other = append(other, fmt.Sprint(v.VLAN))
	}
	msg := fmt.Sprintf("eipoib: eipoibd %s has no VIF for the pod's MAC %s on VLAN %d", c.TAP, mac, c.VLAN)
	if len(other) > 0 {
		msg += fmt.Sprintf(" (it has one on VLAN %s: the network's \"vlan\" changed since ADD)", strings.Join(other, ", "))
	}
	msg += fmt.Sprintf(": under --learn declared its frames are dropped; re-create the pod, or declare it again with `eipoibd vif add %s --vlan %d --name %s`", mac, c.VLAN, c.TAP)
	return types.NewError(ErrVIFMissing, msg, "")
}

// client is the control socket client of c's eipoibd.
func client(c *Conf) ctl.Client { return ctl.Client{Path: c.Socket()} }

// declare records d for the attachment of args, then declares it to c's
// eipoibd, under the records' lock (no DEL or GC frees the VIF in
// between); a declaration the daemon refused is dropped from the record
// again (nothing was declared).
func declare(c *Conf, args *skel.CmdArgs, d decl) error {
	rs := recordsOf(c)
	unlock, err := rs.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := rs.add(args.ContainerID, args.IfName, d); err != nil {
		return err
	}
	err = client(c).AddVIF(ctl.VIFRequest{MAC: d.MAC, VLAN: d.VLAN})
	if err == nil {
		return nil
	}
	mac, _ := net.ParseMAC(d.MAC)
	if gone := daemonGone(c, err); gone != nil {
		return gone
	}
	rs.drop(args.ContainerID, args.IfName, d)
	return refused(c, "vif-add", mac, err)
}

// daemonGone returns the error an operator sees when a request to c's
// eipoibd failed because nothing answered on its control socket (try
// again later: the runtime retries), or nil when err is something else,
// i.e. the daemon's refusal.
func daemonGone(c *Conf, err error) *types.Error {
	var de *ctl.NoDaemonError
	if !errors.As(err, &de) {
		return nil
	}
	why := de.Err.Error()
	var errno syscall.Errno
	if errors.As(de.Err, &errno) {
		why = errno.Error()
	}
	if de.Connected {
		why = "no reply (" + why + ")"
	}
	return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("eipoibd control socket %s: %s: is eipoibd running for %s?", c.Socket(), why, c.TAP), "")
}

// refused reports a request eipoibd answered with an error.
func refused(c *Conf, op string, mac net.HardwareAddr, err error) error {
	return types.NewError(ErrDaemonRefused, fmt.Sprintf("eipoibd %s refused %s of %s on VLAN %d: %v", c.TAP, op, mac, c.VLAN, err), "")
}

// prevMAC returns the MAC of the pod's interface in c's prevResult; a
// configuration without one is the error missing.
func prevMAC(c *Conf, args *skel.CmdArgs, missing string) (net.HardwareAddr, error) {
	if c.Net.PrevResult == nil {
		return nil, badConf("%s", missing)
	}
	res, err := current.NewResultFromResult(c.Net.PrevResult)
	if err != nil {
		return nil, badConf("prevResult: %v", err)
	}
	iface, err := podInterface(res, args)
	if err != nil {
		return nil, err
	}
	return ifaceMAC(iface, args)
}

// podInterface finds the pod's interface in a previous result: the
// interface named args.IfName in the pod's network namespace, as bridge
// reports it.
func podInterface(res *current.Result, args *skel.CmdArgs) (*current.Interface, error) {
	var found *current.Interface
	for _, i := range res.Interfaces {
		if i == nil || i.Name != args.IfName || i.Sandbox == "" {
			continue
		}
		if found == nil || i.Sandbox == args.Netns {
			found = i
		}
	}
	if found == nil {
		return nil, badConf(`prevResult has no interface %s in the pod's namespace %s: list "eipoib" after "bridge"`, args.IfName, args.Netns)
	}
	return found, nil
}

// ifaceMAC is the Ethernet MAC of the pod's interface i.
func ifaceMAC(i *current.Interface, args *skel.CmdArgs) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(i.Mac)
	if err != nil || len(mac) != 6 {
		return nil, badConf("prevResult: interface %s has MAC %q: want an Ethernet MAC", args.IfName, i.Mac)
	}
	return mac, nil
}

// podLink reads the pod's interface ifName in the network namespace at
// path (netlink through a handle bound to that namespace: no thread
// changes namespace); it must be an Ethernet interface. Its error is
// CNI's code 8 (invalid network namespace).
func podLink(path, ifName string) (*netlink.LinkAttrs, error) {
	a, err := netnsLink(path, ifName)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("eipoib: pod interface %s in %s: %v", ifName, path, err), "")
	}
	return a, nil
}

// netnsLink is podLink's work.
func netnsLink(path, ifName string) (*netlink.LinkAttrs, error) {
	if path == "" {
		return nil, errors.New("no network namespace given")
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		return nil, err
	}
	a := l.Attrs()
	if len(a.HardwareAddr) != 6 {
		return nil, fmt.Errorf("%s is not an Ethernet interface (hardware address %s)", ifName, a.HardwareAddr)
	}
	return a, nil
}
