#!/usr/bin/env bash
# Build h2spec (the HTTP/2 conformance tester) from its Go module (through the Go module proxy) into OUT_DIR.
# Usage: build.sh OUT_DIR
# The release is the one pinned in go.mod (github.com/summerwind/h2spec); it is stamped into the binary so
# `h2spec --version` reports it, as h2spec's own Makefile does for a tag.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
cd "$here"
v=$(go list -m -f '{{.Version}}' github.com/summerwind/h2spec)
ld="-s -w -X main.VERSION=${v#v} -X main.COMMIT=module"
ld=${ld/+incompatible/}
tmp=$(mktemp -d "$out/.build.XXXXXX")
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/h2spec" github.com/summerwind/h2spec/cmd/h2spec
mv -f "$tmp/h2spec" "$out/h2spec"
rmdir "$tmp"
echo "$v" > "$out/VERSION"
