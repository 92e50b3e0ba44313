package main

// ADD, DEL and CHECK: find the pod's interface and its MAC, and declare
// it to eipoibd (vif-add), free it (vif-del) or check that it is there
// (show vifs), over the control socket.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
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
// prevResult on or (ipamWrap) runs the real IPAM and returns its result.
func cmdAdd(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.mode == ipamWrap {
		mac, err := netnsMAC(args.Netns, args.IfName)
		if err != nil {
			return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("eipoib: pod interface %s in %s: %v", args.IfName, args.Netns, err), "")
		}
		if err := declare(c, mac); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), delegateTimeout)
		defer cancel()
		r, err := invoke.DelegateAdd(ctx, c.ipamType, c.delegate, nil)
		if err != nil {
			// The runtime calls DEL after a failed ADD; free the VIF
			// now all the same, so that none waits for it.
			client(c).DelVIF(ctl.VIFRequest{MAC: mac.String(), VLAN: c.VLAN})
			return err
		}
		return types.PrintResult(r, c.Net.CNIVersion)
	}
	mac, err := prevMAC(c, args, `no prevResult: list "eipoib" after "bridge" in the plugins of a conflist`)
	if err != nil {
		return err
	}
	if err := declare(c, mac); err != nil {
		return err
	}
	return types.PrintResult(c.Net.PrevResult, c.Net.CNIVersion)
}

// cmdDel frees the pod's VIF. Per the spec DEL must succeed when there
// is nothing left to free: no prevResult and no interface (the MAC is
// unknown), no VIF, or no daemon that could still hold one (delGone)
// are not errors. In ipamWrap mode the real IPAM's DEL runs and nothing is
// freed here: bridge has deleted the pod's interface before it runs its
// IPAM's DEL, so the MAC is unknown; the chained eipoib frees the VIF.
func cmdDel(args *skel.CmdArgs) error {
	c, err := ParseConf(args.StdinData)
	if err != nil {
		return err
	}
	if c.mode == ipamWrap {
		return delegate(c, invoke.DelegateDel)
	}
	var mac net.HardwareAddr
	if c.Net.PrevResult != nil {
		mac, _ = prevMAC(c, args, "")
	} else if args.Netns != "" {
		mac, _ = netnsMAC(args.Netns, args.IfName)
	}
	if mac == nil {
		return nil
	}
	err = client(c).DelVIF(ctl.VIFRequest{MAC: mac.String(), VLAN: c.VLAN})
	if err == nil {
		return nil
	}
	if gone := daemonGone(c, err); gone != nil {
		return delGone(c, mac, gone)
	}
	return refused(c, "vif-del", mac, err)
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
// daemon's VIFs went with it: DEL succeeds.
func delGone(c *Conf, mac net.HardwareAddr, gone *types.Error) error {
	var left []string
	for _, path := range []string{c.Socket(), c.StateFile()} {
		// ENOTDIR: a component of the path is a file, so nothing is there.
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			left = append(left, path)
		}
	}
	if len(left) == 0 {
		return nil
	}
	return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s The VIF of the pod's MAC %s on VLAN %d is not freed yet: eipoibd restores its VIFs when it starts and keeps a declared one until it is deleted. If eipoibd for %s is gone for good, remove %s: the next DEL then succeeds",
		gone.Msg, mac, c.VLAN, c.TAP, strings.Join(left, " and ")), "")
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

// declare declares mac on c's VLAN to c's eipoibd.
func declare(c *Conf, mac net.HardwareAddr) error {
	err := client(c).AddVIF(ctl.VIFRequest{MAC: mac.String(), VLAN: c.VLAN})
	if err == nil {
		return nil
	}
	if gone := daemonGone(c, err); gone != nil {
		return gone
	}
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
	return podMAC(res, args)
}

// podMAC finds the pod's interface in a previous result: the interface
// named args.IfName in the pod's network namespace, as bridge reports
// it.
func podMAC(res *current.Result, args *skel.CmdArgs) (net.HardwareAddr, error) {
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
	mac, err := net.ParseMAC(found.Mac)
	if err != nil || len(mac) != 6 {
		return nil, badConf("prevResult: interface %s has MAC %q: want an Ethernet MAC", args.IfName, found.Mac)
	}
	return mac, nil
}

// netnsMAC reads the MAC of interface ifName in the network namespace
// at path (netlink through a handle bound to that namespace: no thread
// changes namespace).
func netnsMAC(path, ifName string) (net.HardwareAddr, error) {
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
	mac := l.Attrs().HardwareAddr
	if len(mac) != 6 {
		return nil, fmt.Errorf("%s is not an Ethernet interface (hardware address %s)", ifName, mac)
	}
	return mac, nil
}
