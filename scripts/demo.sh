#!/usr/bin/env bash
# The eipoibd demo: two hypervisors, each a network namespace with a Linux
# bridge, two guests and an eipoibd whose TAP is enslaved to the bridge,
# joined by a veth that carries the simulated InfiniBand UD fabric. Guests
# ping each other across the fabric (IPv4 and IPv6) and run iperf3; a
# summary is printed and everything is removed again. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (network namespaces)" >&2; exit 1; }
./scripts/deps.sh
go build -o bin/eipoibd ./cmd/eipoibd

P=eipoib-demo
LOG=$(mktemp -d)
NS=()
cleanup() {
  pkill -TERM -f "bin/eipoibd run --underlay ${P}" 2>/dev/null || true
  sleep 0.5
  for ns in "${NS[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
  rm -rf "$LOG"
}
trap cleanup EXIT
nsadd() { ip netns add "$1"; ip -n "$1" link set lo up; NS+=("$1"); }
x() { ip netns exec "$@"; }

echo "== building the topology: 2 hypervisors x 2 guests, veth underlay (MTU 9000)"
for h in 1 2; do nsadd "$P-hv$h"; done
ip link add "${P}1" netns "$P-hv1" type veth peer name "${P}2" netns "$P-hv2"
for h in 1 2; do
  ip -n "$P-hv$h" link set "${P}$h" mtu 9000 up
  ip -n "$P-hv$h" link add br0 type bridge
  ip -n "$P-hv$h" link set br0 up
  for g in 1 2; do
    nsadd "$P-g$h$g"
    ip link add eth0 netns "$P-g$h$g" type veth peer name "vg$g" netns "$P-hv$h"
    ip -n "$P-hv$h" link set "vg$g" master br0 up
    ip -n "$P-g$h$g" link set eth0 up
  done
done

echo "== starting eipoibd on both hypervisors"
for h in 1 2; do
  x "$P-hv$h" ./bin/eipoibd run --underlay "${P}$h" --bridge br0 --metrics 127.0.0.1:9474 >"$LOG/hv$h.log" 2>&1 &
done
for h in 1 2; do
  for _ in $(seq 100); do grep -q "shim running" "$LOG/hv$h.log" && break; sleep 0.1; done
  grep -q "shim running" "$LOG/hv$h.log" || { cat "$LOG/hv$h.log"; echo "demo: eipoibd did not start" >&2; exit 1; }
done
for h in 1 2; do for g in 1 2; do
  ip -n "$P-g$h$g" addr add "10.77.0.$h$g/24" dev eth0
  ip -n "$P-g$h$g" addr add "fd77::$h$g/64" dev eth0 nodad
done; done
sed -n '1,3p' "$LOG/hv1.log"

ok=0; fail=0
check() { local what=$1; shift; if "$@" >"$LOG/out" 2>&1; then echo "  ok    $what"; ok=$((ok+1)); else echo "  FAIL  $what"; cat "$LOG/out"; fail=$((fail+1)); fi; }
echo "== guests talking across the fabric"
check "ping  g11 -> g21 (10.77.0.21)"  x "$P-g11" ping -c 3 -i 0.2 -W 2 10.77.0.21
check "ping  g12 -> g22 (10.77.0.22)"  x "$P-g12" ping -c 3 -i 0.2 -W 2 10.77.0.22
check "ping6 g11 -> g22 (fd77::22)"    x "$P-g11" ping -6 -c 3 -i 0.2 -W 2 fd77::22
check "ping  g11 -> g12 (same hypervisor)" x "$P-g11" ping -c 2 -i 0.2 -W 2 10.77.0.12
x "$P-g21" iperf3 -s -1 >/dev/null 2>&1 &
sleep 0.5
if x "$P-g11" iperf3 -c 10.77.0.21 -t 3 >"$LOG/iperf" 2>&1; then
  echo "  ok    iperf3 TCP g11 -> g21: $(awk '/receiver/ {print $7, $8}' "$LOG/iperf")"; ok=$((ok+1))
else
  echo "  FAIL  iperf3"; cat "$LOG/iperf"; fail=$((fail+1))
fi

echo "== what hypervisor 1 saw (eipoibd metrics)"
x "$P-hv1" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9474; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3' |
  grep -E '^eipoibd_(tx_frames|rx_frames|vifs|neighbours|groups|tx_broadcast|port_tx_packets|port_rx_packets) ' | sed 's/^/  /'
echo "== summary: $ok checks passed, $fail failed"
[ "$fail" -eq 0 ]
