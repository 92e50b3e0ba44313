#!/usr/bin/env bash
# The soak: eipoibd run for DURATION (default 3m; `make soak DURATION=30m`)
# through what a hypervisor lives through in months, all at once, and a
# report of what leaked or was lost. Run as root on Debian. Not a timed
# test: every bound it asserts is generous and stated in docs/testing.md.
#
#              ul: underlay bridge (MTU 9000), the simulated fabric
#        ┌───────────────┬──────────────────┬─────────────┐
#   hv1: eipoibd     hv2: eipoibd       nh: eipoibd host (ib0)
#   + its keeper     + its keeper       10.77.0.200, fd77::200
#   br0: a1 (.11)    br0: b1 (.21)
#        m  (.50, migrates hv1 ⇄ hv2)   s (.2: dnsmasq)
#        d  (DHCP client, leases 2 min)
#
# Fixed, for the whole run:
#   - pings every 100 ms: a1→b1 (IPv4, IPv6), a1→nh (IPv4), b1→nh (IPv6),
#     a1→m (IPv4), b1→m (IPv6);
#   - two TCP flows of random data at ~640 KB/s, a1→b1 and b1→nh, whose
#     byte counts and SHA-256 digests are compared at both ends;
#   - d's DHCP lease (dnsmasq on s, 2 min: renewed every minute); its
#     address is set with the lease's lifetime, so a lapse shows.
# Churn, for DURATION:
#   - bridge guests: a namespace on br0 that pings b1 or a1 across the
#     fabric once (a learned VIF), then goes (its port goes: VIF freed);
#   - CNI: a pod through the reference bridge plugin and the eipoib plugin
#     chained (ADD declares its VIF, DEL frees it), pinging across once;
#   - declared VIFs: SOAK_VIFS MACs declared with `eipoibd vif add`, then
#     freed with `vif del`, a batch a round;
#   - multicast: a1 and b1 join 4 IPv4 and 4 IPv6 groups (autojoin
#     addresses: IGMP and MLD reports) and leave the previous round's;
#   - events, one every SOAK_EVENT_EVERY seconds, in turn: a restart
#     (SIGTERM) under the keeper, a kill -9 and start, a fault burst (a
#     restart with --fault loss, dup and reorder for SOAK_FAULT_BURST
#     seconds, then a restart without); on hv1 and hv2 alternately;
#   - a SIGHUP reload (vif-idle changed in the config) between events;
#   - m migrates to the other hypervisor every SOAK_MIGRATE_EVERY seconds
#     (its port moved as test/netns/migrate_test.go moves it), and home
#     when the churn stops.
# Every SOAK_SAMPLE seconds (default 60, or DURATION/12 if shorter) per
# daemon: open fds, goroutines, RSS, Go heap, VIF, neighbour, group,
# send-only group and snooped-membership (per-guest source) table sizes,
# pending resolutions, and every drop counter by reason.
# At the end it asserts (each a line of the report, PASS or FAIL):
#   - both flows: the bytes sent were received, digests equal;
#   - fds, goroutines, VIFs, groups, snooped memberships and pending
#     resolutions back at their baseline once the churn stops (waited
#     for, SOAK_SETTLE seconds at most: 180, the daemons' vif-idle of
#     90 s and more); neighbours at most the baseline plus the endpoints
#     churned in the last neighbour TTL (600 s: they age out, there is no
#     flag);
#   - RSS below SOAK_RSS_MB (default 80) MiB, every sample;
#   - no drop reason grew but the injected faults' and the documented
#     ones (docs/testing.md: what restarts, migrations and churn cause);
#   - each restart kept the TAP (tap_start=kept) and each ping's outage
#     across it was at most SOAK_RESTART_BOUND (2 s, docs/persist.md);
#     each migration's at most SOAK_MIGRATE_BOUND (5 s, the README's
#     silent guest); no fixed ping lost a reply outside an event;
#   - the DHCP lease never lapsed and was renewed;
#   - every churn operation and every SIGHUP reload succeeded.
# Results in soak/results/<UTC timestamp>/: report.md (the table),
# plot.png (RSS, fds and goroutines over time, gnuplot), samples.tsv,
# events.tsv, raw/ (daemon logs, ping output, flows). With
# EIPOIB_REQUIRE_NETNS=1 (make test) a missing tool or root is a failure,
# otherwise a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

dur() { # 30m, 90s, 2h or seconds → seconds
  case $1 in
  *h) echo $((${1%h} * 3600)) ;; *m) echo $((${1%m} * 60)) ;; *s) echo "${1%s}" ;; *) echo "$1" ;;
  esac
}
DURATION=$(dur "${1:-${DURATION:-3m}}")
VIF_IDLE=90 # the daemons' vif-idle (see their config below)
SOAK_SETTLE=${SOAK_SETTLE:-$((VIF_IDLE + 90))}
SOAK_SAMPLE=${SOAK_SAMPLE:-$((DURATION / 12 < 60 ? DURATION / 12 : 60))}
SOAK_EVENT_EVERY=${SOAK_EVENT_EVERY:-$((DURATION / 30 > 20 ? DURATION / 30 : 20))}
SOAK_FAULT_BURST=${SOAK_FAULT_BURST:-15}
SOAK_FAULT=${SOAK_FAULT:-loss=0.02,dup=0.02,reorder=0.02}
SOAK_MIGRATE_EVERY=${SOAK_MIGRATE_EVERY:-60}
SOAK_VIFS=${SOAK_VIFS:-20}
SOAK_RSS_MB=${SOAK_RSS_MB:-80}
SOAK_RESTART_BOUND=${SOAK_RESTART_BOUND:-2}
SOAK_MIGRATE_BOUND=${SOAK_MIGRATE_BOUND:-5}
NEIGH_TTL=600 # shim.Config.NeighTTL's default; no flag sets it
[ "$DURATION" -ge 120 ] || { echo "soak: DURATION=$DURATION s: want at least 2m" >&2; exit 2; }
CHURN=$DURATION

# --- can it run here --------------------------------------------------------------
cannot() {
  if [ "${EIPOIB_REQUIRE_NETNS:-}" = 1 ]; then
    echo "soak: FAIL: $* (EIPOIB_REQUIRE_NETNS=1)" >&2
    exit 1
  fi
  echo "soak: SKIP: $*" >&2
  exit 0
}
[ "$(id -u)" -eq 0 ] || cannot "not root (network namespaces)"
for c in ip bridge ping curl socat jq gnuplot dnsmasq dhclient sha256sum flock bc; do
  command -v "$c" >/dev/null 2>&1 || cannot "$c missing (scripts/deps.sh installs it)"
