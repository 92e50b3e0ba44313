#!/usr/bin/env bash
# The scale benchmark: N hypervisors on one simulated fabric,
# every guest pinging every other guest once, all guests at once.
#
#   g1 ── br0 (h1) ── eipoibd ─┐
#   g2 ── br0 (h2) ── eipoibd ─┼── ubr: the underlay bridge (veths, MTU 9000)
#   …                          │
#   gN ── br0 (hN) ── eipoibd ─┘      guests 10.90.0.i/24, MTU 4092
#
# Each guest pings the N-1 others one after the other (ping -c 1 -W
# SCALE_WAIT), the N guests at the same time. The run is done twice:
# "cold", each ping's request also resolving the guest's ARP (as the
# issue measured), and "warm", after an arping warm-up of every pair (the
# guests' ARP caches and the daemons' neighbour tables then know every
# peer, so a ping waits for nothing but its echo): both are reported,
# never one in place of the other (SCALE_MODES chooses).
#
# Reports, on stdout and in bench/results/scale-<UTC>/ (result.md,
# result.tsv, pairs-<mode>.txt: every pair's fate, stats-*: each
# daemon's counters, logs/): pairs answered of N·(N−1), wall time, CPU
# seconds of each daemon (utime+stime over the ping phase), the daemons'
# drops by reason (eipoibd show stats: drop_*, port_drop_*, tap_drop_*,
# summed) and the port's refused sends by errno (port_tx_refused_*),
# broadcast packets each daemon received, peak RSS (VmHWM), and what the
# kernel dropped without telling a sender: neighbour table overflows
# (table_fulls of /proc/net/stat/arp_cache and ndisc_cache) and UDP
# sends whose ENOBUFS udp_v6_send_skb hid (Udp6SndbufErrors).
#
# The neighbour tables (ARP, ND) are the host's, shared by every
# namespace, and hold gc_thresh3 (1,024) entries in all: N guests
# resolving each other need N·(N−1) ARP entries, N underlays N·(N−1) ND
# entries, which N=48 already overflows (sends then fail: EINVAL for
# the daemons, ENOBUFS for ping). Real hypervisors have a table each, so
# by default (SCALE_NEIGH=sized) the run raises the host's gc_thresh2
# and gc_thresh3 to fit N and puts them back at the end;
# SCALE_NEIGH=kernel keeps the kernel's, to see that loss.
#
# Run as root on Debian; it installs what it is missing and removes every
# namespace and process it made, also on failure or Ctrl-C.
#
#   scripts/bench-scale.sh [N]   (default 32; also SCALE_N)
#
# Knobs (environment): SCALE_WAIT (ping's -W, seconds, default 5),
# SCALE_MODES ("cold warm", default both, in that order), SCALE_NEIGH
# (sized or kernel, default sized).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-${SCALE_N:-32}}
SCALE_WAIT=${SCALE_WAIT:-5}
SCALE_MODES=${SCALE_MODES:-cold warm}
SCALE_NEIGH=${SCALE_NEIGH:-sized}
if ! [[ $N =~ ^[0-9]+$ ]] || [ "$N" -lt 2 ] || [ "$N" -gt 250 ]; then
  echo "bench-scale: N must be 2 to 250, not $N" >&2
  exit 2
fi
case $SCALE_NEIGH in sized | kernel) ;; *) echo "bench-scale: SCALE_NEIGH is sized or kernel, not $SCALE_NEIGH" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "bench-scale: run as root (network namespaces)" >&2; exit 1; }

./scripts/deps.sh # ip, ping, arping, among the tests' tools
go build -o bin/eipoibd ./cmd/eipoibd
BIN=$PWD/bin/eipoibd
# shellcheck source=scripts/lib-netns.sh
. scripts/lib-netns.sh

OUT=bench/results/scale-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/logs"
P=es$$
CTL=/run/eipoibd/$P
DPIDS=() # the daemons, by hypervisor (index i-1)
declare -A SYSCTL=() SYSCTL_SET=() # what the run changed: the value before, the value set

# cleanup stops the daemons (SIGTERM, then SIGKILL with whatever else
# still runs in our namespaces: pingers), removes the namespaces and puts
# back the sysctls the run changed.
cleanup() {
  local rc=$? pid k
  set +e
  trap - INT TERM
  for pid in "${DPIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    for pid in "${DPIDS[@]}"; do kill -0 "$pid" 2>/dev/null && break; done
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  ns_remove
  rm -rf "$CTL"
  for k in "${!SYSCTL[@]}"; do
    # Put back what we changed, unless someone changed it since.
    [ "$(sysctl -n "$k")" = "${SYSCTL_SET[$k]}" ] && sysctl -qw "$k=${SYSCTL[$k]}"
  done
  [ "$rc" -eq 0 ] || echo "bench-scale: stopped (exit $rc); partial results in $OUT" >&2
  exit "$rc"
}
on_exit cleanup

