#!/usr/bin/env bash
# Build helm from its Go module (through the Go module proxy) into OUT_DIR.
# Usage: build.sh OUT_DIR
# The release is the one pinned in go.mod (helm.sh/helm/v4); it is stamped into
# the binary so `helm version` reports it, as helm's own Makefile does for a tag.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
cd "$here"
v=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
ld="-s -w -X helm.sh/helm/v4/internal/version.version=$v -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
tmp=$(mktemp -d "$out/.build.XXXXXX")
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm
mv -f "$tmp/helm" "$out/helm"
rmdir "$tmp"
echo "$v" > "$out/VERSION"