done
for p in bridge host-local; do [ -x "/usr/lib/cni/$p" ] || cannot "/usr/lib/cni/$p missing (containernetworking-plugins)"; done
go build -o bin/eipoibd ./cmd/eipoibd
go build -o bin/eipoib ./cmd/eipoib-cni
BIN=$PWD/bin/eipoibd
CNI_PATH=/usr/lib/cni:$PWD/bin

OUT=$PWD/soak/results/$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/raw
RUN=$RAW/run # sockets, state, locks, pids
mkdir -p "$RUN" "$RAW/cni"
{
  echo "date:     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit:   $(git rev-parse HEAD 2>/dev/null || echo unknown) ($(git describe --always --dirty 2>/dev/null || echo '?'))"
  echo "nproc:    $(nproc); kernel $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg) at the start"
  echo "settings: DURATION=$DURATION SOAK_SAMPLE=$SOAK_SAMPLE SOAK_SETTLE=$SOAK_SETTLE SOAK_EVENT_EVERY=$SOAK_EVENT_EVERY" \
    "SOAK_FAULT_BURST=$SOAK_FAULT_BURST SOAK_FAULT=$SOAK_FAULT SOAK_MIGRATE_EVERY=$SOAK_MIGRATE_EVERY SOAK_VIFS=$SOAK_VIFS" \
    "SOAK_RSS_MB=$SOAK_RSS_MB SOAK_RESTART_BOUND=$SOAK_RESTART_BOUND SOAK_MIGRATE_BOUND=$SOAK_MIGRATE_BOUND"
} >"$OUT/machine.txt"

# --- processes and namespaces, removed on any exit ---------------------------------
P=sk$$
# shellcheck source=scripts/lib-netns.sh
. scripts/lib-netns.sh # NS, nsadd, ns_remove, on_exit
x() { ip netns exec "$@"; }
BG=() # background loops and processes outside the namespaces
cleanup() {
  local rc=$? pid
  set +e
  trap - INT TERM
  for pid in "${BG[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for h in 1 2; do [ -s "$RUN/keeper$h.pid" ] && kill -TERM "$(cat "$RUN/keeper$h.pid")" 2>/dev/null; done
  # Everything else runs inside our namespaces: ns_remove kills it
  # (churned guests' namespaces too), then reaps it all.
  mapfile -t NS < <(ip netns list | awk -v p="$P-" 'index($1, p) == 1 {print $1}')
  ns_remove 2>/dev/null # not bash's "Killed" line for each
  [ "$rc" -eq 0 ] || echo "soak: stopped (exit $rc); what there is in $OUT" >&2
  exit "$rc"
}
on_exit cleanup
now() { date +%s.%N | cut -c1-14; }
T0=$(now)
event() { event_at "$(now)" "$@"; }                                                          # kind where detail
event_at() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$OUT/events.tsv"; } # time kind where detail
errors() { printf '%s\t%s\n' "$(now)" "$*" >>"$RAW/errors.tsv"; }
: >"$OUT/events.tsv"
: >"$RAW/errors.tsv"

# --- the topology --------------------------------------------------------------------
echo "== soak: topology (2 hypervisors, a native host, 5 guests) in $OUT"
nsadd "$P-ul"
ip -n "$P-ul" link add ubr mtu 9000 type bridge
ip -n "$P-ul" link set ubr up
for h in hv1 hv2 nh; do
  nsadd "$P-$h"
  ip link add ul netns "$P-$h" type veth peer name "p$h" netns "$P-ul"
  ip -n "$P-ul" link set "p$h" mtu 9000 master ubr up
  ip -n "$P-$h" link set ul mtu 9000 up
done
for h in 1 2; do
  ip -n "$P-hv$h" link add br0 type bridge
  ip -n "$P-hv$h" link set br0 up
  # Devices made from now on in the hypervisor (eipoibd's TAP, the
  # guests' bridge ports) have no IPv6: the TAP's own start-up traffic
  # (DAD, MLD reports, router solicitations from eib0's stack) would give
  # its MAC a learned VIF that no query refreshes (a bridge port's stack
  # never hears them), aging out only after vif-idle, so that the VIF
  # count would fall below the baseline at the end. br0 keeps its IPv6.
  ip netns exec "$P-hv$h" sysctl -q -w net.ipv6.conf.default.disable_ipv6=1
done
# guest NAME HV IFNAME-ON-HV [ADDRESSES...]: a namespace whose eth0
# (MTU 4092) is on hv's br0.
guest() {
  local g=$1 h=$2 port=$3 a
  shift 3
  nsadd "$P-$g"
  ip link add eth0 netns "$P-$g" mtu 4092 type veth peer name "$port" netns "$P-$h" mtu 4092
  ip -n "$P-$h" link set "$port" master br0 up
  ip -n "$P-$g" link set eth0 up
  for a in "$@"; do
    # shellcheck disable=SC2046 # nodad for IPv6 only
    ip -n "$P-$g" addr add "$a" dev eth0 $([[ $a == *:* ]] && echo nodad)
  done
}
guest a1 hv1 va1 10.77.0.11/24 fd77::11/64
guest m hv1 vm 10.77.0.50/24 fd77::50/64
guest d hv1 vd
guest b1 hv2 vb1 10.77.0.21/24 fd77::21/64
guest s hv2 vs 10.77.0.2/24
# m keeps its caches across a move, as a live-migrated guest does
# (migrate_test.go says why).
x "$P-m" sysctl -q -w net.ipv4.conf.eth0.arp_evict_nocarrier=0 net.ipv6.conf.eth0.ndisc_evict_nocarrier=0

# --- the daemons ---------------------------------------------------------------------
# hvN's config: the keys SIGHUP reloads (vif-idle toggles between
# VIF_IDLE and VIF_IDLE + 10 s); the rest on the command line. The query
# interval is short so that groups are reported again soon after a
# restart. vif-idle is short so that the VIFs a learned guest leaves
# behind age out in the settle time (below): d, the quietest fixed guest,
# sends every minute (its renewals), br0 at every query.
for h in 1 2; do
  printf 'vif-idle = "%ds"\nmcast-query-interval = "20s"\nmcast-response-interval = "5s"\n' "$VIF_IDLE" >"$RUN/hv$h.toml"
  mkdir -p "$RUN/hv$h"
