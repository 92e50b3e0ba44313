#!/usr/bin/env bash
# Makes the image's base, once: a Debian root from debootstrap
# --variant=minbase with the verbs libraries (libibverbs1, librdmacm1,
# ibverbs-providers), iproute2 and procps, from the mirror and suite apt is
# configured with here (/etc/apt/sources.list*), as a tarball in a cache
# outside the repository (EIPOIB_BASE_CACHE, default
# /var/cache/eipoibd-base), named by a hash of what makes it (mirror,
# suite, architecture, packages): a change of any makes a new one.
# Concurrent runs serialise on a lock in the cache. Prints the
# tarball's path. make image imports it; the package's test installs
# into a copy of it. Needs root and debootstrap.
#
#   scripts/mkbase.sh            # e.g. /var/cache/eipoibd-base/base-3f2a….tar
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
die() { echo "mkbase: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root"
command -v debootstrap >/dev/null || die "needs debootstrap (scripts/deps.sh installs it)"
# procps (kill, ps): what the eipoibd package depends on besides.
packages=libibverbs1,librdmacm1,ibverbs-providers,iproute2,procps
arch=$(dpkg --print-architecture)
# The first Debian archive apt uses (not -security, -updates or
# -backports), deb822 or one-line, and its suite.
read -r mirror suite < <(
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '
      /^deb / { u = ""; for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { u = $i; s = $(i + 1); break }
                if (u ~ /\/debian\/?$/ && s !~ /-/) { print u, s; exit } }
      /^URIs:/ { u = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i !~ /-/ && u ~ /\/debian\/?$/) { print u, $i; exit } }'
)
[ -n "${mirror:-}" ] || die "no Debian mirror in /etc/apt/sources.list*"
cache=${EIPOIB_BASE_CACHE:-/var/cache/eipoibd-base}
mkdir -p "$cache"
key=$(printf '%s\n' minbase "$mirror" "$suite" "$arch" "$packages" | sha256sum | cut -c1-16)
tar=$cache/base-$key.tar
exec 9>"$cache/lock"
flock 9
if [ ! -s "$tar" ]; then
  root=$(mktemp -d "$cache/root.XXXXXX")
  chmod 755 "$root" # the root directory of the image and of the chroots
  trap 'rm -rf "$root"' EXIT
  log=$cache/debootstrap.log
  echo "mkbase: debootstrap $suite from $mirror with $packages (a few minutes, once)" >&2
  debootstrap --variant=minbase --arch="$arch" --include="$packages" "$suite" "$root" "$mirror" >"$log" 2>&1 ||
    die "debootstrap failed: $(tail -3 "$log" | tr '\n' ' ')"
  # What a container or a chroot does not need: apt's lists and caches.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" --numeric-owner -cf "$tar.tmp" .
  mv "$tar.tmp" "$tar"
fi
echo "$tar"
