#!/usr/bin/env bash
# Builds the Debian packages with dpkg-deb from a staged tree, into
# OUTDIR (default dist/), and checks them with lintian (errors fail):
#   eipoibd        eipoibd (static: the simulated and kernel fabrics) in
#                  /usr/bin, the eipoib CNI plugin in /usr/lib/cni, the
#                  unit eipoibd@.service, /etc/eipoibd/example.toml (a
#                  conffile: docs/eipoibd.toml), eipoibd(8) made from the
#                  binary's usage (scripts/manpage.sh) and the docs;
#   eipoibd-verbs  eipoibd-verbs (cgo: the verbs fabric as well) and a
#                  drop-in that makes eipoibd@.service run it; depends on
#                  eipoibd and on libibverbs1 and librdmacm1.
# The maintainer scripts reload systemd where it runs and start nothing:
# an instance runs once the operator enables it. Removing the package
# stops the running instances. The binaries come from BINDIR when set
# (scripts/build-dist.sh's output, the same VERSION), else are built.
#
#   scripts/mkdeb.sh [OUTDIR]      # prints the paths of the .deb files
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/sbin:/sbin
out=$(realpath -m "${1:-dist}")
version=${VERSION:-$(scripts/version.sh)}
# A Debian version whose "-" would start a Debian revision: "+" instead
# (0.1.0-g2d0ffc9 is 0.1.0+g2d0ffc9, sorting after 0.1.0).
debver=${version//-/+}
arch=amd64
maint="eipoibd maintainers <maintainers@users.noreply.a-seed-e83ae3bd.example>"
for c in dpkg-deb dpkg-shlibdeps fakeroot lintian gzip; do
  command -v "$c" >/dev/null || { echo "mkdeb: needs $c (scripts/deps.sh installs it)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=${BINDIR:-}
if [ -z "$bin" ]; then
  bin=$work/bin
  VERSION=$version scripts/build-dist.sh "$arch" "$bin" >&2
fi

# maintscript NAME STOP: the postinst and postrm (and, with STOP, the
# prerm) of package NAME in its DEBIAN directory.
maintscript() {
  local d=$1/DEBIAN
  cat >"$d/postinst" <<'SH'
#!/bin/sh
# Lets systemd see the new or changed unit; starts nothing (an instance
# runs once enabled: systemctl enable --now eipoibd@eib0). A running
# instance keeps its binary until "systemctl restart eipoibd@NAME".
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
SH
  cat >"$d/postrm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
SH
  if [ -n "${2:-}" ]; then
    cat >"$d/prerm" <<'SH'
#!/bin/sh
# Removed (not upgraded): stop the instances, whose binary goes.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop 'eipoibd@*.service' || true
fi
SH
  fi
  chmod 755 "$d/postinst" "$d/postrm"
  [ ! -e "$d/prerm" ] || chmod 755 "$d/prerm"
}

# docs NAME: copyright and changelog.gz in the package's doc directory.
docs() {
  local d=$1/usr/share/doc/$2
  install -d "$d"
  cat >"$d/copyright" <<CP
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: eipoibd

Files: *
Copyright: 2025-2026 the eipoibd authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0, is
 in /usr/share/common-licenses/Apache-2.0.
CP
  printf '%s (%s) unstable; urgency=medium\n\n  * Release %s: see /usr/share/doc/eipoibd/CHANGELOG.md.\n\n -- %s  %s\n' \
    "$2" "$debver" "$version" "$maint" "$(date -R -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)")" |
    gzip -9n >"$d/changelog.gz"
}

# control NAME DEPENDS DESCRIPTION...: DEBIAN/control, md5sums, and the
# package built into $out.
package() {
  local root=$1 name=$2 deps=$3
  shift 3
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
  {
    echo "Package: $name"
    echo "Version: $debver"
    echo "Architecture: $arch"
    echo "Maintainer: $maint"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
    [ -n "$deps" ] && echo "Depends: $deps"
    echo "Section: net"
    echo "Priority: optional"
    echo "Homepage: https://github.com/eipoib/eipoibd"
    printf 'Description: %s\n' "$1"
    shift
    printf ' %s\n' "$@"
  } >"$root/DEBIAN/control"
  mkdir -p "$out"
  fakeroot dpkg-deb -Zxz --build "$root" "$out/${name}_${debver}_$arch.deb" >/dev/null
  echo "$out/${name}_${debver}_$arch.deb"
}

# eipoibd
r=$work/eipoibd
install -d "$r/DEBIAN"
install -D -m 755 "$bin/eipoibd" "$r/usr/bin/eipoibd"
install -D -m 755 "$bin/eipoib" "$r/usr/lib/cni/eipoib"
# The unit as dist/systemd has it for a manual install in /usr/local,
# with the package's paths.
install -d "$r/usr/lib/systemd/system"
sed 's,/usr/local/,/usr/,g' dist/systemd/eipoibd@.service >"$r/usr/lib/systemd/system/eipoibd@.service"
install -D -m 644 docs/eipoibd.toml "$r/etc/eipoibd/example.toml"
echo /etc/eipoibd/example.toml >"$r/DEBIAN/conffiles"
install -D -m 644 -t "$r/usr/share/doc/eipoibd" README.md CHANGELOG.md docs/*.md
install -d "$r/usr/share/man/man8"
scripts/manpage.sh "$bin/eipoibd" "$version" | gzip -9n >"$r/usr/share/man/man8/eipoibd.8.gz"
docs "$r" eipoibd
maintscript "$r" stop
# procps: the unit's ExecReload runs /bin/kill.
debs=$(package "$r" eipoibd "procps" "Ethernet over IPoIB: a TAP NIC whose traffic travels over InfiniBand" \
  "eipoibd gives a Linux hypervisor an Ethernet NIC (a TAP device) whose" \
  "traffic travels over an InfiniBand fabric as standard IPoIB (RFC 4391)." \
  "Enslaved to a bridge or Open vSwitch, it gives unmodified guests" \
  "Ethernet on the fabric. This build runs the simulated and the kernel" \
  "IPoIB fabrics; eipoibd-verbs adds the verbs one. It also holds the" \
  "eipoib CNI plugin, in /usr/lib/cni.")

# eipoibd-verbs
if [ -x "$bin/eipoibd-verbs" ]; then
  r=$work/eipoibd-verbs
  install -d "$r/DEBIAN" "$r/usr/share/man/man8"
  install -D -m 755 "$bin/eipoibd-verbs" "$r/usr/bin/eipoibd-verbs"
  ln -s eipoibd.8.gz "$r/usr/share/man/man8/eipoibd-verbs.8.gz"
  d=$r/usr/lib/systemd/system/eipoibd@.service.d
  install -d "$d"
  {
    echo "# Installed by eipoibd-verbs: eipoibd@NAME runs eipoibd-verbs, which"
    echo "# also serves fabric = \"verbs\": the uverbs and rdma_cm devices, and"
    echo "# no limit on the memory it registers (ibv_reg_mr pins pages)."
    echo "[Service]"
    echo "ExecStart="
    grep '^ExecStart=' "$work/eipoibd/usr/lib/systemd/system/eipoibd@.service" | sed 's,/usr/bin/eipoibd ,/usr/bin/eipoibd-verbs ,'
    echo "DeviceAllow=char-infiniband_verbs rw"
    echo "DeviceAllow=/dev/infiniband/rdma_cm rw"
    echo "LimitMEMLOCK=infinity"
  } >"$d/verbs.conf"
  docs "$r" eipoibd-verbs
  maintscript "$r"
  # The shared libraries' packages, as dpkg-shlibdeps finds them.
  install -d "$work/shlibs/debian"
  printf 'Source: eipoibd\n\nPackage: eipoibd-verbs\nArchitecture: any\n' >"$work/shlibs/debian/control"
  shl=$(cd "$work/shlibs" && dpkg-shlibdeps -O -e"$r/usr/bin/eipoibd-verbs" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
  debs+=$'\n'$(package "$r" eipoibd-verbs "eipoibd (= $debver), $shl" "eipoibd with the verbs fabric (libibverbs)" \
    "eipoibd-verbs is eipoibd built with the verbs fabric backend: UD QPs on" \
    "an InfiniBand HCA through libibverbs and librdmacm, besides the" \
    "simulated and kernel fabrics. Installed, it is what eipoibd@.service" \
    "runs.")
fi
# lintian: errors fail the build; warnings are shown.
# shellcheck disable=SC2086
lintian --fail-on error --suppress-tags statically-linked-binary $debs >&2
echo "$debs"