done
NSTART=(0 0 0)
# start_daemon H [--fault SPEC]: a new eipoibd on hvH (its log
# raw/hvH-N.log), waited for until it runs. It must not inherit the
# descriptors of the locks (below) its caller holds: it would hold them.
start_daemon() {
  local h=$1 n log
  shift
  n=$((NSTART[h] += 1))
  log=$RAW/hv$h-$n.log
  # A subshell starts it, so that it is no job of ours: killed, it is
  # reaped by init without a "Killed" line from bash.
  (
    ip netns exec "$P-hv$h" "$BIN" run --underlay ul --bridge br0 --persist --fd-store "$RUN/keeper$h.sock" \
      --config "$RUN/hv$h.toml" --metrics 127.0.0.1:9474 --ctl-dir "$RUN/hv$h" --state-dir "$RUN/hv$h" "$@" >"$log" 2>&1 8>&- 9>&- &
    echo $! >"$RUN/hv$h.pid"
  )
  echo "$log" >"$RUN/hv$h.log"
  for _ in $(seq 300); do grep -qs "shim running" "$log" && return 0; sleep 0.1; done
  cat "$log" >&2
  echo "soak: eipoibd on hv$h did not start" >&2
  return 1
}
for h in 1 2; do
  "$BIN" keeper --socket "$RUN/keeper$h.sock" >"$RAW/keeper$h.log" 2>&1 &
  echo $! >"$RUN/keeper$h.pid"
  BG+=("$!")
done
for h in 1 2; do for _ in $(seq 50); do [ -S "$RUN/keeper$h.sock" ] && break; sleep 0.1; done; done
for h in 1 2; do start_daemon "$h"; done
ip netns exec "$P-nh" "$BIN" host --underlay ul >"$RAW/nh.log" 2>&1 &
for _ in $(seq 100); do grep -q "host running" "$RAW/nh.log" && break; sleep 0.1; done
grep -q "host running" "$RAW/nh.log" || { cat "$RAW/nh.log" >&2; exit 1; }
ip -n "$P-nh" addr add 10.77.0.200/24 dev ib0
ip -n "$P-nh" addr add fd77::200/64 dev ib0 nodad

# reachable NS DST: a reply within 30 s (pings once a second).
reachable() { x "$1" ping -q -c 1 -w 30 "$2" >/dev/null 2>&1; }
for pair in a1:10.77.0.21 a1:fd77::21 a1:10.77.0.200 b1:fd77::200 a1:10.77.0.50 b1:fd77::50 b1:10.77.0.2; do
  reachable "$P-${pair%%:*}" "${pair#*:}" || { echo "soak: ${pair%%:*} cannot reach ${pair#*:}" >&2; exit 1; }
done
echo "== soak: all fixed guests reach each other; starting pings, flows and DHCP"

# --- fixed traffic: pings, flows, DHCP ---------------------------------------------------
# PINGS: name, from, to. Every reply is stamped (-D); a lost one is a
# sequence number missing between two stamped replies.
PINGS=(a1-b1-v4:a1:10.77.0.21 a1-b1-v6:a1:fd77::21 a1-nh-v4:a1:10.77.0.200 b1-nh-v6:b1:fd77::200
  a1-m-v4:a1:10.77.0.50 b1-m-v6:b1:fd77::50)
PING_PIDS=()
for p in "${PINGS[@]}"; do
  IFS=: read -r name from to <<<"$p"
  ip netns exec "$P-$from" ping -D -O -n -i 0.1 "$to" >"$RAW/ping-$name.txt" 2>&1 &
  PING_PIDS+=("$!")
done
# FLOWS: name, sender, receiver namespace, address, port. Random data,
# 64 KiB every 100 ms, until the stop file appears; each end counts the
# bytes and digests them.
FLOWS=(a1-b1:a1:b1:10.77.0.21:5001 b1-nh:b1:nh:10.77.0.200:5002)
for f in "${FLOWS[@]}"; do
  IFS=: read -r name from to addr port <<<"$f"
  F=$RAW/flow-$name
  ip netns exec "$P-$to" bash -c "socat -u TCP-LISTEN:$port,reuseaddr STDOUT 2>$F.recv.err | tee >(wc -c >$F.rbytes) | sha256sum >$F.rsha" &
  for _ in $(seq 50); do x "$P-$to" ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
  ip netns exec "$P-$from" bash -c "while [ ! -e $F.stop ]; do head -c 65536 /dev/urandom; sleep 0.1; done |
    tee >(wc -c >$F.sbytes) >(sha256sum >$F.ssha) | socat -u STDIN TCP:$addr:$port 2>$F.send.err; echo \${PIPESTATUS[*]} >$F.status" &
done
ip netns exec "$P-s" dnsmasq --no-daemon --conf-file=/dev/null --port=0 --no-ping --interface=eth0 --bind-interfaces \
  --dhcp-range=10.77.0.100,10.77.0.150,2m --dhcp-leasefile="$RAW/dnsmasq.leases" >"$RAW/dnsmasq.log" 2>&1 &
# d's address carries the lease's lifetime: if a renewal fails, the
# kernel removes it when the lease ends.
cat >"$RUN/dhcp-script" <<'SCRIPT'
#!/bin/sh
case $reason in
BOUND | RENEW | REBIND | REBOOT)
  ip addr replace "$new_ip_address/24" dev "$interface" valid_lft "$new_dhcp_lease_time" preferred_lft "$new_dhcp_lease_time" ;;
EXPIRE | FAIL | RELEASE | STOP)
  [ -z "$old_ip_address" ] || ip addr del "$old_ip_address/24" dev "$interface" ;;
esac
echo "$(date +%s) $reason ${new_ip_address:-} ${new_dhcp_lease_time:-}" >>"${0%/*}/../dhcp-events.txt"
SCRIPT
chmod +x "$RUN/dhcp-script"
: >"$RUN/dhclient.leases"
ip netns exec "$P-d" dhclient -d -v -lf "$RUN/dhclient.leases" -pf "$RUN/dhclient.pid" -sf "$RUN/dhcp-script" eth0 >"$RAW/dhclient.log" 2>&1 &
for _ in $(seq 300); do grep -q BOUND "$RAW/dhcp-events.txt" 2>/dev/null && break; sleep 0.1; done
grep -q BOUND "$RAW/dhcp-events.txt" 2>/dev/null || { cat "$RAW/dhclient.log" >&2; echo "soak: no DHCP lease" >&2; exit 1; }

