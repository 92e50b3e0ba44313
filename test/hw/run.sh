#!/usr/bin/env bash
# The acceptance run of eipoibd on two InfiniBand hosts: both backends,
# two guests per host and partition, two partitions, native IPoIB
# addresses on both hosts, unicast and multicast, an SM re-register, and
# a one-screen summary. Run it as root on host A; test/hw/README.md
# explains the checks and how to read the summary, --help every option.
#
# The transport to host B (ssh, or any command prefix) and the fabric
# (InfiniBand, eipoibd's simulated fabric over an underlay, or the
# kernel backend on package emuib's EMULATED IPoIB wire) are pluggable
# so that test/netns/hwkit_test.go runs this same script on one
# machine, with two network namespaces as the hosts. The emulation is
# for that self-test only, never a result for hardware.
set -u -o pipefail

usage() {
	cat <<'EOF'
usage: test/hw/run.sh --peer ROOT@HOSTB [options]      (as root, on host A)
       test/hw/run.sh --peer ROOT@HOSTB --cleanup      (remove what a killed run left)

Runs eipoibd on host A and host B with guests behind a bridge on each and
checks, per backend and per partition: ping and ping -6 between guests and
with each host's native IPoIB address, ARP and ND, TCP with an exact byte
count both ways, IPv4 and IPv6 multicast with no datagram lost; ping, ping -6
and TCP between a guest and an address host B routes for (the routed leg);
then an SM re-register with the time until guests talk again. The kernel
backend runs all of it with its fast path off and on (--fast-path), checking
from eipoibd's counters that the fast path carried the TCP transfers.
Prints the throughput and RTT of each leg and a summary table, and exits 0
only if nothing failed (1: a check failed, 2: a prerequisite is missing,
3: bad options).

Hosts and transport:
  --peer DEST          ssh destination of host B (root, key-based: ssh -o BatchMode=yes DEST)
  --peer-exec CMD      run host B's commands as `CMD sh -c SCRIPT` instead of ssh
                       (e.g. 'ip netns exec hostB'); replaces --peer
  --local-exec CMD     run host A's commands as `CMD sh -c SCRIPT` (default: here)
  --dev DEV            the IPoIB interface on both hosts (default ib0); with
                       --fabric sim the underlay interface instead
  --peer-dev DEV       host B's, when it differs from --dev
Fabric and backends:
  --fabric ib|sim|emuib
                       ib (default): InfiniBand. sim: eipoibd's simulated UD fabric
                       over --dev, each host's native IPoIB address on `eipoibd host`.
                       emuib: an EMULATION, to self-test the kit, never for hardware:
                       the kernel backend's round on an eipoibd built with -tags emuib,
                       --dev each host's emulated IPoIB parent, every host command run
                       with $EIPOIB_EMUIB set (test/netns TestHWKitEmulated sets it up);
                       no native IPoIB addresses, one partition, no SM
  --backends LIST      comma-separated, of kernel and verbs (default kernel,verbs);
                       with --fabric sim the only backend is sim, with emuib kernel
  --verbs-dev DEV      verbs device of --dev, HCA or HCA:PORT (default: the HCA under
                       /sys/class/net/DEV/device and DEV's port, from its dev_port)
  --eipoibd PATH       eipoibd on both hosts (default: eipoibd on PATH)
  --eipoibd-verbs PATH the -tags verbs build on both hosts (default: eipoibd-verbs on PATH)
  --eipoibd-args ARGS  more flags for eipoibd run, e.g. '--log-level debug --max-vifs 64'
  --fast-path LIST     the kernel backend's legs run once per setting, in turn, with
                       eipoibd run --fast-path SETTING: comma-separated, of off, on and
                       auto; both = off,on (default both). The verbs and sim backends
                       have no fast path: their legs run once ("fast path: n/a")
Partitions and addresses:
  --partitions 1|2     1: P_Key 0xffff only; 2 (default): also --pkey2
  --pkey2 PKEY         second partition's P_Key, full member (default 0x8001)
  --vlan2 VID          its guests' VLAN behind the bridge, mapped with
                       eipoibd --vlan-pkey VID=PKEY (default 100)
  --switch bridge|ovs  the guests' switch: a Linux bridge (default; vlan_filtering
                       for two partitions) or Open vSwitch (the running ovs-vswitchd;
                       eipoibd --ovs-bridge)
  --ovs-datapath DP    datapath of the OVS bridge: system (default) or netdev
                       (userspace; the guests' veths then get tx checksumming off)
  --net4 A.B           partition N's guests and natives use A.B.N.0/24 (default 10.77):
                       native .1 (A) and .2 (B), guests .11 .12 (A) and .21 .22 (B)
  --net6 PFX           and PFX:N::/64 with the same last numbers (default fd77)
Subnet manager leg:
  --sm-restart CMD     permission to restart the SM: run CMD on host A
                       (e.g. 'systemctl restart opensm'); the SM's first sweep
                       asks every port to re-register
  --sm-port-reset      (default) instead reset host A's port through the local
                       SMA: ibportstate -C HCA -P PORT -D 0 PORT reset
  --no-sm              leave the SM leg out (summary: not run)
  --sm-timeout SEC     longest wait for recovery (default 60)
Kernel backend legs (after the checks; --fabric ib with the kernel backend):
  --long-name NAME     rename host A's --dev to NAME (up to 15 bytes, e.g.
                       ibp129s0f0np0xy) and run eipoibd on it: its children's
                       names must fit, ping A1>B1 must pass; renamed back after.
                       The interface is down a moment: not if you reach B over it
  --children N         MemAvailable on host A before and after N IPoIB children
                       of --dev are made and up (the memory each one costs)
Measurements:
  --count N            pings, ARP and ND requests per pair (default 10)
  --bytes N            TCP bytes each way (default 67108864)
  --mcast-settle SEC   wait after receivers join before sending (default 2)
  --work DIR           logs and state on each host (default /tmp/eipoib-hwkit)
  --ns-prefix P        the guests' network namespaces are named PHpPgG (default eht);
                       namespace names are global to a host, unlike the kit's links
  --cleanup            only remove what an interrupted run left, on both hosts
  -h, --help           this text
EOF
}

die() { # usage error
	echo "run.sh: $*" >&2
	echo "run.sh --help lists the options" >&2
	exit 3
}

PEER="" PEER_EXEC="" LOCAL_EXEC="" DEV=ib0 PEER_DEV="" FABRIC=ib BACKENDS="" VERBS_DEV=""
EIPOIBD=eipoibd EIPOIBD_VERBS=eipoibd-verbs PARTITIONS=2 PKEY2=0x8001 VLAN2=100
NET4=10.77 NET6=fd77 SM_MODE=reset SM_RESTART="" SM_TIMEOUT=60 COUNT=10 BYTES=67108864
SETTLE=2 WORK=/tmp/eipoib-hwkit NSP=eht CLEANUP_ONLY=0 SWITCH=bridge OVS_DP=system EXTRA=""
LONG_NAME="" CHILDREN="" FAST_PATH=both

while [ $# -gt 0 ]; do
	opt=$1
	case $opt in
	-h | --help) usage; exit 0 ;;
	--cleanup) CLEANUP_ONLY=1; shift; continue ;;
	--no-sm) SM_MODE=none; shift; continue ;;
	--sm-port-reset) SM_MODE=reset; shift; continue ;;
	esac
	[ $# -ge 2 ] || die "$opt needs a value"
	val=$2
	shift 2
	case $opt in
	--peer) PEER=$val ;;
	--peer-exec) PEER_EXEC=$val ;;
	--local-exec) LOCAL_EXEC=$val ;;
	--dev) DEV=$val ;;
	--peer-dev) PEER_DEV=$val ;;
	--fabric) FABRIC=$val ;;
	--backends) BACKENDS=$val ;;
	--verbs-dev) VERBS_DEV=$val ;;
	--eipoibd) EIPOIBD=$val ;;
	--eipoibd-verbs) EIPOIBD_VERBS=$val ;;
	--eipoibd-args) EXTRA=$val ;;
	--partitions) PARTITIONS=$val ;;
	--pkey2) PKEY2=$val ;;
	--vlan2) VLAN2=$val ;;
	--switch) SWITCH=$val ;;
	--ovs-datapath) OVS_DP=$val ;;
	--net4) NET4=$val ;;
	--net6) NET6=$val ;;
	--sm-restart) SM_MODE=restart SM_RESTART=$val ;;
	--sm-timeout) SM_TIMEOUT=$val ;;
	--count) COUNT=$val ;;
	--bytes) BYTES=$val ;;
	--mcast-settle) SETTLE=$val ;;
	--work) WORK=$val ;;
	--ns-prefix) NSP=$val ;;
	--long-name) LONG_NAME=$val ;;
	--children) CHILDREN=$val ;;
	--fast-path) FAST_PATH=$val ;;
	*) die "unknown option $opt" ;;
	esac
done

