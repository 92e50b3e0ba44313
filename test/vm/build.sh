#!/usr/bin/env bash
# Builds what the VM test boots: Debian's own kernel (linux-image-amd64's
# current dependency, fetched with apt-get download into a cache outside
# the repository and unpacked there) and a small initramfs (test/vm/init)
# that loads the virtio and 9p modules, mounts the host's root read-only
# over virtio-9p, puts tmpfs on /tmp and /run, mounts the test's work
# directory (9p tag "work") on /tmp/work and the unpacked kernel package
# (9p tag "kernel") on /run/kernel, and runs /tmp/work/agent.sh
# (test/vm/agent.sh, which the test copies there) in the host's root.
#
#   test/vm/build.sh            # prints: KERNEL INITRD MODULES_DIR RELEASE
#
# MODULES_DIR is the unpacked package's lib/modules/RELEASE (with
# modules.dep): the share "kernel" is the directory above its lib/modules,
# so that modprobe -d /run/kernel works in the guest. EIPOIB_VM_CACHE overrides
# the cache (default /var/cache/eipoib-vm); once it is filled a run only
# checks it, offline. Concurrent runs serialise on a lock in the cache.
# Needs root, apt, dpkg-deb, kmod, cpio and busybox-static
# (scripts/deps.sh installs them). On failure it prints one line, the
# reason, on stderr and exits 1.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
die() {
  echo "vm: $*" >&2
  exit 1
}
# Any failure the checks below do not foresee still gets a one-line reason.
trap 'die "build.sh line $LINENO: \"$BASH_COMMAND\" failed"' ERR

[ "$(id -u)" -eq 0 ] || die "needs root"
for c in apt-get apt-cache dpkg-deb depmod modprobe cpio flock sha256sum; do
  command -v "$c" >/dev/null 2>&1 || die "needs $c (scripts/deps.sh installs it)"
done
busybox=/bin/busybox
[ -x "$busybox" ] || die "needs $busybox from busybox-static (scripts/deps.sh installs it)"
# The initramfs has no libraries: a dynamically linked busybox would not run.
if ldd "$busybox" >/dev/null 2>&1; then
  die "$busybox is dynamically linked; install busybox-static"
fi
here=$(cd "$(dirname "$0")" && pwd)
init_src=$here/init
[ -r "$init_src" ] || die "missing $init_src"

cache=${EIPOIB_VM_CACHE:-/var/cache/eipoib-vm}
mkdir -p "$cache" || die "cannot create the cache $cache"
cd "$cache"
exec 9>"$cache/.lock"
flock -w 900 9 || die "timed out waiting for the lock on $cache"

# The kernel package: the one cached, else linux-image-amd64's dependency.
# shellcheck disable=SC2012 # Debian's file names are tame
deb=$(ls -v linux-image-[0-9]*-amd64_*_amd64.deb 2>/dev/null | tail -n1 || true)
if [ -z "$deb" ]; then
  pkgname() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}' || true; }
  update() {
    apt-get update -qq >/dev/null 2>&1 || die "no kernel package cached in $cache and apt-get update failed (no Debian archive reachable?)"
  }
  download() {
    rm -rf "$cache/dl" && mkdir "$cache/dl"
    out=$(cd "$cache/dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" 2>&1)
  }
  updated=
  pkg=$(pkgname)
  if [ -z "$pkg" ]; then
    update
    updated=1
    pkg=$(pkgname)
  fi
  [ -n "$pkg" ] || die "no kernel package: apt-cache knows no dependency of linux-image-amd64 (no Debian archive in sources.list?)"
  if ! download; then
    # Stale package lists may name a version the archive no longer has.
    ok=
    if [ -z "$updated" ]; then
      update
      pkg=$(pkgname)
      [ -n "$pkg" ] && download && ok=1
    fi
    [ -n "$ok" ] || die "apt-get download ${pkg:-the kernel package} failed (no Debian archive reachable?): $(echo "$out" | grep -m1 -E '^(E|Err):' || echo "$out" | tail -n1)"
  fi
  mv "$cache"/dl/linux-image-*.deb "$cache/" || die "apt-get download $pkg left no .deb"
  rmdir "$cache/dl"
  # shellcheck disable=SC2012
  deb=$(ls -v linux-image-[0-9]*-amd64_*_amd64.deb 2>/dev/null | tail -n1 || true)
  [ -n "$deb" ] || die "apt-get download $pkg left no linux-image-*-amd64 .deb in $cache"