# --- sampling ------------------------------------------------------------------------------
# sample H LABEL: one line of samples.tsv for hvH's daemon and its drop
# counters in drops.tsv, taken while no restart runs (hvH's lock).
metric() { awk -v m="$1" '$1 == m {print $2; exit}' "$2"; }
sample() {
  local h=$1 label=$2 pid inst fds rss t m
  {
    flock 9
    pid=$(cat "$RUN/hv$h.pid")
    inst=$(basename "$(cat "$RUN/hv$h.log")" .log)
    m=$RUN/metrics$h.$BASHPID
    t=$(now)
    if ! x "$P-hv$h" curl -sf -m 10 http://127.0.0.1:9474/metrics >"$m"; then
      errors "sample hv$h: metrics unreachable"
      return 0
    fi
    fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 | wc -l)
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
    printf '%.1f\t%s\thv%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(echo "$t - $T0" | bc)" "$label" "$h" "$inst" "$fds" \
      "$(metric go_goroutines "$m")" "$rss" "$(metric go_memstats_heap_alloc_bytes "$m")" "$(metric eipoibd_vifs "$m")" \
      "$(metric eipoibd_neighbours "$m")" "$(metric eipoibd_groups "$m")" "$(metric eipoibd_groups_send_only "$m")" \
      "$(metric eipoibd_snooped_groups "$m")" "$(metric eipoibd_pending "$m")" >>"$OUT/samples.tsv"
    awk -v h="hv$h" -v i="$inst" -v t="$t" -v l="$label" '
      /^eipoibd_(port_)?drops_total\{/ && $2 != 0 {
        kind = ($1 ~ /^eipoibd_port_/) ? "port_" : ""
        match($1, /reason="[^"]*"/); r = substr($1, RSTART + 8, RLENGTH - 9)
        print t "\t" h "\t" i "\t" kind r "\t" $2 "\t" l
      }' "$m" >>"$RAW/drops.tsv"
    rm -f "$m"
  } 9>"$RUN/hv$h.lock"
}
printf 'time\tlabel\thv\tinstance\tfds\tgoroutines\trss_kb\theap\tvifs\tneighbours\tgroups\tgroups_send_only\tsnooped\tpending\n' >"$OUT/samples.tsv"
: >"$RAW/drops.tsv"
# The baseline: once what the guests joined or sent to at start-up and
# no longer want has expired (the membership interval: 2 queries of 20 s
# and a response time of 5 s), so that groups and send-only groups hold
# only what the guests answer queries for.
sleep 60
for h in 1 2; do
  sample "$h" baseline
  "$BIN" show groups --ctl-dir "$RUN/hv$h" >"$RAW/groups-hv$h-baseline.txt" 2>&1
done
event baseline - -
echo "== soak: baseline taken; churn for $CHURN s, then up to $SOAK_SETTLE s to settle"
STOP=$RUN/stop
(
  set +e
  while [ ! -e "$STOP.sampler" ]; do
    sleep "$SOAK_SAMPLE"
    for h in 1 2; do sample "$h" run; done
  done
) &
SAMPLER=$!

# --- churn -----------------------------------------------------------------------------------
# locked H CMD...: CMD while no restart runs on hvH.
locked() { local h=$1; shift; { flock 9; "$@"; } 9>"$RUN/hv$h.lock"; }
churn() { printf '%s\t%s\t%s\t%s\t%s\n' "$(now)" "$1" "$2" "$3" "$4" >>"$RAW/churn.tsv"; } # kind hv detail ok|FAIL
: >"$RAW/churn.tsv"
# peer H: the fixed guest on the other hypervisor, the one hvH's churned
# guests ping across the fabric.
peer() { [ "$1" = 1 ] && echo 10.77.0.21 || echo 10.77.0.11; }
bridge_guest() { # H N
  local h=$1 n=$2 ns=$P-c$2 r=FAIL
  if nsadd "$ns" && ip link add eth0 netns "$ns" mtu 4092 type veth peer name "vc$n" netns "$P-hv$h" mtu 4092 &&
    ip -n "$P-hv$h" link set "vc$n" master br0 up && ip -n "$ns" link set eth0 up &&
    ip -n "$ns" addr add "10.77.0.$((60 + n % 40))/24" dev eth0 &&
    x "$ns" ping -q -c 1 -w 20 "$(peer "$h")" >/dev/null; then
    r=ok
  fi
  ip netns delete "$ns"
  churn bridge "hv$h" "$ns" "$r"
}
cni() { # H COMMAND CONFIG NS: the plugin CONFIG names, as a runtime runs it
  local plugin
  plugin=$(jq -r .type <<<"$3")
  [ "$plugin" = eipoib ] && plugin=$PWD/bin/eipoib || plugin=/usr/lib/cni/$plugin
  ip netns exec "$P-hv$1" env CNI_COMMAND="$2" CNI_CONTAINERID="$4" CNI_NETNS="/run/netns/$4" CNI_IFNAME=eth0 \
    CNI_PATH="$CNI_PATH" "$plugin" <<<"$3"
}
cni_pod() { # H N
  local h=$1 n=$2 ns=$P-p$2 r=ok br res ch
  nsadd "$ns" || r=FAIL
  br=$(jq -nc --arg d "$RAW/cni/hv$h" --arg lo "10.77.0.$((140 + 20 * h))" --arg hi "10.77.0.$((159 + 20 * h))" \
    '{cniVersion:"1.0.0",name:"soak",type:"bridge",bridge:"br0",mtu:4092,
      ipam:{type:"host-local",dataDir:$d,ranges:[[{subnet:"10.77.0.0/24",rangeStart:$lo,rangeEnd:$hi}]]}}')
  if res=$(cni "$h" ADD "$br" "$ns" 2>>"$RAW/cni/errors"); then
    ch=$(jq -c --arg s "$RUN/hv$h" --argjson prev "$res" -n \
      '{cniVersion:"1.0.0",name:"soak",type:"eipoib",tap:"eib0",socketDir:$s,stateDir:$s,prevResult:$prev}')
    cni "$h" ADD "$ch" "$ns" >>"$RAW/cni/out" 2>>"$RAW/cni/errors" || r=FAIL
    x "$ns" ping -q -c 1 -w 20 "$(peer "$h")" >/dev/null 2>&1 || r=FAIL
    cni "$h" DEL "$ch" "$ns" >>"$RAW/cni/out" 2>>"$RAW/cni/errors" || r=FAIL
    cni "$h" DEL "$br" "$ns" >>"$RAW/cni/out" 2>>"$RAW/cni/errors" || r=FAIL
  else
    r=FAIL
  fi
  ip netns delete "$ns"
  churn cni "hv$h" "$ns" "$r"
}
vifs() { # H N add|del
  local h=$1 n=$2 i r=ok
  for i in $(seq "$SOAK_VIFS"); do
    "$BIN" vif "$3" "$(printf '02:5a:%02x:%02x:%02x:%02x' "$h" $((n / 256 % 256)) $((n % 256)) "$i")" \
      --name eib0 --ctl-dir "$RUN/hv$h" >>"$RAW/vif.out" 2>&1 || r=FAIL
  done
  churn "vif-$3" "hv$h" "$SOAK_VIFS" "$r"
}
groups() { # NS ROUND add|del
  local r=$(($2 % 200)) i rc=ok
  for i in 1 2 3 4; do
    ip -n "$1" addr "$3" "239.77.$r.$i/32" dev eth0 autojoin 2>>"$RAW/errors.tsv" || rc=FAIL
    ip -n "$1" -6 addr "$3" "ff05::77:$r:$i/128" dev eth0 autojoin 2>>"$RAW/errors.tsv" || rc=FAIL
  done
  churn "groups-$3" "${1#"$P"-}" "$2" "$rc"
}
(
  set +e
  n=0
  while [ ! -e "$STOP" ]; do
    n=$((n + 1))
    h=$((1 + n % 2))
    locked "$h" bridge_guest "$h" "$n"
    locked "$h" cni_pod "$h" "$n"
    locked "$h" vifs "$h" "$n" add
    for g in a1 b1; do
      groups "$P-$g" "$n" add
      [ "$n" -eq 1 ] || groups "$P-$g" $((n - 1)) del
    done
    locked "$h" vifs "$h" "$n" del
    sleep 1
  done
  for g in a1 b1; do groups "$P-$g" "$n" del; done
) &
CHURNER=$!