# raise sets sysctl $1 to $2 if it is lower, to be put back on exit.
raise() {
  local old
  old=$(sysctl -n "$1")
  [ "$old" -lt "$2" ] || return 0
  SYSCTL[$1]=$old SYSCTL_SET[$1]=$2
  sysctl -qw "$1=$2"
}
if [ "$SCALE_NEIGH" = sized ]; then
  # N·(N−1) resolved peers a table, twice over for the guests' and
  # underlays' multicast entries and whatever else the host runs.
  need=$((2 * N * N + 1024))
  for v in 4 6; do
    raise "net.ipv$v.neigh.default.gc_thresh2" "$need"
    raise "net.ipv$v.neigh.default.gc_thresh3" "$((2 * need))"
  done
fi

echo "== topology: $N hypervisors on one underlay bridge, one guest each"
nsadd "$P-ul"
ip -n "$P-ul" link add ubr mtu 9000 type bridge
ip -n "$P-ul" link set ubr up
for i in $(seq "$N"); do
  nsadd "$P-h$i"
  nsadd "$P-g$i"
  ip link add ul netns "$P-h$i" mtu 9000 type veth peer name "p$i" netns "$P-ul" mtu 9000
  ip -n "$P-ul" link set "p$i" master ubr up
  ip -n "$P-h$i" link set ul up
  hypervisor_guest "$P-h$i" "$P-g$i" "10.90.0.$i/24"
done

echo "== starting $N daemons"
mkdir -p "$CTL"
for i in $(seq "$N"); do
  ip netns exec "$P-h$i" "$BIN" run --underlay ul --bridge br0 --ctl-dir "$CTL/h$i" >"$OUT/logs/eipoibd-h$i.log" 2>&1 &
  DPIDS+=("$!")
done
for i in $(seq "$N"); do
  for _ in $(seq 300); do grep -q "shim running" "$OUT/logs/eipoibd-h$i.log" && break; sleep 0.1; done
  grep -q "shim running" "$OUT/logs/eipoibd-h$i.log" || { cat "$OUT/logs/eipoibd-h$i.log" >&2; echo "bench-scale: eipoibd h$i did not start" >&2; exit 1; }
done

# cpu prints each daemon's utime+stime in clock ticks, one a line.
cpu() {
  local pid
  for pid in "${DPIDS[@]}"; do sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}'; done
}
# stats writes each daemon's counters (eipoibd show stats: "name value"
# lines) to $OUT/stats-$1-h<i>.txt, and the kernel's silent drops to
# $OUT/stats-$1-kernel.txt.
stats() {
  local i f
  for i in $(seq "$N"); do
    ip netns exec "$P-h$i" "$BIN" show stats --ctl-dir "$CTL/h$i" >"$OUT/stats-$1-h$i.txt"
  done
  {
    # table_fulls, the 13th column, per CPU in hex.
    for f in arp_cache ndisc_cache; do
      echo "kernel_${f}_table_fulls $(awk 'NR > 1 {print $13}' "/proc/net/stat/$f" | while read -r h; do echo $((16#$h)); done | awk '{s += $1} END {print s + 0}')"
    done
    echo "kernel_udp6_sndbuf_errors $(for i in $(seq "$N"); do ip netns exec "$P-h$i" awk '$1 == "Udp6SndbufErrors" {print $2}' /proc/net/snmp6; done | awk '{s += $1} END {print s + 0}')"
  } >"$OUT/stats-$1-kernel.txt"
}
# pingall runs one pinger per guest, all at once: the guest's N-1 pings
# (or, with arping, its N-1 ARP requests), one after the other, each
# line "src dst ok|lost" into $2.
pingall() {
  local how=$1 out=$2 i
  local pids=()
  for i in $(seq "$N"); do
    ip netns exec "$P-g$i" bash -c '
      src=$1 n=$2 wait=$3 how=$4
      for d in $(seq "$n"); do
        [ "$d" = "$src" ] && continue
        if [ "$how" = arping ]; then
          arping -q -c 1 -w "$wait" -i eth0 "10.90.0.$d" >/dev/null 2>&1 && r=ok || r=lost
        else
          ping -n -q -c 1 -W "$wait" "10.90.0.$d" >/dev/null 2>&1 && r=ok || r=lost
        fi
        echo "$src $d $r"
      done' pinger "$i" "$N" "$SCALE_WAIT" "$how" >"$out.$i" &
    pids+=("$!")
  done
  wait "${pids[@]}" || true
  cat "$out".* >"$out"
  rm -f "$out".*
}