fi

pkg=$(dpkg-deb -f "$deb" Package 2>/dev/null) || die "$cache/$deb is not a valid package (delete it to fetch it again)"
rel=${pkg#linux-image-}
root=$cache/$rel
if [ ! -e "$root/.unpacked" ]; then
  rm -rf "$root" "$root.tmp"
  dpkg-deb -x "$deb" "$root.tmp" || die "dpkg-deb -x $cache/$deb failed (delete it to fetch it again)"
  depmod -b "$root.tmp" "$rel" || die "depmod for $rel failed"
  touch "$root.tmp/.unpacked"
  mv "$root.tmp" "$root"
fi
bzimage=$root/boot/vmlinuz-$rel
mods=$root/lib/modules/$rel
[ -r "$bzimage" ] || die "$pkg has no $bzimage"
# Booted as is, the compressed kernel spends seconds of TCG time
# decompressing itself: when the kernel can boot through the PVH entry,
# boot the uncompressed ELF image (QEMU loads it directly) instead.
kernel=$bzimage
if grep -q '^CONFIG_PVH=y' "$root/boot/config-$rel" 2>/dev/null; then
  vmlinux=$root/vmlinux
  if [ ! -s "$vmlinux" ]; then
    command -v xz >/dev/null 2>&1 || die "needs xz (xz-utils; scripts/deps.sh installs it)"
    grep -q '^CONFIG_KERNEL_XZ=y' "$root/boot/config-$rel" || die "$bzimage is not xz-compressed; cannot unpack it"
    off=$(LC_ALL=C grep -obUaP '\xFD7zXZ\x00' "$bzimage" | head -n1 | cut -d: -f1 || true)
    [ -n "$off" ] || die "no xz stream in $bzimage"
    # The stream is followed by more of the bzImage: xz stops at its end
    # (and tail gets SIGPIPE).
    { tail -c +$((off + 1)) "$bzimage" || true; } | xz -dcq --single-stream >"$vmlinux.tmp" ||
      die "unpacking $bzimage (xz at offset $off) failed"
    [ "$(head -c4 "$vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || die "unpacking $bzimage gave no ELF image"
    mv "$vmlinux.tmp" "$vmlinux"
  fi
  kernel=$vmlinux
fi

# What the guest loads (init, then agent.sh), with their dependencies,
# must all be in the package (and not built in, which modprobe would
# accept: the initramfs needs files).
modprobe_deps() { modprobe -d "$root" -S "$rel" --show-depends -a "$@" 2>&1; }
agent_mods=(crc32_generic ib_uverbs rdma_rxe tun bridge veth)
out=$(modprobe_deps "${agent_mods[@]}") || die "$rel lacks modules the agent loads: $(echo "$out" | grep -m1 -v '^insmod' || true)"
boot_mods=(virtio_pci virtio_net 9pnet_virtio 9p)
out=$(modprobe_deps "${boot_mods[@]}") || die "$rel lacks modules init loads: $(echo "$out" | grep -m1 -v '^insmod' || true)"
# In load order, each once (built-in ones need no file).
mapfile -t files < <(awk '$1 == "insmod" && !seen[$2]++ {print $2}' <<<"$out")
for f in "${files[@]}"; do
  case $f in
  *.ko) ;;
  *) die "module $f is compressed; init's busybox insmod wants plain .ko files" ;;
  esac
done

# The initramfs, named by what goes into it so that a changed init (or
# another worktree's) gets its own.
key=$( (cat "$init_src" "$busybox" && basename -a "${files[@]}") | sha256sum | cut -c1-12)
initrd=$cache/initrd-$rel-$key.cpio
if [ ! -e "$initrd" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp"/{bin,dev,proc,sys,newroot,mods}
  cp "$busybox" "$tmp/bin/busybox"
  cp "$init_src" "$tmp/init"
  chmod 755 "$tmp/init"
  for f in "${files[@]}"; do
    cp "$f" "$tmp/mods/"
    basename "$f" >>"$tmp/mods/order"
  done
  (cd "$tmp" && find . | cpio -o -H newc --quiet) >"$initrd.tmp" || die "cpio failed"
  mv "$initrd.tmp" "$initrd"
fi
echo "$kernel $initrd $mods $rel"