# --- events: restarts, kill -9, fault bursts, reloads, migrations ---------------------------------
alive() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo gone); [ "$s" != Z ] && [ "$s" != gone ]; }
gone() { for _ in $(seq 300); do alive "$1" || return 0; sleep 0.1; done; return 1; }
restart() { # H SIGNAL [--fault SPEC]: the restart's own time is in events.tsv
  local h=$1 sig=$2 pid t log
  shift 2
  pid=$(cat "$RUN/hv$h.pid")
  t=$(now)
  kill "-$sig" "$pid"
  gone "$pid" || { errors "hv$h: eipoibd $pid did not stop on $sig"; kill -KILL "$pid"; gone "$pid"; }
  start_daemon "$h" "$@" || { errors "hv$h: eipoibd did not start again"; return 1; }
  log=$(cat "$RUN/hv$h.log")
  grep -q "tap_start=kept" "$log" || errors "hv$h: $(basename "$log") did not keep the TAP: $(grep -o 'tap_start=[a-z]*' "$log")"
  event "restart-$sig" "hv$h" "$(basename "$log") $(echo "$(now) - $t" | bc)"
}
reload() { # H
  local h=$1 log before
  log=$(cat "$RUN/hv$h.log")
  before=$(grep -c "config reloaded" "$log" || true)
  if grep -q "\"${VIF_IDLE}s\"" "$RUN/hv$h.toml"; then
    sed -i "s/\"${VIF_IDLE}s\"/\"$((VIF_IDLE + 10))s\"/" "$RUN/hv$h.toml"
  else
    sed -i "s/\"$((VIF_IDLE + 10))s\"/\"${VIF_IDLE}s\"/" "$RUN/hv$h.toml"
  fi
  kill -HUP "$(cat "$RUN/hv$h.pid")"
  for _ in $(seq 100); do [ "$(grep -c "config reloaded" "$log" || true)" -gt "$before" ] && break; sleep 0.1; done
  if [ "$(grep -c "config reloaded" "$log" || true)" -gt "$before" ]; then event reload "hv$h" ok; else event reload "hv$h" FAIL; errors "hv$h: SIGHUP not reloaded"; fi
}
echo 1 >"$RUN/m.where"
migrate() {
  local f t
  f=$(cat "$RUN/m.where")
  t=$((3 - f))
  { flock 8; {
    flock 9
    local t0
    t0=$(now) # the move starts here: under load the ip calls below take a while
    ip -n "$P-hv$f" link set vm down
    ip -n "$P-hv$f" link set vm netns "$P-hv$t"
    ip -n "$P-hv$t" link set vm master br0 up
    echo "$t" >"$RUN/m.where"
    event_at "$t0" migrate "hv$f-hv$t"
  } 9>"$RUN/hv2.lock"; } 8>"$RUN/hv1.lock"
}
# One cycle: an event; a quarter of SOAK_EVENT_EVERY later, m's migration
# when it is due; another quarter later, a reload; half of it later, the
# next cycle. A migration is thus never closer than a quarter cycle (5 s)
# to a restart: a restart of the destination's daemon within a second of
# the move makes it forget what it learned of the moved guest before it
# told its guests (docs/testing.md, "What it found"), and the run would
# fail on that coincidence rather than on what it measures.
(
  set +e
  k=0
  moved=$(now)
  quarter=$(echo "$SOAK_EVENT_EVERY / 4" | bc -l)
  while [ ! -e "$STOP" ]; do
    h=$((1 + k % 2))
    case $((k % 3)) in
    0) locked "$h" restart "$h" TERM ;;
    1) locked "$h" restart "$h" KILL ;;
    2)
      locked "$h" restart "$h" TERM --fault "$SOAK_FAULT"
      event fault-start "hv$h" "$SOAK_FAULT"
      sleep "$SOAK_FAULT_BURST"
      event fault-end "hv$h"
      locked "$h" restart "$h" TERM
      ;;
    esac
    sleep "$quarter"
    if [ ! -e "$STOP" ] && [ "$(echo "$(now) - $moved >= $SOAK_MIGRATE_EVERY" | bc)" = 1 ]; then
      migrate
      moved=$(now)
    fi
    sleep "$quarter"
    [ -e "$STOP" ] || locked "$h" reload "$h"
    sleep "$(echo "$quarter * 2" | bc)"
    k=$((k + 1))
  done
) &
EVENTS=$!
BG+=("$SAMPLER" "$CHURNER" "$EVENTS")