# The values go into shell scripts run on both hosts: only plain tokens.
for v in "$DEV" "${PEER_DEV:-x}" "${VERBS_DEV:-x}" "$EIPOIBD" "$EIPOIBD_VERBS" "$WORK" "$NET4" "$NET6"; do
	[[ $v =~ ^[A-Za-z0-9_./:@+-]+$ ]] || die "'$v': only letters, digits and _ . / : @ + - are allowed"
done
[[ $EXTRA =~ ^[A-Za-z0-9_.,=:/\ -]*$ ]] || die "--eipoibd-args: only flags and plain values"
[[ $NSP =~ ^[A-Za-z][A-Za-z0-9]{0,15}$ ]] || die "--ns-prefix is a letter, then up to 15 letters or digits, not '$NSP'"
[ -n "$PEER" ] || [ -n "$PEER_EXEC" ] || die "--peer (or --peer-exec) is required"
case $FABRIC in ib | sim | emuib) ;; *) die "--fabric is ib, sim or emuib, not $FABRIC" ;; esac
case $PARTITIONS in 1 | 2) ;; *) die "--partitions is 1 or 2, not $PARTITIONS" ;; esac
case $SWITCH in bridge | ovs) ;; *) die "--switch is bridge or ovs, not $SWITCH" ;; esac
case $OVS_DP in system | netdev) ;; *) die "--ovs-datapath is system or netdev, not $OVS_DP" ;; esac
[[ $PKEY2 =~ ^0x[0-9a-fA-F]{1,4}$ ]] || die "--pkey2 is a hex P_Key such as 0x8001, not $PKEY2"
PKEY2=$(printf '0x%04x' $((PKEY2 | 0x8000)))
if [ "$PKEY2" = 0xffff ] || [ "$PKEY2" = 0x8000 ]; then die "--pkey2 must differ from 0xffff and 0x8000"; fi
if ! [[ $VLAN2 =~ ^[0-9]+$ ]] || [ "$VLAN2" -lt 2 ] || [ "$VLAN2" -gt 4094 ]; then die "--vlan2 is 2..4094"; fi
[[ $NET4 =~ ^[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "--net4 is the first two numbers of an IPv4 /16, e.g. 10.77"
[[ $NET6 =~ ^[0-9a-fA-F]{1,4}(:[0-9a-fA-F]{1,4}){0,5}$ ]] || die "--net6 is an IPv6 prefix without ::, e.g. fd77"
if [ -n "$LONG_NAME" ]; then
	[[ $LONG_NAME =~ ^[A-Za-z0-9_.-]{1,15}$ ]] || die "--long-name is 1 to 15 letters, digits, _ . - (an interface name)"
	[ "$LONG_NAME" != "$DEV" ] || die "--long-name must differ from --dev"
fi
for v in "$COUNT" "$BYTES" "$SM_TIMEOUT" "$SETTLE" ${CHILDREN:+"$CHILDREN"}; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || die "'$v' is not a positive number"
done
if [ "$FABRIC" = sim ]; then
	BACKENDS=${BACKENDS:-sim}
	[ "$BACKENDS" = sim ] || die "--fabric sim has one backend, sim (not $BACKENDS)"
elif [ "$FABRIC" = emuib ]; then
	BACKENDS=${BACKENDS:-kernel}
	[ "$BACKENDS" = kernel ] || die "--fabric emuib emulates the kernel backend's IPoIB only: --backends kernel (not $BACKENDS)"
	[ "$PARTITIONS" = 1 ] || die "--fabric emuib runs one partition (--partitions 1): the emulation applies no P_Key"
else
	BACKENDS=${BACKENDS:-kernel,verbs}
	for b in ${BACKENDS//,/ }; do
		case $b in kernel | verbs) ;; *) die "--backends takes kernel and verbs, not $b" ;; esac
	done
fi
[ "$FAST_PATH" = both ] && FAST_PATH=off,on
FP_SETTINGS=()
for v in ${FAST_PATH//,/ }; do
	case $v in off | on | auto) ;; *) die "--fast-path takes off, on, auto or both, not $v" ;; esac
	[[ " ${FP_SETTINGS[*]} " == *" $v "* ]] && die "--fast-path: $v twice"
	FP_SETTINGS+=("$v")
done
[ ${#FP_SETTINGS[@]} -gt 0 ] || die "--fast-path needs a setting"
PEER_DEV=${PEER_DEV:-$DEV}
# The kit's directory: fastpath-check.sh, the fast path verdict, and
# perf.sh, the throughput and RTT block.
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=perf.sh source-path=SCRIPTDIR
source "$KIT/perf.sh"
read -r -a LX <<<"$LOCAL_EXEC"
read -r -a PX <<<"$PEER_EXEC"
PKEYS=(0xffff)
[ "$PARTITIONS" = 2 ] && PKEYS+=("$PKEY2")

# on HOST SCRIPT runs SCRIPT with sh on host A or B and returns its status.
on() {
	if [ "$1" = A ]; then
		"${LX[@]}" sh -c "$2"
	elif [ ${#PX[@]} -gt 0 ]; then
		"${PX[@]}" sh -c "$2"
	else
		ssh -o BatchMode=yes "$PEER" "$2"
	fi
}

dev_of() { if [ "$1" = A ]; then echo "$DEV"; else echo "$PEER_DEV"; fi; }
# w HOST: the host's work directory (distinct, for the self-test's shared file system).
w() { echo "$WORK/$1"; }
# ns HOST P G: the namespace of guest G of partition P on HOST.
ns() { echo "$NSP$1p$2g$3"; }
num() { # num HOST G: last number of a guest (G 1, 2) or of the native address (G 0)
	local base=1
	[ "$1" = B ] && base=2
	if [ "$2" = 0 ]; then echo "$base"; else echo "$base$2"; fi
}
ip4() { echo "$NET4.$1.$(num "$2" "$3")"; } # ip4 P HOST G
ip6() { echo "$NET6:$1::$(num "$2" "$3")"; } # ip6 P HOST G
pidx() { [ "$1" = 0xffff ] && echo 1 || echo 2; }

# ---------------------------------------------------------------- cleanup

# topo_down_script HOST: what removes one backend's guests, bridge and
# TAP from HOST, tolerating any of them absent.
topo_down_script() {
	[ "$SWITCH" = ovs ] && echo "ovs-vsctl --timeout=10 --if-exists del-br ehtbr"
	cat <<EOF
for n in \$(ip netns list 2>/dev/null | awk '{print \$1}' | grep '^$NSP$1p'); do ip netns del "\$n"; done
for l in eht0 ehtbr ehtu ehtv11 ehtv12 ehtv21 ehtv22; do ip link del "\$l" 2>/dev/null; done
ip link del ehtx 2>/dev/null # the routed leg's second subnet
true
EOF
}

# stop_pidfile FILE: the shell that stops the process whose pid FILE
# holds (SIGTERM, up to 10 s, then SIGKILL) and removes FILE; the one
# stop of cleanup_script and daemon_down.
stop_pidfile() {
	cat <<EOF
p=\$(cat $1 2>/dev/null) && kill -TERM "\$p" 2>/dev/null
i=0; while [ -n "\$p" ] && kill -0 "\$p" 2>/dev/null && [ \$i -lt 50 ]; do sleep 0.2; i=\$((i+1)); done
[ -n "\$p" ] && kill -KILL "\$p" 2>/dev/null; rm -f $1
EOF
}

# kernel_legs_cleanup W: what undoes the kernel backend legs (below) in
# work directory W: the children of --children, the rename of --long-name.
kernel_legs_cleanup() {
	cat <<EOF
if [ -f $1/mchildren ]; then for c in \$(cat $1/mchildren); do ip link del "\$c" 2>/dev/null; done; fi
if [ -f $1/renamed ]; then
	read -r old new <$1/renamed
	ip link set "\$new" down 2>/dev/null && ip link set "\$new" name "\$old" && ip link set "\$old" up
fi
EOF
}

# cleanup_script HOST: what removes everything this kit made on HOST:
# its processes, the topology, the native addresses and the P_Key child
# it added; the logs stay in WORK/HOST.prev.
# shellcheck disable=SC2016 # '"$f"': expanded by the host's shell
cleanup_script() {
	local W
	W=$(w "$1")
	cat <<EOF
for f in $W/*.pid; do
	[ -f "\$f" ] || continue
$(stop_pidfile '"$f"')
done
$(topo_down_script "$1")
ip link del ehtn1 2>/dev/null; ip link del ehtn2 2>/dev/null
if [ -f $W/native ]; then
	while read -r dev addr; do ip addr del "\$addr" dev "\$dev" 2>/dev/null; done <$W/native
fi
if [ -f $W/child ]; then ip link del "\$(cat $W/child)" 2>/dev/null; fi
$(kernel_legs_cleanup "$W")
if [ -d $W ]; then rm -rf $W.prev && mv $W $W.prev; fi
true
EOF
}

cleanup() {
	trap - EXIT INT TERM
	for h in A B; do on "$h" "$(cleanup_script "$h")" >/dev/null 2>&1; done
}

if [ "$CLEANUP_ONLY" = 1 ]; then
	cleanup
	echo "cleaned up on both hosts (logs of the last run: $WORK/A.prev, $WORK/B.prev)"
	exit 0
fi

# ---------------------------------------------------------- prerequisites

missing=0
need() { # need HOST WHAT FIX SCRIPT: SCRIPT must succeed on HOST
	if on "$1" "$4" >/dev/null 2>&1; then
		printf '  ok       %-s: %s\n' "$1" "$2"
	else
		printf '  MISSING  %-s: %s: %s\n' "$1" "$2" "$3"
		missing=$((missing + 1))
		return 1
	fi
}

# port_script HOST: shell lines setting hca and port (the IB port of the
# IPoIB interface). ipoib_main.c ipoib_parent_init: SET_NETDEV_DEV(dev,
# ca->dev.parent), so device/ is the HCA's PCI device and lists it under
# infiniband/; "priv->dev->dev_port = priv->port - 1".
port_script() {
	local d
	d=$(dev_of "$1")
	echo "hca=\$(ls /sys/class/net/$d/device/infiniband 2>/dev/null | head -n1); port=\$((\$(cat /sys/class/net/$d/dev_port) + 1))"
}

prereqs() {
	echo "prerequisites:"
	local h d tools pk vd
	if ! on B true >/dev/null 2>&1; then
		if [ ${#PX[@]} -gt 0 ]; then
			echo "  MISSING  B: running commands on host B: '$PEER_EXEC sh -c true' failed"
		else
			echo "  MISSING  B: ssh -o BatchMode=yes $PEER true failed: set up key-based ssh as root to host B"
		fi
		missing=$((missing + 1))
		return
	fi
	for h in A B; do
		d=$(dev_of "$h")
		need "$h" "root" "run as root" "[ \$(id -u) = 0 ]"
		need "$h" "mkdir $WORK" "make $WORK writable or give --work DIR" "mkdir -p $(w "$h")"
		need "$h" "no leftovers of an earlier run" "run: test/hw/run.sh --peer ... --cleanup" \
			"! ip link show ehtbr && ! ip link show eht0 && ! ip netns list | grep -q '^$NSP${h}p'"
		need "$h" "test subnets $NET4.1-2.0/24, $NET6:1-2::/64 unused" "choose others with --net4/--net6" \
			"! ip -o addr | grep -Eq ' (${NET4//./\\.}\\.[12]\\.|$NET6:[12]::)'"
		if [[ $BACKENDS =~ kernel|sim ]]; then
			need "$h" "eipoibd ($EIPOIBD)" "install it on host $h, or give --eipoibd PATH" "command -v $EIPOIBD"
		fi
		if [[ $BACKENDS =~ verbs ]]; then
			need "$h" "eipoibd-verbs ($EIPOIBD_VERBS)" "make build gives bin/eipoibd-verbs; install it, or give --eipoibd-verbs PATH" \
				"command -v $EIPOIBD_VERBS"
		fi
		for tools in ip:iproute2 bridge:iproute2 ping:iputils-ping arping:arping awk:gawk; do
			need "$h" "${tools%%:*}" "apt-get install ${tools#*:}" "command -v ${tools%%:*}"
		done
		need "$h" "iperf (version 2: exact TCP bytes, multicast)" "apt-get install iperf (iperf3 cannot join groups)" \
			"iperf -v 2>&1 | grep -q 'version 2'"
		if on "$h" "command -v ndisc6" >/dev/null 2>&1; then
			printf '  ok       %s: ndisc6 (ND checks)\n' "$h"
		else
			printf '  note     %s: no ndisc6 (apt-get install ndisc6): ND is checked by ping -6 and the neighbour table\n' "$h"
		fi
		if [ "$SWITCH" = ovs ]; then
			need "$h" "Open vSwitch running (ovs-vsctl show)" "systemctl start openvswitch-switch (Debian: apt-get install openvswitch-switch)" \
				"ovs-vsctl --timeout=5 show && command -v ovsdb-client"
			if [ "$OVS_DP" = netdev ]; then
				need "$h" "ethtool (checksums off for the netdev datapath)" "apt-get install ethtool" "command -v ethtool"
			fi
		elif [ "$PARTITIONS" = 2 ]; then
			need "$h" "bridge VLAN filtering (second partition's guests)" \
				"a kernel with CONFIG_BRIDGE_VLAN_FILTERING, or --switch ovs, or --partitions 1" \
				"ip link add ehtvf type bridge vlan_filtering 1 && ip link del ehtvf"
		fi
		if [ "$h" = A ] && [ "$FABRIC" = ib ]; then
			case $SM_MODE in
			reset) need A "ibportstate (SM re-register leg)" "apt-get install infiniband-diags, or --sm-restart CMD, or --no-sm" \
				"command -v ibportstate" ;;
			restart) printf '  ok       A: SM restart allowed: %s\n' "$SM_RESTART" ;;
			esac
		fi
		if [ "$FABRIC" = sim ]; then
			need "$h" "underlay $d up" "ip link set $d up" "ip link show dev $d | grep -q 'state UP'"
			need "$h" "underlay $d MTU >= 4168 (IB MTU 4096 + 72)" "ip link set $d mtu 9000" \
				"[ \$(ip -o link show dev $d | sed 's/.* mtu \\([0-9]*\\).*/\\1/') -ge 4168 ]"
			need "$h" "macvlan on $d (the simulated ports)" "modprobe macvlan" \
				"ip link add ehtmv link $d type macvlan mode bridge && ip link del ehtmv"
			continue
		fi
		if [ "$FABRIC" = emuib ]; then
			# shellcheck disable=SC2016 # expanded by the host's shell
			need "$h" "\$EIPOIB_EMUIB set (the emulated kernel's configuration)" \
				"run the host's commands with it (--local-exec/--peer-exec 'env EIPOIB_EMUIB=JSON ...')" '[ -n "$EIPOIB_EMUIB" ]'
			need "$h" "emulated IPoIB parent $d up" "ip link set $d up (its peer in the fabric namespace up too)" \
				"ip link show dev $d | grep -q 'state UP'"
			continue
		fi
		if ! need "$h" "ib_ipoib loaded" "modprobe ib_ipoib" "[ -d /sys/module/ib_ipoib ]"; then
			printf '  skipped  %s: the checks of %s, its port, mode, SM and P_Keys need ib_ipoib\n' "$h" "$d"
			continue
		fi
		if ! need "$h" "$d is an IPoIB interface" "give the IPoIB interface with --dev/--peer-dev (ip -br link)" \
			"[ \$(cat /sys/class/net/$d/type) = 32 ]"; then
			printf '  skipped  %s: the checks of its port, mode, SM and P_Keys need it\n' "$h"
			continue
		fi
		need "$h" "$d up" "ip link set $d up" "[ \$(cat /sys/class/net/$d/operstate) = up ]"
		need "$h" "$d's port ACTIVE" "check the cable and the subnet manager; ibstat shows the state" \
			"$(port_script "$h"); grep -q ACTIVE /sys/class/infiniband/\$hca/ports/\$port/state"
		need "$h" "$d in datagram mode" "echo datagram > /sys/class/net/$d/mode" \
			"[ \$(cat /sys/class/net/$d/mode) = datagram ]"
		need "$h" "a subnet manager (sminfo, else the port's SM LID)" "start opensm on a host of the fabric" \
			"$(port_script "$h"); if command -v sminfo; then sminfo -C \$hca -P \$port; else [ \$(cat /sys/class/infiniband/\$hca/ports/\$port/sm_lid) != 0x0 ]; fi"
		if [ "$PARTITIONS" = 2 ]; then
			pk=${PKEY2#0x}
			need "$h" "P_Key $PKEY2 in the port's P_Key table" \
				"add it to the SM's partitions (opensm partitions.conf: 'p2=$PKEY2 : ALL=full ;') and restart the SM" \
				"$(port_script "$h"); cat /sys/class/infiniband/\$hca/ports/\$port/pkeys/* | grep -qix '0x$pk'"
		fi
		if [[ $BACKENDS =~ verbs ]]; then
			vd=${VERBS_DEV:-\$hca}
			need "$h" "verbs device of $d" "give --verbs-dev HCA:PORT" \
				"$(port_script "$h"); [ -d /sys/class/infiniband/${vd%%:*} ]"
		fi
	done
	if [ "$FABRIC" = sim ] && [ "$SM_MODE" = reset ]; then
		echo "  MISSING  the simulated fabric has no subnet manager: pass --no-sm, or --sm-restart CMD with a stand-in"
		missing=$((missing + 1))
	elif [ "$FABRIC" = emuib ] && [ "$SM_MODE" = reset ]; then
		echo "  MISSING  the emulated wire has no subnet manager: pass --no-sm"
		missing=$((missing + 1))
	fi
}

# ------------------------------------------------------------ the topology

# native_up HOST: each host's native IPoIB address per partition, on the
# IPoIB interface (0xffff) and on a P_Key child (ip link add link ib0 name
# ib0.8001 type ipoib pkey 0x8001); on the simulated fabric on eipoibd
# host's TUN, one per partition, each on a macvlan of the underlay.
native_up() {
	local h=$1 d W p pk ndev s=""
	d=$(dev_of "$h")
	W=$(w "$h")
	for pk in "${PKEYS[@]}"; do
		p=$(pidx "$pk")
		if [ "$FABRIC" = sim ]; then
			ndev=ehtib$p
			s+="ip link add ehtn$p link $d type macvlan mode bridge && ip link set ehtn$p up || exit 1
nohup $EIPOIBD host --underlay ehtn$p --name $ndev --pkey $pk </dev/null >$W/host$p.log 2>&1 &
echo \$! >$W/host$p.pid
i=0; until grep -q 'host running' $W/host$p.log; do
	kill -0 \$(cat $W/host$p.pid) 2>/dev/null && [ \$i -lt 150 ] || { cat $W/host$p.log; exit 1; }
	sleep 0.2; i=\$((i+1))
done
"
		elif [ "$pk" = 0xffff ]; then
			ndev=$d
		else
			ndev=$d.${pk#0x}
			s+="if ! ip link show $ndev >/dev/null 2>&1; then
	ip link add link $d name $ndev type ipoib pkey $pk || exit 1
	echo $ndev >$W/child
fi
ip link set $ndev up || exit 1
"
		fi
		s+="ip addr add $(ip4 "$p" "$h" 0)/24 dev $ndev && echo '$ndev $(ip4 "$p" "$h" 0)/24' >>$W/native || exit 1
ip addr add $(ip6 "$p" "$h" 0)/64 dev $ndev nodad && echo '$ndev $(ip6 "$p" "$h" 0)/64' >>$W/native || exit 1
"
	done
	on "$h" "$s"
}

# stack_off DEV: the line that keeps the host's own IP stack off a
# device of the guests' switch. With arp_ignore 0 (the weak host model,
# net/ipv4/arp.c arp_ignore) the host would answer guests' ARP for its
# native IPoIB address through the switch too, and the guests would see
# the host twice, once as a guest of eipoibd. A Linux bridge keeps its
# ports' frames from the stack; OVS's userspace datapath does not, so
# every port gets it.
stack_off() {
	echo "echo 1 >/proc/sys/net/ipv4/conf/$1/arp_ignore && echo 1 >/proc/sys/net/ipv6/conf/$1/disable_ipv6 || exit 1"
}

# guests_up HOST: the bridge and two guest namespaces per partition; the
# second partition's guest ports are access ports of --vlan2.
guests_up() {
	local h=$1 pk p g n s="" tag
	if [ "$SWITCH" = ovs ]; then
		s+="ovs-vsctl --timeout=10 add-br ehtbr -- set bridge ehtbr datapath_type=$OVS_DP || exit 1
"
	elif [ "$PARTITIONS" = 2 ]; then
		s+="ip link add ehtbr type bridge vlan_filtering 1 || exit 1
"
	else
		s+="ip link add ehtbr type bridge || exit 1
"
	fi
	s+="$(stack_off ehtbr)
ip link set ehtbr up
"
	for pk in "${PKEYS[@]}"; do
		p=$(pidx "$pk")
		for g in 1 2; do
			n=$(ns "$h" "$p" "$g")
			s+="ip netns add $n && ip -n $n link set lo up || exit 1
ip link add ehtv$p$g type veth peer name eth0 netns $n || exit 1
$(stack_off "ehtv$p$g")
"
			if [ "$SWITCH" = ovs ]; then
				tag=""
				[ "$p" = 2 ] && tag=" tag=$VLAN2"
				s+="ovs-vsctl --timeout=10 add-port ehtbr ehtv$p$g$tag || exit 1
ip link set ehtv$p$g up
"
				# The userspace datapath forwards what the veth hands it;
				# checksums left to offload would stay unfilled.
				[ "$OVS_DP" = netdev ] && s+="ethtool -K ehtv$p$g tx off >/dev/null && ip netns exec $n ethtool -K eth0 tx off >/dev/null || exit 1
"
			else
				s+="ip link set ehtv$p$g master ehtbr up
"
			fi
			s+="ip -n $n link set eth0 up
ip -n $n addr add $(ip4 "$p" "$h" "$g")/24 dev eth0
ip -n $n addr add $(ip6 "$p" "$h" "$g")/64 dev eth0 nodad
ip -n $n route add 224.0.0.0/4 dev eth0
"
			if [ "$p" = 2 ] && [ "$SWITCH" = bridge ]; then
				s+="bridge vlan del dev ehtv$p$g vid 1 && bridge vlan add dev ehtv$p$g vid $VLAN2 pvid untagged || exit 1
"
			fi
		done
	done
	on "$h" "$s"
}

# daemon_up HOST BACKEND [FASTPATH]: eipoibd with the TAP eht0 in the
# bridge, with --fast-path FASTPATH unless it is n/a or not given; waits
# until it moves traffic. Its log: WORK/HOST/eipoibd-TAG.log (tag_of).
daemon_up() {
	local h=$1 b=$2 fp=${3:-n/a} d W args bin=$EIPOIBD sw=--bridge tag
	tag=$(tag_of "$b" "$fp")
	[ "$SWITCH" = ovs ] && sw=--ovs-bridge
	d=$(dev_of "$h")
	W=$(w "$h")
	case $b in
	sim) args="--fabric sim --underlay ehtu" ;;
	kernel) args="--fabric kernel --ib-dev $d" ;;
	verbs)
		# The HCA and port of --dev (eipoibd-verbs --ib-dev HCA:PORT).
		bin=$EIPOIBD_VERBS
		args="--fabric verbs --ib-dev ${VERBS_DEV:-\$hca:\$port}"
		;;
	esac
	[ "$PARTITIONS" = 2 ] && args+=" --vlan-pkey $VLAN2=$PKEY2"
	[ "$fp" != n/a ] && args+=" --fast-path $fp"
	local s=""
	[ "$b" = sim ] && s+="ip link add ehtu link $d type macvlan mode bridge && ip link set ehtu up || exit 1
"
	[ "$b" = verbs ] && s+="$(port_script "$h")
"
	s+="mkdir -p $W/ctl
nohup $bin run $args --name eht0 $sw ehtbr --ctl-dir $W/ctl $EXTRA </dev/null >$W/eipoibd-$tag.log 2>&1 &
echo \$! >$W/run.pid
i=0; until grep -q 'shim running' $W/eipoibd-$tag.log; do
	kill -0 \$(cat $W/run.pid) 2>/dev/null && [ \$i -lt 300 ] || { tail -n 20 $W/eipoibd-$tag.log; exit 1; }
	sleep 0.2; i=\$((i+1))
done
"
	s+="$(stack_off eht0)
"
	[ "$PARTITIONS" = 2 ] && [ "$SWITCH" = bridge ] && s+="bridge vlan add dev eht0 vid $VLAN2 || exit 1
"
	on "$h" "$s"
}

# tag_of BACKEND FASTPATH: what names a run's log and saved state: the
# backend, and the fast path setting when there is one (kernel-off).
tag_of() { if [ "$2" = n/a ]; then echo "$1"; else echo "$1-$2"; fi; }

# daemon_down HOST BACKEND [FASTPATH]: saves eipoibd's counters, VIFs,
# neighbours and groups to WORK/HOST/show-TAG.txt for the operator, stops
# it (SIGTERM: it removes its TAP, QPs and children) and makes the native
# stack forget the guests' addresses, which the next backend's QPs change.
daemon_down() {
	local h=$1 b=$2 W d bin=$EIPOIBD s="" what
	W=$(w "$h")
	d=$(dev_of "$h")
	[ "$b" = verbs ] && bin=$EIPOIBD_VERBS
	for what in stats vifs neigh groups; do
		s+="echo '== eipoibd show $what'; $bin show $what --ctl-dir $W/ctl --name eht0
"
	done
	s="{
$s} >$W/show-$(tag_of "$b" "${3:-n/a}").txt 2>&1
$(stop_pidfile "$W/run.pid")
"
	[ "$FABRIC" = ib ] && s+="ip neigh flush dev $d; ip neigh flush dev $d.${PKEY2#0x} 2>/dev/null
"
	on "$h" "${s}true"
}

# ----------------------------------------------------------- measurements

RESULTS=() # rows: check|backend|partition|PASS, FAIL, SKIP or not run|figure
passed=0 failed=0 notrun=0
record() { # record CHECK BACKEND PARTITION STATUS FIGURE (SKIP counts as not run)
	RESULTS+=("$1|$2|$3|$4|$5")
	case $4 in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; *) notrun=$((notrun + 1)) ;; esac
	printf '%-5s %s [%s, %s]: %s\n' "$4" "$1" "$2" "$3" "$5"
}

# verdict CHECK BACKEND P OK ALL PASS-FIGURE FAIL-FIGURE: PASS when all
# ALL pairs (or receivers) were OK.
verdict() {
	if [ "$4" = "$5" ]; then
		record "$1" "$2" "$(pk_of "$3")" PASS "$6"
	else
		record "$1" "$2" "$(pk_of "$3")" FAIL "$7"
	fi
}

# The fast path checks of the kernel backend (CUR_FP off, on or auto):
# around each TCP transfer, eipoibd's counters on the sending and the
# receiving host, and fastpath-check.sh's verdict on them (its comment
# says what PASS takes, and why). FP_WHY: why eipoibd ran with the fast
# path off under auto, from its log ("" when it runs).
FP_WHY=""

# fp_scrape HOST: what fastpath-check.sh reads: show stats, "== vifs",
# show vifs.
fp_scrape() {
	local c
	c="--ctl-dir $(w "$1")/ctl --name eht0"
	on "$1" "$EIPOIBD show stats $c; echo '== vifs'; $EIPOIBD show vifs $c" 2>/dev/null
}

# fp_redirected HOST DIR: HOST's port_fast_path_DIR_redirected (0 if none).
fp_redirected() {
	on "$1" "$EIPOIBD show stats --ctl-dir $(w "$1")/ctl --name eht0" 2>/dev/null |
		awk -v n="port_fast_path_$2_redirected" '$1 == n { v = $2 } END { print v + 0 }'
}

# fp_off_why BACKEND: under auto, the reason each host's eipoibd logged
# for running without its fast path (useFastPath, startFastPath), or "".
fp_off_why() {
	local h line why=""
	[ "$CUR_FP" = auto ] || return 0
	for h in A B; do
		line=$(on "$h" "grep -m1 'fast path off' $(w "$h")/eipoibd-$(tag_of "$1" auto).log" 2>/dev/null)
		line=${line#*fast path off: }
		[ -n "$line" ] && why+="${why:+; }$h: fast path off: ${line:0:160}"
	done
	echo "$why"
}

# fp_before P SH RH G DST: before a transfer from guest G of host SH to
# guest G of host RH (either "" for X, the routed leg's address), the
# counters of both (FP_S0, FP_R0). With the fast path to carry it, first
# waits until it carries guest G's ping to DST each way it is checked:
# eipoibd hands a guest to it only once the guest's announcement window
# (30 s from its first frame) is over; up to 60 s, else FP_LATE says so.
fp_before() {
	local p=$1 sh=$2 rh=$3 g=$4 dst=$5 t0=$SECONDS s r
	FP_S0="" FP_R0="" FP_LATE=""
	[ "$CUR_FP" = n/a ] && return
	if [ "$CUR_FP" != off ] && [ -z "$FP_WHY" ] && [ "$p" = 1 ] && [ -n "$sh" ]; then
		while :; do
			s=$(fp_redirected "$sh" tx)
			[ -n "$rh" ] && r=$(fp_redirected "$rh" rx)
			on "$sh" "$(in_g "$sh" "$p" "$g")ping -n -c 1 -W 1 $dst" >/dev/null 2>&1
			if [ "$(fp_redirected "$sh" tx)" -gt "$s" ] && { [ -z "$rh" ] || [ "$(fp_redirected "$rh" rx)" -gt "$r" ]; }; then
				break
			fi
			if [ $((SECONDS - t0)) -ge 60 ]; then
				FP_LATE=" (a ping of $(label "$sh" "$g") was not carried within 60 s)"
				break
			fi
			sleep 1
		done
	fi
	[ -n "$sh" ] && FP_S0=$(fp_scrape "$sh")
	[ -n "$rh" ] && FP_R0=$(fp_scrape "$rh")
}

# fp_after NAME BACKEND P SH RH G: the fast path row NAME of the transfer
# fp_before saw start: PASS when fastpath-check.sh passes on every host
# checked (SH as the sender, RH as the receiver), SKIP when eipoibd ran
# without its fast path under auto, not run where the fast path is not to
# carry the transfer.
fp_after() {
	local name=$1 b=$2 p=$3 sh=$4 rh=$5 g=$6 setting=off dir h before mac out ok=1 fig=""
	[ "$CUR_FP" = n/a ] && return
	if [ "$CUR_FP" != off ]; then
		if [ -n "$FP_WHY" ]; then
			record "$name" "$b" "$(pk_of "$p")" SKIP "$FP_WHY"
			return
		elif [ "$p" != 1 ]; then
			record "$name" "$b" "$(pk_of "$p")" "not run" "(VLAN $VLAN2: the fast path takes untagged frames only)"
			return
		elif [ -z "$sh" ]; then
			record "$name" "$b" "$(pk_of "$p")" "not run" "(X's source IP is one no ARP or NDP taught: the RX program leaves it to eipoibd)"
			return
		fi
		setting=on
	fi
	for dir in tx rx; do
		h=$sh before=$FP_S0
		[ "$dir" = rx ] && h=$rh before=$FP_R0
		[ -n "$h" ] || continue
		mac=$(on "$h" "ip -n $(ns "$h" "$p" "$g") -br link show eth0" 2>/dev/null | awk '{ print $3 }')
		if [ -z "$mac" ]; then # without it, the VIF's bytes cannot be told
			ok=0
			fig+="${fig:+; }$h: no MAC of guest $(label "$h" "$g")"
			continue
		fi
		out=$(bash "$KIT/fastpath-check.sh" "$setting" "$dir" "$mac" "$BYTES" <(printf '%s\n' "$before") <(fp_scrape "$h") 2>&1) || ok=0
		fig+="${fig:+; }$h ${out#* }"
	done
	if [ "$ok" = 1 ]; then
		record "$name" "$b" "$(pk_of "$p")" PASS "$fig"
	else
		record "$name" "$b" "$(pk_of "$p")" FAIL "$fig$FP_LATE"
	fi
}

# where HOST G: the command prefix of guest G (0: the host's own stack).
in_g() { if [ "$3" = 0 ]; then echo ""; else echo "ip netns exec $(ns "$1" "$2" "$3") "; fi; }
label() { if [ "$2" = 0 ]; then echo "n$1"; else echo "$1$2"; fi; } # A1, nB

PAIRS=("A 1 B 1" "B 2 A 2" "A 1 B 0" "B 1 A 0" "A 0 B 2") # from HOST G to HOST G
ND_PAIRS=("A 1 B 1" "A 1 B 0" "B 1 A 0")
# The emulated wire has no native IPoIB host (NO_NATIVE says why): the
# guests' pairs only, and the legs that need a native "not run".
NO_NATIVE=""
if [ "$FABRIC" = emuib ]; then
	NO_NATIVE="(--fabric emuib: no native IPoIB host on the emulated wire)"
	PAIRS=("A 1 B 1" "B 2 A 2")
	ND_PAIRS=("A 1 B 1")
fi

# ping_check FAMILY(4|6) BACKEND P: every pair, COUNT requests, all answered.
ping_check() {
	local fam=$1 b=$2 p=$3 pair sh sg dh dg dst out tx rx rtt ok=0 sum=0 bad="" n=0 avg
	for pair in "${PAIRS[@]}"; do
		read -r sh sg dh dg <<<"$pair"
		if [ "$fam" = 4 ]; then dst=$(ip4 "$p" "$dh" "$dg"); else dst=$(ip6 "$p" "$dh" "$dg"); fi
		out=$(on "$sh" "$(in_g "$sh" "$p" "$sg")ping -$fam -n -c $COUNT -i 0.2 -W 2 $dst" 2>&1)
		tx=$(sed -n 's/^\([0-9]*\) packets transmitted.*/\1/p' <<<"$out")
		rx=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<<"$out")
		rtt=$(sed -n 's|^rtt [^=]*= [0-9.]*/\([0-9.]*\)/.*|\1|p' <<<"$out")
		n=$((n + ${rx:-0}))
		if [ "${tx:-0}" = "$COUNT" ] && [ "${rx:-0}" = "$COUNT" ] && ! grep -q duplicates <<<"$out"; then
			ok=$((ok + 1))
			sum=$(awk -v a="$sum" -v b="$rtt" 'BEGIN { print a + b }')
		else
			bad+=" $(label "$sh" "$sg")>$(label "$dh" "$dg") ${rx:-0}/$COUNT"
		fi
	done
	avg=$(awk -v s="$sum" -v k="$ok" 'BEGIN { if (k) printf "%.3f", s / k }')
	[ -n "$avg" ] && perf checks "$(pk_of "$p")" "ping$fam" "$avg" ms
	verdict "ping$fam" "$b" "$p" "$ok" ${#PAIRS[@]} \
		"${#PAIRS[@]} pairs $n/$((COUNT * ${#PAIRS[@]})), rtt avg $avg ms" \
		"replies:$bad"
}

pk_of() { [ "$1" = 1 ] && echo 0xffff || echo "$PKEY2"; }

# arp_check BACKEND P: arping from a guest, COUNT requests, all answered
# once (arping's two dialects: iputils and Thomas Habets').
arp_check() {
	local b=$1 p=$2 pair sh sg dh dg out got bad="" ok=0
	for pair in "${ND_PAIRS[@]}"; do
		read -r sh sg dh dg <<<"$pair"
		out=$(on "$sh" "$(in_g "$sh" "$p" "$sg")arping -c $COUNT -w $((COUNT + 3)) -I eth0 $(ip4 "$p" "$dh" "$dg")" 2>&1)
		got=$(sed -n -e 's/^Received \([0-9]*\) response.*/\1/p' \
			-e 's/^[0-9]* packets transmitted, \([0-9]*\) packets received.*(0 extra).*/\1/p' <<<"$out")
		if [ "${got:-0}" = "$COUNT" ]; then ok=$((ok + 1)); else bad+=" $(label "$sh" "$sg")>$(label "$dh" "$dg") ${got:-0}/$COUNT"; fi
	done
	verdict arp "$b" "$p" "$ok" ${#ND_PAIRS[@]} "${#ND_PAIRS[@]} pairs $((COUNT * ok))/$((COUNT * ok)) replies" "replies:$bad"
}

# nd_check BACKEND P: COUNT neighbour solicitations from a guest, each
# answered (ndisc6, or else a flushed entry that ping -6 makes REACHABLE).
nd_check() {
	local b=$1 p=$2 pair sh sg dh dg dst out got bad="" ok=0 how=ndisc6 s x
	on A "command -v ndisc6" >/dev/null 2>&1 && on B "command -v ndisc6" >/dev/null 2>&1 || how="ping -6"
	for pair in "${ND_PAIRS[@]}"; do
		read -r sh sg dh dg <<<"$pair"
		dst=$(ip6 "$p" "$dh" "$dg")
		x=$(in_g "$sh" "$p" "$sg")
		if [ "$how" = ndisc6 ]; then
			s="for i in \$(seq $COUNT); do ${x}ndisc6 -q -n -r 3 -w 1000 $dst eth0; done"
		else
			s="for i in \$(seq $COUNT); do ${x}ip -6 neigh flush to $dst dev eth0; ${x}ping -6 -n -c 1 -W 2 $dst >/dev/null
${x}ip -6 neigh show to $dst dev eth0 | awk '/lladdr/ { print \$3 }'; done"
		fi
		out=$(on "$sh" "$s" 2>/dev/null)
		got=$(grep -Ec '^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$' <<<"$out")
		if [ "$got" = "$COUNT" ] && [ "$(sort -u <<<"$out" | wc -l)" = 1 ]; then
			ok=$((ok + 1))
		else
			bad+=" $(label "$sh" "$sg")>$(label "$dh" "$dg") $got/$COUNT"
		fi
	done
	verdict nd "$b" "$p" "$ok" ${#ND_PAIRS[@]} "${#ND_PAIRS[@]} pairs $((COUNT * ok))/$((COUNT * ok)) advertisements ($how)" \
		"answered:$bad ($how)"
}

# tcp_check BACKEND P FROM TO: one iperf 2 connection of exactly BYTES
# from guest 1 of host FROM to guest 1 of host TO; the client's written
# and the server's read byte counts must both be BYTES. (iperf3's
# receiver stops counting when the end-of-test message overtakes data in
# flight, so its counts differ even on a bare veth: iperf 2 counts exactly.)
#
# With the kernel backend, the fast path row of the transfer follows
# (fp_after).
tcp_check() {
	local b=$1 p=$2 from=$3 to=$4 sent rcvd bps g name="$3""1>$4""1"
	fp_before "$p" "$from" "$to" 1 "$(ip4 "$p" "$to" 1)"
	read -r sent rcvd bps <<<"$(iperf_bytes "$to" "$(in_g "$to" "$p" 1)" "$from" "$(in_g "$from" "$p" 1)" "$(ip4 "$p" "$to" 1)")"
	if [ "$sent" = "$BYTES" ] && [ "$rcvd" = "$BYTES" ]; then
		g=$(gbps "$bps")
		perf checks "$(pk_of "$p")" "tcp $name" "$g" Gbit/s
		record "tcp $name" "$b" "$(pk_of "$p")" PASS "$BYTES B sent = received, $g Gbit/s"
	else
		record "tcp $name" "$b" "$(pk_of "$p")" FAIL "sent $sent, received $rcvd, want $BYTES"
	fi
	fp_after "fastpath $name" "$b" "$p" "$from" "$to" 1
}

gbps() { awk -v r="$1" 'BEGIN { printf "%.2f", r / 1e9 }'; } # gbps BIT/S

# iperf_bytes SRVHOST SRVPREFIX CLIHOST CLIPREFIX DST [SRC]: one iperf 2
# connection of exactly BYTES from CLIPREFIX on CLIHOST (bound to SRC) to
# the server run with SRVPREFIX on SRVHOST, at DST; prints the bytes the client
# wrote, the bytes the server read and the server's rate in bit/s
# ("none" for a count it did not report).
iperf_bytes() {
	local sh=$1 sp=$2 ch=$3 cp=$4 dst=$5 bind=${6:+ -B $6} W cli srv
	W=$(w "$sh")
	on "$sh" "nohup ${sp}iperf -s -y C -P 1 </dev/null >$W/tcp.out 2>&1 & echo \$! >$W/tcp.pid"
	for _ in $(seq 20); do
		cli=$(on "$ch" "${cp}iperf -y C -c $dst$bind -n $BYTES" 2>&1)
		grep -q "^[0-9]*,.*,.*,.*,.*,.*,.*,.*,.*$" <<<"$cli" && break
		sleep 0.25
	done
	srv=$(on "$sh" "i=0; while kill -0 \$(cat $W/tcp.pid) 2>/dev/null && [ \$i -lt 75 ]; do sleep 0.2; i=\$((i+1)); done
kill \$(cat $W/tcp.pid) 2>/dev/null; rm -f $W/tcp.pid; cat $W/tcp.out")
	echo "$(awk -F, 'NF == 9 { print $8; exit }' <<<"$cli" | grep . || echo none)" \
		"$(awk -F, 'NF == 9 { print $8; exit }' <<<"$srv" | grep . || echo none)" \
		"$(awk -F, 'NF == 9 { print $9; exit }' <<<"$srv" | grep . || echo 0)"
}

# mcast_check FAMILY BACKEND P: iperf 2 receivers in both guests of host
# B join a group, guest 1 of host A sends for 2 s at 1 Mbit/s; each
# receiver must report every datagram sent (the last one iperf counts is
# its end-of-stream marker, which receivers do not count) and none lost.
mcast_check() {
	local fam=$1 b=$2 p=$3 name=${4:-mcast$1} grp v="" W g s out sent r lost total ok=0 bad=""
	W=$(w B)
	if [ "$fam" = 4 ]; then grp=239.77.77.$p; else grp=ff15::77:$p v=" -V"; fi
	s=""
	for g in 1 2; do
		s+="nohup $(in_g B "$p" $g)iperf -s -u -B $grp -i 1$v </dev/null >$W/mc$g.out 2>&1 & echo \$! >$W/mc$g.pid
"
	done
	on B "$s"
	sleep "$SETTLE"
	out=$(on A "$(in_g A "$p" 1)iperf -c $grp -u -T 4 -t 2 -b 1M$v" 2>&1)
	sent=$(sed -n 's/.*Sent \([0-9]*\) datagrams.*/\1/p' <<<"$out" | head -n1)
	sent=$((${sent:-1} - 1))
	for g in 1 2; do
		for _ in $(seq 30); do # the receiver's last report comes after the stream ends
			r=$(on B "cat $W/mc$g.out")
			read -r lost total <<<"$(grep -Eo '[0-9]+/ *[0-9]+ +\(' <<<"$r" | tr -d ' (' | awk -F/ '$2 >= t { l = $1; t = $2 } END { print l + 0, t + 0 }')"
			[ "$total" -ge "$sent" ] && break
			sleep 0.1
		done
		on B "kill \$(cat $W/mc$g.pid) 2>/dev/null; rm -f $W/mc$g.pid"
		if [ "$sent" -gt 0 ] && [ "$lost" = 0 ] && [ "$total" = "$sent" ]; then
			ok=$((ok + 1))
		else
			bad+=" B$g $((total - lost))/$sent"
		fi
	done
	verdict "$name" "$b" "$p" "$ok" 2 "A1 > B1,B2 $grp: $sent/$sent datagrams each" "received:$bad (of $sent)"
}

# sm_check BACKEND: make the SM ask host A's port to re-register
# (CLIENT_REREGISTER: the port's SA registrations, multicast joins
# included, must be made again), then time how long until guest A1 pings
# guest B1 again, and check that then COUNT pings and IPv4 multicast pass.
sm_check() {
	local b=$1 t0 t1 out dst rec how="ibportstate reset"
	dst=$(ip4 1 B 1)
	[ "$SM_MODE" = restart ] && how="--sm-restart"
	t0=$(date +%s.%N)
	if [ "$SM_MODE" = restart ]; then
		out=$(on A "$SM_RESTART" 2>&1)
	else
		out=$(on A "$(port_script A); ibportstate -C \$hca -P \$port -D 0 \$port reset" 2>&1)
	fi || { record sm-reregister "$b" 0xffff FAIL "trigger failed: $(tail -n1 <<<"$out")"; return; }
	until on A "$(in_g A 1 1)ping -n -c 1 -W 1 $dst" >/dev/null 2>&1; do
		if [ "$(awk -v a="$t0" -v b="$(date +%s.%N)" -v m="$SM_TIMEOUT" 'BEGIN { print (b - a > m) }')" = 1 ]; then
			record sm-reregister "$b" 0xffff FAIL "no ping A1>B1 within $SM_TIMEOUT s"
			return
		fi
	done
	t1=$(date +%s.%N)
	rec=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	out=$(on A "$(in_g A 1 1)ping -n -c $COUNT -i 0.2 -W 2 $dst" 2>&1)
	if grep -q " $COUNT received" <<<"$out"; then
		record sm-reregister "$b" 0xffff PASS "ping A1>B1 back after $rec s, then $COUNT/$COUNT ($how)"
		mcast_check 4 "$b" 1 "mcast4 after SM"
	else
		record sm-reregister "$b" 0xffff FAIL "first reply after $rec s, then $(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<<"$out")/$COUNT ($how)"
	fi
}

# ------------------------------------------------------------ routed leg

# The routed leg: a native IPoIB router and an address off the fabric's
# subnets. Host B is guest A1's gateway (its native address in partition
# 0xffff) to a second subnet, NET4.201.0/24 and NET6:201::/64, where X
# (.9, ::9) is an address of host B's own stack on a veth pair (ehtx and
# its peer ehtxp): no forwarding sysctl changes on an operator's host,
# and what X sends leaves B's IPoIB interface from B's QP with a source
# IP no ARP or NDP on the fabric names, as forwarded traffic does. The
# kernel backend never learns a packet's sender (af_packet.c packet_rcv:
# IPoIB has no header_ops->parse), and a Linux IPoIB host sends unicast
# inside a subnet without a GRH (sa_query.c ib_init_ah_attr_from_path),
# so eipoibd on host A must deliver X's packets all the same: ping and
# ping -6 from A1 to X, TCP with exact byte counts both ways. The last
# figure is eipoibd's rx_unknown_source on host A: X's packets delivered
# under the partition's stand-in MAC, as the kernel backend must; with
# verbs, packets whose sender it named by source LID are not in it.
RSUB=201
xaddr() { if [ "$1" = 4 ]; then echo "$NET4.$RSUB.$2"; else echo "$NET6:$RSUB::$2"; fi; } # xaddr FAMILY LAST

# routed_up: X on host B, and guest A1's routes to X through host B.
routed_up() {
	on B "ip link add ehtx type veth peer name ehtxp && ip link set ehtxp up && ip link set ehtx up || exit 1
ip addr add $(xaddr 4 9)/24 dev ehtx && ip addr add $(xaddr 6 9)/64 dev ehtx nodad" &&
		on A "$(in_g A 1 1)ip route add $NET4.$RSUB.0/24 via $(ip4 1 B 0) && $(in_g A 1 1)ip -6 route add $NET6:$RSUB::/64 via $(ip6 1 B 0)"
}

# routed_check BACKEND: the routed leg's rows, each figure with its RTT
# or rate, and with the kernel backend each transfer's fast path row; the
# topology's teardown removes X (topo_down_script).
routed_check() {
	local b=$1 fam out tx rx rtt sent rcvd bps bin=$EIPOIBD unk g
	[ "$b" = verbs ] && bin=$EIPOIBD_VERBS
	if ! out=$(routed_up 2>&1); then
		record "routed" "$b" 0xffff FAIL "set-up failed: $out"
		return
	fi
	perf_leg routed 0xffff
	for fam in 4 6; do
		out=$(on A "$(in_g A 1 1)ping -$fam -n -c $COUNT -i 0.2 -W 2 $(xaddr $fam 9)" 2>&1)
		tx=$(sed -n 's/^\([0-9]*\) packets transmitted.*/\1/p' <<<"$out")
		rx=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<<"$out")
		rtt=$(sed -n 's|^rtt [^=]*= [0-9.]*/\([0-9.]*\)/.*|\1|p' <<<"$out" | awk '{ printf "%.3f", $1 }')
		if [ "${tx:-0}" = "$COUNT" ] && [ "${rx:-0}" = "$COUNT" ] && ! grep -q duplicates <<<"$out"; then
			perf routed 0xffff "ping$fam A1>X" "$rtt" ms
			record "routed ping$fam A1>X" "$b" 0xffff PASS "$rx/$COUNT, X $(xaddr $fam 9) via nB, rtt avg $rtt ms"
		else
			record "routed ping$fam A1>X" "$b" 0xffff FAIL "${rx:-0}/$COUNT replies from $(xaddr $fam 9) via nB"
		fi
	done
	fp_before 1 A "" 1 "$(xaddr 4 9)"
	read -r sent rcvd bps <<<"$(iperf_bytes B "" A "$(in_g A 1 1)" "$(xaddr 4 9)")"
	if [ "$sent" = "$BYTES" ] && [ "$rcvd" = "$BYTES" ]; then
		g=$(gbps "$bps")
		perf routed 0xffff "tcp A1>X" "$g" Gbit/s
		record "routed tcp A1>X" "$b" 0xffff PASS "$BYTES B sent = received, $g Gbit/s"
	else
		record "routed tcp A1>X" "$b" 0xffff FAIL "sent $sent, received $rcvd, want $BYTES"
	fi
	fp_after "fastpath A1>X" "$b" 1 A "" 1
	fp_before 1 "" A 1 ""
	read -r sent rcvd bps <<<"$(iperf_bytes A "$(in_g A 1 1)" B "" "$(ip4 1 A 1)" "$(xaddr 4 9)")"
	unk=$(on A "$bin show stats --ctl-dir $(w A)/ctl --name eht0" 2>/dev/null | awk '$1 == "rx_unknown_source" { print $2 }')
	if [ "$sent" = "$BYTES" ] && [ "$rcvd" = "$BYTES" ]; then
		g=$(gbps "$bps")
		perf routed 0xffff "tcp X>A1" "$g" Gbit/s
		record "routed tcp X>A1" "$b" 0xffff PASS "$BYTES B sent = received, $g Gbit/s; eipoibd A rx_unknown_source ${unk:-?}"
	else
		record "routed tcp X>A1" "$b" 0xffff FAIL "sent $sent, received $rcvd, want $BYTES; eipoibd A rx_unknown_source ${unk:-?}"
	fi
	fp_after "fastpath X>A1" "$b" 1 "" A 1
}

# ------------------------------------------------- kernel backend legs

# long_name_check: host A's --dev renamed to --long-name (up to 15
# bytes: the kernel backend names its children after a hash of a parent
# name too long to prefix them, net/core/dev.c dev_valid_name), eipoibd's
# kernel backend on both hosts, then ping A1>B1; the figure lists host
# A's children. Renamed back after (a rename needs the link down).
long_name_check() {
	local W out kids old=$DEV ok=1 h
	W=$(w A)
	if ! out=$(on A "ip link set $DEV down && ip link set $DEV name $LONG_NAME && echo '$DEV $LONG_NAME' >$W/renamed && ip link set $LONG_NAME up || exit 1
i=0; until [ \$(cat /sys/class/net/$LONG_NAME/operstate) = up ]; do [ \$i -lt 150 ] || exit 1; sleep 0.2; i=\$((i+1)); done" 2>&1); then
		record long-name kernel 0xffff FAIL "renaming A's $DEV to $LONG_NAME: $out"
		on A "$(kernel_legs_cleanup "$W"); rm -f $W/renamed" >/dev/null 2>&1
		return
	fi
	DEV=$LONG_NAME
	for h in A B; do
		if ! out=$(guests_up "$h" 2>&1) || ! out=$(daemon_up "$h" kernel 2>&1); then
			record long-name kernel 0xffff FAIL "host $h: eipoibd (kernel) on $(dev_of "$h") did not start: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
			ok=0
			break
		fi
	done
	if [ "$ok" = 1 ]; then
		out=$(on A "$(in_g A 1 1)ping -4 -n -c $COUNT -i 0.2 -W 2 $(ip4 1 B 1)" 2>&1)
		kids=$(on A "ip -br link | awk '\$1 ~ /@$LONG_NAME\$/ { sub(/@.*/, \"\", \$1); print \$1 }' | sort | tr '\n' ' '")
		if grep -q " $COUNT received" <<<"$out" && [ -n "$kids" ]; then
			record long-name kernel 0xffff PASS "A's dev $LONG_NAME (${#LONG_NAME} B), children ${kids% }; ping A1>B1 $COUNT/$COUNT"
		else
			record long-name kernel 0xffff FAIL "children '${kids% }', ping A1>B1 $(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<<"$out")/$COUNT"
		fi
	fi
	for h in A B; do
		daemon_down "$h" kernel
		on "$h" "$(topo_down_script "$h")" >/dev/null 2>&1
	done
	DEV=$old
	on A "$(kernel_legs_cleanup "$W"); rm -f $W/renamed" >/dev/null 2>&1
}

# children_mem_check: MemAvailable on host A before and after --children
# N IPoIB children of --dev (ip link add ... type ipoib pkey 0xffff,
# over netlink as the kernel backend makes them) are up with carrier
# (their broadcast join made; on mlx5 each has opened its own channels
# by then, mlx5i_pkey_open); the children are deleted after.
children_mem_check() {
	local W out made up before after
	W=$(w A)
	out=$(on A "mem() { awk '/^MemAvailable:/ { print \$2 }' /proc/meminfo; }
before=\$(mem) made=0
i=1; while [ \$i -le $CHILDREN ]; do
	ip link add link $DEV name ehtc\$i type ipoib pkey 0xffff || break
	echo ehtc\$i >>$W/mchildren
	ip link set ehtc\$i up || break
	made=\$i i=\$((i+1))
done
up() { cat /sys/class/net/ehtc*/carrier 2>/dev/null | grep -c 1; }
t=0; until [ \$(up) -ge \$made ] || [ \$t -ge 300 ]; do sleep 0.2; t=\$((t+1)); done
echo \"made \$made carrier \$(up) before \$before after \$(mem)\"
$(kernel_legs_cleanup "$W"); rm -f $W/mchildren" 2>&1)
	read -r made up before after <<<"$(sed -n 's/^made \([0-9]*\) carrier \([0-9]*\) before \([0-9]*\) after \([0-9]*\)$/\1 \2 \3 \4/p' <<<"$out")"
	if [ "${made:-0}" = "$CHILDREN" ] && [ "${up:-0}" = "$CHILDREN" ]; then
		record child-mem kernel 0xffff PASS "$CHILDREN children: MemAvailable $((before / 1024)) > $((after / 1024)) MiB, $(((before - after) / CHILDREN)) KiB each"
	else
		record child-mem kernel 0xffff FAIL "${made:-0} of $CHILDREN children made, ${up:-0} with carrier: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
	fi
}

# kernel_legs: the two legs above, each "not run" with its reason
# without InfiniBand, the kernel backend or its option.
kernel_legs() {
	local why=""
	if [ "$FABRIC" = sim ]; then
		why="(--fabric sim: no InfiniBand here)"
	elif [ "$FABRIC" = emuib ]; then
		why="(--fabric emuib: its parent is a veth, no IPoIB driver)"
	elif [[ ,$BACKENDS, != *,kernel,* ]]; then
		why="(--backends $BACKENDS)"
	elif [ "$setup_ok" != 1 ]; then
		why="(set-up failed, above)"
	fi
	if [ -n "$why" ]; then
		record long-name kernel 0xffff "not run" "$why"
		record child-mem kernel 0xffff "not run" "$why"
		return
	fi
	echo
	echo "kernel backend legs:"
	if [ -n "$LONG_NAME" ]; then long_name_check; else record long-name kernel 0xffff "not run" "(--long-name NAME not given)"; fi
	if [ -n "$CHILDREN" ]; then children_mem_check; else record child-mem kernel 0xffff "not run" "(--children N not given)"; fi
}

# ------------------------------------------------------------------ main

prereqs
if [ "$missing" -gt 0 ]; then
	echo "prerequisites: $missing missing (above); nothing was set up"
	exit 2
fi

trap cleanup EXIT
trap 'exit 130' INT TERM

echo
setup_ok=1
if [ -n "$NO_NATIVE" ]; then
	echo "setting up: bridges and guests on both hosts (EMULATED IPoIB wire: no native addresses)"
else
	echo "setting up: native addresses, bridges and guests on both hosts"
	for h in A B; do
		if ! out=$(native_up "$h" 2>&1); then
			echo "host $h: native IPoIB address: $out"
			setup_ok=0
		fi
	done
fi

# Each backend's round; the kernel backend's once per --fast-path
# setting, its rows' backend kernel/SETTING (L).
for b in ${BACKENDS//,/ }; do
	fps=(n/a)
	[ "$b" = kernel ] && fps=("${FP_SETTINGS[@]}")
	for CUR_FP in "${fps[@]}"; do
		CUR_B=$b L=$b
		[ "$CUR_FP" != n/a ] && L=$b/$CUR_FP
		echo
		echo "backend $L:"
		ok=$setup_ok why="set-up failed (above)"
		for h in A B; do
			[ "$ok" = 1 ] || break
			if ! out=$(guests_up "$h" 2>&1) || ! out=$(daemon_up "$h" "$b" "$CUR_FP" 2>&1); then
				echo "host $h: eipoibd ($L) did not start: $out"
				ok=0
				# --fast-path on where the kernel cannot run it
				# (internal/daemon/fabric.go useFastPath, startFastPath)
				r=$(grep -o -m1 -e '--fast-path on: .*' <<<"$out" | head -n1)
				[ -n "$r" ] && why="host $h: eipoibd refused ${r:0:160}"
			fi
		done
		FP_WHY=""
		[ "$ok" = 1 ] && FP_WHY=$(fp_off_why "$b")
		[ -n "$FP_WHY" ] && echo "fast path: SKIP under auto, $FP_WHY"
		for pk in "${PKEYS[@]}"; do
			p=$(pidx "$pk")
			if [ "$ok" != 1 ]; then
				record "all checks" "$L" "$pk" FAIL "$why"
				continue
			fi
			perf_leg checks "$pk"
			ping_check 4 "$L" "$p"
			ping_check 6 "$L" "$p"
			arp_check "$L" "$p"
			nd_check "$L" "$p"
			tcp_check "$L" "$p" A B
			tcp_check "$L" "$p" B A
			mcast_check 4 "$L" "$p"
			mcast_check 6 "$L" "$p"
			[ -n "$NO_NATIVE" ] && record "native pairs" "$L" "$pk" "not run" "$NO_NATIVE"
		done
		if [ -n "$NO_NATIVE" ]; then
			record routed "$L" 0xffff "not run" "$NO_NATIVE"
		elif [ "$ok" = 1 ]; then
			routed_check "$L"
		fi
		if [ "$SM_MODE" = none ]; then
			record sm-reregister "$L" 0xffff "not run" "(--no-sm)"
		elif [ "$ok" = 1 ]; then
			sm_check "$L"
		fi
		for h in A B; do
			daemon_down "$h" "$b" "$CUR_FP"
			on "$h" "$(topo_down_script "$h")" >/dev/null 2>&1
		done
	done
done
CUR_FP=n/a # the kernel legs below are no round

kernel_legs

for b in kernel verbs; do
	[[ ,$BACKENDS, == *,$b,* ]] && continue
	if [ "$FABRIC" != ib ]; then
		record "all checks" "$b" all "not run" "(--fabric $FABRIC: no InfiniBand here)"
	else
		record "all checks" "$b" all "not run" "(--backends $BACKENDS)"
	fi
done
if [ "$PARTITIONS" = 1 ]; then
	record "all checks" all "$PKEY2" "not run" "(--partitions 1)"
fi

# The verbs port: the device and port each host's eipoibd-verbs opened,
# from its "verbs port open" log line (--ib-dev HCA:PORT).
verbs_ports=""
if [[ ,$BACKENDS, == *,verbs,* ]]; then
	for h in A B; do
		vp=$(on "$h" "sed -n -e 's/.*msg=\"verbs port open\".* device=\([^ ]*\) port=\([0-9]*\).*/\1 (port \2)/p' \
			-e 's/.*\"msg\":\"verbs port open\".*\"device\":\"\([^\"]*\)\",\"port\":\([0-9]*\).*/\1 (port \2)/p' $(w "$h")/eipoibd-verbs.log | head -n1" 2>/dev/null)
		verbs_ports+=" $h ${vp:-did not open}"
	done
fi

echo
echo "eipoibd hardware kit: fabric $FABRIC, switch $SWITCH, $COUNT requests per pair, logs in $WORK/{A,B}.prev on each host"
[ -n "$verbs_ports" ] && echo "verbs port:$verbs_ports"
[ "$FABRIC" = emuib ] && echo "EMULATED IPoIB wire (package emuib): a self-test of the kit, no result for InfiniBand hardware"
perf_block
printf '%-18s %-10s %-9s %-8s %s\n' check backend partition result figure
for r in "${RESULTS[@]}"; do
	IFS='|' read -r c b pk st fig <<<"$r"
	printf '%-18s %-10s %-9s %-8s %s\n' "$c" "$b" "$pk" "$st" "$fig"
done
echo "summary: $passed passed, $failed failed, $notrun not run"
[ "$failed" -eq 0 ]
