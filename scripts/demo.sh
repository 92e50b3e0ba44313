#!/usr/bin/env bash
# The eipoibd demo: two hypervisors, each a network namespace with a Linux
# bridge, two guests and an eipoibd whose TAP is enslaved to the bridge,
# and a native IPoIB host (eipoibd host: a TUN ib0, as a Linux ib0 in
# datagram mode), all on one underlay bridge that carries the simulated
# InfiniBand UD fabric. Guests ping each other and the native host across
# the fabric (IPv4 and IPv6) and run iperf3; a summary is printed and
# everything is removed again: the processes it started (by PID), its
# namespaces and its temporary directory, which also holds the daemons'
# control sockets. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (network namespaces)" >&2; exit 1; }
# The namespaces' prefix, and the underlay links' ("$P-hv1"): at most 11
# characters, so that those fit IFNAMSIZ. TestDemo gives each run its own,
# so that two test suites on one machine do not meet.
P=${EIPOIB_DEMO_PREFIX:-eipoib-demo}
[ ${#P} -le 11 ] || { echo "demo: EIPOIB_DEMO_PREFIX \"$P\" is longer than 11 characters" >&2; exit 2; }
./scripts/deps.sh
go build -o bin/eipoibd ./cmd/eipoibd

LOG=$(mktemp -d)
NS=()
PIDS=() # what the demo started in the background, as "ip netns exec" (not x: a function runs in a subshell of its own) so that $! is the command's own PID: ip netns exec execs it
# alive: PID is running (a child that exited stays a zombie until waited).
# The status is read once: a process that exits between a check and a
# read is gone, not an error on the demo's output.
alive() { local st; st=$(cat "/proc/$1/status" 2>/dev/null) || return 1; ! grep -q '^State:[[:space:]]*Z' <<<"$st"; }
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    left=0
    for pid in "${PIDS[@]}"; do alive "$pid" && left=1; done
    [ "$left" -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do
    alive "$pid" && { echo "demo: PID $pid ignored SIGTERM for 5 s: killed" >&2; kill -KILL "$pid" 2>/dev/null || true; }
    wait "$pid" 2>/dev/null || true
  done
  for ns in "${NS[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
  rm -rf "$LOG"
}
trap cleanup EXIT
nsadd() { ip netns add "$1"; ip -n "$1" link set lo up; NS+=("$1"); }
x() { ip netns exec "$@"; }

echo "== building the topology: 2 hypervisors x 2 guests and a native IPoIB host on an underlay bridge (MTU 9000)"
nsadd "$P-ul"
ip -n "$P-ul" link add ubr mtu 9000 type bridge
ip -n "$P-ul" link set ubr up
for h in hv1 hv2 nh; do
  nsadd "$P-$h"
  ip link add "${P}-$h" netns "$P-$h" type veth peer name "p$h" netns "$P-ul"
  ip -n "$P-ul" link set "p$h" mtu 9000 master ubr up
  ip -n "$P-$h" link set "${P}-$h" mtu 9000 up
done
for h in 1 2; do
  ip -n "$P-hv$h" link add br0 type bridge
  ip -n "$P-hv$h" link set br0 up
  for g in 1 2; do
    nsadd "$P-g$h$g"
    ip link add eth0 netns "$P-g$h$g" type veth peer name "vg$g" netns "$P-hv$h"
    ip -n "$P-hv$h" link set "vg$g" master br0 up
    ip -n "$P-g$h$g" link set eth0 up
  done
done

echo "== starting eipoibd on both hypervisors, and eipoibd host as the native host"
for h in 1 2; do
  ip netns exec "$P-hv$h" ./bin/eipoibd run --underlay "${P}-hv$h" --bridge br0 --metrics 127.0.0.1:9474 --ctl-dir "$LOG/hv$h-ctl" >"$LOG/hv$h.log" 2>&1 &
  PIDS+=($!)
done
ip netns exec "$P-nh" ./bin/eipoibd host --underlay "${P}-nh" --neigh-file "$LOG/neigh" >"$LOG/nh.log" 2>&1 &
PIDS+=($!)
for f in hv1:"shim running" hv2:"shim running" nh:"host running"; do
  for _ in $(seq 100); do grep -q "${f#*:}" "$LOG/${f%%:*}.log" && break; sleep 0.1; done
  grep -q "${f#*:}" "$LOG/${f%%:*}.log" || { cat "$LOG/${f%%:*}.log"; echo "demo: eipoibd did not start" >&2; exit 1; }
done
for h in 1 2; do for g in 1 2; do
  ip -n "$P-g$h$g" addr add "10.77.0.$h$g/24" dev eth0
  ip -n "$P-g$h$g" addr add "fd77::$h$g/64" dev eth0 nodad
done; done
ip -n "$P-nh" addr add 10.77.0.200/24 dev ib0
ip -n "$P-nh" addr add fd77::200/64 dev ib0 nodad
sed -n '1,3p' "$LOG/hv1.log"

ok=0; fail=0
check() { local what=$1; shift; if "$@" >"$LOG/out" 2>&1; then echo "  ok    $what"; ok=$((ok+1)); else echo "  FAIL  $what"; cat "$LOG/out"; fail=$((fail+1)); fi; }
echo "== guests talking across the fabric"
check "ping  g11 -> g21 (10.77.0.21)"  x "$P-g11" ping -c 3 -i 0.2 -W 2 10.77.0.21
check "ping  g12 -> g22 (10.77.0.22)"  x "$P-g12" ping -c 3 -i 0.2 -W 2 10.77.0.22
check "ping6 g11 -> g22 (fd77::22)"    x "$P-g11" ping -6 -c 3 -i 0.2 -W 2 fd77::22
check "ping  g11 -> g12 (same hypervisor)" x "$P-g11" ping -c 2 -i 0.2 -W 2 10.77.0.12
ip netns exec "$P-g21" iperf3 -s -1 >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
if x "$P-g11" iperf3 -c 10.77.0.21 -t 3 >"$LOG/iperf" 2>&1; then
  echo "  ok    iperf3 TCP g11 -> g21: $(awk '/receiver/ {print $7, $8}' "$LOG/iperf")"; ok=$((ok+1))
else
  echo "  FAIL  iperf3"; cat "$LOG/iperf"; fail=$((fail+1))
fi

echo "== guests and the native IPoIB host"
check "ping  g11 -> native host (10.77.0.200)" x "$P-g11" ping -c 3 -i 0.2 -W 2 10.77.0.200
check "ping6 g22 -> native host (fd77::200)"   x "$P-g22" ping -6 -c 3 -i 0.2 -W 2 fd77::200
check "ping  native host -> g12 (10.77.0.12)"  x "$P-nh" ping -c 3 -i 0.2 -W 2 10.77.0.12
check "ping6 native host -> g21 (fd77::21)"    x "$P-nh" ping -6 -c 3 -i 0.2 -W 2 fd77::21
ip netns exec "$P-nh" iperf3 -s -1 >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
if x "$P-g21" iperf3 -c 10.77.0.200 -t 3 >"$LOG/iperf-nh" 2>&1; then
  echo "  ok    iperf3 TCP g21 -> native host: $(awk '/receiver/ {print $7, $8}' "$LOG/iperf-nh")"; ok=$((ok+1))
else
  echo "  FAIL  iperf3 to the native host"; cat "$LOG/iperf-nh"; fail=$((fail+1))
fi
echo "== the native host's neighbour table (20-byte IPoIB addresses: flags, QPN, GID; one QPN per guest)"
sed 's/^/  /' "$LOG/neigh"
echo "== hypervisor 1's guests, as its control socket lists them (eipoibd show vifs)"
./bin/eipoibd show vifs --ctl-dir "$LOG/hv1-ctl" | sed 's/^/  /'
echo "== what hypervisor 1 saw (eipoibd metrics)"
x "$P-hv1" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9474; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3' |
  grep -E '^eipoibd_(tx_frames_total|rx_frames_total|vifs|neighbours|groups|tx_broadcast_total|port_tx_packets_total|port_rx_packets_total) ' | sed 's/^/  /'
echo "== summary: $ok checks passed, $fail failed"
[ "$fail" -eq 0 ]
