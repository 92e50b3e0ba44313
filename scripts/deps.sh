#!/usr/bin/env bash
# Installs what eipoibd's demo and tests need on a Debian machine: the
# network tools, QEMU and what test/vm/build.sh needs to boot Debian's
# kernel with soft-RoCE, rdma-core and the verbs libraries (the guest runs
# the host's own binaries), and a C compiler for the verbs backend's cgo
# (all only when missing, so it is quick once done), the Go modules,
# staticcheck and the VM tests' kernel (test/vm/build.sh), the last two
# at once.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/sbin:/sbin
# Commands, by the package that provides them.
declare -A pkg=([ip]=iproute2 [nstat]=iproute2 [ping]=iputils-ping [arping]=arping [iperf3]=iperf3 [iperf]=iperf [tshark]=tshark
  [tcpdump]=tcpdump [ethtool]=ethtool [ovs-vsctl]=openvswitch-switch [ovs-vswitchd]=openvswitch-switch [ovsdb-client]=openvswitch-common
  [dnsmasq]=dnsmasq-base [dhclient]=isc-dhcp-client [ndisc6]=ndisc6 [nsenter]=util-linux [curl]=curl [bridge]=iproute2 [rdma]=iproute2
  [qemu-system-x86_64]=qemu-system-x86 [cpio]=cpio [modprobe]=kmod [depmod]=kmod [xz]=xz-utils
  [ibv_devinfo]=ibverbs-utils [gcc]=gcc [systemd-analyze]=systemd)
pkg+=([prometheus]=prometheus [promtool]=prometheus) # TestPrometheus, TestPrometheusRules (deploy/prometheus, deploy/grafana)
pkg+=([stress-ng]=stress-ng) # make test-load's CPU hogs
pkg+=([shellcheck]=shellcheck) # TestKitShellcheck (test/netns): the hardware kit's scripts
pkg+=([mount]=mount [umount]=mount) # TestKernelBackendEmulated pins the emulated IPoIB wire in a bpffs mount
pkg+=([socat]=socat [jq]=jq [gnuplot]=gnuplot-nox [bc]=bc [flock]=util-linux) # scripts/soak.sh
pkg+=([libvirtd]=libvirt-daemon-system [virtlogd]=libvirt-daemon-system [virsh]=libvirt-clients) # TestLibvirt, and TestVLANFilterVM in the QEMU guest
# make deb and make image, TestDebPackage and TestImagePod (docs/release.md)
pkg+=([dpkg-deb]=dpkg [dpkg-shlibdeps]=dpkg-dev [fakeroot]=fakeroot [lintian]=lintian [systemd-analyze]=systemd
  [debootstrap]=debootstrap [podman]=podman [runc]=runc [catatonit]=catatonit) # catatonit: the pods' infra (pause) image
pkg+=([qemu-aarch64-static]=qemu-user-static) # make release runs the arm64 binaries
# Packages with no command to look for (libraries, providers, a static
# busybox where a dynamic one may be installed): installed or not.
libs=(busybox-static rdma-core ibverbs-providers libibverbs-dev librdmacm-dev)
libs+=(containernetworking-plugins) # /usr/lib/cni: bridge, host-local, static, dhcp for TestCNI
missing=()
for cmd in "${!pkg[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg[$cmd]}")
done
for p in "${libs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' installed$' || missing+=("$p")
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
# The VM tests' kernel (test/vm/build.sh: on a fresh machine it downloads
# Debian's kernel package and unpacks it; once cached it only checks),
# fetched while Go fetches the modules and builds staticcheck, so that the
# download and the compiler overlap instead of the first VM test waiting
# for it. A failure is reported here and again, with its reason, by the
# VM tests.
vm=""
vmlog=$(mktemp)
trap 'rm -f "$vmlog"' EXIT
if [ "$(id -u)" -eq 0 ]; then
  test/vm/build.sh >/dev/null 2>"$vmlog" &
  vm=$!
fi
go mod download
if [ "${1:-}" = "--lint" ]; then
  gobin=$(go env GOPATH)/bin
  [ -x "$gobin/staticcheck" ] || go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION:-v0.8.2}"
  [ -x "$gobin/goimports" ] || go install "golang.org/x/tools/cmd/goimports@${GOIMPORTS_VERSION:-v0.51.0}"
fi
if [ -n "$vm" ] && ! wait "$vm"; then
  echo "deps: the VM tests' kernel is not ready: $(cat "$vmlog")" >&2
fi