# --- settle and check ----------------------------------------------------------------------------------
sleep "$CHURN"
touch "$STOP"
echo "== soak: churn stopping"
wait "$CHURNER" "$EVENTS" || true
[ "$(cat "$RUN/m.where")" = 1 ] || migrate
event churn-stopped - -
STOPPED=$(now)
# Levels back at the baseline (the last two columns of a sample line
# after fds: the ones compared; neighbours apart).
level() { # H: fds goroutines vifs groups groups_send_only snooped pending, now
  sample "$1" settle
  awk -F'\t' -v h="hv$1" '$2 == "settle" && $3 == h {l = $5 " " $6 " " $9 " " $11 " " $12 " " $13 " " $14} END {print l}' "$OUT/samples.tsv"
}
baseline_of() { awk -F'\t' -v h="hv$1" '$2 == "baseline" && $3 == h {print $5, $6, $9, $11, $12, $13, $14}' "$OUT/samples.tsv"; }
# at_baseline WANT GOT: every level equal, but goroutines and send-only
# groups at most the baseline's. Goroutines: the baseline sample can
# catch one that serves a moment's work (a resolution, a join); a leak
# shows as more. Send-only groups follow what the guests sent to in the
# last membership interval (a router solicitation after a move, a
# report), not a state; a leak would show as more.
at_baseline() { awk -v w="$1" -v g="$2" 'BEGIN {
  n = split(w, a, " "); split(g, b, " ")
  for (i = 1; i <= n; i++) if (i == 2 || i == 5 ? b[i] > a[i] : b[i] != a[i]) exit 1
  exit b[1] == "" }'; }
settled=()
deadline=$((SECONDS + SOAK_SETTLE))
for h in 1 2; do
  want=$(baseline_of "$h")
  while :; do
    settled[h]=$(level "$h")
    at_baseline "$want" "${settled[h]}" || [ "$SECONDS" -ge "$deadline" ] && break
    sleep 5
  done
done
# What the groups were, for a report that shows them apart.
for h in 1 2; do "$BIN" show groups --ctl-dir "$RUN/hv$h" >"$RAW/groups-hv$h-end.txt" 2>&1; done
SETTLED=$(now)
touch "$STOP.sampler"
# The flows end: the senders stop, each end's count and digest is written.
for f in "${FLOWS[@]}"; do touch "$RAW/flow-${f%%:*}.stop"; done
for f in "${FLOWS[@]}"; do
  F=$RAW/flow-${f%%:*}
  for _ in $(seq 600); do [ -s "$F.rsha" ] && [ -s "$F.ssha" ] && [ -s "$F.rbytes" ] && [ -s "$F.sbytes" ] && break; sleep 0.1; done
done
for pid in "${PING_PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
for pid in "${PING_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
wait "$SAMPLER" 2>/dev/null || true
END=$(now)
event end - -

# --- the checks ------------------------------------------------------------------------------------------
# Each check records its result; none stops the script.
set +e
# Drop reasons allowed to grow (docs/testing.md says why each one does):
# the injected faults, and what restarts, migrations and churn cause.
ALLOWED=" port_fault_loss port_unknown_qpn unresolved dst_local "
RESULTS=() # "PASS|FAIL<tab>check<tab>detail"
check() { # ok? check detail
  if [ "$1" = 0 ]; then RESULTS+=("PASS	$2	$3"); else RESULTS+=("FAIL	$2	$3"); fi
}
# Flows.
for f in "${FLOWS[@]}"; do
  name=${f%%:*}
  F=$RAW/flow-$name
  sb=$(cat "$F.sbytes" 2>/dev/null || echo ?) rb=$(cat "$F.rbytes" 2>/dev/null || echo ?)
  ss=$(cut -c1-16 "$F.ssha" 2>/dev/null || echo ?) rs=$(cut -c1-16 "$F.rsha" 2>/dev/null || echo ?)
  st=$(cat "$F.status" 2>/dev/null || echo ?)
  [ "$sb" = "$rb" ] && [ "$ss" = "$rs" ] && [ "$st" = "0 0 0" ] && [ "$sb" != "?" ]
  check $? "flow $name: every byte, digest equal" "sent $sb B, received $rb B; sha256 $ss… / $rs…; sender exits $st"
done
# Pings: the runs of lost replies (raw/ping-runs.tsv: name, from, to,
# lost), each from its first lost request to the reply after it. A lost
# request's time is when ping -O reported it unanswered, as it sent the
# next one, less the interval: not the reply before, which comes early
# when ping itself is kept off the CPU.
: >"$RAW/ping-runs.tsv"
for p in "${PINGS[@]}"; do
  name=${p%%:*}
  awk -v n="$name" -v end="$END" '
    /packets transmitted/ { sent = $1 }
    /no answer yet for icmp_seq=/ {
      match($0, /icmp_seq=[0-9]+/); s = substr($0, RSTART + 9, RLENGTH - 9) + 0
      if (!(s in na)) na[s] = sprintf("%.6f", substr($1, 2, length($1) - 2) - 0.1)
      next
    }
    /icmp_seq=/ && !/DUP!/ {
      t = substr($1, 2, length($1) - 2)
      match($0, /icmp_seq=[0-9]+/); s = substr($0, RSTART + 9, RLENGTH - 9) + 0
      if (s > last) { if (s > last + 1) print n "\t" (last + 1 in na ? na[last + 1] : lt == "" ? t : lt) "\t" t "\t" s - last - 1; last = s; lt = t }
    }
    END { if (sent > last) print n "\t" (last + 1 in na ? na[last + 1] : lt) "\t" end "\t" sent - last; print n "\t-\t-\t0\t" sent > "/dev/stderr" }
  ' "$RAW/ping-$name.txt" >>"$RAW/ping-runs.tsv" 2>>"$RAW/ping-sent.tsv"
