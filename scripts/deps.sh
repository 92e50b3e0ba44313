#!/usr/bin/env bash
# Installs what eipoibd's demo and tests need on a Debian machine: the
# network tools (only when missing, so it is quick once done), the Go
# modules and staticcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A pkg=([ip]=iproute2 [nstat]=iproute2 [ping]=iputils-ping [arping]=arping [iperf3]=iperf3 [iperf]=iperf [tshark]=tshark
  [tcpdump]=tcpdump [ethtool]=ethtool [ovs-vsctl]=openvswitch-switch [ovs-vswitchd]=openvswitch-switch [ovsdb-client]=openvswitch-common
  [dnsmasq]=dnsmasq-base [dhclient]=isc-dhcp-client)
missing=()
for cmd in "${!pkg[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: need ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi
go mod download
if [ "${1:-}" = "--lint" ]; then
  gobin=$(go env GOPATH)/bin
  [ -x "$gobin/staticcheck" ] || go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION:-v0.8.2}"
fi
