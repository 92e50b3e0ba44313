#!/usr/bin/env bash
# The network benchmark (issue 8): eipoibd against the forwarders it
# competes with, between two guests on two hypervisors, in one run on one
# topology. Run as root on Debian; it installs what it is missing.
#
#   g1 ── br0 (h1) ── FORWARDER ══ veth underlay, MTU 9000 ══ FORWARDER ── br0 (h2) ── g2
#   10.88.0.1/24, MTU 4092                                                10.88.0.2/24
#
# Forwarders, one after the other (only the forwarder is replaced):
#   (a) eipoibd on the simulated fabric, IB MTU 4096, offloads on (default)
#   (b) eipoibd --offload=false
#   (c) kernel VXLAN over the underlay's IPv6 link-local addresses
#   (d) socat: a TAP and a UDP socket, the naive user-space tunnel
# Measures: iperf3 TCP with 1 and 4 streams, both directions; the highest
# rate of 64-byte UDP datagrams received with < 0.1 % loss (bin/udprate,
# built from cmd/udprate: a paced sendmmsg sender in g1 whose UDP GSO
# buffers g1's eth0 cuts into single datagrams, a counting recvmmsg
# receiver in g2; iperf3 -u cannot offer more than ~80 kpps); median ping
# RTT; for the user-space forwarders CPU seconds per Gbit (one TCP stream
# g1 → g2) and peak RSS.
#
# Results go to bench/results/<UTC timestamp>/: table.md, plot.png,
# machine.txt, data.tsv and raw/ (iperf3 and udprate JSON, ping output,
# daemon logs).
#
# Knobs (environment): BENCH_TIME (s per TCP test, default 10),
# BENCH_UDP_TIME (s per step of the UDP rate search, default 3 or
# BENCH_TIME if smaller), BENCH_UDP_START (first rate tried, pps, default
# 20000), BENCH_UDP_STEPS (bisection steps, default 4), BENCH_UDP_TRIES
# (tries before a rate counts as lossy, default 2), BENCH_UDP_LOSS (the
# loss threshold, percent, default 0.1), BENCH_UDP_FLOWS (sender sockets,
# each its own source port and thread, default 2), BENCH_UDP_GSO
# (datagrams per sent buffer, cut in g1's eth0; 0 sends them one by one;
# default 32), BENCH_PING_COUNT (default 200, 10 ms apart),
# BENCH_FORWARDERS (subset of "a b c d").
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_TIME=${BENCH_TIME:-10}
BENCH_UDP_TIME=${BENCH_UDP_TIME:-$((BENCH_TIME < 3 ? BENCH_TIME : 3))}
BENCH_UDP_START=${BENCH_UDP_START:-20000}
BENCH_UDP_MAX=${BENCH_UDP_MAX:-10000000}
BENCH_UDP_MIN=${BENCH_UDP_MIN:-1000}
BENCH_UDP_STEPS=${BENCH_UDP_STEPS:-4}
BENCH_UDP_TRIES=${BENCH_UDP_TRIES:-2}
BENCH_UDP_LOSS=${BENCH_UDP_LOSS:-0.1} # percent
BENCH_UDP_FLOWS=${BENCH_UDP_FLOWS:-2}
BENCH_UDP_GSO=${BENCH_UDP_GSO:-32}
BENCH_PING_COUNT=${BENCH_PING_COUNT:-200}
BENCH_FORWARDERS=${BENCH_FORWARDERS:-a b c d}
UDP_PORT=5300

[ "$(id -u)" -eq 0 ] || { echo "bench: run as root (network namespaces)" >&2; exit 1; }
STARTED=$SECONDS

# --- what the benchmark needs ------------------------------------------------
declare -A pkg=([ip]=iproute2 [ping]=iputils-ping [iperf3]=iperf3 [socat]=socat [gnuplot]=gnuplot-nox [jq]=jq [ethtool]=ethtool)
missing=()
for cmd in "${!pkg[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
go build -o bin/eipoibd ./cmd/eipoibd
go build -o bin/udprate ./cmd/udprate
BIN=$PWD/bin/eipoibd
UDPRATE=$PWD/bin/udprate