done
# Windows: when an event may lose replies. A restart: from its signal
# to its bound after eipoibd runs again; a fault burst: its whole span;
# a migration: from the move to its bound (m's pings only).
awk -F'\t' -v rb="$SOAK_RESTART_BOUND" -v mb="$SOAK_MIGRATE_BOUND" '
  $2 ~ /^restart-/ { split($4, d, " "); printf "%s\t%s\t%.3f\t%.3f\t%s, running again %.2f s after the signal\n", $2, $3, $1 - d[2] - 0.5, $1 + rb + 1, d[1], d[2] }
  $2 == "fault-start" { fs[$3] = $1 }
  $2 == "fault-end" { printf "fault\t%s\t%.3f\t%.3f\t%s\n", $3, fs[$3], $1 + 1, "-" }
  $2 == "migrate" { printf "migrate\t%s\t%.3f\t%.3f\t-\n", $3, $1 - 0.5, $1 + mb + 1 }
' "$OUT/events.tsv" >"$RAW/windows.tsv"
# Each window's outage: the longest run of lost replies, of any ping it
# may touch, that starts in it (the last reply before the run came in
# it), in seconds (100 ms a reply).
awk -F'\t' '
  NR == FNR { rn[++r] = $1; rs[r] = $2; re[r] = $3; rl[r] = $4; next }
  {
    o = 0; who = "-"
    for (i = 1; i <= r; i++) {
      if (rs[i] == "-") continue
      if ($1 == "migrate" && rn[i] !~ /-m-/) continue
      if (rs[i] >= $3 && rs[i] <= $4 && rl[i] > o) { o = rl[i]; who = rn[i] }
    }
    printf "%s\t%s\t%.1f\t%s\t%s\t%s\n", $1, $2, o / 10, who, $3, $5
  }' "$RAW/ping-runs.tsv" "$RAW/windows.tsv" >"$RAW/outages.tsv"