TSV=$OUT/result.tsv
printf 'mode\tN\tpairs\tanswered\twall_s\tcpu_s_all\tcpu_s_min\tcpu_s_median\tcpu_s_max\trss_mib_max\tbroadcast_rx_per_daemon\trx_packets_per_daemon\tdrops\trefused\tkernel_silent_drops\n' >"$TSV"
HZ=$(getconf CLK_TCK)
for mode in $SCALE_MODES; do
  for i in $(seq "$N"); do ip -n "$P-g$i" neigh flush dev eth0; done
  for i in $(seq "$N"); do ip netns exec "$P-h$i" "$BIN" neigh flush --ctl-dir "$CTL/h$i" >/dev/null; done
  if [ "$mode" = warm ]; then
    echo "== $mode: arping warm-up, every guest to every other"
    pingall arping "$OUT/arping-$mode.txt"
    echo "   $(grep -c ' ok$' "$OUT/arping-$mode.txt") of $((N * (N - 1))) ARP requests answered"
  fi
  stats "$mode-before"
  mapfile -t c0 < <(cpu)
  echo "== $mode: every guest pings every other once, all guests at once"
  t0=$(date +%s.%N)
  pingall ping "$OUT/pairs-$mode.txt"
  t1=$(date +%s.%N)
  mapfile -t c1 < <(cpu)
  stats "$mode-after"
  ok=$(grep -c ' ok$' "$OUT/pairs-$mode.txt" || true)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
  cpus=()
  for k in "${!c1[@]}"; do cpus+=("$((c1[k] - c0[k]))"); done
  cpuline=$(printf '%s\n' "${cpus[@]}" | sort -n | awk -v hz="$HZ" '{v[NR] = $1 / hz; s += v[NR]} END {printf "%.2f\t%.2f\t%.2f\t%.2f", s, v[1], v[int((NR + 1) / 2)], v[NR]}')
  rss=$(for pid in "${DPIDS[@]}"; do awk '/^VmHWM/ {print $2}' "/proc/$pid/status"; done | sort -n | tail -1 | awk '{printf "%.1f", $1 / 1024}')
  # Counters over the ping phase: after minus before, summed over the
  # daemons. Every broadcast one daemon sends, each other one receives
  # and translates: each daemon received the sum of tx_broadcast but its
  # own, (N-1)/N of the sum on average.
  rises=$(awk 'FNR == 1 {after = FILENAME ~ /-after-/}
      after {d[$1] += $2; next} {d[$1] -= $2}
      END {for (k in d) if (d[k] != 0) print k, d[k]}' "$OUT"/stats-"$mode"-{before,after}-*.txt | sort)
  sum() { awk -v re="$1" '$1 ~ re {s += $2} END {print s + 0}' <<<"$rises"; }
  list() { awk -v re="$1" '$1 ~ re {printf "%s%s=%d", sep, $1, $2; sep = ","} END {if (!sep) printf "none"}' <<<"$rises"; }
  drops=$(list '^(port_|tap_)?drop_')
  refused=$(list '^port_tx_refused_')
  kernel=$(list '^kernel_')
  bcast=$(($(sum '^tx_broadcast$') * (N - 1) / N))
  rxpk=$(($(sum '^rx_packets$') / N))
  printf '%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$N" $((N * (N - 1))) "$ok" "$wall" "$cpuline" "$rss" "$bcast" "$rxpk" "$drops" "$refused" "$kernel" >>"$TSV"
  echo "   $ok of $((N * (N - 1))) pairs answered in $wall s; drops: $drops; refused sends: $refused; kernel: $kernel"
  [ "$ok" -eq $((N * (N - 1))) ] || grep ' lost$' "$OUT/pairs-$mode.txt" | head -5 | sed 's/^/   lost: g/'
done

{
  echo "# Scale: $N hypervisors, one guest each, every guest pings every other once"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git describe --always --dirty 2>/dev/null || echo '?'),"
  echo "$(nproc) cores shared by the $N daemons and the $N guests' pingers, kernel $(uname -r),"
  echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg); ping -W $SCALE_WAIT."
  echo "cold: each ping also resolves the guest's ARP; warm: after an arping warm-up of every pair."
  echo "CPU: utime+stime of each daemon over the ping phase (all daemons; min/median/max of one)."
  echo "Broadcast rx: broadcast packets each daemon received and translated over the ping phase (the"
  echo "daemons' tx_broadcast summed, times (N-1)/N: all but its own); rx packets: packets each daemon read from the fabric (mean)."
  echo "Drops: the daemons' drop_*, port_drop_* and tap_drop_* counters' rises, summed; refused: the"
  echo "sends their ports' kernel refused, by errno, each try (passed: went after a bounded wait)."
  echo "Kernel: drops no sender was told of (neighbour table overflows, host-wide; hidden ENOBUFS)."
  echo "Neighbour tables: $SCALE_NEIGH (gc_thresh3: IPv4 $(sysctl -n net.ipv4.neigh.default.gc_thresh3), IPv6 $(sysctl -n net.ipv6.neigh.default.gc_thresh3))."
  echo
  echo "| mode | pairs answered | wall s | CPU s, all daemons | CPU s per daemon min/median/max | peak RSS MiB | broadcast rx per daemon | rx packets per daemon | drops | refused sends | kernel, silent |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  tail -n +2 "$TSV" | awk -F'\t' '{printf "| %s | %d of %d | %s | %s | %s / %s / %s | %s | %s | %s | %s | %s | %s |\n", $1, $4, $3, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15}'
} >"$OUT/result.md"
echo
cat "$OUT/result.md"
echo
echo "results: $OUT"
