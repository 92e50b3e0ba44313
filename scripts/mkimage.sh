#!/usr/bin/env bash
# make image: builds the container image here, with no registry: the
# binaries on the host (scripts/build-dist.sh, or BINDIR's), the base
# from debootstrap (scripts/mkbase.sh, cached; imported into podman once
# per base as localhost/eipoibd-base:HASH), then podman build from
# deploy/kubernetes/Containerfile, tagged localhost/eipoibd:VERSION.
# podman runs with scripts/containers.conf (runc, no default ulimits)
# unless CONTAINERS_CONF names another. Needs root and podman. Prints
# the image's name.
#
#   scripts/mkimage.sh            # localhost/eipoibd:0.1.0-g2d0ffc9
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "mkimage: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root"
command -v podman >/dev/null || die "needs podman (scripts/deps.sh installs it)"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/containers.conf}
version=${VERSION:-$(scripts/version.sh)}
base=$(scripts/mkbase.sh)
baseimg=localhost/eipoibd-base:$(basename "$base" .tar | sed 's/^base-//')
if ! podman image exists "$baseimg"; then
  podman import --quiet "$base" "$baseimg" >/dev/null
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
if [ -n "${BINDIR:-}" ]; then
  cp "$BINDIR"/eipoibd "$BINDIR"/eipoibd-verbs "$BINDIR"/eipoib "$ctx"/
else
  VERSION=$version scripts/build-dist.sh amd64 "$ctx" >&2
fi
image=localhost/eipoibd:$version
podman build --quiet --pull=never --build-arg BASE="$baseimg" --build-arg VERSION="$version" \
  -f deploy/kubernetes/Containerfile -t "$image" "$ctx" >/dev/null
echo "$image"