worst() { awk -F'\t' -v k="$1" '$1 ~ k && $3 > m {m = $3; w = $2 " " $6 " (" $4 ")"} END {print m + 0, w}' "$RAW/outages.tsv"; }
count() { awk -F'\t' -v k="$1" '$1 ~ k' "$RAW/outages.tsv" | wc -l; }
read -r wr wrw < <(worst '^restart-')
awk -v w="$wr" -v b="$SOAK_RESTART_BOUND" 'BEGIN {exit !(w <= b)}'
check $? "restart outages <= ${SOAK_RESTART_BOUND}s" "$(count '^restart-') restarts ($(count '^restart-TERM') SIGTERM, $(count '^restart-KILL') kill -9); longest ping outage ${wr}s: $wrw"
read -r wm wmw < <(worst '^migrate')
awk -v w="$wm" -v b="$SOAK_MIGRATE_BOUND" 'BEGIN {exit !(w <= b)}'
check $? "migration outages <= ${SOAK_MIGRATE_BOUND}s" "$(count '^migrate') migrations; longest ping outage ${wm}s: $wmw"
kept=$(grep -c 'did not keep the TAP' "$RAW/errors.tsv" || true)
check "$kept" "every restart kept the TAP" "tap_start=kept in $(($(count '^restart-') - kept)) of $(count '^restart-') restarts"
# Lost replies outside every window: runs that start in none.
stray=$(awk -F'\t' '
  NR == FNR { k[++w] = $1; ws[w] = $3; we[w] = $4; next }
  $2 != "-" {
    ok = 0
    for (i = 1; i <= w; i++) if ((k[i] != "migrate" || $1 ~ /-m-/) && $2 >= ws[i] && $2 <= we[i]) ok = 1
    if (!ok) { n++; l = l sprintf(" %s:%d@%.1f", $1, $4, $2 - t0) }
  }
  END { print n + 0 l }' t0="$T0" "$RAW/windows.tsv" "$RAW/ping-runs.tsv")
lost=$(awk -F'\t' '$2 != "-" {n += $4} END {print n + 0}' "$RAW/ping-runs.tsv")
sent=$(awk -F'\t' '{n += $5} END {print n + 0}' "$RAW/ping-sent.tsv")
[ "${stray%% *}" = 0 ]
check $? "no ping reply lost outside an event" "$lost of $sent replies lost in all (${#PINGS[@]} pings at 100 ms); outside an event: ${stray}"
# Levels back at the baseline, neighbours within their bound.
for h in 1 2; do
  want=$(baseline_of "$h")
  at_baseline "$want" "${settled[h]}"
  check $? "hv$h: fds goroutines vifs groups send-only snooped pending back at baseline (goroutines, send-only: at most)" "baseline $want; after the churn ${settled[h]} ($(echo "$SETTLED - $STOPPED" | bc | cut -d. -f1) s after it stopped)"
  nb=$(awk -F'\t' -v h="hv$h" '$2 == "baseline" && $3 == h {print $10}' "$OUT/samples.tsv")
  nf=$(awk -F'\t' -v h="hv$h" '$2 == "settle" && $3 == h {n = $10} END {print n}' "$OUT/samples.tsv")
  other=hv$((3 - h))
  churned=$(awk -F'\t' -v o="$other" -v since="$(echo "$SETTLED - $NEIGH_TTL" | bc)" '($2 == "bridge" || $2 == "cni") && $3 == o && $1 >= since' "$RAW/churn.tsv" | wc -l)
  moves=$(awk -F'\t' -v since="$(echo "$SETTLED - $NEIGH_TTL" | bc)" '$2 == "migrate" && $1 >= since' "$OUT/events.tsv" | wc -l)
  [ -n "$nf" ] && [ "$nf" -le $((nb + churned + moves)) ]
  check $? "hv$h: neighbours within the baseline + endpoints of the last ${NEIGH_TTL}s" "$nf <= $nb + $churned guests churned on $other + $moves moves of m"
done
# RSS.
rss=$(awk -F'\t' 'NR > 1 && $7 > m {m = $7} END {printf "%.1f", m / 1024}' "$OUT/samples.tsv")
awk -v r="$rss" -v b="$SOAK_RSS_MB" 'BEGIN {exit !(r < b)}'
check $? "RSS < ${SOAK_RSS_MB} MiB" "largest RSS of any sample ${rss} MiB"
# Drops: each reason's growth, per daemon, over its instances (a new
# instance counts from zero; the baseline instance from the baseline).
awk -F'\t' '
  { k = $2 "\t" $4; if ($5 > m[k, $3]) m[k, $3] = $5; if ($6 == "baseline") b[k, $3] = $5; seen[k, $3] = 1; keys[k] = 1 }
  END { for (ki in seen) { split(ki, a, SUBSEP); g[a[1]] += m[ki] - b[ki] } for (k in keys) print k "\t" g[k] }
' "$RAW/drops.tsv" | sort >"$RAW/drops-grown.tsv"
unexpected=$(awk -F'\t' -v a="$ALLOWED" 'index(a, " " $2 " ") == 0 && $3 > 0 {printf " %s %s:%d", $1, $2, $3}' "$RAW/drops-grown.tsv")
[ -z "$unexpected" ]
check $? "no drop reason grew but the allowed ones" "grown: $(awk -F'\t' '{printf "%s %s:%d; ", $1, $2, $3}' "$RAW/drops-grown.tsv")unexpected:${unexpected:- none}"
# DHCP.
renewals=$(grep -cE ' (RENEW|REBIND) ' "$RAW/dhcp-events.txt" || true)
lapses=$(grep -cE ' (EXPIRE|FAIL|RELEASE|STOP) ' "$RAW/dhcp-events.txt" || true)
addr=$(ip -n "$P-d" -4 -o addr show dev eth0 | awk '{print $4}')
[ "$lapses" = 0 ] && [ -n "$addr" ] && [ "$renewals" -ge $((DURATION / 60 - 1)) ]
check $? "DHCP lease renewed, never lapsed" "$renewals renewals of a 2-minute lease, $lapses lapses; d holds ${addr:-nothing} at the end"
# Churn, reloads, errors.
chf=$(awk -F'\t' '$5 != "ok"' "$RAW/churn.tsv" | wc -l)
check "$chf" "every churn operation succeeded" "$(awk -F'\t' '{n[$2]++} END {for (k in n) printf "%s %d, ", k, n[k]}' "$RAW/churn.tsv")$chf failed; VIFs made and freed: $(awk -F'\t' -v v="$SOAK_VIFS" '$2 == "bridge" || $2 == "cni" {n++} $2 == "vif-add" {n += v} END {print n + 0}' "$RAW/churn.tsv")"
rl=$(awk -F'\t' '$2 == "reload"' "$OUT/events.tsv" | wc -l)
rf=$(awk -F'\t' '$2 == "reload" && $4 != "ok"' "$OUT/events.tsv" | wc -l)
check "$rf" "every SIGHUP reloaded" "$((rl - rf)) of $rl reloads logged 'config reloaded'"
other=$(grep -vc 'did not keep the TAP' "$RAW/errors.tsv" || true)
check "$other" "no other error" "$(grep -v 'did not keep the TAP' "$RAW/errors.tsv" | head -3 | tr '\n\t' '  ')"

# --- the report and the plot ---------------------------------------------------------------------------------
fail=0
{
  echo "# eipoibd soak, $(date -u -d "@${T0%.*}" '+%Y-%m-%d %H:%M UTC'), $((DURATION / 60)) min"
  echo
  sed 's/^/    /' "$OUT/machine.txt"
  echo
  echo "| result | check | detail |"
  echo "| --- | --- | --- |"
  for r in "${RESULTS[@]}"; do
    IFS=$'\t' read -r res what detail <<<"$r"
    [ "$res" = PASS ] || fail=1
    echo "| $res | $what | $detail |"
  done
  echo
  echo "Per daemon, each sample (RSS and heap in MiB):"
  echo
  echo "| s | hv | instance | fds | goroutines | RSS | heap | VIFs | neighbours | groups | send-only | snooped | pending |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  awk -F'\t' 'NR > 1 {printf "| %.0f%s | %s | %s | %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s |\n", $1, ($2 == "run" ? "" : " " $2), $3, $4, $5, $6, $7 / 1024, $8 / 1048576, $9, $10, $11, $12, $13, $14}' "$OUT/samples.tsv"
  echo
  echo "Lost replies of the fixed pings ($(IFS=' '; echo "${PINGS[*]%%:*}"), 10 a second each), per minute of the run:"
  echo
  echo "| minute | lost |"
  echo "| --- | --- |"
  awk -F'\t' -v t0="$T0" -v end="$END" '
    $2 != "-" { m = int(($2 - t0) / 60); lost[m] += $4 }
    END { for (m = 0; m <= int((end - t0) / 60); m++) printf "| %d | %d |\n", m, lost[m] }' "$RAW/ping-runs.tsv"
  echo
  echo "Restarts, fault bursts and migrations: the longest run of lost ping replies in each one's window:"
  echo
  echo "| s | event | where | outage | ping | detail |"
  echo "| --- | --- | --- | --- | --- | --- |"
  awk -F'\t' -v t0="$T0" '{printf "| %.0f | %s | %s | %.1f s | %s | %s |\n", $5 - t0, $1, $2, $3, $4, $6}' "$RAW/outages.tsv"
} >"$OUT/report.md"
for h in 1 2; do awk -F'\t' -v h="hv$h" '$3 == h {print $1 / 60, $7 / 1024, $5, $6}' "$OUT/samples.tsv" >"$RAW/plot-hv$h.dat"; done
gnuplot <<GNUPLOT
set terminal png size 1000,900
set output '$OUT/plot.png'
set multiplot layout 3,1 title "eipoibd soak: $((DURATION / 60)) min, 2 hypervisors (restarts every ${SOAK_EVENT_EVERY} s reset a daemon's figures)"
set xlabel "minutes"
set grid
set key top left
set ylabel "RSS (MiB)"
plot '$RAW/plot-hv1.dat' using 1:2 with linespoints title "hv1", '$RAW/plot-hv2.dat' using 1:2 with linespoints title "hv2"
set yrange [0:*]
set ylabel "open fds"
plot '$RAW/plot-hv1.dat' using 1:3 with linespoints title "hv1", '$RAW/plot-hv2.dat' using 1:3 with linespoints title "hv2"
set ylabel "goroutines"
plot '$RAW/plot-hv1.dat' using 1:4 with linespoints title "hv1", '$RAW/plot-hv2.dat' using 1:4 with linespoints title "hv2"
unset multiplot
GNUPLOT
echo
sed -n '/^| result/,/^$/p' "$OUT/report.md"
echo "soak: report in $OUT/report.md, plot $OUT/plot.png ($(echo "$(now) - $T0" | bc | cut -d. -f1) s)"
[ "$fail" = 0 ] && echo "soak: PASS" || echo "soak: FAIL"
exit "$fail"
