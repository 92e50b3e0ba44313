#!/bin/sh
# Operators' test kit for the kernel IPoIB backend, on two hosts with an
# IB (or IPoIB-capable) HCA each. Run it on host A as root:
#
#   test/hw/run.sh PEER_SSH IB_DEV PEER_NATIVE_IP
#
#   PEER_SSH        ssh destination of host B (root), with eipoibd installed
#   IB_DEV          the IPoIB parent on both hosts (ib0)
#   PEER_NATIVE_IP  an IPv4 address configured natively on B's IB_DEV
#
# It checks the prerequisites on both hosts (IB_DEV up, port ACTIVE, a
# subnet manager reachable, ib_ipoib loaded, datagram mode), starts
# eipoibd --fabric kernel on both with a guest namespace behind each TAP
# (10.77.0.1 and fd77::1 on A, .2 / ::2 on B), runs ping, ping -6, iperf3
# and an ARP check against B's native IPoIB address, and prints a
# pass/fail summary. It cleans up after itself.
set -u
PEER=${1:?peer ssh destination}; DEV=${2:-ib0}; NATIVE=${3:?native IPoIB address on the peer}
EIPOIBD=${EIPOIBD:-eipoibd}
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
both() { sh -c "$1" && ssh "$PEER" "$1"; }

check() { # prerequisites, on both hosts
	both "lsmod | grep -q '^ib_ipoib'" && ok "ib_ipoib loaded" || bad "ib_ipoib not loaded (modprobe ib_ipoib)"
	both "ip link show $DEV | grep -q 'state UP'" && ok "$DEV up" || bad "$DEV not up"
	both "grep -q ACTIVE /sys/class/net/$DEV/device/infiniband/*/ports/*/state" && ok "port ACTIVE" || bad "port not ACTIVE"
	both "[ \$(cat /sys/class/net/$DEV/mode) = datagram ]" && ok "datagram mode" || bad "connected mode (echo datagram > /sys/class/net/$DEV/mode)"
	both "sminfo >/dev/null 2>&1" && ok "subnet manager reachable" || bad "no subnet manager (sminfo failed)"
}

start() { # $1: host (local|peer), $2: last octet
	cmd="ip netns add eibg; $EIPOIBD run --fabric kernel --ib-dev $DEV --name eibt >/tmp/eipoibd-hw.log 2>&1 & echo \$! >/tmp/eipoibd-hw.pid;
	sleep 3; ip link add eibv type veth peer name eibvg; ip link set eibvg netns eibg;
	ip link add eibbr type bridge; ip link set eibt master eibbr; ip link set eibv master eibbr;
	ip link set eibbr up; ip link set eibv up; ip link set eibt up;
	ip -n eibg link set eibvg up; ip -n eibg addr add 10.77.0.$2/24 dev eibvg; ip -n eibg addr add fd77::$2/64 dev eibvg nodad"
	if [ "$1" = local ]; then sh -c "$cmd"; else ssh "$PEER" "$cmd"; fi
}

stop() {
	c="kill \$(cat /tmp/eipoibd-hw.pid) 2>/dev/null; ip netns del eibg 2>/dev/null; ip link del eibbr 2>/dev/null; ip link del eibv 2>/dev/null; true"
	sh -c "$c"; ssh "$PEER" "$c"
}
trap stop EXIT

check
[ "$fail" -eq 0 ] || { echo "prerequisites failed: $fail"; exit 1; }
start local 1; start peer 2
ip netns exec eibg ping -c 5 -W 2 10.77.0.2 >/dev/null && ok "ping guest to guest" || bad "ping guest to guest"
ip netns exec eibg ping -6 -c 5 -W 2 fd77::2 >/dev/null && ok "ping -6 guest to guest" || bad "ping -6 guest to guest"
ssh "$PEER" "ip netns exec eibg iperf3 -s -1 -D" && sleep 1
ip netns exec eibg iperf3 -c 10.77.0.2 -t 5 >/tmp/iperf3-hw.txt 2>&1 && ok "iperf3 ($(grep receiver /tmp/iperf3-hw.txt | awk '{print $7, $8}'))" || bad "iperf3"
# ARP interop: the guest resolves the peer's native IPoIB address (same
# subnet needed: give the guest an address in it), and the native stack
# answers with its own 20-byte address, shown to the guest as a REMAC.
ip -n eibg addr add "$NATIVE/32" dev eibvg 2>/dev/null; ip -n eibg route add "$NATIVE" dev eibvg
ip netns exec eibg arping -c 3 -w 5 -I eibvg "$NATIVE" >/dev/null && ok "ARP with native IPoIB $NATIVE" || bad "ARP with native IPoIB $NATIVE"
echo "summary: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
