#!/usr/bin/env bash
# make release: everything a release ships, in dist/release/ (emptied
# first), each checked to report VERSION (default scripts/version.sh's)
# before SHA256SUMS is written:
#   eipoibd-VERSION-linux-{amd64,arm64}        static: simulated and kernel fabrics
#   eipoib-VERSION-linux-{amd64,arm64}         the CNI plugin, static
#   eipoibd-verbs-VERSION-linux-amd64          cgo: the verbs fabric too
#   eipoibd_DEBVERSION_amd64.deb, eipoibd-verbs_DEBVERSION_amd64.deb
#   eipoibd-VERSION.oci.tar                    the image (podman save --format oci-archive)
#   SHA256SUMS
# Every binary is run ("version", "--version"): the arm64 ones under
# qemu-aarch64-static, the packages' unpacked, the image's with podman.
# Needs root (the image); see docs/release.md.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "release: $*" >&2; exit 1; }
command -v qemu-aarch64-static >/dev/null || die "needs qemu-aarch64-static (scripts/deps.sh installs it)"
export VERSION=${VERSION:-$(scripts/version.sh)}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/containers.conf}
out=dist/release
rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for arch in amd64 arm64; do
  scripts/build-dist.sh "$arch" "$work/$arch"
  for b in eipoibd eipoib eipoibd-verbs; do
    [ ! -e "$work/$arch/$b" ] || cp "$work/$arch/$b" "$out/$b-$VERSION-linux-$arch"
  done
done
BINDIR=$work/amd64 scripts/mkdeb.sh "$out" >/dev/null
image=$(BINDIR=$work/amd64 scripts/mkimage.sh)
podman save --quiet --format oci-archive -o "$out/eipoibd-$VERSION.oci.tar" "$image"

# Each says VERSION.
says() { # what WANT COMMAND...: the first line of COMMAND's output is WANT
  local what=$1 want=$2 got
  shift 2
  got=$("$@" 2>&1 | head -1) || true
  [ "$got" = "$want" ] || die "$what says \"$got\", want \"$want\""
}
says eipoibd-linux-amd64 "eipoibd $VERSION" "$out/eipoibd-$VERSION-linux-amd64" version
says eipoibd-verbs-linux-amd64 "eipoibd $VERSION" "$out/eipoibd-verbs-$VERSION-linux-amd64" version
says eipoib-linux-amd64 "eipoib $VERSION" "$out/eipoib-$VERSION-linux-amd64" --version
# arm64 under QEMU's user-mode emulation, called directly (no binfmt).
says eipoibd-linux-arm64 "eipoibd $VERSION" qemu-aarch64-static "$out/eipoibd-$VERSION-linux-arm64" version
says eipoib-linux-arm64 "eipoib $VERSION" qemu-aarch64-static "$out/eipoib-$VERSION-linux-arm64" --version
debver=${VERSION//-/+}
for p in eipoibd eipoibd-verbs; do
  deb=$out/${p}_${debver}_amd64.deb
  [ "$(dpkg-deb -f "$deb" Version)" = "$debver" ] || die "$deb: Version $(dpkg-deb -f "$deb" Version), want $debver"
  dpkg-deb -x "$deb" "$work/deb"
done
says eipoibd.deb "eipoibd $VERSION" "$work/deb/usr/bin/eipoibd" version
says eipoibd-verbs.deb "eipoibd $VERSION" "$work/deb/usr/bin/eipoibd-verbs" version
says eipoibd.deb:eipoib "eipoib $VERSION" "$work/deb/usr/lib/cni/eipoib" --version
says "the image" "eipoibd $VERSION" podman run --rm --quiet "oci-archive:$out/eipoibd-$VERSION.oci.tar" version
says "the image's eipoib" "eipoib $VERSION" podman run --rm --quiet --entrypoint /usr/local/bin/eipoib "oci-archive:$out/eipoibd-$VERSION.oci.tar" --version

(cd "$out" && sha256sum -- * >SHA256SUMS && sha256sum --quiet -c SHA256SUMS)
ls -l "$out"
