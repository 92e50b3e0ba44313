#!/usr/bin/env bash
# Builds what the package, the image and the release ship, for one
# architecture, into OUTDIR, each stamped with VERSION (default
# scripts/version.sh's): eipoibd and the eipoib CNI plugin static
# (CGO_ENABLED=0: the simulated and kernel fabrics), and, for amd64 only,
# eipoibd-verbs (cgo on libibverbs and librdmacm: the verbs fabric too,
# position-independent as Debian builds C). Stripped (-s -w): the
# packages ship no debug symbols; "go version -m" still reads the
# build information, VERSION included.
#
#   scripts/build-dist.sh amd64 OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:?usage: build-dist.sh ARCH OUTDIR}
out=${2:?usage: build-dist.sh ARCH OUTDIR}
version=${VERSION:-$(scripts/version.sh)}
mkdir -p "$out"
export GOOS=linux GOARCH=$arch
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/eipoibd" ./cmd/eipoibd
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=$version" -o "$out/eipoib" ./cmd/eipoib-cni
if [ "$arch" = amd64 ]; then
  CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags verbs -ldflags "-s -w -X main.version=$version" -o "$out/eipoibd-verbs" ./cmd/eipoibd
fi