OUT=bench/results/$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/raw
mkdir -p "$RAW"
{
  echo "date:     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit:   $(git rev-parse HEAD 2>/dev/null || echo unknown) ($(git describe --always --dirty 2>/dev/null || echo '?'))"
  echo "nproc:    $(nproc)"
  echo "kernel:   $(uname -r)"
  echo "cpu:      $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "memory:   $(awk '/^MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, at the start)"
  echo "tools:    $(iperf3 --version | head -1); $(socat -V | awk '/socat version/ {print "socat", $3}'); $(go version)"
  echo "settings: BENCH_TIME=$BENCH_TIME BENCH_UDP_TIME=$BENCH_UDP_TIME BENCH_UDP_START=$BENCH_UDP_START" \
    "BENCH_UDP_STEPS=$BENCH_UDP_STEPS BENCH_UDP_TRIES=$BENCH_UDP_TRIES BENCH_UDP_LOSS=$BENCH_UDP_LOSS" \
    "BENCH_UDP_FLOWS=$BENCH_UDP_FLOWS BENCH_UDP_GSO=$BENCH_UDP_GSO BENCH_PING_COUNT=$BENCH_PING_COUNT"
} >"$OUT/machine.txt"

# --- processes and namespaces, removed on any exit -----------------------------
P=eb$$
NS=()
exec 3>&1 4>&2
declare -A RUNNING=() # pid → what, for the processes this script started and has not reaped
# x runs a command in a namespace. Not for background processes: "x … &"
# forks a subshell, and $! would be its PID, not the command's; those use
# "ip netns exec", which execs the command in the same process.
x() { ip netns exec "$@"; }

# run runs a measuring client in the background and waits for it. Bash
# defers a trap until a foreground command ends, and skips a SIGINT trap
# altogether when that command catches SIGINT itself (iperf3 and ping do,
# and then exit normally), so Ctrl-C would not stop the run; the wait
# builtin returns at once on a trapped signal and the trap runs.
run() { "$@" & wait "$!"; }

# reap stops one of our processes (SIGTERM, SIGKILL after 10 s) and reaps it,
# so its PID is never signalled again once the kernel may reuse it.
reap() {
  local pid=$1 state
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)
    [ "$state" = Z ] || [ "$state" = gone ] && break
    sleep 0.1
  done
  [ "$state" = Z ] || [ "$state" = gone ] || kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  unset "RUNNING[$pid]"
}

