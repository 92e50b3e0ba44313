#!/bin/bash
# Runs in the VM (from init, as /tmp/work/agent.sh in the host's root;
# the test copies it into its work directory). It loads the RDMA and
# networking modules from the unpacked kernel package (init mounts it on
# /run/kernel, and its modules on /lib/modules), brings lo up and eth0
# up with MTU 9000, adds the soft-RoCE device rxe0 on eth0 and waits until
# its port is active with eth0's link-local address as GID 0. Then it
# writes /tmp/work/ready (the guest's uptime) or, if any of that failed,
# /tmp/work/failed (the reason, one line) and exits. A guest booted with
# ipv6.disable=1 (no /proc/sys/net/ipv6) has no link-local address for
# rxe0's GID: it gets eth0 up and no rxe0.
#
# Once ready it runs each /tmp/work/cmd/N.sh that appears (the test
# writes it under another name and renames it), in the background, in a
# session of its own, with stdin /dev/null and output to N.out; it
# renames N.sh to N.run, writes N.pid (the session: kill -- -PID stops the
# whole command) and, when the command ends, N.rc (its exit status). It
# stops when /tmp/work/stop appears, and init then powers the VM off.
set -u
w=/tmp/work
log() {
  local up _
  read -r up _ </proc/uptime
  echo "agent: [$up] $*" >/dev/console
}
fail() {
  log "$*"
  echo "$*" >$w/failed.tmp && mv $w/failed.tmp $w/failed
  exit 1
}
# sleep without a fork (a fork costs much under TCG): wait for input that
# never comes on a FIFO only this shell holds open.
mkfifo /run/agent.nap || fail "cannot make /run/agent.nap"
exec 8<>/run/agent.nap
nap() { read -r -t "$1" -u 8 || true; }

# The kernel package, unpacked: init mounts it on /run/kernel.
kernel=/run/kernel
rel=$(uname -r)
[ -e "$kernel/lib/modules/$rel/modules.dep" ] || fail "no $kernel/lib/modules/$rel/modules.dep"
# crc32_generic first: rdma_rxe needs the crc32 algorithm.
for m in crc32_generic ib_uverbs rdma_rxe tun bridge veth; do
  out=$(modprobe -d "$kernel" "$m" 2>&1) || fail "modprobe $m: $out"
done
log "modules loaded"
ip link set lo up || fail "ip link set lo up failed"
out=$(ip link set eth0 mtu 9000 up 2>&1) || fail "eth0 (MTU 9000): $out"
if [ ! -d /proc/sys/net/ipv6 ]; then
  read -r up _ </proc/uptime
  echo "$up" >$w/ready.tmp && mv $w/ready.tmp $w/ready
  log "ready: eth0 up, no IPv6 (ipv6.disable=1), no rxe0"
else
  out=$(rdma link add rxe0 type rxe netdev eth0 2>&1) ||
    fail "rdma link add rxe0 type rxe netdev eth0: $out; kernel: $(dmesg | grep -i rxe | tail -n 3 | tr '\n' ' ')"
  log "rxe0 added"
  port=/sys/class/infiniband/rxe0/ports/1
  ll=
  for _ in $(seq 200); do
    ll=$(ip -6 -o addr show dev eth0 scope link | awk '{print $4; exit}')
    if [ -n "$ll" ] && grep -q ACTIVE $port/state 2>/dev/null &&
      grep -qi '^fe80:' $port/gids/0 2>/dev/null; then
      break
    fi
    nap 0.05
  done
  [ -n "$ll" ] || fail "eth0 has no link-local address"
  grep -q ACTIVE $port/state || fail "rxe0 port 1 is not active: $(cat $port/state)"
  grep -qi '^fe80:' $port/gids/0 || fail "rxe0 GID 0 is not eth0's link-local address: $(cat $port/gids/0)"
  read -r up _ </proc/uptime
  echo "$up" >$w/ready.tmp && mv $w/ready.tmp $w/ready
  log "ready: eth0 $ll, rxe0 active"
fi

mkdir -p $w/cmd
while [ ! -e $w/stop ]; do
  for f in "$w"/cmd/*.sh; do
    [ -e "$f" ] || continue
    n=${f%.sh}
    mv "$f" "$n.run" || continue
    (
      cd $w || exit
      setsid bash "$n.run" </dev/null >"$n.out" 2>&1 &
      echo $! >"$n.pid.tmp" && mv "$n.pid.tmp" "$n.pid"
      wait $!
      echo $? >"$n.rc.tmp" && mv "$n.rc.tmp" "$n.rc"
    ) &
  done
  nap 0.05
done
log "stopping"
