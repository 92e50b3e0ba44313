#!/usr/bin/env bash
# Prints the version every build stamps into eipoibd and the eipoib CNI
# plugin (-X main.version), the package and the image tag:
#   - at a tag vX.Y.Z: X.Y.Z; N commits after it: X.Y.Z-N-gHASH (git
#     describe --tags, without the "v");
#   - with no tag: the release in the VERSION file at the root of the
#     repository, then -gHASH (0.1.0-g2d0ffc9);
#   - -dirty at the end when the tree has uncommitted changes;
#   - outside a git checkout (a source tarball): VERSION alone.
# Only [0-9A-Za-z.-]: an OCI image tag and a Debian version both take it
# (the .deb's Version replaces "-" by "+", see scripts/mkdeb.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
release=$(tr -d ' \n' < VERSION)
if d=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null); then
  echo "${d#v}"
elif d=$(git describe --always --dirty 2>/dev/null); then
  echo "$release-g$d"
else
  echo "$release"
fi