cleanup() {
  local rc=$? pids ns pid
  set +e
  exec 1>&3 2>&4 # a trap can run inside a redirected measurement
  trap - INT TERM
  for pid in "${!RUNNING[@]}"; do reap "$pid"; done
  # Anything still inside our namespaces was started by this script too.
  for ns in "${NS[@]}"; do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    [ ${#pids[@]} -eq 0 ] || { echo "bench: stopping leftover processes in $ns: ${pids[*]}" >&2; kill -KILL "${pids[@]}" 2>/dev/null; }
  done
  for ns in "${NS[@]}"; do ip netns delete "$ns" 2>/dev/null; done
  [ "$rc" -eq 0 ] || echo "bench: stopped (exit $rc); partial results in $OUT" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

nsadd() { ip netns add "$1"; NS+=("$1"); ip -n "$1" link set lo up; }

# --- the topology ----------------------------------------------------------------
echo "== topology: h1, h2 over a veth underlay (MTU 9000); br0 and one guest (MTU 4092) each"
for h in 1 2; do nsadd "$P-h$h"; done
for g in 1 2; do nsadd "$P-g$g"; done
ip link add ul1 netns "$P-h1" type veth peer name ul2 netns "$P-h2"
for h in 1 2; do
  ip -n "$P-h$h" link set "ul$h" mtu 9000 up
  ip -n "$P-h$h" link add br0 type bridge
  ip -n "$P-h$h" link set br0 up
  ip link add eth0 netns "$P-g$h" mtu 4092 type veth peer name vg1 netns "$P-h$h" mtu 4092
  ip -n "$P-h$h" link set vg1 master br0 up
  ip -n "$P-g$h" link set eth0 up
  ip -n "$P-g$h" addr add "10.88.0.$h/24" dev eth0
done
# udprate's GSO buffers leave g1 as single datagrams, as from a NIC that
# segments: every forwarder sees 64-byte frames.
ip netns exec "$P-g1" ethtool -K eth0 tx-udp-segmentation off >/dev/null
# The underlays' link-local addresses, once DAD is done: the port GIDs of
# the simulated fabric, and the tunnel endpoints of VXLAN and socat.
declare -A LL
for h in 1 2; do
  for _ in $(seq 50); do
    LL[$h]=$(ip -n "$P-h$h" -6 -o addr show dev "ul$h" scope link | awk '!/tentative/ {sub("/.*", "", $4); print $4}')
    [ -n "${LL[$h]}" ] && break
    sleep 0.1
  done
  [ -n "${LL[$h]}" ] || { echo "bench: no link-local address on ul$h" >&2; exit 1; }
done

ip netns exec "$P-g2" iperf3 -s >"$RAW/iperf3-server.log" 2>&1 &
RUNNING[$!]="iperf3 server"

# --- forwarders: up and down -----------------------------------------------------
FPIDS=() # the user-space forwarder's processes: h1's, then h2's

eipoibd_up() { # extra flags...
  local h
  FPIDS=()
  for h in 1 2; do
    ip netns exec "$P-h$h" "$BIN" run --underlay "ul$h" --bridge br0 --ctl-dir "/run/eipoibd/$P-h$h" "$@" >"$RAW/$F-eipoibd-h$h.log" 2>&1 &
    RUNNING[$!]="eipoibd h$h"
    FPIDS+=("$!")
  done
  for h in 1 2; do
    for _ in $(seq 100); do grep -q "shim running" "$RAW/$F-eipoibd-h$h.log" && break; sleep 0.1; done
    grep -q "shim running" "$RAW/$F-eipoibd-h$h.log" || { cat "$RAW/$F-eipoibd-h$h.log" >&2; return 1; }
  done
}

user_down() {
  local pid
  # eipoibd logs its non-zero counters on SIGUSR2: the drops, if any, go
  # into its log next to the numbers.
  if [[ $F == [ab] ]]; then
    for pid in "${FPIDS[@]}"; do kill -USR2 "$pid" 2>/dev/null || true; done
    sleep 0.3
  fi
  for pid in "${FPIDS[@]}"; do reap "$pid"; done
  FPIDS=()
}

vxlan_up() {
  local h o
  for h in 1 2; do
    o=$((3 - h))
    ip -n "$P-h$h" link add vx0 mtu 4092 type vxlan id 88 dstport 4789 \
      local "${LL[$h]}" remote "${LL[$o]}" dev "ul$h"
    ip -n "$P-h$h" link set vx0 master br0 up
  done
}

vxlan_down() {
  local h
  for h in 1 2; do ip -n "$P-h$h" link delete vx0; done
}

socat_up() {
  local h o
  FPIDS=()
  for h in 1 2; do
    o=$((3 - h))
    ip netns exec "$P-h$h" socat -b 65536 TUN,tun-type=tap,tun-name=st0,iff-no-pi,iff-up \
      "UDP6-DATAGRAM:[${LL[$o]}%ul$h]:5088,bind=[${LL[$h]}%ul$h]:5088" >"$RAW/$F-socat-h$h.log" 2>&1 &
    RUNNING[$!]="socat h$h"
    FPIDS+=("$!")
  done
  for h in 1 2; do
    for _ in $(seq 50); do ip -n "$P-h$h" link show st0 >/dev/null 2>&1 && break; sleep 0.1; done
    ip -n "$P-h$h" link set st0 mtu 4092 master br0 up
  done
}

# --- measures ----------------------------------------------------------------------
declare -A V # "$F.measure" → value as printed

# connected waits until g1 reaches g2 (the guests' ARP caches are flushed
# first: each forwarder shows them other MACs).
connected() {
  local g
  for g in 1 2; do ip -n "$P-g$g" neigh flush dev eth0; done
  for _ in $(seq 20); do
    run x "$P-g1" ping -c 1 -W 1 10.88.0.2 >/dev/null 2>&1 && return 0
  done
  return 1
}

# iperf runs one iperf3 client in g1 into $RAW/$1.json; a refused start
# (the server still busy with the last test) is tried again.
iperf() {
  local name=$1; shift
  local try
  for try in 1 2 3; do
    if run timeout $((BENCH_TIME + BENCH_UDP_TIME + 30)) ip netns exec "$P-g1" \
      iperf3 -c 10.88.0.2 -J "$@" >"$RAW/$name.json" 2>"$RAW/$name.err"; then
      [ -s "$RAW/$name.err" ] || rm -f "$RAW/$name.err"
      return 0
    fi
    echo "   ($name: try $try failed: $(jq -r '.error // empty' "$RAW/$name.json" 2>/dev/null))" >&2
    sleep 1
  done
  return 1
}

gbps() { jq -r '.end.sum_received.bits_per_second' "$RAW/$1.json" | awk '{ printf "%.2f", $1 / 1e9 }'; }

# cpu_ticks sums utime+stime of the forwarder's processes.
cpu_ticks() {
  local pid t=0
  for pid in "${FPIDS[@]}"; do
    t=$((t + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}

tcp_tests() {
  local t0 t1 bytes
  t0=$(cpu_ticks)
  if iperf "$F-tcp1" -t "$BENCH_TIME"; then
    t1=$(cpu_ticks)
    V[$F.tcp1]=$(gbps "$F-tcp1")
    bytes=$(jq -r '.end.sum_received.bytes' "$RAW/$F-tcp1.json")
    if [ ${#FPIDS[@]} -gt 0 ]; then
      V[$F.cpu]=$(awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v b="$bytes" \
        'BEGIN { if (b > 0) printf "%.2f", t / hz / (b * 8 / 1e9); else print "n/a" }')
    fi
  else V[$F.tcp1]=err; fi
  sleep 0.5
  if iperf "$F-tcp1-R" -t "$BENCH_TIME" -R; then V[$F.tcp1R]=$(gbps "$F-tcp1-R"); else V[$F.tcp1R]=err; fi
  sleep 0.5
  if iperf "$F-tcp4" -t "$BENCH_TIME" -P 4; then V[$F.tcp4]=$(gbps "$F-tcp4"); else V[$F.tcp4]=err; fi
  sleep 0.5
  if iperf "$F-tcp4-R" -t "$BENCH_TIME" -P 4 -R; then V[$F.tcp4R]=$(gbps "$F-tcp4-R"); else V[$F.tcp4R]=err; fi
  echo "   TCP Gbit/s: 1 stream ${V[$F.tcp1]} / -R ${V[$F.tcp1R]}; 4 streams ${V[$F.tcp4]} / -R ${V[$F.tcp4R]}"
}

# udp_trial sends 64-byte datagrams at $1 pps for BENCH_UDP_TIME (udprate,
# the receiver in g2, the sender in g1) and sets TRIAL_PASS (loss below
# BENCH_UDP_LOSS), TRIAL_RECV (pps), TRIAL_LIMITED (the sender fell short
# of the rate by more than 5 %: "true" or "false") and TRIAL_RXLIMIT (1 when
# most of the loss was the receiving socket's overflow, not the path's);
# a lossy rate gets BENCH_UDP_TRIES tries, the best one counts.
udp_trial() {
  local rate=$1 try name rpid res pass recv sent loss limited drops
  TRIAL_PASS=0 TRIAL_RECV=0 TRIAL_LIMITED=false TRIAL_RXLIMIT=0
  for ((try = 1; try <= BENCH_UDP_TRIES; try++)); do
    sleep 0.3
    name=$F-udp-$rate-$try
    # The receiver stops on the sender's end datagrams, or 1 s after the
    # last datagram if they were lost.
    ip netns exec "$P-g2" "$UDPRATE" recv --listen "10.88.0.2:$UDP_PORT" \
      --duration $((BENCH_UDP_TIME + 10))s --idle 1s >"$RAW/$name-recv.json" 2>"$RAW/$name-recv.err" &
    rpid=$!
    RUNNING[$rpid]="udprate recv"
    for _ in $(seq 50); do grep -q listening "$RAW/$name-recv.err" && break; sleep 0.1; done
    if ! run timeout $((BENCH_UDP_TIME + 30)) ip netns exec "$P-g1" "$UDPRATE" send --to "10.88.0.2:$UDP_PORT" \
      --rate "$rate" --size 64 --duration "${BENCH_UDP_TIME}s" --flows "$BENCH_UDP_FLOWS" --gso "$BENCH_UDP_GSO" \
      >"$RAW/$name-send.json" 2>"$RAW/$name-send.err"; then
      echo "   ($name: sender failed: $(cat "$RAW/$name-send.err"))" >&2
      reap "$rpid"
      continue
    fi
    wait "$rpid" || true
    unset "RUNNING[$rpid]"
    [ -s "$RAW/$name-send.err" ] || rm -f "$RAW/$name-send.err"
    # Loss: the datagrams the sender sent that the receiver never got
    # (duplicates do not make up for them).
    res=$(jq -rs --arg max "$BENCH_UDP_LOSS" '(.[0] | select(.mode == "send")) as $s | (.[1] | select(.mode == "recv")) as $r |
        (if $s.sent > 0 then ($s.sent - $r.received) * 100 / $s.sent else 100 end) as $loss | [
        (if $loss < ($max | tonumber) then 1 else 0 end),
        ($r.pps | round), ($s.pps | round), ($loss * 1000 | round / 1000), $s.sender_limited,
        (if $s.sent > $r.received and $r.socket_drops * 2 >= $s.sent - $r.received then 1 else 0 end)] | @tsv' \
      "$RAW/$name-send.json" "$RAW/$name-recv.json") && [ -n "$res" ] || continue
    read -r pass recv sent loss limited drops <<<"$res"
    echo "   UDP $rate pps: sent $sent$([ "$limited" = true ] && echo " (sender-limited)"), received $recv pps, loss $loss %$([ "$drops" -eq 1 ] && echo " (mostly the receiver's socket overflowing)")"
    TRIAL_RECV=$recv TRIAL_LIMITED=$limited TRIAL_RXLIMIT=$drops
    if [ "$pass" -eq 1 ]; then TRIAL_PASS=1; break; fi
  done
}

# udp_search doubles the rate until a loss of BENCH_UDP_LOSS % or more (or
# until the sender cannot send faster), then bisects between the last good
# and the first lossy rate; the result is the received pps of the best
# good rate, "≥ …, sender-limited" when the sender was the limit, and
# "receiver-limited" noted when the first lossy rate lost mostly in the
# receiving socket.
udp_search() {
  local good=0 good_recv=0 bad=0 bad_rx=0 rate=$BENCH_UDP_START limited="" mid
  udp_trial "$rate"
  if [ "$TRIAL_PASS" -eq 1 ]; then
    while :; do
      good=$rate good_recv=$TRIAL_RECV
      if [ "$TRIAL_LIMITED" = true ]; then limited="≥ "; break; fi
      rate=$((rate * 2))
      [ "$rate" -le "$BENCH_UDP_MAX" ] || break
      udp_trial "$rate"
      [ "$TRIAL_PASS" -eq 1 ] || { bad=$rate bad_rx=$TRIAL_RXLIMIT; break; }
    done
  else
    bad=$rate bad_rx=$TRIAL_RXLIMIT
    while [ $((rate / 2)) -ge "$BENCH_UDP_MIN" ]; do
      rate=$((rate / 2))
      udp_trial "$rate"
      if [ "$TRIAL_PASS" -eq 1 ]; then good=$rate good_recv=$TRIAL_RECV; break; fi
      bad=$rate bad_rx=$TRIAL_RXLIMIT
    done
  fi
  if [ "$good" -gt 0 ] && [ "$bad" -gt 0 ] && [ -z "$limited" ]; then
    for ((s = 0; s < BENCH_UDP_STEPS; s++)); do
      mid=$(((good + bad) / 2))
      udp_trial "$mid"
      if [ "$TRIAL_PASS" -eq 1 ]; then
        good=$mid
        [ "$TRIAL_RECV" -gt "$good_recv" ] && good_recv=$TRIAL_RECV
      else bad=$mid bad_rx=$TRIAL_RXLIMIT; fi
    done
  fi
  if [ "$good" -eq 0 ]; then
    V[$F.udp]="< $((BENCH_UDP_MIN / 1000))"
  else
    V[$F.udp]="$limited$(awk -v p="$good_recv" 'BEGIN { printf "%.1f", p / 1000 }')"
  fi
  if [ -n "$limited" ]; then V[$F.udp]+=", sender-limited"
  elif [ "$bad_rx" -eq 1 ]; then V[$F.udp]+=", receiver-limited"; fi
  echo "   UDP 64 B: ${V[$F.udp]} kpps received with < $BENCH_UDP_LOSS % loss"
}

ping_test() {
  if run x "$P-g1" ping -c "$BENCH_PING_COUNT" -i 0.01 -W 1 10.88.0.2 >"$RAW/$F-ping.txt" 2>&1 ||
    grep -q 'time=' "$RAW/$F-ping.txt"; then
    V[$F.rtt]=$(grep -o 'time=[0-9.]*' "$RAW/$F-ping.txt" | cut -d= -f2 | sort -g |
      awk '{ a[NR] = $1 } END { if (NR == 0) { print "err"; exit }
        m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.0f", m * 1000 }')
  else V[$F.rtt]=err; fi
  echo "   ping RTT median: ${V[$F.rtt]} µs"
}

rss() {
  local pid out=()
  for pid in "${FPIDS[@]}"; do
    out+=("$(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status")")
  done
  V[$F.rss]="${out[0]} / ${out[1]}"
}

measure() {
  if ! connected; then
    echo "   g1 does not reach g2: no numbers for this forwarder" >&2
    V[$F.tcp1]="err: no connectivity"
    return
  fi
  tcp_tests
  udp_search
  ping_test
  [ ${#FPIDS[@]} -eq 0 ] || rss
}

# --- the run -----------------------------------------------------------------------------
declare -A LABEL=(
  [a]="(a) eipoibd, sim fabric, IB MTU 4096, offloads on"
  [b]="(b) eipoibd --offload=false"
  [c]="(c) kernel VXLAN (IPv6 link-local underlay)"
  [d]="(d) socat TAP ↔ UDP"
)
declare -A SHORT=([a]="(a) eipoibd" [b]="(b) eipoibd, offload off" [c]="(c) kernel VXLAN" [d]="(d) socat")

for F in a b c d; do
  [[ " $BENCH_FORWARDERS " == *" $F "* ]] || continue
  echo "== ${LABEL[$F]}"
  case $F in
    a)
      if eipoibd_up; then measure; else V[$F.tcp1]="err: eipoibd did not start"; fi
      user_down ;;
    b)
      if eipoibd_up --offload=false; then measure; else V[$F.tcp1]="err: eipoibd did not start"; fi
      user_down ;;
    c) vxlan_up; measure; vxlan_down ;;
    d) socat_up; measure; user_down ;;
  esac
done

# --- the report ---------------------------------------------------------------------------
cell() { echo "${V[$1]:-n/a}"; }
num() { [[ ${V[$1]:-} =~ ^[0-9.]+$ ]]; }
ratio() { # F1 F2 → tcp1 of F1 / tcp1 of F2
  if num "$1.tcp1" && num "$2.tcp1" && awk -v d="${V[$2.tcp1]}" 'BEGIN { exit !(d > 0) }'; then
    awk -v a="${V[$1.tcp1]}" -v b="${V[$2.tcp1]}" 'BEGIN { printf "%.2f", a / b }'
  else
    echo "n/a"
  fi
}
{
  echo "# eipoibd network benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Two guests (MTU 4092) on two hypervisors (Linux bridge each) joined by a veth"
  echo "underlay (MTU 9000); iperf3 from g1 to g2 (→) and back (←, \`-R\`), $BENCH_TIME s each."
  echo "Machine: $(nproc) cores, $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), kernel $(uname -r); see machine.txt."
  echo
  echo "| forwarder | TCP 1 stream → (Gbit/s) | TCP 1 stream ← | TCP 4 streams → | TCP 4 streams ← | UDP 64 B, < $BENCH_UDP_LOSS % loss (kpps) | ping RTT median (µs) | CPU s per Gbit (1 stream →) | peak RSS h1 / h2 (MiB) |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for F in a b c d; do
    [[ " $BENCH_FORWARDERS " == *" $F "* ]] || continue
    if [[ ${V[$F.tcp1]:-} == n/a* ]] || [[ ${V[$F.tcp1]:-} == "err: "* ]]; then
      echo "| ${LABEL[$F]} | ${V[$F.tcp1]} | | | | | | | |"
      continue
    fi
    if [ "$F" = c ]; then cpu="— (kernel)" rss="— (kernel)"; else cpu=$(cell "$F.cpu") rss=$(cell "$F.rss"); fi
    echo "| ${LABEL[$F]} | $(cell "$F.tcp1") | $(cell "$F.tcp1R") | $(cell "$F.tcp4") | $(cell "$F.tcp4R") | $(cell "$F.udp") | $(cell "$F.rtt") | $cpu | $rss |"
  done
  echo
  echo "TCP one stream (→), ratios:"
  echo
  echo "| | to (c) VXLAN | to (d) socat |"
  echo "| --- | ---: | ---: |"
  echo "| (a) eipoibd | $(ratio a c) | $(ratio a d) |"
  echo "| (b) eipoibd --offload=false | $(ratio b c) | $(ratio b d) |"
  echo
  if num a.rtt && num c.rtt; then
    echo "RTT that eipoibd (a) adds over VXLAN (c): $((${V[a.rtt]} - ${V[c.rtt]})) µs (median to median)."
  else
    echo "RTT that eipoibd (a) adds over VXLAN (c): n/a."
  fi
  echo
  echo "UDP: the highest rate received with less than $BENCH_UDP_LOSS % loss, by doubling from"
  echo "$BENCH_UDP_START pps and bisecting $BENCH_UDP_STEPS steps, $BENCH_UDP_TIME s a step (udprate, $BENCH_UDP_FLOWS flows,"
  echo "GSO buffers of $BENCH_UDP_GSO cut in g1's eth0); \"≥ …, sender-limited\" where the sender could not"
  echo "send faster, \"receiver-limited\" where the first lossy rate lost mostly in g2's socket."
  echo "Sender, receiver and forwarder share the machine's $(nproc) cores. CPU: utime+stime of both"
  echo "processes over the 1-stream → test, per Gbit received. Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
} >"$OUT/table.md"

# The plot: TCP throughput per forwarder ("-" where there is no number).
{
  printf 'forwarder\t1 stream →\t1 stream ←\t4 streams →\t4 streams ←\n'
  for F in a b c d; do
    [[ " $BENCH_FORWARDERS " == *" $F "* ]] || continue
    if num "$F.tcp1"; then printf '"%s"' "${SHORT[$F]}"; else printf '"%s (n/a)"' "${SHORT[$F]}"; fi
    for m in tcp1 tcp1R tcp4 tcp4R; do
      if num "$F.$m"; then printf '\t%s' "${V[$F.$m]}"; else printf '\t-'; fi
    done
    printf '\n'
  done
} >"$OUT/data.tsv"
gnuplot <<EOF
set terminal png size 1000,560
set output '$OUT/plot.png'
set datafile separator "\t"
set datafile missing "-"
set title "TCP between two guests on two hypervisors (iperf3, $BENCH_TIME s; $(nproc) cores)"
set ylabel "Gbit/s"
set yrange [0:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set xtics nomirror font ",9"
set grid ytics
plot '$OUT/data.tsv' using 2:xtic(1) title columnheader(2), '' using 3 title columnheader(3), \
  '' using 4 title columnheader(4), '' using 5 title columnheader(5)
EOF

echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (at the end)" >>"$OUT/machine.txt"
echo "duration: $((SECONDS - STARTED)) s" >>"$OUT/machine.txt"
echo
cat "$OUT/table.md"
echo
echo "bench: results in $OUT ($((SECONDS - STARTED)) s)"
