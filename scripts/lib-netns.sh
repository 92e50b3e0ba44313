# shellcheck shell=bash
# Sourced by the benchmark scripts (bench.sh, bench-scale.sh) and the
# soak (soak.sh): the network namespaces a script makes, removed again on
# any exit, and the hypervisor-and-guest pair they are built of. The sourcing script sets
# its cleanup with on_exit and calls ns_remove from it.

NS=() # the namespaces made, in order

# nsadd makes namespace $1 with its loopback up.
nsadd() { ip netns add "$1"; NS+=("$1"); ip -n "$1" link set lo up; }

# ns_remove kills what still runs inside the namespaces (the script
# started it all) and deletes them.
ns_remove() {
  local ns pids
  for ns in "${NS[@]}"; do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
  done
  wait 2>/dev/null
  for ns in "${NS[@]}"; do ip netns delete "$ns" 2>/dev/null; done
  NS=()
}

# on_exit runs function $1 on any exit; SIGINT and SIGTERM exit with
# 130 and 143 (so that $1 sees why).
on_exit() {
  # shellcheck disable=SC2064 # the function's name, now
  trap "$1" EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# hypervisor_guest gives hypervisor namespace $1 a bridge br0 and the
# guest namespace $2 an eth0 on it (veth, MTU 4092: the IPoIB MTU of IB
# MTU 4096) with address $3; its hypervisor side is vg.
hypervisor_guest() {
  ip -n "$1" link add br0 type bridge
  ip -n "$1" link set br0 up
  ip link add eth0 netns "$2" mtu 4092 type veth peer name vg netns "$1" mtu 4092
  ip -n "$1" link set vg master br0 up
  ip -n "$2" link set eth0 up
  ip -n "$2" addr add "$3" dev eth0
}
